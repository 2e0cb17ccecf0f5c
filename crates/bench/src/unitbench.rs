//! `compcache-unitbench`: what compressing several pages as one unit would gain on real pages,
//! and what it would cost to read them back (issue 13, "multi-page units").
//!
//! A large folio's swap-out writes up to 64 KiB of contiguous pages at once; a store could
//! compress such a run as one unit instead of page by page. This measures it on page dumps
//! (tools/pagedump), for unit sizes of 4 KiB (the store as it is: the baseline) to 64 KiB, with
//! liblz4 (block API, default acceleration, as `crates/store/src/compress/lz4.rs`) and zstd
//! levels 1 and 3 (bulk API, frames without checksum, content size or dictionary id, as
//! `compress/zstd.rs`); `--codecs` adds others, among them recompression's own (`zstd-9+dict`:
//! level 9 with a dictionary trained from the dump as recompression trains one from its
//! device).
//!
//! The model of a unit:
//! - The dump is cut into aligned groups of `unit / 4 KiB` consecutive pages (the dumps hold a
//!   process's resident anonymous pages in address order; pages-mixed.bin alternates its
//!   sources every 16 pages, so no group of 64 KiB or less mixes two programs until a source
//!   runs out). Same-filled pages (every 8-byte word equal) cost 0 bytes, as in the store:
//!   they are left out of their group, and the group's other pages, concatenated, are the unit.
//! - `ratio` is all original bytes (same-filled pages included, as zram's `orig_data_size`)
//!   over the compressed bytes of all units. `ratio stored` also stores a unit raw (its
//!   original size) when it does not compress below 3/4 of its size: what a store would hold.
//!   Neither counts the allocator's overhead (size classes, headers), which a unit larger than
//!   a page would change too: today's pool has no object larger than a page.
//! - Reading a page means, for a compressed unit, decompressing the whole unit and copying the
//!   page out; for a raw unit, copying the page. `random read` times that for single pages
//!   drawn at random (not same-filled; the same draws for every row), each read timed on its
//!   own: the cost of a swap-in fault that reads one page. `sequential read` decompresses each
//!   unit once and copies out all its pages: the best case, readahead or a whole-folio swap-in.
//!
//! Compression time is the thread's CPU time (from /proc/thread-self/schedstat; wall-clock
//! time if that is missing), in seconds per GiB of the pages compressed (same-filled ones left
//! out), median of `--runs` passes after one that warms up. Every row's figures are also
//! given as a ratio to the same codec's row of the first unit size (4 KiB unless `--units-kib`
//! says otherwise), measured in the same run.
//! Every unit is decompressed and compared with the original once before anything is timed.

use clap::Parser;
use compcache_store::recompress::dict;
use compcache_store::PAGE_SIZE;
use serde::Serialize;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use zstd::zstd_safe::{CParameter, DParameter};

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Parser)]
#[command(about = "Compressing runs of pages as one unit (4-64 KiB): ratio, compression CPU, and the cost of reading one page back")]
struct Args {
    /// Page files (raw 4 KiB pages, e.g. from tools/pagedump). Default: data/pages-mixed.bin
    pages: Vec<PathBuf>,
    /// Unit sizes in KiB, multiples of 4. The first is the baseline of the ratios.
    #[arg(long, value_delimiter = ',', default_value = "4,16,32,64")]
    units_kib: Vec<usize>,
    /// Compression passes per row; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Random single-page reads per row.
    #[arg(long, default_value_t = 50_000)]
    reads: usize,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Codecs: `lz4`, `zstd-N`, and `zstd-N+dict` (zstd at level N with a 16 KiB dictionary
    /// trained on 576 pages spread over the dump, as recompression trains its own; `zstd-9+dict`
    /// is what recompression stores idle pages with).
    #[arg(long, value_delimiter = ',', default_value = "lz4,zstd-1,zstd-3")]
    codecs: Vec<String>,
}

/// A codec as the store's backends use it: lz4, or zstd at a level, with or without a
/// dictionary (recompression's codec).
#[derive(Clone, Copy)]
enum Codec {
    Lz4,
    Zstd(i32, bool),
}

impl Codec {
    fn parse(s: &str) -> Option<Codec> {
        if s == "lz4" {
            return Some(Codec::Lz4);
        }
        let rest = s.strip_prefix("zstd-")?;
        let (level, dict) = match rest.strip_suffix("+dict") {
            Some(l) => (l, true),
            None => (rest, false),
        };
        level.parse().ok().filter(|l| (1..=22).contains(l)).map(|l| Codec::Zstd(l, dict))
    }

