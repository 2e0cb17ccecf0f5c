//! `compcache-storebench`: the page store measured against its peers on the same real pages,
//! in one run, reported as ratios.
//!
//! Candidates: compcache's store (single thread and one thread per core); a baseline that
//! compresses with the same liblz4 into one `malloc`ed buffer per page (what a naive userspace
//! store does); and kernel zram (a device of our own from /sys/class/zram-control, written
//! and read with O_DIRECT, memory from its `mm_stat`). Times are wall-clock medians of
//! `--runs` runs; every figure that is compared is a ratio within this run.

mod recomp;
mod zram;

use clap::Parser;
use compcache_store::{Algorithm, Config, Store, PAGE_SIZE};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Benchmark compcache's page store against kernel zram and a malloc-per-page baseline on real pages")]
struct Args {
    /// Page files (raw 4 KiB pages, e.g. from tools/pagedump). Default: data/pages-mixed.bin
    pages: Vec<PathBuf>,
    /// Compression algorithm for compcache and zram.
    #[arg(long, default_value = "lz4")]
    algorithm: Algorithm,
    /// Runs per measurement; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Threads for the "all cores" runs (default: the number of CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Skip kernel zram (it needs root and /sys/class/zram-control).
    #[arg(long)]
    no_zram: bool,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Instead: the recompression comparison (memory once recompression has settled, its CPU
    /// time, read latency of recompressed pages; against zram's lzo-rle, lz4, zstd and zstd
    /// with a dictionary on the same pages). See recomp.rs.
    #[arg(long)]
    recompress: bool,
    /// With --recompress: the recompression codec's zstd level.
    #[arg(long, default_value_t = compcache_store::config::DEFAULT_RECOMPRESS_LEVEL)]
    recompress_level: i32,
    /// With --recompress: the cold tier's zstd level (its rows move every page there).
    #[arg(long, default_value_t = compcache_store::config::DEFAULT_COLD_LEVEL)]
    cold_level: i32,
}

#[derive(Serialize, Default, Clone)]
struct Row {
    name: String,
    threads: usize,
    write_pages_per_s: f64,
    read_pages_per_s: f64,
    /// Bytes of memory holding the data (compcache/zram: mem_used_total; malloc: heap in use).
    mem_bytes: u64,
    compr_bytes: u64,
}

#[derive(Serialize)]
struct Report {
    pages: usize,
    page_files: Vec<String>,
    algorithm: String,
    orig_bytes: u64,
    runs: usize,
    rows: Vec<Row>,
    compression_ratio: f64,
    mem_used_over_compr: f64,
}

fn main() {
    let args = Args::parse();
    let files = if args.pages.is_empty() { vec![PathBuf::from("data/pages-mixed.bin")] } else { args.pages.clone() };
    let mut data = Vec::new();
    for f in &files {
        match std::fs::read(f) {
            Ok(mut d) => {
                d.truncate(d.len() / PAGE_SIZE * PAGE_SIZE);
                data.extend_from_slice(&d);
            }
            Err(e) => {
                eprintln!(
                    "compcache-storebench: cannot read page file {}: {e} (make one with tools/pagedump/pagedump.py --all)",
                    f.display()
                );
                std::process::exit(2);
            }
        }
    }
    let pages = data.len() / PAGE_SIZE;
    if pages == 0 {
        eprintln!("compcache-storebench: the page files hold no whole page");
        std::process::exit(2);
    }
    if args.recompress {
        recomp::main(&data, args.recompress_level, args.cold_level, !args.no_zram, args.json.as_deref());
        return;
    }
    let data = Arc::new(data);
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    eprintln!("{pages} pages ({} MiB) from {} file(s), {} runs each", (pages * PAGE_SIZE) >> 20, files.len(), args.runs);

    let mut rows = Vec::new();
    let mut last_stats = None;
    for t in [1, threads] {
        let (row, stats) = median_row(args.runs, || bench_store(&data, args.algorithm, t));
        eprintln!("  compcache x{t}: write {:.0} pages/s, read {:.0} pages/s", row.write_pages_per_s, row.read_pages_per_s);
        rows.push(row);
        last_stats = Some(stats);
    }
    let (row, _) = median_row(args.runs, || (bench_malloc(&data), ()));
    eprintln!("  malloc-per-page x1: write {:.0} pages/s, read {:.0} pages/s", row.write_pages_per_s, row.read_pages_per_s);
    rows.push(row);
    if !args.no_zram {
        match zram::available() {
            Ok(()) => {
                for t in [1, threads] {
                    let (row, _) = median_row(args.runs, || match zram::bench(&data, args.algorithm.name(), None, t) {
                        Ok(r) => (r, ()),
                        Err(e) => {
                            eprintln!("compcache-storebench: zram run failed: {e}");
                            std::process::exit(1);
                        }
                    });
                    eprintln!("  zram x{t}: write {:.0} pages/s, read {:.0} pages/s", row.write_pages_per_s, row.read_pages_per_s);
                    rows.push(row);
                }
            }
            Err(why) => eprintln!("  zram skipped: {why}"),
        }
    }
    let s = last_stats.expect("at least one compcache run");
    let report = Report {
        pages,
        page_files: files.iter().map(|f| f.display().to_string()).collect(),
        algorithm: args.algorithm.name().into(),
        orig_bytes: (pages * PAGE_SIZE) as u64,
        runs: args.runs,
        compression_ratio: s.orig_data_size as f64 / s.compr_data_size.max(1) as f64,
        mem_used_over_compr: s.mem_used_total as f64 / s.compr_data_size.max(1) as f64,
        rows,
    };
    print_markdown(&report);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).expect("report serializes");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("compcache-storebench: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}

/// Runs `f` `runs` times and keeps the run with the median write speed.
fn median_row<S>(runs: usize, mut f: impl FnMut() -> (Row, S)) -> (Row, S) {
    let mut all: Vec<(Row, S)> = (0..runs.max(1)).map(|_| f()).collect();
    all.sort_by(|a, b| a.0.write_pages_per_s.total_cmp(&b.0.write_pages_per_s));
    let mid = all.len() / 2;
    let (mut row, s) = all.swap_remove(mid);
    // the read speed's own median, independently of the write's
    row.read_pages_per_s = {
        let mut r: Vec<f64> = all.iter().map(|x| x.0.read_pages_per_s).chain([row.read_pages_per_s]).collect();
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    (row, s)
}

/// Splits `0..pages` into `threads` contiguous ranges and runs `f(range)` on each in parallel.
fn parallel(pages: usize, threads: usize, f: impl Fn(std::ops::Range<usize>) + Sync) -> f64 {
    let chunk = pages.div_ceil(threads);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let r = (t * chunk).min(pages)..((t + 1) * chunk).min(pages);
            let f = &f;
            s.spawn(move || f(r));
        }
    });
    start.elapsed().as_secs_f64()
}

