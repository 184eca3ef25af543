//! One module per subcommand.

mod dump;
mod mem;

use std::process::ExitCode;

/// Every subcommand of `hwtrace`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List the packets of a raw Intel PT trace.
    Dump(dump::DumpArgs),
    /// Page tables of a physical memory dump: translate, maps, selfmap.
    Mem(mem::MemArgs),
}

/// Runs one subcommand.
pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Dump(args) => dump::run(args),
        Command::Mem(args) => mem::run(args),
    }
}
