//! `compcache-sealbench`: what sealing a backing record costs, per record, against what the
//! backing path already pays for the same page, in one run, on real pages.
//!
//! For each page of the page files (same-filled pages left out: they never reach the device)
//! it times, per record of the page's compressed size (the size the backing device stores):
//! - the baselines: the store's compressor (compress, decompress), a buffered `pwrite` of
//!   the record to a file (the cheapest write the backing path makes; the real one adds
//!   `sync_file_range` and the device's writeout), and an O_DIRECT `pread` of the blocks
//!   around the record from that file once written back (the read the backing path makes);
//! - the seals, through the store's own `RecordSeal` (`backing/seal.rs`): crc32c (encryption
//!   off) and AES-256-GCM (on), each sealing and opening in place;
//! - ChaCha20-Poly1305 (ring), for CPUs without AES instructions.
//!
//! Then the same at fixed record sizes (1, 2, 3 and 4 KiB of real compressed bytes). Times are
//! medians of `--runs` passes over all records; the figures compared are ratios within the run.
//!
//! Last, the whole path A/B: a store with a 1 MiB memory limit and a backing file in `--tmp`,
//! so that nearly every page overflows to the file (compress, seal, `pwrite`,
//! `sync_file_range`) and every read comes from it (O_DIRECT `pread`, open, decompress), with
//! encryption off and on, alternating, `--runs` times each.

use clap::Parser;
use compcache_store::backing::seal::{RecordSeal, HEADER};
use compcache_store::{Algorithm, BackingConfig, Config, Store, PAGE_SIZE};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Cost of sealing backing records (crc32c, AES-256-GCM) against compression and a pwrite, on real pages")]
struct Args {
    /// Page files (raw 4 KiB pages, e.g. from tools/pagedump). Default: data/pages-mixed.bin
    pages: Vec<PathBuf>,
    /// Passes per measurement; the median is reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Most pages to use (spread over the files' pages).
    #[arg(long, default_value_t = 32768)]
    max_pages: usize,
    /// Directory for the pwrite baseline's file (removed at the end).
    #[arg(long, default_value = "/var/tmp")]
    tmp: PathBuf,
}

/// Median nanoseconds per item of `runs` passes of `pass`, which handles `items` items.
fn time(runs: usize, items: usize, mut pass: impl FnMut()) -> f64 {
    time_part(runs, items, || {
        let s = Instant::now();
        pass();
        s.elapsed()
    })
}

