//! `compcache-cachebench`: the store in cache mode (`docs/cache.md`) on real data, counting
//! what it saves and what it costs; policies compared on the same accesses in one run.
//!
//! The origin is an image built from real data: files of the system (`/usr/share/doc`,
//! `/usr/lib`: text, binaries and already compressed files, an equal share of each, every file
//! from a page boundary as a file system lays them out) followed by page dumps of real processes (tools/pagedump). It is
//! written to a file in `--dir` (tmpfs by default: what is measured is counted, not timed) and
//! opened by the store as any origin is (`FileOrigin`).
//!
//! Two measurements:
//!
//! - `incompressible`: should pages that do not compress (the store's `huge_pages`, kept raw
//!   at one pool page each) be cached? A working set of pages drawn at random from the whole
//!   image is read one page at a time, with Zipf-distributed popularity, under a budget
//!   smaller than the working set. Policy `raw` is the store as it is (every page read is
//!   cached); policy `skip` never caches an incompressible page: its reads go to the origin
//!   (the harness sends them there and never to the store, so the cache never sees them, which
//!   is what a store that declined them would do; readahead is off, so no other read differs).
//!   Both policies see the same accesses in the same order. Reported per budget: hit ratio
//!   (reads served from RAM / all reads), origin reads avoided per MiB of budget, and the cache's
//!   memory per cached byte at the end (`mem_used_total / orig_data_size`).
//! - `fill`: memory per cached byte on file data alone. The files part of the image is read
//!   once in order (a `cp`), then the same part's pages at random (re-reads), under a budget of
//!   a quarter of it: the cache fills to its budget and evicts. Once with compaction left to
//!   the insert path (which compacts only when an eviction batch did not lower the pool's
//!   pages), once with the maintenance step (`Store::maintain`, which compacts) every
//!   `--maintain-every` reads, as a server's maintenance timer runs it. Reported:
//!   `mem_used_total / orig_data_size`, the compressed ratio `compr_data_size /
//!   orig_data_size`, pages compacted, inserts skipped for lack of room, and the highest
//!   `mem_used_total` seen against the budget.
//!
//! Every read is compared with the image: a wrong byte stops the run.

use clap::Parser;
use compcache_store::{Algorithm, Config, OriginConfig, Stats, Store, PAGE_SIZE};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

const P: u64 = PAGE_SIZE as u64;
const MIB: u64 = 1 << 20;

