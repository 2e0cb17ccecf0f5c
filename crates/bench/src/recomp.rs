//! `compcache-storebench --recompress`: what background recompression (`recompress/` in the
//! store) buys on real pages, in one run, against kernel zram given the same pages.
//!
//! compcache rows: the store with lz4 and no recompression; with recompression (zstd at
//! `--recompress-level`, default 9, no dictionary); with recompression and a self-trained
//! dictionary. Each is filled, its pages
//! aged past the idle age, and recompressed until a whole pass of the device changes nothing
//! ("settled"); then `mem_used_total`, the CPU time recompression took per GiB of data, and the
//! latency of single-page reads (random order, one thread, p50/p99) and the time per page to
//! read every page once in index order are taken. Writes are timed
//! before recompression: the write path does not change with it.
//!
//! Cold-tier rows (`--cold-level`, default the tier's own 19): the same two stores, then every
//! page moved to a cold tier (`BackingConfig::in_memory`: RAM compressed 64 KiB at a time) by
//! idle writeback, GC'd and compacted: `mem_used_total` then counts the pool and the tier; the
//! CPU time of that writeback per GiB; and reads of cold pages (random and in order).
//!
//! zram rows: lzo-rle (its default), lz4, zstd, and zstd with a dictionary through
//! `algorithm_params` (Linux 6.12+; trained by zstd's trainer on a sample of the same pages,
//! which favours zram slightly), memory from `mm_stat` after the same pages are written.

use std::path::Path;
use std::time::{Duration, Instant};

use compcache_store::{BackingConfig, Config, DictSource, Medium, RecompressConfig, Store, WritebackBudget, PAGE_SIZE};
use serde::Serialize;

use crate::zram;

#[derive(Serialize, Clone)]
struct RecompRow {
    name: String,
    mem_bytes: u64,
    write_pages_per_s: f64,
    /// compcache with recompression: CPU seconds it took per GiB of data stored.
    recompress_cpu_s_per_gib: Option<f64>,
    /// compcache with a cold tier: CPU seconds moving every page there took, per GiB.
    cold_cpu_s_per_gib: Option<f64>,
    /// Single-page reads, ns (compcache only).
    read_p50_ns: Option<u64>,
    read_p99_ns: Option<u64>,
    /// Every page read once in index order (what readahead and multi-page requests do), ns
    /// per page (compcache only).
    read_in_order_ns: Option<u64>,
    /// Pages recompressed (with a dictionary) when settled.
    recomp_pages: u64,
    recomp_dict_pages: u64,
}