/// As `time`, for a pass that times the part of itself that counts and returns it.
fn time_part(runs: usize, items: usize, mut pass: impl FnMut() -> Duration) -> f64 {
    pass(); // warm up: caches, page faults, CPU frequency
    let mut t: Vec<f64> = (0..runs).map(|_| pass().as_nanos() as f64 / items as f64).collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

struct Row {
    what: &'static str,
    ns: f64,
}

fn main() {
    let args = Args::parse();
    let files = if args.pages.is_empty() { vec![PathBuf::from("data/pages-mixed.bin")] } else { args.pages.clone() };
    let mut data = Vec::new();
    for f in &files {
        let mut d = std::fs::read(f).unwrap_or_else(|e| {
            eprintln!("compcache-sealbench: cannot read page file {}: {e} (make one with tools/pagedump/ensure-data.sh)", f.display());
            std::process::exit(2);
        });
        d.truncate(d.len() / PAGE_SIZE * PAGE_SIZE);
        data.extend_from_slice(&d);
    }
    let all: Vec<&[u8]> = data.chunks_exact(PAGE_SIZE).filter(|p| !p.chunks_exact(8).all(|w| w == &p[..8])).collect();
    let step = all.len().div_ceil(args.max_pages).max(1);
    let pages: Vec<&[u8]> = all.iter().step_by(step).copied().collect();
    let n = pages.len();
    assert!(n > 0, "no page that is not same-filled");

    // The records as the backing device would hold them: HEADER, then the compressed page, or
    // the raw page where it does not compress (as the store does).
    let backend = Algorithm::Lz4.backend(None);
    let mut comp = backend.new_context();
    let mut cbuf = vec![0u8; 2 * PAGE_SIZE];
    let mut records: Vec<Vec<u8>> = pages
        .iter()
        .map(|p| {
            let payload = match comp.compress(p, &mut cbuf) {
                Some(c) if c < PAGE_SIZE => &cbuf[..c],
                _ => p,
            };
            let mut r = vec![0u8; HEADER];
            r.extend_from_slice(payload);
            r
        })
        .collect();
    let payload_bytes: usize = records.iter().map(|r| r.len() - HEADER).sum();
    let mean = payload_bytes as f64 / n as f64;
    println!(
        "{n} pages (of {} not same-filled in {}), lz4: mean record payload {mean:.0} bytes ({:.2}:1), {} stored raw",
        all.len(),
        files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "),
        PAGE_SIZE as f64 / mean,
        records.iter().filter(|r| r.len() - HEADER == PAGE_SIZE).count()
    );

    let rows = measure(&args, &pages, &mut records, &mut *comp);
    report(&rows, mean);

    let ab = store_ab(&args, &pages);
    println!(
        "\nthe whole store path, {} pages through a 1 MiB memory limit to a backing file in {}:",
        pages.len().min(8192),
        args.tmp.display()
    );
    println!("{:<12} {:>14} {:>14}", "", "ns/page write", "ns/page read");
    println!("{:<12} {:>14.0} {:>14.0}", "plaintext", ab[0][0], ab[0][1]);
    println!("{:<12} {:>14.0} {:>14.0}", "encrypted", ab[1][0], ab[1][1]);
    println!("{:<12} {:>13.1}% {:>13.1}%", "difference", 100.0 * (ab[1][0] / ab[0][0] - 1.0), 100.0 * (ab[1][1] / ab[0][1] - 1.0));

    // Fixed sizes: the first `size` bytes of the concatenated compressed stream, per record.
    let stream: Vec<u8> = records.iter().flat_map(|r| r[HEADER..].iter().copied()).collect();
    println!("\nfixed record sizes (real compressed bytes), ns per record:");
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  {:>10}",
        "bytes", "crc seal", "crc open", "gcm seal", "gcm open", "c20p seal", "c20p open", "gcm GB/s"
    );
    for size in [1024, 2048, 3072, 4096] {
        let count = (stream.len() / size).min(8192);
        let mut recs: Vec<Vec<u8>> = stream
            .chunks_exact(size)
            .take(count)
            .map(|c| {
                let mut r = vec![0u8; HEADER];
                r.extend_from_slice(c);
                r
            })
            .collect();
        let t = seal_times(args.runs, &mut recs);
        println!(
            "{size:>6} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0}  {:>10.2}",
            t[0],
            t[1],
            t[2],
            t[3],
            t[4],
            t[5],
            size as f64 / t[2]
        );
    }
}

