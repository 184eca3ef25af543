//! `hwtrace msr`: explain a register value field by field, or build one
//! from named fields. The layouts come from `hwtrace-regs`.

use anyhow::{Context as _, Result, anyhow, bail};
use hwtrace_regs::debugctl::{DebugCtl, DebugCtlLayout};
use hwtrace_regs::explain::{Explanation, parse_number};
use hwtrace_regs::lbr::LbrFormat;
use hwtrace_regs::{Context, RegisterId, Uarch, build, explain};
use std::io::{BufWriter, Write};
use std::process::ExitCode;

/// Explain or build trace-hardware register values (IA32_RTIT_*, IA32_DEBUGCTL, LBR MSRs, ToPA entries).
#[derive(Debug, clap::Args)]
pub struct MsrArgs {
    #[command(subcommand)]
    command: MsrCommand,
}

#[derive(Debug, clap::Subcommand)]
enum MsrCommand {
    /// Print every field of VALUE read as REGISTER, and any reserved bits set.
    Explain(ExplainArgs),
    /// Compose a value of REGISTER from `--set FIELD=VALUE` options.
    Build(BuildArgs),
    /// List the registers hwtrace knows.
    List,
}

/// Options choosing a layout where it depends on the processor.
#[derive(Debug, clap::Args)]
struct LayoutArgs {
    /// Micro-architecture (netburst, core2, nehalem, westmere, sandybridge,
    /// ivybridge, haswell, broadwell, skylake, goldmont, goldmontplus): picks
    /// the DEBUGCTL layout, MSR_LBR_SELECT semantics, LBR format and depth.
    #[arg(long)]
    uarch: Option<String>,
    /// LBR format, `IA32_PERF_CAPABILITIES[5:0]` (0-7); overrides --uarch's.
    #[arg(long)]
    lbr_format: Option<String>,
}

impl LayoutArgs {
    fn context(&self) -> Result<Context> {
        let uarch = self.uarch.as_deref().map(Uarch::from_name).transpose()?;
        let lbr_format = match self.lbr_format.as_deref() {
            None => None,
            Some(s) => {
                let n =
                    parse_number(s).ok_or_else(|| anyhow!("--lbr-format `{s}` is not a number"))?;
                let n = u8::try_from(n).map_err(|_| anyhow!("--lbr-format {n} is out of range"))?;
                Some(LbrFormat::from_encoding(n)?)
            }
        };
        Ok(Context { uarch, lbr_format })
    }
}

#[derive(Debug, clap::Args)]
struct ExplainArgs {
    /// Register: SDM name (IA32_RTIT_CTL, MSR_LBR_SELECT, MSR_LASTBRANCH_3_FROM_IP, TOPA_ENTRY, ...) or MSR number (0x570).
    register: String,
    /// The value (hex with 0x or h, or decimal).
    value: String,
    #[command(flatten)]
    layout: LayoutArgs,
}

#[derive(Debug, clap::Args)]
struct BuildArgs {
    /// Register: SDM name or MSR number.
    register: String,
    /// A field and its value, e.g. `--set TraceEn=1 --set MTCFreq=3`; flags take 0/1 or true/false.
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    set: Vec<String>,
    #[command(flatten)]
    layout: LayoutArgs,
}

/// Runs `hwtrace msr`.
pub fn run(args: MsrArgs) -> Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match args.command {
        MsrCommand::Explain(a) => run_explain(&a, &mut out)?,
        MsrCommand::Build(a) => run_build(&a, &mut out)?,
        MsrCommand::List => run_list(&mut out)?,
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn run_explain(a: &ExplainArgs, out: &mut dyn Write) -> Result<()> {
    let ctx = a.layout.context()?;
    let id = RegisterId::parse(&a.register)?;
    let raw = parse_number(&a.value)
        .ok_or_else(|| anyhow!("`{}` is not a number (use 0x1C4, 1C4h or 452)", a.value))?;
    let e = explain(id, raw, &ctx).with_context(|| format!("cannot explain {id}"))?;
    print_explanation(out, id, &e, &ctx)
}

fn run_build(a: &BuildArgs, out: &mut dyn Write) -> Result<()> {
    let ctx = a.layout.context()?;
    let id = RegisterId::parse(&a.register)?;
    let mut settings = Vec::with_capacity(a.set.len());
    for s in &a.set {
        let (field, value) = s
            .split_once('=')
            .ok_or_else(|| anyhow!("--set `{s}` is not FIELD=VALUE"))?;
        let value = match value.trim().to_ascii_lowercase().as_str() {
            "true" | "on" | "yes" => 1,
            "false" | "off" | "no" => 0,
            v => parse_number(v)
                .ok_or_else(|| anyhow!("--set {field}: `{value}` is not a number"))?,
        };
        settings.push((field.trim(), value));
    }
    if settings.is_empty() {
        bail!(
            "give at least one --set FIELD=VALUE (see `hwtrace msr explain {id} 0` for the field names)"
        );
    }
    let raw =
        build(id, &ctx, settings.iter().copied()).with_context(|| format!("cannot build {id}"))?;
    writeln!(out, "{raw:#x}")?;
    let e = explain(id, raw, &ctx)?;
    print_explanation(out, id, &e, &ctx)
}

fn run_list(out: &mut dyn Write) -> Result<()> {
    for id in RegisterId::ALL {
        let number = id
            .msr()
            .map_or_else(|| "memory".to_string(), |n| format!("{n:#x}"));
        let name = id
            .to_string()
            .replace("_0_", "_n_")
            .replace("ADDR0_", "ADDRn_");
        writeln!(out, "{number:>8}  {name}")?;
    }
    Ok(())
}

fn print_explanation(
    out: &mut dyn Write,
    id: RegisterId,
    e: &Explanation,
    ctx: &Context,
) -> Result<()> {
    let number = id
        .msr()
        .map_or_else(String::new, |n| format!(" (MSR {n:#x})"));
    writeln!(out, "{id}{number} = {:#018x}", e.raw)?;
    let mut layout = e.def.sdm.to_string();
    if let Some(u) = ctx.uarch {
        layout.push_str(&format!("; {u}"));
    }
    writeln!(out, "  layout: {layout}")?;
    let width = e.fields().map(|f| f.name.len()).max().unwrap_or(5).max(5);
    writeln!(
        out,
        "  {:<6} {:<width$} {:>18}  meaning",
        "bits", "field", "value"
    )?;
    for f in e.fields() {
        writeln!(
            out,
            "  {:<6} {:<width$} {:>18}  {}",
            f.bits.to_string(),
            f.name,
            format!("{:#x}", f.value),
            f.meaning
        )?;
    }
    let ranges: Vec<String> = e.reserved_ranges().map(|r| r.to_string()).collect();
    if ranges.is_empty() {
        writeln!(out, "  reserved bits: none set")?;
    } else {
        writeln!(
            out,
            "  reserved bits set: {} (mask {:#x}) — the processor refuses or mis-handles this value",
            ranges.join(", "),
            e.reserved_set()
        )?;
    }
    if id == RegisterId::DebugCtl {
        let layout = if ctx.uarch == Some(Uarch::NetBurst) {
            DebugCtlLayout::NetBurst
        } else {
            DebugCtlLayout::Modern
        };
        let d = DebugCtl::from_raw(e.raw, layout);
        match d.validate() {
            Ok(mode) => writeln!(out, "  BTS: {mode}")?,
            Err(err) => writeln!(out, "  BTS: {} — {err}", d.bts_mode())?,
        }
    }
    Ok(())
}