#[derive(Parser)]
#[command(about = "Cache mode on real data: caching incompressible pages or not, and memory per cached byte")]
struct Args {
    /// Page dumps to put after the files in the origin (raw 4 KiB pages, tools/pagedump).
    #[arg(long, num_args = 1.., default_value = "data/pages-mixed.bin")]
    pages: Vec<PathBuf>,
    /// Directories whose regular files make the file data of the origin, in this order.
    #[arg(long, num_args = 1.., default_values = ["/usr/share/doc", "/usr/lib"])]
    files: Vec<PathBuf>,
    /// MiB of file data (from --files, an equal share from each).
    #[arg(long, default_value_t = 128)]
    file_mib: u64,
    /// MiB of page dumps (from --pages).
    #[arg(long, default_value_t = 64)]
    dump_mib: u64,
    /// MiB of the working set read by the `incompressible` measurement.
    #[arg(long, default_value_t = 96)]
    working_set_mib: u64,
    /// Reads of the `incompressible` measurement, as a multiple of the working set's pages.
    #[arg(long, default_value_t = 4)]
    rounds: u64,
    /// Zipf exponent of the working set's popularity (0: uniform).
    #[arg(long, default_value_t = 0.9)]
    zipf: f64,
    /// Compression algorithm of the cache.
    #[arg(long, default_value = "lz4")]
    algorithm: Algorithm,
    /// Memory budgets (MiB) of the `incompressible` measurement.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32")]
    budgets_mib: Vec<u64>,
    /// Reads between two maintenance steps in the `fill` measurement's second run.
    #[arg(long, default_value_t = 4096)]
    maintain_every: u64,
    /// Directory for the origin image (removed at the end).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Seed of the random accesses.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// xorshift64*: the accesses, the same for every policy.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Appends the regular files under `dir` (sorted, not following symbolic links), each from a
/// page boundary, until `image` holds `limit` bytes.
fn add_files(dir: &Path, image: &mut Vec<u8>, limit: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if image.len() >= limit {
            return;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_dir() {
            add_files(&path, image, limit);
        } else if meta.is_file() && meta.len() > 0 {
            let Ok(data) = std::fs::read(&path) else { continue };
            let take = data.len().min(limit - image.len());
            image.extend_from_slice(&data[..take]);
            image.resize(image.len().div_ceil(PAGE_SIZE) * PAGE_SIZE, 0);
        }
    }
}

/// Which pages of `image` the store keeps raw (`huge_pages`): written one by one into a
/// one-page RAM store, the store's own classification.
fn incompressible(image: &[u8], algorithm: Algorithm) -> Vec<bool> {
    let store = Store::new(Config { algorithm, ..Config::with_disksize(P) }).expect("a one-page RAM store");
    let mut ctx = store.context();
    image
        .chunks_exact(PAGE_SIZE)
        .map(|page| {
            let before = store.stats().huge_pages_since;
            store.write_page(&mut ctx, 0, page).expect("writing a page into a RAM store");
            store.stats().huge_pages_since > before
        })
        .collect()
}

fn cache_store(path: &Path, size: u64, budget: u64, algorithm: Algorithm) -> Store {
    let mut o = OriginConfig::new(path);
    // Off: every read is one page, so the `skip` policy's reads differ from `raw`'s in
    // nothing but the incompressible pages.
    o.readahead_max_bytes = 0;
    let cfg = Config { mem_limit_bytes: budget, origin: Some(o), algorithm, ..Config::with_disksize(size) };
    Store::new(cfg).unwrap_or_else(|e| {
        eprintln!("compcache-cachebench: {e}");
        std::process::exit(1)
    })
}

fn read_checked(store: &Store, ctx: &mut compcache_store::Context, image: &[u8], index: u64, buf: &mut [u8]) {
    store.read(ctx, index * P, buf).unwrap_or_else(|e| panic!("reading page {index}: {e}"));
    assert!(buf[..] == image[(index * P) as usize..][..PAGE_SIZE], "page {index} read back wrong");
}

#[derive(Serialize)]
struct PolicyRow {
    budget_mib: u64,
    policy: &'static str,
    reads: u64,
    hits: u64,
    origin_reads: u64,
    hit_ratio: f64,
    origin_reads_avoided_per_budget_mib: f64,
    mem_used_total: u64,
    orig_data_size: u64,
    compr_data_size: u64,
    mem_per_cached_byte: f64,
    huge_pages_cached: u64,
    evictions: u64,
}

#[derive(Serialize)]
struct FillRow {
    run: &'static str,
    budget_mib: u64,
    reads: u64,
    hit_ratio: f64,
    mem_used_total: u64,
    mem_used_max_seen: u64,
    orig_data_size: u64,
    compr_data_size: u64,
    mem_per_cached_byte: f64,
    compr_per_cached_byte: f64,
    pages_compacted: u64,
    inserts_skipped: u64,
    evictions: u64,
    mem_per_cached_byte_after_full_compaction: f64,
}

#[derive(Serialize)]
struct Report {
    algorithm: String,
    image_mib: f64,
    file_pages: u64,
    dump_pages: u64,
    incompressible_file_pages: u64,
    incompressible_dump_pages: u64,
    working_set_pages: u64,
    working_set_incompressible_pages: u64,
    zipf: f64,
    incompressible: Vec<PolicyRow>,
    fill: Vec<FillRow>,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn main() {
    let args = Args::parse();
    let mut image = Vec::new();
    // An equal share of the file data from each directory (what is left of one's share goes
    // to the next).
    for (k, d) in args.files.iter().enumerate() {
        let share = (args.file_mib * MIB) as usize * (k + 1) / args.files.len();
        add_files(d, &mut image, share);
    }
    let file_pages = (image.len() / PAGE_SIZE) as u64;
    let dump_limit = image.len() + (args.dump_mib * MIB) as usize;
    for f in &args.pages {
        let d = std::fs::read(f).unwrap_or_else(|e| {
            eprintln!("compcache-cachebench: cannot read page file {}: {e} (make one with tools/pagedump/pagedump.py --all)", f.display());
            std::process::exit(2)
        });
        let take = (d.len() / PAGE_SIZE * PAGE_SIZE).min(dump_limit.saturating_sub(image.len()));
        image.extend_from_slice(&d[..take]);
    }
    let pages = (image.len() / PAGE_SIZE) as u64;
    let dump_pages = pages - file_pages;
    if file_pages == 0 || pages < 64 {
        eprintln!(
            "compcache-cachebench: the origin would hold {file_pages} pages of files and {dump_pages} of dumps: give --files and --pages"
        );
        std::process::exit(2);
    }
    let huge = incompressible(&image, args.algorithm);
    let huge_files = huge[..file_pages as usize].iter().filter(|&&h| h).count() as u64;
    let huge_dumps = huge[file_pages as usize..].iter().filter(|&&h| h).count() as u64;
    let path = args.dir.join(format!("compcache-cachebench-{}.img", std::process::id()));
    std::fs::write(&path, &image).unwrap_or_else(|e| {
        eprintln!("compcache-cachebench: cannot write the origin image {}: {e}", path.display());
        std::process::exit(2)
    });
    struct Remove<'a>(&'a Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _remove = Remove(&path);
    eprintln!(
        "origin {}: {file_pages} pages of files ({huge_files} incompressible) + {dump_pages} pages of dumps ({huge_dumps} incompressible)",
        path.display()
    );

    // --- incompressible: raw or skip ---------------------------------------------------------
    let mut rng = Rng(args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let ws = (args.working_set_mib * MIB / P).min(pages);
    // The working set: `ws` distinct pages of the image at random, rank 0 the most popular.
    let mut all: Vec<u64> = (0..pages).collect();
    for i in 0..ws as usize {
        let j = i + rng.below(pages - i as u64) as usize;
        all.swap(i, j);
    }
    let set = &all[..ws as usize];
    let ws_huge = set.iter().filter(|&&i| huge[i as usize]).count() as u64;
    let mut cdf = Vec::with_capacity(ws as usize);
    let mut sum = 0.0;
    for r in 0..ws {
        sum += 1.0 / ((r + 1) as f64).powf(args.zipf);
        cdf.push(sum);
    }
    let reads = ws * args.rounds;
    let accesses: Vec<u64> = (0..reads)
        .map(|_| {
            let u = rng.unit() * sum;
            set[cdf.partition_point(|&c| c < u).min(ws as usize - 1)]
        })
        .collect();
    eprintln!("working set {ws} pages ({ws_huge} incompressible), {reads} reads, Zipf {}", args.zipf);
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut rows = Vec::new();
    for &budget_mib in &args.budgets_mib {
        for policy in ["raw", "skip"] {
            let store = cache_store(&path, pages * P, budget_mib * MIB, args.algorithm);
            let mut ctx = store.context();
            let mut bypassed = 0;
            for &i in &accesses {
                if policy == "skip" && huge[i as usize] {
                    bypassed += 1;
                    continue;
                }
                read_checked(&store, &mut ctx, &image, i, &mut buf);
            }
            let s = store.stats();
            let row = PolicyRow {
                budget_mib,
                policy,
                reads,
                hits: s.cache_hits,
                origin_reads: s.cache_misses + bypassed,
                hit_ratio: ratio(s.cache_hits, reads),
                origin_reads_avoided_per_budget_mib: s.cache_hits as f64 / budget_mib as f64,
                mem_used_total: s.mem_used_total,
                orig_data_size: s.orig_data_size,
                compr_data_size: s.compr_data_size,
                mem_per_cached_byte: ratio(s.mem_used_total, s.orig_data_size),
                huge_pages_cached: s.huge_pages,
                evictions: s.cache_evictions,
            };
            eprintln!(
                "  budget {budget_mib:>3} MiB {policy:>4}: hit ratio {:.3}, {:.0} origin reads avoided per MiB, mem/cached {:.3}, {} huge pages cached",
                row.hit_ratio, row.origin_reads_avoided_per_budget_mib, row.mem_per_cached_byte, row.huge_pages_cached
            );
            rows.push(row);
        }
    }

    // --- fill: memory per cached byte on file data -------------------------------------------
    let budget = (file_pages * P / 4).max(MIB) / MIB * MIB;
    let mut order: Vec<u64> = (0..file_pages).collect();
    let mut random: Vec<u64> = (0..file_pages).map(|_| rng.below(file_pages)).collect();
    order.append(&mut random);
    let mut fill = Vec::new();
    for (run, every) in [("no maintenance", 0), ("maintenance", args.maintain_every)] {
        let store = cache_store(&path, pages * P, budget, args.algorithm);
        let mut ctx = store.context();
        let mut max_seen = 0;
        for (n, &i) in order.iter().enumerate() {
            read_checked(&store, &mut ctx, &image, i, &mut buf);
            if every > 0 && (n as u64 + 1) % every == 0 {
                store.maintain(Duration::ZERO);
            }
            if n % 256 == 0 {
                max_seen = max_seen.max(store.stats().mem_used_total);
            }
        }
        let s: Stats = store.stats();
        max_seen = max_seen.max(s.mem_used_total);
        store.compact();
        let c = store.stats();
        let row = FillRow {
            run,
            budget_mib: budget / MIB,
            reads: order.len() as u64,
            hit_ratio: ratio(s.cache_hits, s.cache_hits + s.cache_misses),
            mem_used_total: s.mem_used_total,
            mem_used_max_seen: max_seen,
            orig_data_size: s.orig_data_size,
            compr_data_size: s.compr_data_size,
            mem_per_cached_byte: ratio(s.mem_used_total, s.orig_data_size),
            compr_per_cached_byte: ratio(s.compr_data_size, s.orig_data_size),
            pages_compacted: s.pages_compacted,
            inserts_skipped: s.cache_misses.saturating_sub(s.cache_inserts),
            evictions: s.cache_evictions,
            mem_per_cached_byte_after_full_compaction: ratio(c.mem_used_total, c.orig_data_size),
        };
        eprintln!(
            "  fill, {run}: budget {} MiB, mem {} (max seen {}), cached {}, mem/cached {:.3} (compressed {:.3}; {:.3} after a full compaction), {} pages compacted, {} inserts skipped, {} evictions",
            row.budget_mib,
            row.mem_used_total,
            row.mem_used_max_seen,
            row.orig_data_size,
            row.mem_per_cached_byte,
            row.compr_per_cached_byte,
            row.mem_per_cached_byte_after_full_compaction,
            row.pages_compacted,
            row.inserts_skipped,
            row.evictions
        );
        fill.push(row);
    }

    let report = Report {
        algorithm: args.algorithm.name().to_string(),
        image_mib: image.len() as f64 / MIB as f64,
        file_pages,
        dump_pages,
        incompressible_file_pages: huge_files,
        incompressible_dump_pages: huge_dumps,
        working_set_pages: ws,
        working_set_incompressible_pages: ws_huge,
        zipf: args.zipf,
        incompressible: rows,
        fill,
    };
    let json = serde_json::to_string_pretty(&report).expect("the report serialises");
    println!("{json}");
    if let Some(p) = &args.json {
        std::fs::write(p, &json).unwrap_or_else(|e| eprintln!("compcache-cachebench: cannot write {}: {e}", p.display()));
    }
}
