//! What `compcache swapon` records about each device it set up, so that `compcache swapoff`
//! finds the server to stop: one private JSON file per device in [`STATE_DIR`].

use std::path::{Path, PathBuf};

use crate::failure::Failure;
use crate::frontend::Frontend;

/// Where `compcache swapon` records its devices (one JSON file each) and the servers' logs.
pub const STATE_DIR: &str = "/run/compcache/swap";

/// What `compcache swapon` records about a device it set up, in `STATE_DIR/<dev>.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwapState {
    pub device: PathBuf,
    pub frontend: Frontend,
    pub pid: u32,
    pub log: PathBuf,
    pub stats: PathBuf,
    pub control: PathBuf,
    /// The supervisor holding the server's descriptors (docs/swap.md, "When the server
    /// dies"): a detached `compcache swap-supervisor`, or `swapon --foreground` itself; 0 for
    /// none. `pid` is then the server it runs now (it rewrites this record for each successor).
    pub supervisor: u32,
    /// Whether the supervisor holds the FUSE connection, so that a successor can take the
    /// device over (`compcache restart`).
    pub takeover: bool,
}

impl SwapState {
    /// The record of `device`, served by `frontend`'s server `pid` logging to `log`: its final
    /// statistics go to `STATE_DIR/<device>.stats.json` (the server's `--stats-dir`), its
    /// control socket is `/run/compcache/<device>.ctl` (`session::Session`).
    pub fn new(device: PathBuf, frontend: Frontend, pid: u32, log: PathBuf) -> SwapState {
        let name = device.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let stats = Path::new(STATE_DIR).join(format!("{name}.stats.json"));
        let control = PathBuf::from(format!("/run/compcache/{name}.ctl"));
        SwapState { device, frontend, pid, log, stats, control, supervisor: 0, takeover: false }
    }

    pub fn path_for(device: &Path) -> PathBuf {
        let name = device.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "device".into());
        Path::new(STATE_DIR).join(format!("{name}.json"))
    }

    pub fn save(&self) -> Result<(), Failure> {
        let v = serde_json::json!({
            "device": self.device, "frontend": self.frontend.name(), "pid": self.pid,
            "log": self.log, "stats": self.stats, "control": self.control,
            "supervisor": self.supervisor, "takeover": self.takeover,
        });
        let path = Self::path_for(&self.device);
        crate::private_file::create_private_dir_all(Path::new(STATE_DIR)).map_err(|e| Failure::new(format!("{STATE_DIR}: {e}")))?;
        crate::private_file::write_replacing_own(&path, format!("{v:#}\n").as_bytes())
            .map_err(|e| Failure::new(format!("{}: {e}", path.display())))
    }

    pub fn load(path: &Path) -> Result<SwapState, Failure> {
        let text = std::fs::read_to_string(path).map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
        let s = |k: &str| PathBuf::from(v.get(k).and_then(|x| x.as_str()).unwrap_or_default());
        Ok(SwapState {
            device: s("device"),
            frontend: v
                .get("frontend")
                .and_then(|x| x.as_str())
                .unwrap_or_default()
                .parse()
                .map_err(|e: String| Failure::new(format!("{}: {e}", path.display())))?,
            pid: v.get("pid").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
            log: s("log"),
            stats: s("stats"),
            control: s("control"),
            supervisor: v.get("supervisor").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
            takeover: v.get("takeover").and_then(|x| x.as_bool()).unwrap_or(false),
        })
    }

    /// Every recorded device.
    pub fn all() -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(STATE_DIR)
            .map(|d| {
                d.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.to_string_lossy().ends_with(".json") && !p.to_string_lossy().ends_with(".stats.json"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}
