//! The `compcache` command: parsing and wiring only. Each subcommand lives in its own module
//! under `cmd/` with an `Args` struct (clap derive) and a `run(args) -> Result<(), Failure>`;
//! to add one, add a module there and one variant to [`Command`].

mod backing;
mod cmd;
mod expr;
mod failure;
mod fdstore;
mod frontend;
mod log;
mod maintenance;
mod metrics;
mod paths;
mod private_file;
mod process;
mod recompress_args;
mod store_args;
mod table;
mod takeover_reserve;
mod target;
#[cfg(test)]
mod test_flags;
mod units;

use clap::{Parser, Subcommand};

/// compcache: compressed memory for Linux in userspace. A compressed RAM block device,
/// served over NBD, for the kernel to swap to.
#[derive(Parser)]
#[command(name = "compcache", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Serve(cmd::serve::Args),
    Stat(cmd::stat::Args),
    List(cmd::list::Args),
    Compact(cmd::compact::Args),
    Swapon(cmd::swapon::SwaponArgs),
    Swapoff(cmd::swapon::SwapoffArgs),
    Restart(cmd::swapon::RestartArgs),
    Supervise(cmd::supervise::Args),
    /// The supervisor of a FUSE swap server (started by `compcache swapon`).
    #[command(hide = true)]
    SwapSupervisor(cmd::swapon::SupervisorArgs),
    Ublk(cmd::device::UblkArgs),
    NbdAttach(cmd::device::NbdAttachArgs),
    Fuse(cmd::fuse::FuseArgs),
    Dict(cmd::dict::Args),
    Recompress(cmd::recompress::Args),
    Set(cmd::set::Args),
    Writeback(cmd::writeback::Args),
    /// Write man pages or shell completions (packaging: packaging/build-deb.sh).
    #[command(hide = true)]
    Generate(cmd::generate::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(a) => cmd::serve::run(a),
        Command::Stat(a) => cmd::stat::run(a),
        Command::List(a) => cmd::list::run(a),
        Command::Compact(a) => cmd::compact::run(a),
        Command::Swapon(a) => cmd::swapon::run_swapon(a),
        Command::Swapoff(a) => cmd::swapon::run_swapoff(a),
        Command::Restart(a) => cmd::swapon::run_restart(a),
        Command::Supervise(a) => cmd::supervise::run(a),
        Command::SwapSupervisor(a) => cmd::swapon::run_supervisor(a),
        Command::Ublk(a) => cmd::device::run_ublk(a),
        Command::NbdAttach(a) => cmd::device::run_nbd_attach(a),
        Command::Fuse(a) => cmd::fuse::run_fuse(a),
        Command::Dict(a) => cmd::dict::run(a),
        Command::Recompress(a) => cmd::recompress::run(a),
        Command::Set(a) => cmd::set::run(a),
        Command::Writeback(a) => cmd::writeback::run(a),
        Command::Generate(a) => cmd::generate::run(a, <Cli as clap::CommandFactory>::command()),
    };
    if let Err(f) = result {
        if f.has_message() {
            log::error(&f.to_string());
        }
        std::process::exit(f.exit_code());
    }
}
