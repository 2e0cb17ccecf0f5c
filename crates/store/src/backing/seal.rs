//! Sealing and opening backing records: what makes a record on the device readable by the run
//! that wrote it, at the place and for the slot it was written for, and by nothing else.
//!
//! # Two seals
//! - **AES-256-GCM** (the default, `BackingConfig::encrypt`): the payload is encrypted under a
//!   random 256-bit key drawn from the kernel (`getrandom`) when the device opens and kept only
//!   in the server's memory ([`KeyPage`]). The header is the 16-byte tag. Whoever reads the
//!   device (another user through a mistaken mode, root reading the raw disk later, a stolen
//!   disk, the file left behind by a SIGKILLed server) sees ciphertext that no one can decrypt
//!   once the process is gone.
//! - **crc32c** (`encrypt: false`): the payload is stored as it is; the header is a crc32c of
//!   the run's random 64-bit identifier, the generation, location, slot index, length and
//!   payload, then 12 zero bytes. The device is then only as private as its mode.
//!
//! Both bind a record to its run, place, segment generation, owner slot and length: a record
//! read for the wrong slot, from the wrong place, from an earlier life of its segment, written
//! by another run or server, from a hole, a truncated or a corrupted file is an error, never
//! data (the tag forges with probability 2^-128 per read; the crc collides with 2^-32).
//!
//! # Record layout (`HEADER` bytes, then the payload's length in bytes)
//! ```text
//! AES-256-GCM: tag (16 bytes) | ciphertext (len bytes)
//!   nonce (96 bits) = generation u64 LE | loc as u32 LE
//!   associated data = loc u64 LE | slot index u64 LE | len u16 LE
//! crc32c:      crc (4 bytes LE) | 0 (12 bytes) | payload (len bytes)
//!   crc = crc32c(run u64 | generation u64 | loc u64 | slot index u64 | len u16, all LE)
//!         extended over the payload
//! ```
//!
//! # Why a nonce never repeats under one key
//! GCM must never seal two messages with one (key, nonce): that would reveal the XOR of the
//! two plaintexts and let an attacker forge tags. The key lives for one run (one opening of
//! the device), and within a run:
//! 1. every opening of a segment (FREE -> OPEN) takes the next value of one 64-bit counter as
//!    the segment's generation (`SpaceMap::open_segment`): no two lives of any segments share
//!    a generation, and the counter cannot wrap (2^64 openings at one per microsecond take
//!    half a million years);
//! 2. during one life, a log head reserves each record's bytes once, appending (`LogHead::
//!    reserve`): two records of one generation have different `loc`s inside one segment, so
//!    different `loc as u32`s, since a segment is at most 4 GiB (`BackingConfig::validate`);
//! 3. a reserved record is sealed once and written once; a write that fails is not retried at
//!    its place (its bytes are freed and the page goes elsewhere, with a new reservation).
//!
//! So (generation, `loc as u32`) names one seal of the run. A new run draws a new key.
//!
//! A run can outlive its process (a successor takes the device over: `keep.rs`): the key is
//! then kept in the state file, and so are the counter and each segment's generation, a
//! generation stored there before any record is sealed with it. The successor goes on from
//! the counter and never appends to a segment the dead process had open (it is full from
//! then on), so 1-3 hold across processes too.

use std::io;
use std::ptr::NonNull;

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, NONCE_LEN};

/// Bytes before each record's payload: the AES-GCM tag, or the crc and padding.
pub const HEADER: usize = 16;

/// How this run seals its records: its secrets, drawn when the device opens and never
/// written to disk (kept in the state file, memory, when the run can be taken over).
pub struct RecordSeal {
    kind: Kind,
}

enum Kind {
    Aead(KeyPage),
    Checksum { run: u64 },
}

/// A run's secret as the state file keeps it (`keep.rs`), so that a successor that takes the
/// device over opens the records of the run it continues: the key's 32 bytes, or the run
/// identifier. The state file is as private as the pool's pages, which are in it too.
pub(crate) enum Secret {
    Key([u8; 32]),
    Run(u64),
}

