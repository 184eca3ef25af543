//! `hwtrace ptxed`: libipt's ptxed command line, same output.

use std::io::Write;
use std::process::ExitCode;

/// Arguments: exactly what libipt's ptxed takes, parsed by hand (see
/// `ptxed::options`) because its syntax (`--raw file:0x2:0x1002`,
/// order-dependent `--cpu`/`--filter` before `--pt`) is not clap's.
#[derive(Debug, clap::Args)]
pub struct PtxedArgs {
    /// ptxed options, e.g. `--raw code.bin:0x1000 --pt trace.pt --no-inst`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        num_args = 0..,
        value_name = "ARGS"
    )]
    pub args: Vec<String>,
}

pub fn run(args: PtxedArgs) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = crate::ptxed::main(&args.args, &mut out);
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
        r => r?,
    }
    result?;
    Ok(ExitCode::SUCCESS)
}
