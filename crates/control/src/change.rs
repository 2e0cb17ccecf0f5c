//! The commands that change a running device (protocol version 2; the table is in lib.rs):
//! `set` (memory limit, writeback's watermarks, rate and limit, the `mem_used_max` reset),
//! `writeback` (an idle writeback now) and `recompress` (recompression's tunables, a run now).
//!
//! Each checks its whole request before it changes anything: a refused request leaves the
//! device as it was, and says which field is wrong.

use compcache_store::{RecompressTuning, Store, WritebackBudget, WritebackReport, WritebackTuning};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::ControlState;

/// The fields of `{"cmd":"set", ...}` besides `cmd`; every one optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetRequest {
    /// Bytes; 0: no limit.
    mem_limit: Option<u64>,
    /// Resets `mem_used_max` to the current use.
    #[serde(default)]
    reset_mem_used_max: bool,
    writeback: Option<WritebackTuning>,
}

fn refuse(msg: impl std::fmt::Display) -> Value {
    json!({"ok": false, "error": msg.to_string()})
}

/// `set`: answers the values after the change: `mem_limit`, `mem_used_max`, and `writeback`
/// (its settings, or null without a backing device).
pub(crate) fn set(state: &ControlState, req: &Value) -> Value {
    let mut fields = req.as_object().cloned().unwrap_or_default();
    fields.remove("cmd");
    let r: SetRequest = match serde_json::from_value(Value::Object(fields)) {
        Ok(r) => r,
        Err(e) => return refuse(format!("set: {e} (fields: mem_limit, reset_mem_used_max, writeback)")),
    };
    let store = &state.store;
    if r.mem_limit == Some(0) && state.device.origin.is_some() {
        return refuse("set: mem_limit 0 on a cache device: a cache needs a memory budget; give a size");
    }
    if let Err(e) = compcache_store::config::check_mem_limit(r.mem_limit.unwrap_or(0)) {
        return refuse(format!("set: mem_limit: {e}"));
    }
    // The writeback change is the one that can be refused (no backing device, watermarks out
    // of order): made first, so that a refusal leaves the memory limit untouched too.
    let writeback = match &r.writeback {
        Some(t) => match store.tune_writeback(t) {
            Ok(s) => Some(s),
            Err(e) => return refuse(format!("set: writeback: {e}")),
        },
        None => store.writeback_settings(),
    };
    if let Some(bytes) = r.mem_limit {
        store.set_mem_limit(bytes);
    }
    if r.reset_mem_used_max {
        store.reset_mem_used_max();
    }
    let s = store.stats();
    json!({"ok": true, "mem_limit": s.mem_limit, "mem_used_max": s.mem_used_max, "writeback": writeback})
}

/// `writeback`: `{"cmd":"writeback", "idle_secs": N, "max_bytes": M}` writes back pages not
/// accessed for `idle_secs` (default 0: every page), coldest first, at most `max_bytes`
/// (default: no cap but the device's writeback limit, which bounds it as zram's
/// `writeback_limit` bounds `echo idle > writeback`); answers `report`.
pub(crate) fn writeback(store: &Store, req: &Value) -> Value {
    let num = |k: &str| match req.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| format!("writeback: \"{k}\" must be a whole number, not {v}")),
    };
    let (idle, max) = match (num("idle_secs"), num("max_bytes")) {
        (Ok(i), Ok(m)) => (i.unwrap_or(0), m.unwrap_or(u64::MAX)),
        (Err(e), _) | (_, Err(e)) => return refuse(e),
    };
    if let Err(e) = compcache_store::config::check_idle_secs("writeback: \"idle_secs\"", idle) {
        return refuse(e);
    }
    if !store.has_backing() {
        return refuse("writeback: this device has no backing device (start it with --backing PATH)");
    }
    let r = store.writeback_idle(idle, WritebackBudget { max_bytes: max });
    json!({"ok": true, "report": report_json(&r)})
}

fn report_json(r: &WritebackReport) -> Value {
    json!({
        "pages": r.pages,
        "bytes": r.bytes,
        "writes": r.writes,
        "raced": r.raced,
        "pool_pages_freed": r.pool_pages_freed,
        "device_full": r.device_full,
        "error": r.error.as_ref().map(ToString::to_string),
    })
}

/// `{"cmd":"recompress", "set": {...}, "run_ms": N}`: changes recompression's tunables
/// (`RecompressTuning`'s fields; none: nothing changes) and, with `run_ms`, recompresses now
/// for up to that much CPU time (at most a minute). Answers the settings after the change and
/// what the run did.
pub(crate) fn recompress(store: &Store, req: &Value) -> Value {
    let tuning: RecompressTuning = match req.get("set").map(|v| serde_json::from_value(v.clone())) {
        None => Default::default(),
        Some(Ok(t)) => t,
        Some(Err(e)) => return refuse(format!("\"set\": {e}")),
    };
    let settings = match store.tune_recompression(&tuning) {
        Ok(s) => s,
        Err(e) => return refuse(e),
    };
    let run_ms = req.get("run_ms").and_then(Value::as_u64).unwrap_or(0).min(60_000);
    let report = (run_ms > 0).then(|| store.recompress(std::time::Duration::from_millis(run_ms)));
    json!({"ok": true, "settings": settings, "report": report})
}

#[cfg(test)]
mod tests {
    use crate::{answer, ControlState, DeviceInfo};
    use compcache_store::{BackingConfig, Config, Store, PAGE_SIZE};
    use serde_json::{json, Value};
    use std::sync::Arc;