impl RecordSeal {
    /// A new run's seal: a fresh AES-256-GCM key with `encrypt`, a fresh run identifier
    /// without. Fails only if the kernel's random generator does.
    pub fn new(encrypt: bool) -> io::Result<RecordSeal> {
        RecordSeal::drawn(encrypt, &mut |_| ())
    }

    /// As [`RecordSeal::new`], and gives the secret to `keep` (the state file's tier region)
    /// before this copy of it is wiped.
    pub(crate) fn drawn(encrypt: bool, keep: &mut dyn FnMut(&Secret)) -> io::Result<RecordSeal> {
        let kind = if encrypt {
            Kind::Aead(KeyPage::new(getrandom, &mut |raw| {
                let mut s = Secret::Key(*raw);
                keep(&s);
                if let Secret::Key(k) = &mut s {
                    wipe(k.as_mut_ptr(), k.len());
                }
            })?)
        } else {
            let mut run = [0u8; 8];
            getrandom(&mut run)?;
            let run = u64::from_le_bytes(run);
            keep(&Secret::Run(run));
            Kind::Checksum { run }
        };
        Ok(RecordSeal { kind })
    }

    /// The seal of a run taken over (`keep.rs`): the secret its state file kept.
    pub(crate) fn from_secret(secret: &Secret) -> io::Result<RecordSeal> {
        let kind = match secret {
            Secret::Key(key) => Kind::Aead(KeyPage::new(
                |raw| {
                    raw.copy_from_slice(key);
                    Ok(())
                },
                &mut |_| (),
            )?),
            Secret::Run(run) => Kind::Checksum { run: *run },
        };
        Ok(RecordSeal { kind })
    }

    /// Whether records are encrypted.
    pub fn encrypts(&self) -> bool {
        matches!(self.kind, Kind::Aead(_))
    }

    /// Seals `rec` (`HEADER` bytes, then the payload) in place, for the record of slot `index`
    /// at `loc` in a segment of generation `gen`. Each (`gen`, `loc`) is sealed at most once
    /// per run (module docs).
    pub fn seal(&self, gen: u64, loc: u64, index: u64, rec: &mut [u8]) {
        let (head, payload) = rec.split_at_mut(HEADER);
        match &self.kind {
            Kind::Aead(key) => {
                let tag = key
                    .key()
                    .seal_in_place_separate_tag(nonce(gen, loc), Aad::from(aad(loc, index, payload.len())), payload)
                    .expect("a record (at most a page) is far below AES-GCM's message limit");
                head.copy_from_slice(tag.as_ref());
            }
            Kind::Checksum { run } => {
                head.fill(0);
                head[..4].copy_from_slice(&record_crc(*run, gen, loc, index, payload).to_le_bytes());
            }
        }
    }

    /// Checks `rec` read from `loc` for slot `index` (its segment of generation `gen`) and, if
    /// it is this run's record for them, leaves the plaintext payload in `rec[HEADER..]`. On
    /// an error `rec[HEADER..]` holds no usable data.
    pub fn open(&self, gen: u64, loc: u64, index: u64, rec: &mut [u8]) -> Result<(), String> {
        let (head, payload) = rec.split_at_mut(HEADER);
        match &self.kind {
            Kind::Aead(key) => {
                let tag = Tag::from(<[u8; HEADER]>::try_from(&*head).expect("a 16-byte header"));
                let aad = Aad::from(aad(loc, index, payload.len()));
                match key.key().open_in_place_separate_tag(nonce(gen, loc), aad, tag, payload, 0..) {
                    Ok(_) => Ok(()),
                    Err(_) => Err(format!(
                        "backing record at byte {loc} fails its authentication (AES-256-GCM tag): corrupt, stale or written by another run"
                    )),
                }
            }
            Kind::Checksum { run } => {
                let stored = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
                let want = record_crc(*run, gen, loc, index, payload);
                // The padding is checked too: any flipped bit of a record is an error.
                if stored == want && head[4..].iter().all(|&b| b == 0) {
                    Ok(())
                } else {
                    Err(format!("backing record at byte {loc} fails its checksum (stored {stored:#010x}, computed {want:#010x}, or its padding is not zero)"))
                }
            }
        }
    }
}