pub fn main(data: &[u8], level: i32, cold_level: i32, with_zram: bool, json: Option<&Path>) {
    let pages = data.len() / PAGE_SIZE;
    let gib = data.len() as f64 / (1u64 << 30) as f64;
    let rc = RecompressConfig { level, ..RecompressConfig::default() };
    let mut rows = vec![
        compcache(data, "compcache lz4", None, None),
        compcache(
            data,
            &format!("compcache lz4 + recompress zstd-{level}"),
            Some(RecompressConfig { dict: DictSource::None, ..rc.clone() }),
            None,
        ),
        compcache(data, &format!("compcache lz4 + recompress zstd-{level} + dict"), Some(rc.clone()), None),
        compcache(data, &format!("compcache lz4, cold tier zstd-{cold_level}"), None, Some(cold_level)),
        compcache(
            data,
            &format!("compcache lz4 + recompress zstd-{level} + dict, cold tier zstd-{cold_level}"),
            Some(rc),
            Some(cold_level),
        ),
    ];
    for r in &mut rows {
        for cpu in [r.recompress_cpu_s_per_gib.as_mut(), r.cold_cpu_s_per_gib.as_mut()].into_iter().flatten() {
            *cpu /= gib;
        }
    }
    if with_zram {
        match zram::available() {
            Ok(()) => {
                let dict = train_dict(data);
                for (name, alg, params) in [
                    ("zram lzo-rle", "lzo-rle", None),
                    ("zram lz4", "lz4", None),
                    ("zram zstd", "zstd", None),
                    ("zram zstd + dict", "zstd", dict.as_ref().map(|p| format!("dict={}", p.display()))),
                ] {
                    if name.ends_with("dict") && params.is_none() {
                        continue;
                    }
                    match zram::bench(data, alg, params.as_deref(), 1) {
                        Ok(r) => rows.push(RecompRow {
                            name: name.into(),
                            mem_bytes: r.mem_bytes,
                            write_pages_per_s: r.write_pages_per_s,
                            recompress_cpu_s_per_gib: None,
                            cold_cpu_s_per_gib: None,
                            read_p50_ns: None,
                            read_p99_ns: None,
                            read_in_order_ns: None,
                            recomp_pages: 0,
                            recomp_dict_pages: 0,
                        }),
                        Err(e) => eprintln!("  {name} skipped: {e}"),
                    }
                }
                if let Some(p) = dict {
                    let _ = std::fs::remove_file(p);
                }
            }
            Err(why) => eprintln!("  zram skipped: {why}"),
        }
    }
    print(pages, &rows);
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&rows).expect("rows serialize");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("compcache-storebench: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}

fn compcache(data: &[u8], name: &str, rc: Option<RecompressConfig>, cold_level: Option<i32>) -> RecompRow {
    let pages = data.len() / PAGE_SIZE;
    let idle = rc.as_ref().map_or(0, |r| r.idle_secs);
    // Room for every page raw with its record header, in whole segments, and four to spare.
    let backing = cold_level.map(|level| {
        let seg = compcache_store::config::DEFAULT_SEGMENT_BYTES;
        let bytes = (pages as u64 * (PAGE_SIZE as u64 + 64)).div_ceil(seg) * seg + 4 * seg;
        BackingConfig { medium: Medium::Memory { level }, ..BackingConfig::in_memory(bytes) }
    });
    let cfg = Config { recompress: rc, backing, ..Config::with_disksize(data.len() as u64) };
    let store = Store::new(cfg).expect("store for the page set");
    let mut ctx = store.context();
    let start = Instant::now();
    for (i, p) in data.chunks_exact(PAGE_SIZE).enumerate() {
        store.write_page(&mut ctx, i as u64, p).expect("write");
    }
    let write_pages_per_s = pages as f64 / start.elapsed().as_secs_f64();
    store.advance_clock(idle + 1);
    if store.recompresses() {
        // Settled: two passes over every slot that install and reject nothing (the first pass
        // may only sample pages for the dictionary).
        let mut quiet = 0u64;
        while quiet < 2 * pages as u64 {
            let r = store.recompress(Duration::from_secs(3600));
            quiet = if r.done + r.rejected == 0 { quiet + r.scanned.max(1) } else { 0 };
        }
    }
    let mut cold_cpu_s = None;
    if cold_level.is_some() {
        // Every page is idle: all of them go (what `maintain` does to pages idle past
        // `--cold-idle`), then GC and compaction give back what they left.
        let t = thread_cpu_s();
        let r = store.writeback_idle(0, WritebackBudget::UNLIMITED);
        assert!(r.error.is_none() && !r.device_full, "cold writeback: {r:?}");
        let g = store.gc(u64::MAX);
        assert!(g.error.is_none() && g.corrupt == 0, "GC: {g:?}");
        cold_cpu_s = Some(thread_cpu_s() - t);
    }
    store.compact();
    let s = store.stats();
    let (p50, p99) = read_latency(&store, data);
    let in_order = read_in_order(&store, data);
    if cold_level.is_some() {
        eprintln!(
            "  {name}: cold tier {} pages, {:.1} MiB of it in RAM, pool {:.1} MiB",
            s.bd_count,
            s.bd_mem_bytes as f64 / 1048576.0,
            (s.mem_used_total - s.bd_mem_bytes) as f64 / 1048576.0
        );
    }
    eprintln!(
        "  {name}: mem_used_total {:.1} MiB, recompressed {} (with dictionary {}), dictionaries installed {} (refused {}), recompressions {}",
        s.mem_used_total as f64 / 1048576.0,
        s.recomp_pages,
        s.recomp_dict_pages,
        s.dicts_installed,
        s.dicts_refused,
        s.recompress_done
    );
    RecompRow {
        name: name.into(),
        mem_bytes: s.mem_used_total,
        write_pages_per_s,
        recompress_cpu_s_per_gib: store.recompresses().then_some(s.recompress_cpu_ms as f64 / 1000.0),
        cold_cpu_s_per_gib: cold_cpu_s,
        read_p50_ns: Some(p50),
        read_p99_ns: Some(p99),
        read_in_order_ns: Some(in_order),
        recomp_pages: s.recomp_pages,
        recomp_dict_pages: s.recomp_dict_pages,
    }
}

/// This thread's CPU time, seconds.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Single-page reads in a random order (every page checked): p50 and p99 in ns.
fn read_latency(store: &Store, data: &[u8]) -> (u64, u64) {
    let pages = data.len() / PAGE_SIZE;
    let mut order: Vec<usize> = (0..pages).collect();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..pages).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut ns = timed_reads(store, data, order);
    ns.sort_unstable();
    (ns[ns.len() / 2], ns[ns.len() * 99 / 100])
}