    fn name(self) -> String {
        match self {
            Codec::Lz4 => "lz4".into(),
            Codec::Zstd(l, false) => format!("zstd-{l}"),
            Codec::Zstd(l, true) => format!("zstd-{l}+dict"),
        }
    }
}

/// Pages recompression samples to train its dictionary, and the dictionary's largest size
/// (the store's defaults: `RecompressConfig::dict_samples`, 16 KiB).
const DICT_SAMPLES: usize = 576;
const DICT_BYTES: usize = 16 << 10;

/// A dictionary trained as recompression trains its own: `DICT_SAMPLES` pages spread evenly
/// over the dense pages, by `compcache_store::recompress::dict::train`.
fn train_dict(dense: &[u8], level: i32) -> Vec<u8> {
    let n = dense.len() / PAGE_SIZE;
    let stride = (n / DICT_SAMPLES).max(1);
    let samples: Vec<u8> = dense.chunks_exact(PAGE_SIZE).step_by(stride).take(DICT_SAMPLES).flatten().copied().collect();
    let trained = dict::train(&samples, DICT_BYTES, level).unwrap_or_else(|e| {
        eprintln!("compcache-unitbench: training a dictionary failed: {e}");
        std::process::exit(1);
    });
    eprintln!("  dictionary: {} bytes, gain on held-out pages {:.1}%", trained.bytes.len(), trained.gain_permille as f64 / 10.0);
    trained.bytes
}

/// A codec's working state (zstd's contexts are made once, as the store's per-worker context).
enum Coder {
    Lz4,
    Zstd(Box<zstd::bulk::Compressor<'static>>, Box<zstd::bulk::Decompressor<'static>>),
}

impl Coder {
    /// `dict`: the dictionary of a `+dict` codec.
    fn new(codec: Codec, dict: &[u8]) -> Coder {
        match codec {
            Codec::Lz4 => Coder::Lz4,
            Codec::Zstd(level, _) => {
                let mut c = zstd::bulk::Compressor::with_dictionary(level, dict).expect("zstd compression context");
                c.set_parameter(CParameter::ChecksumFlag(false)).expect("zstd parameter");
                c.set_parameter(CParameter::ContentSizeFlag(false)).expect("zstd parameter");
                c.set_parameter(CParameter::DictIdFlag(false)).expect("zstd parameter");
                let mut d = zstd::bulk::Decompressor::with_dictionary(dict).expect("zstd decompression context");
                d.set_parameter(DParameter::WindowLogMax(27)).expect("zstd parameter");
                Coder::Zstd(Box::new(c), Box::new(d))
            }
        }
    }

    /// Compresses `src` into `dst` (at least `bound(src.len())` bytes); returns the size.
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> usize {
        match self {
            Coder::Lz4 => lz4::block::compress_to_buffer(src, None, false, dst).expect("lz4 compress"),
            Coder::Zstd(c, _) => c.compress_to_buffer(src, dst).expect("zstd compress"),
        }
    }

    /// Decompresses `src` into all of `dst`, whose length is the unit's original size.
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) {
        let want = dst.len();
        let n = match self {
            Coder::Lz4 => lz4::block::decompress_to_buffer(src, Some(want as i32), dst).expect("lz4 decompress"),
            Coder::Zstd(_, d) => d.decompress_to_buffer(src, dst).expect("zstd decompress"),
        };
        assert_eq!(n, want, "unit decompressed to the wrong size");
    }