/// The nonce of the record at `loc` in generation `gen` (module docs: unique per run).
fn nonce(gen: u64, loc: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[..8].copy_from_slice(&gen.to_le_bytes());
    n[8..].copy_from_slice(&(loc as u32).to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

/// What the tag covers besides the payload: the whole location, the owner and the length.
fn aad(loc: u64, index: u64, len: usize) -> [u8; 18] {
    let mut a = [0u8; 18];
    a[..8].copy_from_slice(&loc.to_le_bytes());
    a[8..16].copy_from_slice(&index.to_le_bytes());
    a[16..].copy_from_slice(&(len as u16).to_le_bytes());
    a
}

/// The checksum of an unencrypted record (layout in the module docs).
fn record_crc(run: u64, gen: u64, loc: u64, index: u64, payload: &[u8]) -> u32 {
    let mut h = [0u8; 34];
    h[..8].copy_from_slice(&run.to_le_bytes());
    h[8..16].copy_from_slice(&gen.to_le_bytes());
    h[16..24].copy_from_slice(&loc.to_le_bytes());
    h[24..32].copy_from_slice(&index.to_le_bytes());
    h[32..].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&h), payload)
}

/// Fills `buf` from the kernel's random generator (`getrandom`, which blocks only until the
/// pool is initialised at boot).
fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: getrandom writes at most `buf.len() - got` bytes into `buf[got..]`, which is
        // ours and that long.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(())
}

/// The run's AES-256-GCM key (ring's `LessSafeKey`, the expanded key schedule), alone in an
/// anonymous page of its own that is
/// - locked (`mlock`): never written to swap, whether or not the server runs under
///   `mlockall` (the swap servers do; `compcache serve` does only with `--mlock`);
/// - left out of core dumps (`MADV_DONTDUMP`) and zero in a forked child (`MADV_WIPEONFORK`,
///   until the child's `exec`);
/// - zeroed before it is unmapped, on drop.
///
/// The 32 random key bytes are drawn into the same page and zeroed once the key is expanded.
/// What this cannot promise: building the key passes ring's structures by value, which may
/// leave copies in stack frames that later calls overwrite (locked memory in the swap
/// servers). Root on the running machine can read the process's memory anyway.
struct KeyPage {
    /// Start of the mapping: a `LessSafeKey` at offset 0, initialised from `new` to `drop`.
    page: NonNull<u8>,
}

const KEY_PAGE_BYTES: usize = 4096;
/// Where the raw key bytes are drawn, after the `LessSafeKey`.
const RAW_KEY_OFFSET: usize = KEY_PAGE_BYTES - 32;
const _: () = assert!(
    std::mem::size_of::<LessSafeKey>() <= RAW_KEY_OFFSET && std::mem::align_of::<LessSafeKey>() <= KEY_PAGE_BYTES,
    "the expanded key and the raw key share one page without overlapping"
);

// SAFETY: a `KeyPage` owns its mapping alone (nothing else has its address) and gives out only
// `&LessSafeKey`, which is Send and Sync (asserted below): sending or sharing the page is
// sending or sharing that key.
unsafe impl Send for KeyPage {}
// SAFETY: as above.
unsafe impl Sync for KeyPage {}
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<LessSafeKey>();
};

