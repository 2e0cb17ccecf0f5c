//! zram-generator.conf: the fuzzer's bytes are a configuration file, parsed, then each section
//! interpreted on a small and a large machine; each line is also evaluated as a size expression
//! and parsed as a compression-algorithm value on its own.
//!
//! The parser lives in the `compcache` binary crate (crates/cli/src/cmd/zramconf/), which has
//! no library target; the file uses nothing but std, so it is compiled in here as a module of
//! its own with `#[path]`: the fuzzed code is exactly the shipped code, and the CLI crate is not
//! changed for it.
//!
//! Checked: no panic (and no stack overflow); an expression's value is finite; a device size or
//! memory limit is whole pages; a size is positive when it is given; a memory limit above 0 is
//! never 0 (no limit); an algorithm list names an algorithm first.

#[allow(dead_code)]
// Formatted with the main workspace, not from here.
#[rustfmt::skip]
#[path = "../../crates/cli/src/cmd/zramconf/mod.rs"]
pub mod parser;

use crate::expr::eval;
use parser::device::parse_algorithms;
use parser::{interpret, parse_into, Vars};

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut sections = Vec::new();
    if parse_into(&mut sections, &text, "fuzz.conf").is_ok() {
        for section in &sections {
            for ram_mib in [512.0, 65536.0] {
                if let Ok(dev) = interpret(section, ram_mib, &Vars::new()) {
                    if let Some(b) = dev.size_bytes {
                        assert_eq!(b % 4096, 0, "size {b} is not whole pages");
                        assert!(b > 0, "a device of 0 bytes from {section:?}");
                    }
                    if let Some(b) = dev.mem_limit_bytes {
                        assert_eq!(b % 4096, 0, "memory limit {b} is not whole pages");
                        // A limit above 0 never becomes 0, "no limit".
                        let asked = section.keys.get("zram-resident-limit").and_then(|e| eval(e, ram_mib).ok());
                        if asked.is_some_and(|mib| mib > 0.0) {
                            assert!(b > 0, "a memory limit of {asked:?} MiB became none, from {section:?}");
                        }
                    }
                }
            }
        }
    }
    for line in text.lines() {
        if let Ok(v) = eval(line, 2048.0) {
            assert!(v.is_finite(), "`{line}` evaluates to {v}");
        }
        if let Ok(specs) = parse_algorithms(line) {
            assert!(specs[0].name.is_some(), "`{line}`: the first entry names no algorithm");
        }
    }
}
