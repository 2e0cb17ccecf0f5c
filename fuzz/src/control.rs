//! The control protocol: the fuzzer's bytes are what a control client sends, split into
//! request lines as the control server splits them, each answered by `control::answer`.
//!
//! Checked: no panic; every answer is one JSON object on one line with a boolean `ok`; a
//! refusal carries an `error` string; `stat` and `info` answers carry the device, `set`'s the
//! memory limit; `recompress` and `writeback` are refused (the store has neither).

use compcache_control::{answer, ControlState, DeviceInfo, MAX_LINE_BYTES};
use compcache_store::{Config, Store};
use serde_json::Value;
use std::sync::{Arc, OnceLock};

fn state() -> &'static ControlState {
    static STATE: OnceLock<ControlState> = OnceLock::new();
    STATE.get_or_init(|| {
        let store = Arc::new(Store::new(Config::with_disksize(1 << 20)).expect("a 1 MiB store"));
        let device = DeviceInfo {
            export_name: "compcache".into(),
            nbd_socket: Some("/run/compcache/fuzz.sock".into()),
            nbd_tcp: None,
            control_socket: "/run/compcache/fuzz.ctl".into(),
            pid: 1,
            version: "fuzz".into(),
            origin: None,
            frontend: "nbd-server".into(),
            backing: None,
        };
        ControlState { store, device }
    })
}

pub fn run(data: &[u8]) {
    let state = state();
    for line in data.split(|&b| b == b'\n') {
        if line.len() > MAX_LINE_BYTES {
            continue; // the server closes the connection instead of answering
        }
        let text = String::from_utf8_lossy(line);
        if text.trim().is_empty() {
            continue;
        }
        let v = answer(state, text.trim());
        let out = v.to_string();
        assert!(!out.contains('\n'), "an answer spans lines: {out}");
        let Value::Object(map) = &v else { panic!("the answer is not an object: {out}") };
        match map.get("ok") {
            Some(Value::Bool(true)) => {
                let cmd =
                    serde_json::from_str::<Value>(text.trim()).ok().and_then(|r| r.get("cmd").and_then(Value::as_str).map(String::from));
                match cmd.as_deref() {
                    Some("stat") | Some("info") => assert!(map.contains_key("device"), "{out}"),
                    Some("compact") => {
                        assert!(map.get("pages_freed").is_some_and(Value::is_u64), "{out}")
                    }
                    Some("set") => assert!(map.get("mem_limit").is_some_and(Value::is_u64), "{out}"),
                    // The fuzzed store has neither recompression nor a backing device.
                    Some("recompress") | Some("writeback") => panic!("ok without the feature: {out}"),
                    other => panic!("ok for command {other:?}: {out}"),
                }
            }
            Some(Value::Bool(false)) => assert!(map.get("error").is_some_and(Value::is_string), "refusal without an error: {out}"),
            _ => panic!("no boolean ok: {out}"),
        }
    }
}