    fn bound(&self, len: usize) -> usize {
        match self {
            Coder::Lz4 => lz4::block::compress_bound(len).expect("lz4 bound"),
            Coder::Zstd(..) => zstd::zstd_safe::compress_bound(len),
        }
    }
}

/// One unit: a range of the dense pages (the pages that are not same-filled, in dump order)
/// and where its stored bytes are.
#[derive(Clone, Copy)]
struct Unit {
    first_page: usize,
    pages: usize,
    /// Offset and length of the compressed bytes in `Layout::blob`.
    off: usize,
    len: usize,
    /// Stored raw: the compressed size is more than 3/4 of the unit's.
    raw: bool,
}

/// All units of one (codec, unit size), compressed.
struct Layout {
    units: Vec<Unit>,
    blob: Vec<u8>,
    /// For each dense page, the index of its unit.
    unit_of: Vec<u32>,
}

#[derive(Serialize, Clone)]
struct Row {
    codec: String,
    unit_kib: usize,
    units: usize,
    /// Units of more than one page (the rest are lone pages: same-filled neighbours).
    multi_page_units: usize,
    compr_bytes: u64,
    /// compr_bytes, with the units that compress to more than 3/4 counted at their raw size.
    stored_bytes: u64,
    raw_units: usize,
    ratio: f64,
    ratio_stored: f64,
    compress_s_per_gib: f64,
    random_read_p50_ns: f64,
    random_read_p99_ns: f64,
    random_read_mean_ns: f64,
    sequential_read_ns_per_page: f64,
}

#[derive(Serialize)]
struct Report {
    page_files: Vec<String>,
    pages: usize,
    same_filled_pages: usize,
    runs: usize,
    reads: usize,
    compress_clock: &'static str,
    rows: Vec<Row>,
}

