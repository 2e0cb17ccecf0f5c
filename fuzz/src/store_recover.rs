//! Taking a device over from a damaged state file (`Store::recover`): never a panic or a hang,
//! never a page recovery could have checked returned wrong, and a recovered store that works.
//!
//! The input builds a state, damages it, and has a successor take it over:
//! 1. byte 0 configures a 32-page store: bit 0 zstd instead of lz4, bit 1 recompression (pages
//!    idle for 2 s, dictionaries trained on 9 samples and always installed);
//! 2. operations until an opcode byte of 0xff: WRITE (page, kind, version), DISCARD (page),
//!    compaction, the clock moving on and a recompression run; a byte model records each
//!    page's contents;
//! 3. the store is dropped (its state file kept open), then damage operations, each a region
//!    byte, an offset and bytes, written into the state file with `pwrite`:
//!    - *derived state*, which recovery must recompute and never trust: the lock and mover
//!      bits of slots' meta words, the list and count fields of page descriptors (`inuse`,
//!      `list_prev`, `list_next`), and journal records that are free or not yet filled, or that
//!      name a slot that is not locked;
//!    - *anything* (the header, slot data words, page chains, pool pages, dictionaries), which
//!      only has to give no panic and a store that works afterwards: recovery checks the
//!      structure (header, owners, classes, chains), not the bytes of a page, as the kernel
//!      trusts its own memory.
//! 4. `Store::recover`: an error is fine (one line) for damage of the second kind and never for
//!    the first. After a recovery with derived-state damage only, every page reads exactly as
//!    the model says and none is lost. After any recovery, every page reads as an I/O error or
//!    as some page (never a panic); then every page is written and reads back exactly, and
//!    discarding the whole device gives every pool page back.

use crate::{Bytes, PAGE};
use compcache_store::{Algorithm, Config, RecompressConfig, Store};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

const PAGES: u64 = 32;

fn config(c: u8) -> Config {
    let mut cfg = Config::with_disksize(PAGES * PAGE as u64);
    if c & 1 != 0 {
        cfg.algorithm = Algorithm::Zstd;
        cfg.level = Some(1);
    }
    if c & 2 != 0 {
        cfg.recompress = Some(RecompressConfig { idle_secs: 2, dict_samples: 9, min_dict_gain_permille: 0, ..RecompressConfig::default() });
    }
    cfg
}

/// A page of one of five kinds, naming (page, version) so that a wrong page cannot pass.
fn page(kind: u8, index: u64, version: u8) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    let mut x = (index << 8 | version as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rng = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    match kind % 5 {
        0 => return p,
        1 => p.chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&(index << 8 | version as u64).to_ne_bytes())),
        2 => p.chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&rng().to_ne_bytes())),
        3 => p.iter_mut().enumerate().for_each(|(i, b)| *b = b"swap memory page "[i % 17]),
        _ => p[..PAGE / 2].chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&rng().to_ne_bytes())),
    }
    p[..8].copy_from_slice(&index.to_le_bytes());
    p[8] = version;
    p
}

fn pwrite(fd: &OwnedFd, off: usize, bytes: &[u8]) {
    // SAFETY: a plain pwrite of our own buffer into our own descriptor.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), off as libc::off_t) };
    assert_eq!(n, bytes.len() as isize, "the state file takes writes inside its size");
}

fn pread_u64(fd: &OwnedFd, off: usize) -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: as above, a read into our own buffer.
    let n = unsafe { libc::pread(fd.as_raw_fd(), b.as_mut_ptr().cast(), 8, off as libc::off_t) };
    assert_eq!(n, 8);
    u64::from_ne_bytes(b)
}