fn bench_store(data: &Arc<Vec<u8>>, alg: Algorithm, threads: usize) -> (Row, compcache_store::Stats) {
    let pages = data.len() / PAGE_SIZE;
    let mut cfg = Config::with_disksize((pages * PAGE_SIZE) as u64);
    cfg.algorithm = alg;
    let store = Store::new(cfg).expect("store for the page set");
    let wt = parallel(pages, threads, |r| {
        let mut ctx = store.context();
        for i in r {
            store.write_page(&mut ctx, i as u64, &data[i * PAGE_SIZE..][..PAGE_SIZE]).expect("write");
        }
    });
    let rt = parallel(pages, threads, |r| {
        let mut ctx = store.context();
        let mut buf = vec![0u8; PAGE_SIZE];
        for i in r {
            store.read_page(&mut ctx, i as u64, &mut buf).expect("read");
            assert!(buf == data[i * PAGE_SIZE..][..PAGE_SIZE], "page {i} read back wrong");
        }
    });
    let s = store.stats();
    let row = Row {
        name: "compcache".into(),
        threads,
        write_pages_per_s: pages as f64 / wt,
        read_pages_per_s: pages as f64 / rt,
        mem_bytes: s.mem_used_total,
        compr_bytes: s.compr_data_size,
    };
    (row, s)
}

