//! `compcache dict train`: a zstd dictionary for recompression (`--dict PATH`, or
//! zram-generator's `zstd(dict=PATH)`), trained on pages from page dumps (tools/pagedump) or
//! from a device (a compcache swap device's block device, read as root), with zstd's trainer as
//! the store trains its own (`compcache_store::recompress::dict::train`).
//!
//! Pages are sampled evenly over the inputs; zero and other same-filled pages are skipped (the
//! store keeps them as a fill word, never compressed). The dictionary is written to a new
//! private file (mode 0600, never through a symbolic link: `private_file`), since it is made
//! of the pages' contents.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use compcache_store::recompress::dict;
use compcache_store::PAGE_SIZE;

use crate::failure::Failure;
use crate::private_file;
use crate::units::human;

/// Recompression dictionaries.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Train a zstd dictionary on pages of page dumps or devices.
    Train(TrainArgs),
}

#[derive(clap::Args, Debug)]
struct TrainArgs {
    /// Where the pages come from: page dumps (raw 4 KiB pages, e.g. from tools/pagedump) or
    /// block devices (e.g. a running compcache device's /dev/ublkbN or its loop device).
    #[arg(long = "from", value_name = "PATH", required = true)]
    from: Vec<PathBuf>,
    /// The dictionary file to write (a new file, mode 0600).
    #[arg(long, short, value_name = "PATH")]
    out: PathBuf,
    /// Largest dictionary (SIZE) [default: 16K, what the store trains].
    #[arg(long, value_name = "SIZE", default_value = "16K")]
    size: String,
    /// Pages to sample, at most [default: 4608 (18 MiB)].
    #[arg(long, value_name = "N", default_value_t = 4608)]
    samples: usize,
    /// zstd level the gain is measured at (the recompression level) [default: 9].
    #[arg(long, value_name = "N", default_value_t = compcache_store::config::DEFAULT_RECOMPRESS_LEVEL)]
    level: i32,
    /// Print the result as JSON (the dictionary, its size, the pages sampled and skipped, the
    /// gain measured in permille).
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<(), Failure> {
    match args.command {
        Command::Train(a) => train(a),
    }
}

/// `--size`: bytes, not pages (`5000` is 5000 bytes; it was once rounded down to 4096, and
/// `300` to 0 and refused), 256 bytes to 1 MiB.
fn dict_size(text: &str) -> Result<usize, Failure> {
    let bytes = compcache_store::parse_bytes(text, 0).map_err(|e| Failure::usage(format!("--size: {e}")))?;
    if !(256..=1 << 20).contains(&bytes) {
        return Err(Failure::usage(format!("--size {text}: a dictionary of 256 bytes to 1 MiB (256 to 1M), please")));
    }
    Ok(bytes as usize)
}

fn train(a: TrainArgs) -> Result<(), Failure> {
    let max_bytes = dict_size(&a.size)?;
    if !(1..=22).contains(&a.level) {
        return Err(Failure::usage(format!("--level {}: zstd levels are 1..=22", a.level)));
    }
    let mut inputs = Vec::new();
    for path in &a.from {
        let mut f = File::open(path).map_err(|e| Failure::new(format!("cannot open {}: {e}", path.display())))?;
        // Block devices report their size through seeking to the end, files through it too.
        let bytes = f.seek(SeekFrom::End(0)).map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
        inputs.push((path, f, bytes / PAGE_SIZE as u64));
    }
    let total: u64 = inputs.iter().map(|i| i.2).sum();
    if total == 0 {
        return Err(Failure::new("the inputs hold no whole 4 KiB page"));
    }
    // Every `stride`th page of the inputs taken together, skipping same-filled ones.
    let stride = (total / a.samples.max(1) as u64).max(1);
    let mut pages = Vec::with_capacity(a.samples.min(total as usize) * PAGE_SIZE);
    let mut page = vec![0u8; PAGE_SIZE];
    let mut skipped = 0u64;
    let mut index = 0u64;
    for (path, f, n) in &inputs {
        let mut i = index.next_multiple_of(stride) - index;
        while i < *n && pages.len() < a.samples * PAGE_SIZE {
            f.read_exact_at(&mut page, i * PAGE_SIZE as u64)
                .map_err(|e| Failure::new(format!("{}: reading page {i}: {e}", path.display())))?;
            if page.chunks_exact(8).all(|w| w == &page[..8]) {
                skipped += 1;
            } else {
                pages.extend_from_slice(&page);
            }
            i += stride;
        }
        index += n;
    }
    let sampled = pages.len() / PAGE_SIZE;
    let trained = dict::train(&pages, max_bytes, a.level).map_err(|e| Failure::new(format!("training failed: {e}")))?;
    let mut file = private_file::create_new(&a.out).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => Failure::new(format!("{} exists: remove it or choose another --out", a.out.display())),
        _ => Failure::new(format!("cannot create {}: {e}", a.out.display())),
    })?;
    std::io::Write::write_all(&mut file, &trained.bytes).map_err(|e| Failure::new(format!("writing {}: {e}", a.out.display())))?;
    if a.json {
        println!(
            "{:#}",
            serde_json::json!({
                "dict": a.out, "bytes": trained.bytes.len(), "sampled_pages": sampled, "same_filled_skipped": skipped,
                "level": a.level, "gain_permille": trained.gain_permille, "held_out_pages": sampled / 9,
            })
        );
        return Ok(());
    }
    println!(
        "dictionary {} ({}) from {sampled} pages ({skipped} same-filled skipped): saves {:.1}% against zstd level {} alone on {} held-out pages",
        a.out.display(),
        human(trained.bytes.len() as u64),
        trained.gain_permille as f64 / 10.0,
        a.level,
        sampled / 9
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::dict_size;

    #[test]
    fn the_dictionary_size_is_bytes() {
        for (text, bytes) in [("300", 300), ("5000", 5000), ("16K", 16384), ("1M", 1 << 20), ("1.5K", 1536)] {
            assert_eq!(dict_size(text).unwrap(), bytes, "{text}");
        }
        for bad in ["255", "2M", "-1", "10%", "lots"] {
            assert!(dict_size(bad).unwrap_err().to_string().starts_with("--size"), "{bad}");
        }
    }
}
