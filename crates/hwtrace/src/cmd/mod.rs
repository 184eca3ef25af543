//! One module per subcommand.

mod dump;

use std::process::ExitCode;

/// Every subcommand of `hwtrace`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List the packets of a raw Intel PT trace.
    Dump(dump::DumpArgs),
}

/// Runs one subcommand.
pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Dump(args) => dump::run(args),
    }
}