/// Writes then reads `pages` through a store whose pages (nearly) all live on a backing file;
/// returns the median ns per page written and per page read, encryption off and on.
fn store_ab(args: &Args, pages: &[&[u8]]) -> [[f64; 2]; 2] {
    let pages = &pages[..pages.len().min(8192)];
    let mut t = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    for round in 0..args.runs + 1 {
        // Alternate which goes first, so that neither always meets a warmer machine.
        for encrypt in if round % 2 == 0 { [false, true] } else { [true, false] } {
            let path = args.tmp.join(format!("compcache-sealbench-store-{}", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let mut b = BackingConfig::new(&path);
            b.promote = false;
            b.encrypt = encrypt;
            let cfg = Config { mem_limit_bytes: 1 << 20, backing: Some(b), ..Config::with_disksize((pages.len() * PAGE_SIZE) as u64) };
            let store = Store::new(cfg).expect("a store with a backing file");
            let mut ctx = store.context();
            let s = Instant::now();
            for (i, p) in pages.iter().enumerate() {
                store.write_page(&mut ctx, i as u64, p).expect("write");
            }
            let w = s.elapsed();
            let mut out = vec![0u8; PAGE_SIZE];
            let s = Instant::now();
            for i in 0..pages.len() {
                store.read_page(&mut ctx, i as u64, &mut out).expect("read");
            }
            let r = s.elapsed();
            assert!(store.stats().bd_count * 10 >= pages.len() as u64 * 9, "nearly every page on the file");
            drop(store);
            let _ = std::fs::remove_file(&path);
            if round > 0 {
                t[encrypt as usize][0].push(w.as_nanos() as f64 / pages.len() as f64);
                t[encrypt as usize][1].push(r.as_nanos() as f64 / pages.len() as f64);
            }
        }
    }
    for (name, wr) in ["plaintext", "encrypted"].iter().zip(&t) {
        let us = |v: &Vec<f64>| v.iter().map(|x| format!("{:.0}", x / 1000.0)).collect::<Vec<_>>().join(" ");
        println!("  {name} runs, us/page: write {}; read {}", us(&wr[0]), us(&wr[1]));
    }
    t.map(|wr| {
        wr.map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
    })
}

/// crc32c seal and open, AES-256-GCM seal and open, ChaCha20-Poly1305 seal and open, in ns per
/// record over `recs` (each HEADER + payload; restored to plaintext between passes).
fn seal_times(runs: usize, recs: &mut [Vec<u8>]) -> [f64; 6] {
    let n = recs.len();
    let mut out = [0.0; 6];
    for (k, encrypt) in [false, true].into_iter().enumerate() {
        let s = RecordSeal::new(encrypt).expect("a run seal");
        // Every pass seals at new places (a nonce never repeats under one key: seal.rs).
        let mut gen = 0u64;
        out[2 * k] = time(runs, n, || {
            gen += 1;
            for (i, r) in recs.iter_mut().enumerate() {
                s.seal(gen, (i * 8192) as u64, i as u64, r);
            }
        });
        // Open what the last pass sealed, then seal it again at new places so that the next
        // pass finds sealed records; only the opens are timed.
        let mut sealed_gen = gen;
        out[2 * k + 1] = time_part(runs, n, || {
            let t = Instant::now();
            for (i, r) in recs.iter_mut().enumerate() {
                s.open(sealed_gen, (i * 8192) as u64, i as u64, r).expect("opens");
            }
            let opened = t.elapsed();
            sealed_gen += 1;
            for (i, r) in recs.iter_mut().enumerate() {
                s.seal(sealed_gen, (i * 8192) as u64, i as u64, r);
            }
            opened
        });
        for (i, r) in recs.iter_mut().enumerate() {
            s.open(sealed_gen, (i * 8192) as u64, i as u64, r).expect("opens");
        }
    }
    let key_bytes: Vec<u8> = (0..32u8).map(|b| b.wrapping_mul(73) ^ 0x5c).collect();
    let key = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key_bytes).expect("key"));
    let nonce = |gen: u64, i: usize| {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&gen.to_le_bytes());
        b[8..].copy_from_slice(&(i as u32).to_le_bytes());
        Nonce::assume_unique_for_key(b)
    };
    let mut gen = 0u64;
    out[4] = time(runs, n, || {
        gen += 1;
        for (i, r) in recs.iter_mut().enumerate() {
            let (head, payload) = r.split_at_mut(HEADER);
            let tag = key.seal_in_place_separate_tag(nonce(gen, i), Aad::from(&(i as u64).to_le_bytes()), payload).expect("seal");
            head.copy_from_slice(tag.as_ref());
        }
    });
    let mut sealed_gen = gen;
    out[5] = time_part(runs, n, || {
        let t = Instant::now();
        for (i, r) in recs.iter_mut().enumerate() {
            let (head, payload) = r.split_at_mut(HEADER);
            let tag = ring::aead::Tag::from(<[u8; HEADER]>::try_from(&*head).expect("16 bytes"));
            key.open_in_place_separate_tag(nonce(sealed_gen, i), Aad::from(&(i as u64).to_le_bytes()), tag, payload, 0..).expect("opens");
        }
        let opened = t.elapsed();
        sealed_gen += 1;
        for (i, r) in recs.iter_mut().enumerate() {
            let (head, payload) = r.split_at_mut(HEADER);
            let tag = key.seal_in_place_separate_tag(nonce(sealed_gen, i), Aad::from(&(i as u64).to_le_bytes()), payload).expect("seal");
            head.copy_from_slice(tag.as_ref());
        }
        opened
    });
    out
}