pub fn run(data: &[u8]) {
    let mut b = Bytes::new(data);
    let cfg = config(b.u8());
    let store = Store::new(cfg.clone()).expect("a 32-page store");
    let mut ctx = store.context();
    let mut model: Vec<Vec<u8>> = vec![vec![0u8; PAGE]; PAGES as usize];
    for _ in 0..64 {
        match b.u8() {
            0xff => break,
            op if op % 4 <= 1 => {
                let (i, kind, v) = (b.u8() as u64 % PAGES, b.u8(), b.u8());
                let p = page(kind, i, v);
                store.write_page(&mut ctx, i, &p).expect("a store without a limit takes every write");
                model[i as usize] = p;
            }
            2 => {
                let i = b.u8() as u64 % PAGES;
                store.discard_page(i);
                model[i as usize] = vec![0u8; PAGE];
            }
            _ => {
                store.compact();
                store.advance_clock(5);
                store.recompress(Duration::from_millis(20));
            }
        }
    }
    let r = store.state_regions();
    let fd = store.state_fd().expect("a RAM store's state is kept").try_clone_to_owned().unwrap();
    drop((ctx, store));

    let mut anything = false;
    // Slots a damaged journal record names (never locked afterwards).
    let mut named = [false; PAGES as usize];
    for _ in 0..16 {
        let region = b.u8();
        if region == 0xff {
            break;
        }
        let (off, val) = (b.u32() as usize, b.u32());
        match region % 5 {
            // A slot's lock and mover bits (63, 59, 58, 57): derived.
            0 => {
                let s = off % PAGES as usize;
                let at = r.slots + s * 16;
                // Not the lock bit of a slot a damaged record names: that would make the
                // record authoritative (a real one is written only under the lock).
                let bits = if named[s] { val as u64 & 0b0000_1110 } else { val as u64 & 0b1000_1110 };
                let meta = pread_u64(&fd, at) | (bits << 56);
                pwrite(&fd, at, &meta.to_ne_bytes());
            }
            // A descriptor's `inuse`, `list_prev` or `list_next` (not `next`, not `free_head`).
            1 => {
                let desc = off % (r.capacity_pages as usize).min(4096);
                let field = [1usize, 3, 4][(off >> 16) % 3];
                pwrite(&fd, r.descs + desc * 20 + field * 4, &val.to_ne_bytes());
            }
            // A journal record that recovery must ignore: free (slot word 0) or being filled
            // (u64::MAX) with any old words, or naming a slot that is not locked.
            2 => {
                let rec = r.journal + (off % 1024) * 64;
                let slot_word = match val % 3 {
                    0 => 0,
                    1 => u64::MAX,
                    _ => {
                        let s = (val as u64 >> 8) % PAGES;
                        let meta = pread_u64(&fd, r.slots + s as usize * 16);
                        if meta >> 63 == 1 {
                            0 // that slot is locked: a record for it is authoritative
                        } else {
                            named[s as usize] = true;
                            s + 1
                        }
                    }
                };
                pwrite(&fd, rec + 8, &(val as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_ne_bytes());
                pwrite(&fd, rec + 16, &(!(val as u64)).to_ne_bytes());
                pwrite(&fd, rec, &slot_word.to_ne_bytes());
            }
            // Anything at all.
            _ => {
                let at = off % r.len;
                let n = (val as usize % 8 + 1).min(r.len - at);
                pwrite(&fd, at, &val.to_ne_bytes().repeat(2)[..n]);
                anything = true;
            }
        }
    }

    let (store, report) = match Store::recover(cfg, fd) {
        Ok(x) => x,
        Err(e) if anything => {
            assert!(!e.to_string().contains('\n'), "one line: {e}");
            return;
        }
        Err(e) => panic!("derived-state damage only, and recovery refused: {e}"),
    };
    let mut ctx = store.context();
    let mut out = vec![0u8; PAGE];
    for i in 0..PAGES {
        let got = store.read_page(&mut ctx, i, &mut out);
        if !anything {
            assert!(got.is_ok() && out == model[i as usize], "page {i} after derived-state damage only ({report})");
        }
    }
    if !anything {
        assert_eq!(report.lost_pages, 0, "{report}");
    }
    for i in 0..PAGES {
        store.write_page(&mut ctx, i, &page(3, i, 200)).expect("a recovered store takes writes");
    }
    for i in 0..PAGES {
        store.read_page(&mut ctx, i, &mut out).expect("and reads them back");
        assert!(out == page(3, i, 200), "page {i} after rewriting the recovered store");
    }
    store.discard(0, PAGES * PAGE as u64).unwrap();
    let s = store.stats();
    assert_eq!(
        (s.mem_used_total - s.bd_mem_bytes, s.compr_data_size),
        (0, 0),
        "every pool page given back after discarding everything ({report})"
    );
}
