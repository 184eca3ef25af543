//! `hwtrace lbr decode`: the branches of an LBR stack, oldest first.
//!
//! Input is a text dump of the LBR MSRs, one `REGISTER VALUE` per line
//! (MSR_LASTBRANCH_n_FROM_IP/_TO_IP, MSR_LBR_INFO_n, MSR_LASTBRANCH_TOS,
//! IA32_PERF_CAPABILITIES, by SDM name or MSR number). The entries are
//! decoded per the LBR format (SDM Vol. 3B §18.4.8.1 “LBR Stack and Intel
//! 64 Processors”) and read from TOS + 1 round to TOS (§18.4.8 “LBR
//! Stack”). The decoding itself is `hwtrace_regs::dump`.
//! With `--elf FILE[@BIAS]` every address is followed by its symbol,
//! `(name+0xoff)` (`crate::symbols`).

use anyhow::{Context as _, Result, anyhow, bail};
use hwtrace_regs::Uarch;
use hwtrace_regs::dump::{LbrEntry, LbrMsrDump};
use hwtrace_regs::explain::parse_number;
use hwtrace_regs::lbr::LbrFormat;
use serde_json::json;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::symbols::{SymbolArgs, Symbolizer};

/// Last Branch Record stacks.
#[derive(Debug, clap::Args)]
pub struct LbrArgs {
    #[command(subcommand)]
    command: LbrCommand,
}

#[derive(Debug, clap::Subcommand)]
enum LbrCommand {
    /// Print the branches of an LBR MSR dump, oldest first.
    Decode(DecodeArgs),
}

#[derive(Debug, clap::Args)]
struct DecodeArgs {
    /// Text dump: `REGISTER VALUE` per line, `#` comments.
    file: PathBuf,
    /// MSR_LASTBRANCH_TOS (default: the value in the dump).
    #[arg(long)]
    tos: Option<String>,
    /// LBR format, `IA32_PERF_CAPABILITIES[5:0]` (0-7) (default: the dump's
    /// IA32_PERF_CAPABILITIES, else --uarch's format).
    #[arg(long)]
    format: Option<String>,
    /// Micro-architecture (nehalem, westmere, sandybridge, haswell, skylake, ...):
    /// supplies the format and bounds the stack depth.
    #[arg(long)]
    uarch: Option<String>,
    /// Entries in the stack (default: one past the highest entry in the dump).
    #[arg(long)]
    depth: Option<String>,
    /// One JSON object per branch.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    symbols: SymbolArgs,
}

/// Runs `hwtrace lbr`.
pub fn run(args: LbrArgs) -> Result<ExitCode> {
    match args.command {
        LbrCommand::Decode(args) => decode(args),
    }
}

fn number(flag: &str, s: &str) -> Result<u64> {
    parse_number(s).ok_or_else(|| anyhow!("{flag} `{s}` is not a number"))
}

fn decode(args: DecodeArgs) -> Result<ExitCode> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let dump = LbrMsrDump::parse(&text).with_context(|| format!("{}", args.file.display()))?;
    let uarch = args.uarch.as_deref().map(Uarch::from_name).transpose()?;
    let format = match (
        &args.format,
        dump.format(),
        uarch.and_then(Uarch::lbr_format),
    ) {
        (Some(s), _, _) => {
            let n = number("--format", s)?;
            LbrFormat::from_encoding(u8::try_from(n).unwrap_or(u8::MAX))?
        }
        (None, Some(f), _) => f.context("IA32_PERF_CAPABILITIES in the dump")?,
        (None, None, Some(f)) => f,
        (None, None, None) => bail!(
            "no LBR format: give --format N, --uarch NAME, or IA32_PERF_CAPABILITIES in the dump"
        ),
    };
    let tos = match (&args.tos, dump.tos) {
        (Some(s), _) => number("--tos", s)?,
        (None, Some(t)) => t,
        (None, None) => bail!("no TOS: give --tos N or MSR_LASTBRANCH_TOS in the dump"),
    };
    let depth = match &args.depth {
        Some(s) => u8::try_from(number("--depth", s)?).unwrap_or(u8::MAX),
        None => dump.depth(),
    };
    if let Some(u) = uarch
        && depth > u.lbr_depth()
    {
        bail!(
            "{u} has {} LBR entries, the dump needs {depth}",
            u.lbr_depth()
        );
    }
    let values = dump
        .values(depth)
        .with_context(|| format!("{}", args.file.display()))?;
    let stack = values.stack(tos, format)?;
    let symbols = args.symbols.load()?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    for entry in stack.entries() {
        print(&entry, args.json, &symbols, &mut out)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn print(e: &LbrEntry, json: bool, symbols: &Symbolizer, out: &mut dyn Write) -> Result<()> {
    let in_tsx = e.info.map(|i| i.in_tsx).or(e.from.in_tsx);
    let tsx_abort = e.info.map(|i| i.tsx_abort).or(e.from.tsx_abort);
    if json {
        let mut line = json!({
            "slot": e.slot,
            "from": format!("{:#x}", e.from.ip.0),
            "to": format!("{:#x}", e.to.ip.0),
            "mispredicted": e.mispredicted(),
            "in_tsx": in_tsx,
            "tsx_abort": tsx_abort,
            "cycles": e.cycles(),
        });
        if !symbols.is_empty() {
            line["from_sym"] = json!(symbols.symbolize(e.from.ip.0));
            line["to_sym"] = json!(symbols.symbolize(e.to.ip.0));
        }
        writeln!(out, "{line}")?;
        return Ok(());
    }
    write!(
        out,
        "{} -> {}",
        symbols.address(e.from.ip.0),
        symbols.address(e.to.ip.0)
    )?;
    match e.mispredicted() {
        Some(true) => write!(out, " mispredicted")?,
        Some(false) => write!(out, " predicted")?,
        None => {}
    }
    if in_tsx == Some(true) {
        write!(out, " in_tsx")?;
    }
    if tsx_abort == Some(true) {
        write!(out, " tsx_abort")?;
    }
    if let Some(c) = e.cycles() {
        write!(out, " cycles={c}")?;
    }
    writeln!(out)?;
    Ok(())
}
