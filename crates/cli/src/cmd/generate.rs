//! `compcache generate man|completions --out DIR`: the man pages and shell completions the
//! package ships (packaging/build-deb.sh), made from the clap definitions that parse the command
//! line, so that they cannot drift from it. Hidden from `--help`, from the man pages and from
//! the completions: it is a build step, not something an operator runs.
//!
//! Man pages: `compcache.1`, and one page per subcommand at any depth, named after the command
//! line (`compcache-serve.1`, `compcache-dict-train.1`), as git's and cargo's are.
//! Completions: bash (`compcache`), zsh (`_compcache`) and fish (`compcache.fish`), the file
//! names each shell looks up (docs/packaging.md says where the package puts them).

use std::path::{Path, PathBuf};

use clap::Command;
use clap_complete::Shell;
use clap_mangen::Man;

use crate::failure::Failure;

/// Write man pages or shell completions (packaging).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand, Debug)]
enum What {
    /// Write compcache.1 and one page per subcommand (compcache-serve.1, ...).
    Man {
        /// Directory to write the pages into (made if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Write completions for bash (compcache), zsh (_compcache) and fish (compcache.fish).
    Completions {
        /// Directory to write the completion files into (made if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// The shells completions are written for, and each one's file name.
const SHELLS: [(Shell, &str); 3] = [(Shell::Bash, "compcache"), (Shell::Zsh, "_compcache"), (Shell::Fish, "compcache.fish")];

/// `cli` is the whole command's definition (`Cli::command()`); prints each file written.
pub fn run(args: Args, cli: Command) -> Result<(), Failure> {
    let written = match args.what {
        What::Man { out } => man_pages(cli, &out)?,
        What::Completions { out } => completions(cli, &out)?,
    };
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

/// Writes `compcache.1` and a page for every visible subcommand, recursively; returns the paths.
fn man_pages(cli: Command, out: &Path) -> Result<Vec<PathBuf>, Failure> {
    make_dir(out)?;
    // Built once from the root: that names each subcommand after its path (`compcache-dict-train`)
    // and gives every page the version (`propagate_version`).
    let mut cli = cli.disable_help_subcommand(true);
    cli.build();
    let mut written = Vec::new();
    write_pages(&cli, &cli, out, &mut written)?;
    Ok(written)
}

fn write_pages(root: &Command, cmd: &Command, out: &Path, written: &mut Vec<PathBuf>) -> Result<(), Failure> {
    let version = root.get_version().unwrap_or_default();
    let man = Man::new(cmd.clone()).source(format!("{} {version}", root.get_name())).manual(root.get_name().to_string());
    let path = out.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page).map_err(|e| Failure::new(format!("rendering the man page {}: {e}", path.display())))?;
    page.extend_from_slice(see_also(root, cmd).as_bytes());
    write_file(&path, &page)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        write_pages(root, sub, out, written)?;
    }
    Ok(())
}

/// A SEE ALSO section in roff: a subcommand's page points to the command's page, which lists
/// every subcommand; all point to the prose documentation, which has what clap's help does
/// not (the control protocol, the statistics, the swap set-up).
fn see_also(root: &Command, cmd: &Command) -> String {
    let name = root.get_name();
    let mut text = String::from(".SH \"SEE ALSO\"\n");
    if !std::ptr::eq(root, cmd) {
        text.push_str(&format!("\\fB{name}\\fR(1)\n.PP\n"));
    }
    text.push_str(&format!(
        "The documentation in /usr/share/doc/{name}/ (README.md, and docs/cli.md for every flag, the \
         control protocol and the error messages), or in the source tree.\n"
    ));
    text
}

/// Writes the completion file of each shell in [`SHELLS`]; returns the paths.
fn completions(cli: Command, out: &Path) -> Result<Vec<PathBuf>, Failure> {
    make_dir(out)?;
    let mut cli = without_hidden_subcommands(&cli);
    let bin_name = cli.get_name().to_string();
    let mut written = Vec::new();
    for (shell, file) in SHELLS {
        let path = out.join(file);
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut cli, &bin_name, &mut script);
        write_file(&path, &script)?;
        written.push(path);
    }
    Ok(written)
}

/// `cli` without its hidden subcommands: clap_complete completes hidden subcommands too (this
/// one would be offered on every `compcache <TAB>`), and clap cannot remove a subcommand, so
/// the root is rebuilt from its parts. The root has no settings that change what is completed
/// beyond these; `rebuilt_root_completes_as_the_original` checks that.
fn without_hidden_subcommands(cli: &Command) -> Command {
    let mut root = Command::new(cli.get_name().to_string())
        .args(cli.get_arguments().cloned())
        .subcommands(cli.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    if let Some(v) = cli.get_version() {
        root = root.version(v.to_string()).propagate_version(true);
    }
    if let Some(about) = cli.get_about() {
        root = root.about(about.clone());
    }
    root
}

fn make_dir(dir: &Path) -> Result<(), Failure> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::new(format!("making the output directory {}: {e}; give an --out DIR that can be written", dir.display())))
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), Failure> {
    std::fs::write(path, data).map_err(|e| Failure::new(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::collections::BTreeSet;

    fn cli() -> Command {
        crate::Cli::command()
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("compcache-generate-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn file_names(paths: &[PathBuf]) -> BTreeSet<String> {
        paths.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect()
    }

    /// Every visible subcommand path, as man page names (`compcache-dict-train.1`).
    fn expected_pages(cmd: &Command, prefix: &str, names: &mut BTreeSet<String>) {
        names.insert(format!("{prefix}.1"));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            expected_pages(sub, &format!("{prefix}-{}", sub.get_name()), names);
        }
    }

    #[test]
    fn one_man_page_per_visible_subcommand() {
        let dir = scratch("man");
        let written = man_pages(cli(), &dir).unwrap();
        let mut expected = BTreeSet::new();
        expected_pages(&cli(), "compcache", &mut expected);
        assert_eq!(file_names(&written), expected);
        for must in ["compcache.1", "compcache-serve.1", "compcache-swapon.1", "compcache-dict-train.1"] {
            assert!(expected.contains(must), "{must} missing from {expected:?}");
        }
        assert!(!expected.iter().any(|n| n.contains("generate") || n.contains("help")), "{expected:?}");
        let serve = std::fs::read_to_string(dir.join("compcache-serve.1")).unwrap();
        assert!(serve.starts_with(".ie"), "roff expected: {}", &serve[..80.min(serve.len())]);
        assert!(serve.contains(".TH compcache-serve 1"), "title");
        assert!(serve.contains("\\-\\-mem\\-limit"), "serve's flags are on its page");
        assert!(serve.contains(&format!("compcache {}", env!("CARGO_PKG_VERSION"))), "version in the footer");
        assert!(serve.contains("\\fBcompcache\\fR(1)"), "see also the command's page");
        let root = std::fs::read_to_string(dir.join("compcache.1")).unwrap();
        assert!(root.contains("compcache\\-serve(1)"), "the command's page lists the subcommands' pages");
        assert!(!root.contains("generate"), "the hidden subcommand stays out of the pages");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn completions_for_three_shells_without_the_hidden_subcommand() {
        let dir = scratch("completions");
        let written = completions(cli(), &dir).unwrap();
        assert_eq!(file_names(&written), SHELLS.iter().map(|(_, f)| f.to_string()).collect());
        for (_, file) in SHELLS {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            for word in ["serve", "swapon", "--mem-limit", "train"] {
                assert!(text.contains(word), "{file} lacks {word}");
            }
            assert!(!text.contains("generate"), "{file} completes the hidden subcommand");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rebuilt_root_completes_as_the_original() {
        let mut original = cli();
        original.build();
        let mut rebuilt = without_hidden_subcommands(&cli());
        rebuilt.build();
        let args = |c: &Command| c.get_arguments().map(|a| a.get_id().to_string()).collect::<BTreeSet<_>>();
        assert_eq!(args(&rebuilt), args(&original), "the root's own flags");
        let visible = |c: &Command| c.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| s.get_name().to_string()).collect::<Vec<_>>();
        assert_eq!(visible(&rebuilt), visible(&original));
        assert!(original.get_subcommands().any(|s| s.get_name() == "generate"));
        assert!(!rebuilt.get_subcommands().any(|s| s.get_name() == "generate"));
        assert_eq!(rebuilt.get_version(), original.get_version());
    }

    /// The example configuration the package ships (packaging/zram-generator.conf.example,
    /// docs/packaging.md): compcache reads it with no note (every key in it is one compcache
    /// uses) and gets the values its comments give, and the same with its commented-out keys
    /// switched on.
    #[test]
    fn packaged_sample_config_is_read_as_documented() {
        use crate::cmd::zramconf::{interpret, parse_into};
        const MIB: u64 = 1 << 20;
        let text = include_str!("../../../../packaging/zram-generator.conf.example");
        let mut sections = Vec::new();
        parse_into(&mut sections, text, "example").unwrap();
        assert_eq!(sections.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["zram0"]);
        let dev = interpret(&sections[0], 16384.0, &Default::default()).unwrap();
        assert!(dev.notes.is_empty(), "{:?}", dev.notes);
        assert_eq!(dev.size_bytes, Some(4096 * MIB), "min(ram / 2, 4096) on 16 GiB");
        assert_eq!((dev.algorithm.as_deref(), dev.priority, dev.mem_limit_bytes), (Some("lz4"), Some(100), None));

        // A commented-out key is `#key = value` (prose comments have `# ` and no ` = `).
        fn key_line(line: &str) -> Option<&str> {
            line.strip_prefix('#').filter(|l| l.split_once(" = ").is_some_and(|(k, _)| !k.contains(' ')))
        }
        let all_on: String = text.lines().map(|l| key_line(l).unwrap_or(l).to_string() + "\n").collect();
        assert_eq!(all_on.lines().filter(|l| !l.starts_with('#') && l.contains(" = ")).count(), 6, "{all_on}");
        let mut sections = Vec::new();
        parse_into(&mut sections, &all_on, "example, all keys").unwrap();
        let dev = interpret(&sections[0], 16384.0, &Default::default()).unwrap();
        assert!(dev.notes.is_empty(), "{:?}", dev.notes);
        assert_eq!(dev.mem_limit_bytes, Some(4096 * MIB), "ram / 4");
        assert_eq!(dev.writeback_device.as_deref(), Some(Path::new("/dev/disk/by-partlabel/compcache-backing")));
        assert_eq!(dev.size_bytes, Some(4096 * MIB), "below host-memory-limit: a device");
    }

    #[test]
    fn unwritable_out_dir_says_which() {
        let e = man_pages(cli(), Path::new("/proc/compcache-no-such-dir")).unwrap_err().to_string();
        assert!(e.contains("/proc/compcache-no-such-dir") && e.contains("--out"), "{e}");
    }
}
