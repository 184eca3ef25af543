//! The `hwtrace` command line: thin wiring of the library crates.
//!
//! Each subcommand lives in `cmd/<name>.rs` with its arguments and a `run`
//! function; this file only dispatches and turns errors into exit codes.

mod answers;
mod cmd;
mod flow;
mod image_args;
mod input;
mod perfdecode;
mod progress;
mod ptdump;
mod ptxed;
mod symbols;
mod timing_args;

use clap::Parser;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "hwtrace",
    version,
    about = "x86 hardware branch tracing: Intel PT, BTS and LBR"
)]
struct Cli {
    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A corrupt PDB is reported as an error, without the panic message the
    // `pdb` crate's reader would print first.
    hwtrace_report::symbols::quiet_caught_panics();
    match cmd::run(cli.command) {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("hwtrace: error: {err:#}");
            ExitCode::from(1)
        }
    }
}

/// A closed pipe (`hwtrace dump big.pt | head`) is how a reader says it has
/// seen enough, not a failure.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