fn main() {
    let args = Args::parse();
    if args.units_kib.is_empty() || args.units_kib.iter().any(|&k| k == 0 || k * 1024 % PAGE_SIZE != 0) {
        eprintln!("compcache-unitbench: --units-kib takes multiples of {} KiB", PAGE_SIZE / 1024);
        std::process::exit(2);
    }
    let codecs: Vec<Codec> = args
        .codecs
        .iter()
        .map(|c| {
            Codec::parse(c).unwrap_or_else(|| {
                eprintln!("compcache-unitbench: --codecs {c}: say lz4, zstd-N or zstd-N+dict (N in 1..=22)");
                std::process::exit(2);
            })
        })
        .collect();
    let files = if args.pages.is_empty() { vec![PathBuf::from("data/pages-mixed.bin")] } else { args.pages.clone() };
    let mut data = Vec::new();
    for f in &files {
        let mut d = std::fs::read(f).unwrap_or_else(|e| {
            eprintln!("compcache-unitbench: cannot read page file {}: {e} (make one with tools/pagedump/ensure-data.sh)", f.display());
            std::process::exit(2);
        });
        d.truncate(d.len() / PAGE_SIZE * PAGE_SIZE);
        data.extend_from_slice(&d);
    }
    let pages = data.len() / PAGE_SIZE;
    // The pages that are not same-filled, in dump order, and each one's index in the dump.
    let mut dense = Vec::with_capacity(data.len());
    let mut dense_index = Vec::new();
    for (i, p) in data.chunks_exact(PAGE_SIZE).enumerate() {
        if !p.chunks_exact(8).all(|w| w == &p[..8]) {
            dense.extend_from_slice(p);
            dense_index.push(i);
        }
    }
    drop(data);
    let dense_pages = dense_index.len();
    if dense_pages == 0 {
        eprintln!("compcache-unitbench: the page files hold no page that is not same-filled");
        std::process::exit(2);
    }
    let clock = if cpu_time().is_some() { "thread CPU time (/proc/thread-self/schedstat)" } else { "wall clock" };
    eprintln!(
        "{pages} pages ({} MiB, {} same-filled) from {} file(s); {} passes per row, {} random reads; compression timed by {clock}",
        (pages * PAGE_SIZE) >> 20,
        pages - dense_pages,
        files.len(),
        args.runs,
        args.reads
    );

    // The same random draws for every row: indices into the dense pages.
    let mut rng = SplitMix64(0x13_u64 << 32 | 0x5eed);
    let draws: Vec<usize> = (0..args.reads).map(|_| (rng.next() % dense_pages as u64) as usize).collect();

    let mut rows = Vec::new();
    for codec in &codecs {
        let codec = *codec;
        let dict = match codec {
            Codec::Zstd(level, true) => train_dict(&dense, level),
            _ => Vec::new(),
        };
        let mut coder = Coder::new(codec, &dict);
        for &kib in &args.units_kib {
            let unit_pages = kib * 1024 / PAGE_SIZE;
            let groups = group_units(&dense_index, unit_pages);
            let (layout, compress_s) = compress_all(&mut coder, &dense, &groups, args.runs);
            check(&mut coder, &dense, &layout, unit_pages);
            let reads = random_reads(&mut coder, &dense, &layout, unit_pages, &draws);
            let seq = sequential_read(&mut coder, &dense, &layout, unit_pages, args.runs);
            let compr_bytes: u64 = layout.units.iter().map(|u| u.len as u64).sum();
            let stored_bytes: u64 = layout.units.iter().map(|u| if u.raw { (u.pages * PAGE_SIZE) as u64 } else { u.len as u64 }).sum();
            let orig = (pages * PAGE_SIZE) as f64;
            let row = Row {
                codec: codec.name(),
                unit_kib: kib,
                units: layout.units.len(),
                multi_page_units: layout.units.iter().filter(|u| u.pages > 1).count(),
                compr_bytes,
                stored_bytes,
                raw_units: layout.units.iter().filter(|u| u.raw).count(),
                ratio: orig / compr_bytes as f64,
                ratio_stored: orig / stored_bytes as f64,
                compress_s_per_gib: compress_s / (dense.len() as f64 / GIB),
                random_read_p50_ns: reads.p50,
                random_read_p99_ns: reads.p99,
                random_read_mean_ns: reads.mean,
                sequential_read_ns_per_page: seq,
            };
            eprintln!(
                "  {} {kib} KiB: ratio {:.3} (stored {:.3}), compress {:.2} s/GiB, read p50 {:.0} ns p99 {:.0} ns, sequential {:.0} ns/page",
                row.codec, row.ratio, row.ratio_stored, row.compress_s_per_gib, row.random_read_p50_ns, row.random_read_p99_ns, seq
            );
            rows.push(row);
        }
    }

    let report = Report {
        page_files: files.iter().map(|f| f.display().to_string()).collect(),
        pages,
        same_filled_pages: pages - dense_pages,
        runs: args.runs,
        reads: args.reads,
        compress_clock: clock,
        rows,
    };
    print_markdown(&report);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).expect("report serializes");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("compcache-unitbench: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}

/// The units as ranges of dense pages: the dense pages whose dump index falls in the same
/// aligned group of `unit_pages` pages form one unit. `dense_index` is increasing, so each
/// unit is a contiguous range of the dense pages.
fn group_units(dense_index: &[usize], unit_pages: usize) -> Vec<(usize, usize)> {
    let mut units: Vec<(usize, usize)> = Vec::new();
    let mut last_group = usize::MAX;
    for (d, &i) in dense_index.iter().enumerate() {
        if i / unit_pages == last_group {
            units.last_mut().expect("a unit is open").1 += 1;
        } else {
            last_group = i / unit_pages;
            units.push((d, 1));
        }
    }
    units
}

/// Compresses every unit: one pass that builds the layout (and warms up), then `runs` timed
/// passes. Returns the layout and the median pass's compression time in seconds.
fn compress_all(coder: &mut Coder, dense: &[u8], groups: &[(usize, usize)], runs: usize) -> (Layout, f64) {
    let max_unit = groups.iter().map(|g| g.1).max().unwrap_or(1) * PAGE_SIZE;
    let mut out = vec![0u8; coder.bound(max_unit)];
    let mut units = Vec::with_capacity(groups.len());
    let mut blob = Vec::new();
    let mut unit_of = vec![0u32; dense.len() / PAGE_SIZE];
    for (u, &(first, n)) in groups.iter().enumerate() {
        let src = &dense[first * PAGE_SIZE..][..n * PAGE_SIZE];
        let len = coder.compress(src, &mut out);
        units.push(Unit { first_page: first, pages: n, off: blob.len(), len, raw: len * 4 > src.len() * 3 });
        blob.extend_from_slice(&out[..len]);
        unit_of[first..first + n].fill(u as u32);
    }
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            timed_cpu(|| {
                for &(first, n) in groups {
                    black_box(coder.compress(&dense[first * PAGE_SIZE..][..n * PAGE_SIZE], &mut out));
                }
            })
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (Layout { units, blob, unit_of }, times[times.len() / 2])
}

/// Decompresses every unit and compares it with the original pages.
fn check(coder: &mut Coder, dense: &[u8], layout: &Layout, unit_pages: usize) {
    let mut buf = vec![0u8; unit_pages * PAGE_SIZE];
    for u in &layout.units {
        let orig = &dense[u.first_page * PAGE_SIZE..][..u.pages * PAGE_SIZE];
        let out = &mut buf[..u.pages * PAGE_SIZE];
        coder.decompress(&layout.blob[u.off..][..u.len], out);
        assert!(out == orig, "unit at dense page {} decompressed wrong", u.first_page);
    }
}

struct ReadTimes {
    p50: f64,
    p99: f64,
    mean: f64,
}

/// Reads the drawn pages one at a time, each timed on its own: a raw unit's page is copied,
/// a compressed unit is decompressed whole and the page copied out of it.
fn random_reads(coder: &mut Coder, dense: &[u8], layout: &Layout, unit_pages: usize, draws: &[usize]) -> ReadTimes {
    let mut buf = vec![0u8; unit_pages * PAGE_SIZE];
    let mut page = vec![0u8; PAGE_SIZE];
    let mut read = |coder: &mut Coder, d: usize| {
        let u = &layout.units[layout.unit_of[d] as usize];
        let at = (d - u.first_page) * PAGE_SIZE;
        if u.raw {
            // a raw unit holds its pages as they are (here: the original pages, the same copy)
            page.copy_from_slice(&dense[d * PAGE_SIZE..][..PAGE_SIZE]);
        } else {
            let out = &mut buf[..u.pages * PAGE_SIZE];
            coder.decompress(&layout.blob[u.off..][..u.len], out);
            page.copy_from_slice(&out[at..][..PAGE_SIZE]);
        }
        black_box(&page);
    };
    for &d in draws.iter().take(1000) {
        read(coder, d); // warm up: caches, page faults, CPU frequency
    }
    let mut ns: Vec<f64> = draws
        .iter()
        .map(|&d| {
            let s = Instant::now();
            read(coder, d);
            s.elapsed().as_nanos() as f64
        })
        .collect();
    ns.sort_by(f64::total_cmp);
    let pct = |p: f64| ns[((ns.len() as f64 * p) as usize).min(ns.len() - 1)];
    ReadTimes { p50: pct(0.5), p99: pct(0.99), mean: ns.iter().sum::<f64>() / ns.len() as f64 }
}

/// Nanoseconds per page to read every page in order, each unit decompressed once (median of
/// `runs` passes, after one to warm up).
fn sequential_read(coder: &mut Coder, dense: &[u8], layout: &Layout, unit_pages: usize, runs: usize) -> f64 {
    let mut buf = vec![0u8; unit_pages * PAGE_SIZE];
    let mut page = vec![0u8; PAGE_SIZE];
    let mut pass = || {
        let s = Instant::now();
        for u in &layout.units {
            if u.raw {
                for p in dense[u.first_page * PAGE_SIZE..][..u.pages * PAGE_SIZE].chunks_exact(PAGE_SIZE) {
                    page.copy_from_slice(p);
                    black_box(&page);
                }
            } else {
                let out = &mut buf[..u.pages * PAGE_SIZE];
                coder.decompress(&layout.blob[u.off..][..u.len], out);
                for p in out.chunks_exact(PAGE_SIZE) {
                    page.copy_from_slice(p);
                    black_box(&page);
                }
            }
        }
        s.elapsed()
    };
    pass();
    let pages = dense.len() / PAGE_SIZE;
    let mut t: Vec<f64> = (0..runs.max(1)).map(|_| pass().as_nanos() as f64 / pages as f64).collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Seconds `f` took: thread CPU time where the kernel reports it, else wall-clock time.
fn timed_cpu(f: impl FnOnce()) -> f64 {
    let c0 = cpu_time();
    let w0 = Instant::now();
    f();
    let wall = w0.elapsed();
    match (c0, cpu_time()) {
        (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64(),
        _ => wall.as_secs_f64(),
    }
}

/// This thread's CPU time so far: the first field of /proc/thread-self/schedstat, in ns. The
/// kernel brings it up to date at each tick and context switch, so it lags by at most a tick:
/// small against the passes timed here (a second or so).
fn cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(Duration::from_nanos(s.split_whitespace().next()?.parse().ok()?))
}

/// Steele, Lea and Flood's SplitMix64: a fixed seed gives the same draws on every run.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn print_markdown(r: &Report) {
    println!(
        "### Multi-page units: {} pages ({} MiB, {} same-filled) of {}",
        r.pages,
        (r.pages * PAGE_SIZE) >> 20,
        r.same_filled_pages,
        r.page_files.join(", ")
    );
    println!();
    println!("compression: {}, median of {} passes; {} random single-page reads per row", r.compress_clock, r.runs, r.reads);
    println!("(xN and memory: against the first unit size's row of the same codec; memory is the stored bytes, units over 3/4 raw)");
    println!();
    println!(
        "| codec | unit KiB | ratio | ratio stored | raw units | memory | compress s/GiB | random read p50 ns | p99 ns | sequential ns/page |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &r.rows {
        let base = r.rows.iter().find(|b| b.codec == row.codec).expect("a row of the codec");
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.1}% | {:.3}x | {:.2} ({:.2}x) | {:.0} ({:.1}x) | {:.0} ({:.1}x) | {:.0} ({:.2}x) |",
            row.codec,
            row.unit_kib,
            row.ratio,
            row.ratio_stored,
            100.0 * row.raw_units as f64 / row.units as f64,
            row.stored_bytes as f64 / base.stored_bytes as f64,
            row.compress_s_per_gib,
            row.compress_s_per_gib / base.compress_s_per_gib,
            row.random_read_p50_ns,
            row.random_read_p50_ns / base.random_read_p50_ns,
            row.random_read_p99_ns,
            row.random_read_p99_ns / base.random_read_p99_ns,
            row.sequential_read_ns_per_page,
            row.sequential_read_ns_per_page / base.sequential_read_ns_per_page,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codecs_parse_and_name_themselves() {
        for name in ["lz4", "zstd-1", "zstd-9+dict", "zstd-22"] {
            assert_eq!(Codec::parse(name).map(Codec::name).as_deref(), Some(name));
        }
        for bad in ["zstd-0", "zstd-23", "zstd", "zstd-x", "lz4+dict", "zstd-9+dic"] {
            assert!(Codec::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_unit_round_trips_with_a_trained_dictionary() {
        // Pages of text records, so that the trainer has something to learn.
        let dense: Vec<u8> = (0..600u32)
            .flat_map(|i| format!("{{\"id\":{i},\"name\":\"user{}\",\"score\":{}}}\n", i % 97, i * 7 % 1000).into_bytes())
            .cycle()
            .take(600 * PAGE_SIZE)
            .collect();
        let dict = train_dict(&dense, 9);
        let mut coder = Coder::new(Codec::Zstd(9, true), &dict);
        let unit = &dense[..4 * PAGE_SIZE];
        let mut out = vec![0u8; coder.bound(unit.len())];
        let n = coder.compress(unit, &mut out);
        let mut back = vec![0u8; unit.len()];
        coder.decompress(&out[..n], &mut back);
        assert!(back == unit);
    }
}