/// Every page read once in index order (every page checked): ns per page. Neighbouring pages
/// share a cold-tier block, which a reading thread decodes once for them.
fn read_in_order(store: &Store, data: &[u8]) -> u64 {
    // Past the backing tier's promotion window (a page read again within 4 s goes back to the
    // pool): these reads are of cold pages, as the random ones were, not promotions.
    store.advance_clock(60);
    let ns = timed_reads(store, data, 0..data.len() / PAGE_SIZE);
    ns.iter().sum::<u64>() / ns.len().max(1) as u64
}

/// Reads the pages `order` names one at a time, checking each against `data`: each read's ns.
fn timed_reads(store: &Store, data: &[u8], order: impl IntoIterator<Item = usize>) -> Vec<u64> {
    let mut ctx = store.context();
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut ns = Vec::with_capacity(data.len() / PAGE_SIZE);
    for i in order {
        let t = Instant::now();
        store.read_page(&mut ctx, i as u64, &mut buf).expect("read");
        ns.push(t.elapsed().as_nanos() as u64);
        assert!(buf == data[i * PAGE_SIZE..][..PAGE_SIZE], "page {i} read back wrong");
    }
    ns
}

/// A zstd dictionary (16 KiB) trained on every 16th page, for zram's `algorithm_params`, in a
/// private temporary file; `None` if training fails.
fn train_dict(data: &[u8]) -> Option<std::path::PathBuf> {
    let sample: Vec<u8> = data.chunks_exact(PAGE_SIZE).step_by(16).take(4096).flatten().copied().collect();
    // The store's own trainer (what `compcache dict train` uses), at the recompression level.
    let level = compcache_store::config::DEFAULT_RECOMPRESS_LEVEL;
    let dict = compcache_store::recompress::dict::train(&sample, 16 << 10, level)
        .map_err(|e| eprintln!("  dictionary training failed: {e}"))
        .ok()?
        .bytes;
    let path = std::env::temp_dir().join(format!("compcache-storebench-{}.dict", std::process::id()));
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).ok()?;
    std::io::Write::write_all(&mut f, &dict).ok()?;
    Some(path)
}

fn print(pages: usize, rows: &[RecompRow]) {
    let by = |name: &str| rows.iter().find(|r| r.name == name).map(|r| r.mem_bytes as f64);
    let (lzo, zstd) = (by("zram lzo-rle"), by("zram zstd"));
    let ratio = |m: u64, b: Option<f64>| b.map_or("-".to_string(), |b| format!("{:.3}x", m as f64 / b));
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    println!("### Recompression: {pages} pages ({} MiB)", (pages * PAGE_SIZE) >> 20);
    println!();
    println!("| store | mem_used_total MiB | vs zram lzo-rle | vs zram zstd | write pages/s | recompress CPU s/GiB | cold tier CPU s/GiB | read p50 ns | read p99 ns | read in order ns/page | recompressed (dict) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.1} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} ({}) |",
            r.name,
            r.mem_bytes as f64 / 1048576.0,
            ratio(r.mem_bytes, lzo),
            ratio(r.mem_bytes, zstd),
            r.write_pages_per_s,
            r.recompress_cpu_s_per_gib.map_or("-".to_string(), |c| format!("{c:.1}")),
            r.cold_cpu_s_per_gib.map_or("-".to_string(), |c| format!("{c:.1}")),
            opt(r.read_p50_ns),
            opt(r.read_p99_ns),
            opt(r.read_in_order_ns),
            r.recomp_pages,
            r.recomp_dict_pages,
        );
    }
}
