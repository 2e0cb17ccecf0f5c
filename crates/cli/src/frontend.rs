//! The kernel front ends a swap device can be served through, and which this machine has.

use std::fmt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::str::FromStr;

/// A front end: how the kernel reaches the store as a block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frontend {
    /// ublk (Linux 6.0+, ublk_drv): /dev/ublkbN, `compcache ublk`.
    Ublk,
    /// The kernel's NBD driver, served in-process: /dev/nbdN, `compcache nbd-attach`.
    Nbd,
    /// A file on a FUSE mount through a loop device: /dev/loopN, `compcache fuse`.
    Fuse,
}

/// `swapon --frontend`: one front end, or the first this kernel has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    Auto,
    One(Frontend),
}

impl Frontend {
    /// In `auto`'s order of preference.
    pub const ALL: [Frontend; 3] = [Frontend::Ublk, Frontend::Nbd, Frontend::Fuse];

    /// The name in flags, log lines and `swapon`'s state files.
    pub fn name(self) -> &'static str {
        match self {
            Frontend::Ublk => "ublk",
            Frontend::Nbd => "nbd",
            Frontend::Fuse => "fuse",
        }
    }

    /// The `compcache` subcommand that serves it.
    pub fn server_command(self) -> &'static str {
        match self {
            Frontend::Ublk => "ublk",
            Frontend::Nbd => "nbd-attach",
            Frontend::Fuse => "fuse",
        }
    }

    /// Whether this machine can run it, loading its kernel module first if needed; the error
    /// says what is missing.
    pub fn kernel_support(self) -> Result<(), String> {
        match self {
            Frontend::Ublk => {
                if compcache_ublk::kernel_support().is_err() {
                    modprobe("ublk_drv");
                }
                compcache_ublk::kernel_support().map_err(|e| e.to_string())
            }
            Frontend::Nbd => {
                if compcache_kernel_nbd::kernel_support().is_err() {
                    modprobe("nbd");
                }
                compcache_kernel_nbd::kernel_support().map_err(|e| e.to_string())
            }
            Frontend::Fuse => fuse_kernel_support(),
        }
    }

    /// The one asked for if this machine has it, or with `auto` the first it has.
    pub fn choose(wanted: Wanted) -> Result<Frontend, String> {
        match wanted {
            Wanted::One(f) => f.kernel_support().map(|_| f),
            Wanted::Auto => {
                let mut missing = Vec::new();
                for f in Frontend::ALL {
                    match f.kernel_support() {
                        Ok(()) => return Ok(f),
                        Err(e) => missing.push(e),
                    }
                }
                Err(format!("no front end: {}", missing.join("; ")))
            }
        }
    }
}

/// Whether this machine can run the FUSE front end (FUSE, loop, losetup), loading the
/// modules if needed; the error says what is missing.
pub fn fuse_kernel_support() -> Result<(), String> {
    if compcache_fuse::kernel_support().is_err() {
        modprobe("fuse");
    }
    compcache_fuse::kernel_support()?;
    if !Path::new("/dev/loop-control").exists() {
        modprobe("loop");
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err("no loop devices: no /dev/loop-control (modprobe loop; CONFIG_BLK_DEV_LOOP)".into());
    }
    match Command::new("losetup").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("no losetup (util-linux; apt-get install mount)".into()),
    }
}

/// `modprobe -q NAME`, quietly; whether it worked is judged by the caller's own check.
pub fn modprobe(name: &str) {
    let _ = Command::new("modprobe").arg("-q").arg(name).stdout(Stdio::null()).stderr(Stdio::null()).status();
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Frontend {
    type Err = String;
    fn from_str(s: &str) -> Result<Frontend, String> {
        Frontend::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| format!("unknown front end {s:?} (ublk, nbd or fuse)"))
    }
}

impl FromStr for Wanted {
    type Err = String;
    fn from_str(s: &str) -> Result<Wanted, String> {
        match s {
            "auto" => Ok(Wanted::Auto),
            _ => s.parse().map(Wanted::One).map_err(|_| format!("unknown front end {s:?} (auto, ublk, nbd or fuse)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_name_their_server() {
        for f in Frontend::ALL {
            assert_eq!(f.name().parse::<Frontend>(), Ok(f));
            assert_eq!(f.to_string(), f.name());
        }
        assert_eq!(Frontend::Nbd.server_command(), "nbd-attach");
        assert_eq!("auto".parse::<Wanted>(), Ok(Wanted::Auto));
        assert_eq!("fuse".parse::<Wanted>(), Ok(Wanted::One(Frontend::Fuse)));
        assert!("zram".parse::<Wanted>().unwrap_err().contains("auto, ublk, nbd or fuse"));
    }
}