/// The naive baseline: lz4 into a `Vec<u8>` per page (same-filled pages skipped as zram does).
fn bench_malloc(data: &[u8]) -> Row {
    let pages = data.len() / PAGE_SIZE;
    let heap0 = heap_in_use();
    let start = Instant::now();
    let mut table: Vec<Option<Vec<u8>>> = Vec::with_capacity(pages);
    let mut compr = 0u64;
    for i in 0..pages {
        let p = &data[i * PAGE_SIZE..][..PAGE_SIZE];
        if p.chunks_exact(8).all(|c| c == &p[..8]) {
            table.push(None);
            continue;
        }
        let c = {
            let mut c = vec![0u8; 2 * PAGE_SIZE];
            let n = lz4::block::compress_to_buffer(p, None, false, &mut c).expect("lz4");
            c.truncate(n);
            c.shrink_to_fit();
            c
        };
        compr += c.len() as u64;
        table.push(Some(c));
    }
    let wt = start.elapsed().as_secs_f64();
    let mem = heap_in_use().saturating_sub(heap0).saturating_sub((pages * std::mem::size_of::<Option<Vec<u8>>>()) as u64);
    let start = Instant::now();
    let mut buf = vec![0u8; PAGE_SIZE];
    for (i, e) in table.iter().enumerate() {
        match e {
            Some(c) => {
                lz4::block::decompress_to_buffer(c, Some(PAGE_SIZE as i32), &mut buf).expect("round trip");
            }
            None => buf.copy_from_slice(&data[i * PAGE_SIZE..][..PAGE_SIZE]),
        }
        assert!(buf == data[i * PAGE_SIZE..][..PAGE_SIZE]);
    }
    let rt = start.elapsed().as_secs_f64();
    Row {
        name: "malloc-per-page".into(),
        threads: 1,
        write_pages_per_s: pages as f64 / wt,
        read_pages_per_s: pages as f64 / rt,
        mem_bytes: mem,
        compr_bytes: compr,
    }
}

/// glibc's count of heap bytes in use (arena + mmapped chunks).
fn heap_in_use() -> u64 {
    // SAFETY: mallinfo2 only reads allocator statistics; it has no preconditions.
    let mi = unsafe { libc::mallinfo2() };
    (mi.uordblks + mi.hblkhd) as u64
}

fn print_markdown(r: &Report) {
    println!("### Store benchmark: {} pages ({} MiB) of {}, {}", r.pages, r.orig_bytes >> 20, r.page_files.join(", "), r.algorithm);
    println!();
    println!("compression ratio (orig_data_size / compr_data_size): {:.2}", r.compression_ratio);
    println!("mem_used_total / compr_data_size: {:.4}", r.mem_used_over_compr);
    println!();
    let base = |name: &str, t: usize| r.rows.iter().find(|x| x.name == name && x.threads == t).cloned();
    println!("| store | threads | write pages/s | read pages/s | compressed MiB | memory MiB | memory/compressed | orig/memory | write vs zram | read vs zram | memory vs zram |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &r.rows {
        let z = base("zram", row.threads).or_else(|| base("zram", 1));
        let ratio = |a: f64, b: Option<f64>| b.map(|b| format!("{:.2}x", a / b)).unwrap_or_else(|| "-".into());
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.4} | {:.2} | {} | {} | {} |",
            row.name,
            row.threads,
            row.write_pages_per_s,
            row.read_pages_per_s,
            row.compr_bytes as f64 / 1048576.0,
            row.mem_bytes as f64 / 1048576.0,
            row.mem_bytes as f64 / row.compr_bytes.max(1) as f64,
            r.orig_bytes as f64 / row.mem_bytes.max(1) as f64,
            ratio(row.write_pages_per_s, z.as_ref().map(|z| z.write_pages_per_s)),
            ratio(row.read_pages_per_s, z.as_ref().map(|z| z.read_pages_per_s)),
            ratio(row.mem_bytes as f64, z.as_ref().map(|z| z.mem_bytes as f64)),
        );
    }
}