fn measure(args: &Args, pages: &[&[u8]], records: &mut [Vec<u8>], comp: &mut dyn compcache_store::compress::BackendContext) -> Vec<Row> {
    let n = pages.len();
    let mut cbuf = vec![0u8; 2 * PAGE_SIZE];
    let mut out = vec![0u8; PAGE_SIZE];
    let mut rows = Vec::new();
    rows.push(Row {
        what: "lz4 compress (the page)",
        ns: time(args.runs, n, || {
            for p in pages {
                std::hint::black_box(comp.compress(p, &mut cbuf));
            }
        }),
    });
    rows.push(Row {
        what: "lz4 decompress",
        ns: time(args.runs, n, || {
            for r in records.iter() {
                let payload = &r[HEADER..];
                if payload.len() < PAGE_SIZE {
                    comp.decompress(payload, &mut out).expect("round trip");
                } else {
                    out.copy_from_slice(payload);
                }
                std::hint::black_box(&out);
            }
        }),
    });
    let path = args.tmp.join(format!("compcache-sealbench-{}", std::process::id()));
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).expect("pwrite file");
    // Records packed back to back, as a log head writes them; the file is rewritten in place
    // each pass (page cache pages already there, as on a device in use).
    rows.push(Row {
        what: "pwrite of the record (buffered)",
        ns: time(args.runs, n, || {
            let mut off = 0u64;
            for r in records.iter() {
                file.write_all_at(r, off).expect("pwrite");
                off += r.len() as u64;
            }
        }),
    });
    // The read the backing path makes: O_DIRECT, the aligned blocks around the record, from
    // the file written back first (so from the device, not the page cache).
    let total: u64 = records.iter().map(|r| r.len() as u64).sum();
    file.set_len(total.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64).expect("whole blocks");
    file.sync_all().expect("fsync");
    let direct = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path);
    if let Ok(direct) = direct {
        let mut mem = vec![0u8; 4 * PAGE_SIZE];
        let shift = mem.as_ptr().align_offset(PAGE_SIZE);
        let buf = &mut mem[shift..shift + 3 * PAGE_SIZE];
        let align = PAGE_SIZE as u64;
        rows.push(Row {
            what: "pread O_DIRECT of its blocks",
            ns: time(args.runs, n, || {
                let mut off = 0u64;
                for r in records.iter() {
                    let (start, end) = (off / align * align, (off + r.len() as u64).div_ceil(align) * align);
                    direct.read_exact_at(&mut buf[..(end - start) as usize], start).expect("pread");
                    off += r.len() as u64;
                }
            }),
        });
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    let t = seal_times(args.runs, records);
    for (what, ns) in [
        ("crc32c seal (encryption off)", t[0]),
        ("crc32c open", t[1]),
        ("AES-256-GCM seal (on)", t[2]),
        ("AES-256-GCM open", t[3]),
        ("ChaCha20-Poly1305 seal", t[4]),
        ("ChaCha20-Poly1305 open", t[5]),
    ] {
        rows.push(Row { what, ns });
    }
    rows
}

fn report(rows: &[Row], mean: f64) {
    let get = |w: &str| rows.iter().find(|r| r.what.starts_with(w)).expect("row").ns;
    println!("\n{:<34} {:>10} {:>10}", "per record (real pages)", "ns", "GB/s");
    for r in rows {
        let gbs = if r.what.starts_with("lz4 compress") { PAGE_SIZE as f64 / r.ns } else { mean / r.ns };
        println!("{:<34} {:>10.0} {:>10.2}", r.what, r.ns, gbs);
    }
    let (comp, decomp, pw) = (get("lz4 compress"), get("lz4 decompress"), get("pwrite"));
    let pread = rows.iter().find(|r| r.what.starts_with("pread")).map_or(0.0, |r| r.ns);
    let (crc_s, crc_o, gcm_s, gcm_o) = (get("crc32c seal"), get("crc32c open"), get("AES-256-GCM seal"), get("AES-256-GCM open"));
    println!("\nwhat encryption adds, per record:");
    println!(
        "  write: AES-GCM seal - crc seal = {:.0} ns = {:.1}% of compress + crc + pwrite",
        gcm_s - crc_s,
        100.0 * (gcm_s - crc_s) / (comp + crc_s + pw)
    );
    println!(
        "  read:  AES-GCM open - crc open = {:.0} ns = {:.1}% of O_DIRECT pread + crc open + decompress ({:.1}% without the pread)",
        gcm_o - crc_o,
        100.0 * (gcm_o - crc_o) / (pread + crc_o + decomp),
        100.0 * (gcm_o - crc_o) / (crc_o + decomp)
    );
}
