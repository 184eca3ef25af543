//! `hwtrace ptxed`: libipt's ptxed command line and output, over hwtrace's
//! flow decoder.
//!
//! ptxed decodes a trace over code images and prints every instruction's
//! address and every event; `--no-inst --check` (what libipt's tests use)
//! prints addresses only. The block decoder (ptxed's default) prints the
//! same instructions; its blocks show in `--block:show-blocks` and
//! `--stat:blocks`.

mod options;
pub(crate) mod print;
mod run;

use std::io::Write;

/// Runs ptxed with `args` (without the program name), writing to `out`.
pub fn main(args: &[String], out: &mut dyn Write) -> anyhow::Result<()> {
    let options = options::parse(args)?;
    run::run(options, out)
}