    fn state(backing: Option<&std::path::Path>) -> ControlState {
        let cfg = Config {
            mem_limit_bytes: 4 << 20,
            backing: backing.map(|p| BackingConfig { size_bytes: 8 << 20, ..BackingConfig::new(p) }),
            ..Config::with_disksize(16 << 20)
        };
        ControlState { store: Arc::new(Store::new(cfg).unwrap()), device: DeviceInfo::default() }
    }

    fn ask(s: &ControlState, req: Value) -> Value {
        answer(s, &req.to_string())
    }

    #[test]
    fn set_changes_the_memory_limit_and_resets_the_peak() {
        let s = state(None);
        let mut ctx = s.store.context();
        let page: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 % 251) as u8).collect();
        for i in 0..64 {
            s.store.write_page(&mut ctx, i, &page).unwrap();
        }
        for i in 0..64 {
            s.store.discard_page(i);
        }
        s.store.compact();
        let a = ask(&s, json!({"cmd": "set", "mem_limit": 8 << 20}));
        assert_eq!((a["ok"].as_bool(), a["mem_limit"].as_u64()), (Some(true), Some(8 << 20)), "{a}");
        assert!(a["mem_used_max"].as_u64().unwrap() > 0 && a["writeback"].is_null(), "{a}");
        assert_eq!(s.store.stats().mem_limit, 8 << 20);
        let a = ask(&s, json!({"cmd": "set", "reset_mem_used_max": true}));
        assert_eq!(a["mem_used_max"].as_u64(), Some(s.store.stats().mem_used_total), "{a}");
        assert_eq!(a["mem_limit"].as_u64(), Some(8 << 20), "untouched when not given");
        let cache = ControlState { device: DeviceInfo { origin: Some("/dev/vdb".into()), ..DeviceInfo::default() }, ..s };
        let a = ask(&cache, json!({"cmd": "set", "mem_limit": 0}));
        assert!(a["error"].as_str().unwrap().contains("a cache needs a memory budget"), "{a}");
        assert_eq!(cache.store.stats().mem_limit, 8 << 20);
    }

    #[test]
    fn a_refused_set_changes_nothing_and_says_why() {
        let dir = std::env::temp_dir().join(format!("compcache-change-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let s = state(Some(&dir.join("b.img")));
        let cases = [
            (json!({"cmd": "set", "mem_limt": 1}), "unknown field `mem_limt`"),
            (json!({"cmd": "set", "mem_limit": -1}), "mem_limit"),
            (json!({"cmd": "set", "mem_limit": 100}), "mem_limit: memory limit 100 bytes is below one page"),
            (json!({"cmd": "set", "mem_limit": 1 << 20, "writeback": {"high_pct": 10}}), "watermarks high 10% low"),
            (json!({"cmd": "set", "writeback": {"rate": 1}}), "unknown field `rate`"),
        ];
        for (req, why) in cases {
            let a = ask(&s, req.clone());
            assert_eq!(a["ok"], false, "{req} -> {a}");
            assert!(a["error"].as_str().unwrap().contains(why), "{req} -> {a}");
            assert_eq!(s.store.stats().mem_limit, 4 << 20, "{req} changed the memory limit");
        }
        let a = ask(&s, json!({"cmd": "set", "writeback": {"high_pct": 60, "low_pct": 40, "limit_bytes": 1 << 20}}));
        assert_eq!(
            a["writeback"],
            json!({"high_pct": 60, "low_pct": 40, "rate_bytes": 0, "limit_bytes": 1 << 20, "limit_left_bytes": 1 << 20}),
            "{a}"
        );
        // Without a backing device, writeback cannot be tuned or run.
        let plain = state(None);
        for req in [json!({"cmd": "set", "writeback": {}}), json!({"cmd": "writeback"})] {
            let a = ask(&plain, req);
            assert!(a["error"].as_str().unwrap().contains("no backing device"), "{a}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writeback_moves_idle_pages_now() {
        let dir = std::env::temp_dir().join(format!("compcache-change-wb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let s = state(Some(&dir.join("b.img")));
        let mut ctx = s.store.context();
        for i in 0..100u64 {
            let page: Vec<u8> = (0..PAGE_SIZE).map(|j| ((i as usize * 31 + j) % 97) as u8).collect();
            s.store.write_page(&mut ctx, i, &page).unwrap();
        }
        let a = ask(&s, json!({"cmd": "writeback", "idle_secs": 3600}));
        assert_eq!(a["report"]["pages"], 0, "nothing has been idle an hour: {a}");
        s.store.advance_clock(7200);
        let a = ask(&s, json!({"cmd": "writeback", "idle_secs": 3600, "max_bytes": 8192}));
        let pages = a["report"]["pages"].as_u64().unwrap();
        assert!(pages > 0 && a["report"]["bytes"].as_u64().unwrap() < 8192 + PAGE_SIZE as u64, "{a}");
        let a = ask(&s, json!({"cmd": "writeback", "idle_secs": 3600}));
        assert_eq!(a["report"]["pages"].as_u64().unwrap() + pages, 100, "{a}");
        assert_eq!(s.store.stats().bd_writeback_pages, 100);
        let a = ask(&s, json!({"cmd": "writeback", "idle_secs": 86_400}));
        assert!(a["error"].as_str().unwrap().contains("above the most an idle age can be, 65535 s"), "{a}");
        let a = ask(&s, json!({"cmd": "writeback", "idle_secs": "old"}));
        assert!(a["error"].as_str().unwrap().contains("\"idle_secs\" must be a whole number"), "{a}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