impl KeyPage {
    /// A key page whose 32 key bytes `fill` writes (drawn, or a kept key copied in); `keep`
    /// sees them once before they are wiped.
    fn new(fill: impl FnOnce(&mut [u8]) -> io::Result<()>, keep: &mut dyn FnMut(&[u8; 32])) -> io::Result<KeyPage> {
        // SAFETY: an anonymous private mapping at an address the kernel chooses; no memory of
        // ours is touched. The result is checked for MAP_FAILED below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                KEY_PAGE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let page = NonNull::new(p.cast::<u8>()).expect("mmap never returns null for a kernel-chosen address");
        // SAFETY: `p` is our new mapping of KEY_PAGE_BYTES; these calls change only how the
        // kernel treats it. Their failures are handled (mlock) or harmless (the madvises:
        // older kernels).
        let locked = unsafe {
            libc::madvise(p, KEY_PAGE_BYTES, libc::MADV_DONTDUMP);
            libc::madvise(p, KEY_PAGE_BYTES, libc::MADV_WIPEONFORK);
            libc::mlock(p, KEY_PAGE_BYTES)
        };
        if locked != 0 {
            compcache_log::warning(
                "compcache",
                &format!(
                    "cannot lock the backing device's key in memory (mlock: {}): it could be written to swap",
                    io::Error::last_os_error()
                ),
            );
        }
        // SAFETY: the last 32 bytes of our mapping, writable, not aliased; the mapping is
        // zero-filled, so they are initialised.
        let raw = unsafe { std::slice::from_raw_parts_mut(page.as_ptr().add(RAW_KEY_OFFSET), 32) };
        let key = fill(raw).and_then(|()| {
            keep(<&[u8; 32]>::try_from(&*raw).expect("32 bytes"));
            UnboundKey::new(&AES_256_GCM, raw).map_err(|_| io::Error::other("AES-256-GCM refused a 32-byte key"))
        });
        wipe(page.as_ptr().wrapping_add(RAW_KEY_OFFSET), 32);
        let key = match key {
            Ok(k) => LessSafeKey::new(k),
            Err(e) => {
                // SAFETY: our mapping, holding no object; unmapped once.
                unsafe { libc::munmap(p, KEY_PAGE_BYTES) };
                return Err(e);
            }
        };
        // SAFETY: offset 0 of our mapping is page-aligned (enough for `LessSafeKey`, asserted
        // above), writable, large enough, and holds no object yet.
        unsafe { page.as_ptr().cast::<LessSafeKey>().write(key) };
        Ok(KeyPage { page })
    }

    fn key(&self) -> &LessSafeKey {
        // SAFETY: `new` wrote a `LessSafeKey` at offset 0, which lives until `drop`; only
        // shared references to it are ever made.
        unsafe { &*self.page.as_ptr().cast::<LessSafeKey>() }
    }
}

impl Drop for KeyPage {
    fn drop(&mut self) {
        let p = self.page.as_ptr();
        // SAFETY: the key at offset 0 is initialised (`new`) and no reference to it outlives
        // `&self`; it is dropped once, here, and its bytes are wiped and unmapped after.
        unsafe { std::ptr::drop_in_place(p.cast::<LessSafeKey>()) };
        wipe(p, KEY_PAGE_BYTES);
        // SAFETY: our mapping, unmapped once; nothing refers to it any more.
        unsafe { libc::munmap(p.cast(), KEY_PAGE_BYTES) };
    }
}

