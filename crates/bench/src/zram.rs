//! Kernel zram as the baseline: a device of our own (hot_add), written and read back with
//! O_DIRECT so the page cache stays out of the way, memory from its `mm_stat`. The device is
//! reset and removed when the guard drops, also when a run fails.

use crate::{parallel, Row};
use compcache_store::PAGE_SIZE;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

const CONTROL: &str = "/sys/class/zram-control";

pub fn available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    if !std::path::Path::new(CONTROL).exists() {
        return Err(format!("{CONTROL} is missing (no zram in this kernel?)"));
    }
    Ok(())
}

/// A zram device we created; removed on drop.
struct Device {
    id: u32,
}

impl Device {
    fn create(algorithm: &str, params: Option<&str>, disksize: u64) -> Result<Device, String> {
        let id: u32 = fs::read_to_string(format!("{CONTROL}/hot_add"))
            .map_err(|e| format!("hot_add: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("hot_add answer: {e}"))?;
        let dev = Device { id };
        dev.set("comp_algorithm", algorithm)?;
        if let Some(p) = params {
            // zram's algorithm_params (Linux 6.12+): "algo=NAME level=N dict=PATH".
            dev.set("algorithm_params", &format!("algo={algorithm} {p}"))?;
        }
        dev.set("disksize", &disksize.to_string())?;
        Ok(dev)
    }
    fn sys(&self, attr: &str) -> String {
        format!("/sys/block/zram{}/{attr}", self.id)
    }
    fn set(&self, attr: &str, value: &str) -> Result<(), String> {
        fs::write(self.sys(attr), value).map_err(|e| format!("zram{}/{attr} <- {value}: {e}", self.id))
    }
    fn mm_stat(&self) -> Result<Vec<u64>, String> {
        let text = fs::read_to_string(self.sys("mm_stat")).map_err(|e| format!("mm_stat: {e}"))?;
        Ok(text.split_whitespace().filter_map(|w| w.parse().ok()).collect())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = fs::write(self.sys("reset"), "1");
        if let Err(e) = fs::write(format!("{CONTROL}/hot_remove"), self.id.to_string()) {
            eprintln!("compcache-storebench: could not remove zram{}: {e}", self.id);
        }
    }
}

#[repr(C, align(4096))]
struct AlignedPage([u8; PAGE_SIZE]);

/// Writes and reads `data` through a zram device of `algorithm` (with zram's
/// `algorithm_params` `params`, e.g. "level=9 dict=/path", if given) on `threads` threads.
pub fn bench(data: &[u8], algorithm: &str, params: Option<&str>, threads: usize) -> Result<Row, String> {
    let pages = data.len() / PAGE_SIZE;
    let dev = Device::create(algorithm, params, (pages * PAGE_SIZE) as u64)?;
    let path = format!("/dev/zram{}", dev.id);
    let open = || -> Result<File, String> {
        OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(&path).map_err(|e| format!("{path}: {e}"))
    };
    let file = open()?;
    let errors = std::sync::Mutex::new(Vec::new());
    let wt = parallel(pages, threads, |r| {
        let mut buf = Box::new(AlignedPage([0; PAGE_SIZE]));
        for i in r {
            buf.0.copy_from_slice(&data[i * PAGE_SIZE..][..PAGE_SIZE]);
            if let Err(e) = file.write_all_at(&buf.0, (i * PAGE_SIZE) as u64) {
                errors.lock().expect("no poisoned lock").push(format!("write page {i}: {e}"));
                return;
            }
        }
    });
    let rt = parallel(pages, threads, |r| {
        let mut buf = Box::new(AlignedPage([0; PAGE_SIZE]));
        for i in r {
            if let Err(e) = file.read_exact_at(&mut buf.0, (i * PAGE_SIZE) as u64) {
                errors.lock().expect("no poisoned lock").push(format!("read page {i}: {e}"));
                return;
            }
            if buf.0[..] != data[i * PAGE_SIZE..][..PAGE_SIZE] {
                errors.lock().expect("no poisoned lock").push(format!("page {i} read back wrong from zram"));
                return;
            }
        }
    });
    if let Some(e) = errors.into_inner().expect("no poisoned lock").into_iter().next() {
        return Err(e);
    }
    let mm = dev.mm_stat()?;
    drop(file);
    Ok(Row {
        name: "zram".into(),
        threads,
        write_pages_per_s: pages as f64 / wt,
        read_pages_per_s: pages as f64 / rt,
        mem_bytes: mm.get(2).copied().unwrap_or(0),
        compr_bytes: mm.get(1).copied().unwrap_or(0),
    })
}
