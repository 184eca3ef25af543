//! One module per subcommand.

use std::process::ExitCode;

/// Every subcommand of `hwtrace`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {}

/// Runs one subcommand.
pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {}
}