/// Zeroes `len` bytes at `p` with volatile writes, which the compiler may not drop as dead
/// stores before the memory is unmapped. `p..p + len` must be writable and hold no object but
/// bytes (the raw key, the page after its key was dropped).
fn wipe(p: *mut u8, len: usize) {
    for i in 0..len {
        // SAFETY: callers pass writable memory of `len` bytes holding no object but bytes.
        unsafe { std::ptr::write_volatile(p.add(i), 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seal: &RecordSeal, gen: u64, loc: u64, index: u64, payload: &[u8]) -> Vec<u8> {
        let mut rec = vec![0u8; HEADER];
        rec.extend_from_slice(payload);
        seal.seal(gen, loc, index, &mut rec);
        rec
    }

    /// One body over both seals (foyer's habit): what either must refuse.
    fn binds_place_owner_generation_and_bytes(encrypt: bool) {
        let s = RecordSeal::new(encrypt).unwrap();
        assert_eq!(s.encrypts(), encrypt);
        let payload = b"a compressed page, or a raw one".repeat(40);
        let rec = record(&s, 7, 4096 + 17, 3, &payload);
        let open = |gen, loc, index, rec: &[u8]| {
            let mut r = rec.to_vec();
            s.open(gen, loc, index, &mut r).map(|()| r[HEADER..].to_vec())
        };
        assert_eq!(open(7, 4113, 3, &rec).unwrap(), payload, "read back after being sealed");
        assert_eq!(encrypt, rec[HEADER..] != payload[..], "encrypted iff encrypt");
        assert!(open(8, 4113, 3, &rec).is_err(), "another life of the segment");
        assert!(open(7, 4113 + (1 << 32), 3, &rec).is_err(), "another place with the same low bits");
        assert!(open(7, 4114, 3, &rec).is_err(), "another place");
        assert!(open(7, 4113, 4, &rec).is_err(), "another slot");
        assert!(open(7, 4113, 3, &rec[..rec.len() - 1]).is_err(), "another length");
        for bit in [0, 7 * 8 + 3, HEADER * 8, HEADER * 8 + 9, rec.len() * 8 - 1] {
            let mut bad = rec.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(open(7, 4113, 3, &bad).is_err(), "bit {bit} flipped (header: {})", bit < HEADER * 8);
        }
        assert!(open(7, 4113, 3, &vec![0u8; rec.len()]).is_err(), "a hole");
        let other = RecordSeal::new(encrypt).unwrap();
        let mut r = rec.clone();
        assert!(other.open(7, 4113, 3, &mut r).is_err(), "another run's record");
    }

    #[test]
    fn an_encrypted_record_binds_place_owner_generation_and_bytes() {
        binds_place_owner_generation_and_bytes(true);
    }

    #[test]
    fn a_checksummed_record_binds_place_owner_generation_and_bytes() {
        binds_place_owner_generation_and_bytes(false);
    }

    #[test]
    fn an_encrypted_record_holds_no_plaintext_and_differs_per_place() {
        let s = RecordSeal::new(true).unwrap();
        let page = b"SECRET-password ".repeat(256);
        let a = record(&s, 1, 0, 0, &page);
        let b = record(&s, 1, 4112, 0, &page);
        assert!(!a.windows(6).any(|w| w == b"SECRET"), "no plaintext");
        assert_ne!(a[HEADER..], b[HEADER..], "the same page at two places: two ciphertexts");
        assert_eq!(a.len(), HEADER + page.len(), "no expansion beyond the header");
    }

    #[test]
    fn a_kept_secret_opens_the_records_of_the_run_that_drew_it() {
        for encrypt in [true, false] {
            let mut kept = None;
            let s = RecordSeal::drawn(encrypt, &mut |sec| {
                kept = Some(match sec {
                    Secret::Key(k) => Secret::Key(*k),
                    Secret::Run(r) => Secret::Run(*r),
                })
            })
            .unwrap();
            let rec = record(&s, 3, 100, 9, b"payload of the dead run");
            let successor = RecordSeal::from_secret(&kept.unwrap()).unwrap();
            let mut r = rec.clone();
            successor.open(3, 100, 9, &mut r).unwrap();
            assert_eq!(&r[HEADER..], b"payload of the dead run", "encrypt {encrypt}");
        }
    }

    #[test]
    fn the_raw_key_is_wiped_once_expanded() {
        let k = KeyPage::new(getrandom, &mut |_| ()).unwrap();
        // SAFETY: the page is mapped and initialised while `k` lives; read only.
        let page = unsafe { std::slice::from_raw_parts(k.page.as_ptr(), KEY_PAGE_BYTES) };
        assert!(page[..std::mem::size_of::<LessSafeKey>()].iter().any(|&b| b != 0), "holds the expanded key");
        assert!(page[RAW_KEY_OFFSET..].iter().all(|&b| b == 0), "the raw key bytes are gone");
        let mut buf = vec![0xa5u8; 100];
        wipe(buf.as_mut_ptr(), buf.len());
        assert!(buf.iter().all(|&b| b == 0));
    }
}
