//! `hwtrace ptdump`: libipt's ptdump command line, same output.

use std::io::Write;
use std::process::ExitCode;

/// Arguments: exactly what libipt's ptdump takes, parsed by hand (see
/// `ptdump::options`) because its syntax (`--cpu 6/142`, `file:0x10-0x80`,
/// order-dependent `--pevent:*`) is not clap's.
#[derive(Debug, clap::Args)]
pub struct PtdumpArgs {
    /// ptdump options and the trace file, e.g. `--time --cpu 6/142 trace.pt`
    /// (`hwtrace ptdump --help` lists them).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        num_args = 0..,
        value_name = "ARGS"
    )]
    pub args: Vec<String>,
}

pub fn run(args: PtdumpArgs) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = crate::ptdump::main(&args.args, &mut out);
    out.flush()?;
    result?;
    Ok(ExitCode::SUCCESS)
}
