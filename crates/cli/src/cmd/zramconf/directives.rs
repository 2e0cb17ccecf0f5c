//! The global section's directives (the lines before the first section header): zram-generator
//! knows one, `set!VAR = program`, and so does compcache, with its semantics:
//!
//! - `program` runs as `/bin/sh -c -- program`, as the user running compcache (root for
//!   `swapon`, as zram-generator runs as root at boot), stdin from /dev/null, stderr passed
//!   through; its standard output is parsed as an expression (like `zram-size`, over `ram` and
//!   the variables set before it) and the value is remembered as `VAR`, for later `set!` lines
//!   and every section's `zram-size` and `zram-resident-limit`;
//! - the files are read in order (the main file, then the drop-ins), so a later `set!` of the
//!   same name wins, for every section (sections are sized after every file is read);
//! - a program that exits non-zero gives a warning, and its output is still used; output that
//!   is not UTF-8 or not an expression is an error (zram-generator then fails as a whole);
//! - any other `op!` and any plain `key = value` there are warned about and ignored.

use super::ini::Entry;
use crate::expr::{eval_with, Vars};

/// What a program printed, and how it ended.
pub struct ProgramOutput {
    pub stdout: Vec<u8>,
    /// The exit code, or 128 + the signal that ended it.
    pub exit: i32,
}

/// Runs a `set!` program with `/bin/sh`.
pub fn run_with_sh(program: &str) -> Result<ProgramOutput, String> {
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", "--", program])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running /bin/sh: {e}"))?;
    let exit = out.status.code().unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0));
    Ok(ProgramOutput { stdout: out.stdout, exit })
}

/// Applies the global entries of `origin`: `set!` lines run `run` and define variables in
/// `vars`; the rest become warnings.
pub fn apply(
    entries: &[Entry],
    origin: &str,
    ram_mib: f64,
    vars: &mut Vars,
    warnings: &mut Vec<String>,
    run: &mut dyn FnMut(&str) -> Result<ProgramOutput, String>,
) -> Result<(), String> {
    for e in entries {
        let at = format!("{origin}:{}", e.line);
        let Some(bang) = e.key.find('!') else {
            warnings.push(format!("{at}: `{}` outside any [zramN] section is ignored (zram-generator ignores it too)", e.key));
            continue;
        };
        let (op, var) = e.key.split_at(bang + 1);
        if op != "set!" {
            warnings.push(format!("{at}: unknown directive `{op}` is ignored (zram-generator knows only set!)"));
            continue;
        }
        let var = var.trim();
        let out = run(&e.value).map_err(|err| format!("{at}: {}: {err}", e.key))?;
        if out.exit != 0 {
            warnings.push(format!(
                "{at}: {}: `{}` exited {}; its output is used all the same, as zram-generator does",
                e.key, e.value, out.exit
            ));
        }
        let text = String::from_utf8(out.stdout)
            .map_err(|_| format!("{at}: {}: `{}` printed something that is not UTF-8 text", e.key, e.value))?;
        let v = eval_with(&text, ram_mib, vars).map_err(|err| {
            format!(
                "{at}: {}: `{}` printed `{}`, which is not an expression ({err}); the program must print a number of MiB or an expression such as `ram / 4`",
                e.key,
                e.value,
                text.trim_end()
            )
        })?;
        vars.insert(var.to_string(), v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: &str) -> Entry {
        Entry { key: key.into(), value: value.into(), line: 1 }
    }

    fn apply_sh(entries: &[Entry], vars: &mut Vars) -> Result<Vec<String>, String> {
        let mut w = Vec::new();
        apply(entries, "f", 1000.0, vars, &mut w, &mut run_with_sh).map(|_| w)
    }

    #[test]
    fn set_runs_the_program_and_defines_a_variable() {
        let mut vars = Vars::new();
        let w =
            apply_sh(&[entry("set!half", "echo 'ram / 2'"), entry("set!more", "echo half + 10"), entry("set!half", "printf 7")], &mut vars)
                .unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!((vars["half"], vars["more"]), (7.0, 510.0), "later programs see earlier variables; a later set! of a name wins");
        // The program runs as this user, with stdin empty.
        use std::os::unix::fs::MetadataExt;
        let uid = std::fs::metadata("/proc/self").unwrap().uid();
        apply_sh(&[entry("set!uid", "id -u"), entry("set!stdin", "wc -c")], &mut vars).unwrap();
        assert_eq!((vars["uid"], vars["stdin"]), (uid as f64, 0.0));
    }

    #[test]
    fn a_failing_program_warns_and_bad_output_is_an_error() {
        let mut vars = Vars::new();
        let w = apply_sh(&[entry("set!x", "echo 5; exit 3")], &mut vars).unwrap();
        assert_eq!(vars["x"], 5.0);
        assert!(w[0].contains("exited 3"), "{w:?}");
        let e = apply_sh(&[entry("set!y", "echo lots")], &mut vars).unwrap_err();
        assert!(e.contains("printed `lots`") && e.contains("must print"), "{e}");
        assert!(apply_sh(&[entry("set!y", "true")], &mut vars).unwrap_err().contains("not an expression"), "empty output");
        assert!(apply_sh(&[entry("set!y", "printf '\\377'")], &mut vars).unwrap_err().contains("UTF-8"));
        let e = apply(&[entry("set!z", "x")], "f", 1.0, &mut vars, &mut Vec::new(), &mut |_| Err("no shell".into())).unwrap_err();
        assert!(e.contains("no shell"), "{e}");
    }

    #[test]
    fn other_global_lines_are_warned_about() {
        let mut vars = Vars::new();
        let w = apply_sh(&[entry("zram-size", "1"), entry("unset!x", "y")], &mut vars).unwrap();
        assert!(w[0].contains("outside any [zramN] section") && w[1].contains("unknown directive `unset!`"), "{w:?}");
        assert!(vars.is_empty());
    }
}
