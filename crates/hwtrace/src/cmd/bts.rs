//! `hwtrace bts decode`: the branches in a BTS buffer, oldest first.
//!
//! Input is what a driver can save: the DS buffer management area
//! (IA32_DS_AREA points at it) and the BTS buffer from its base, or a file
//! of raw records a drain handler appended (SDM Vol. 3B §18.4.9 “BTS and
//! DS Save Area”). The decoding itself is `hwtrace_regs::dump`.
//! With `--elf FILE[@BIAS]` every address is followed by its symbol,
//! `(name+0xoff)` (`crate::symbols`).

use anyhow::{Context as _, Result, bail};
use hwtrace_regs::ds::{DsFormat, DsManagementArea};
use hwtrace_regs::dump::{BtsDump, BtsEntry, BtsOrder};
use serde_json::json;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::input::MappedFile;
use crate::symbols::{SymbolArgs, Symbolizer};

/// Branch Trace Store records.
#[derive(Debug, clap::Args)]
pub struct BtsArgs {
    #[command(subcommand)]
    command: BtsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum BtsCommand {
    /// Print the branches of a BTS buffer (or raw record file) in the order they were taken.
    Decode(DecodeArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["ds", "records"])))]
struct DecodeArgs {
    /// The DS buffer management area (the bytes IA32_DS_AREA points at).
    #[arg(long, value_name = "DSFILE", requires = "buffer")]
    ds: Option<PathBuf>,
    /// The BTS buffer, from its base (with --ds).
    #[arg(long, value_name = "BUFFILE", requires = "ds")]
    buffer: Option<PathBuf>,
    /// Raw records one after the other, oldest first (instead of --ds/--buffer).
    #[arg(long, value_name = "RAWFILE", conflicts_with_all = ["ds", "buffer"])]
    records: Option<PathBuf>,
    /// Layout: 32 (12-byte records, 4-byte pointers) or 64 (24-byte records).
    #[arg(long, default_value = "64", value_parser = ["32", "64"])]
    format: String,
    /// Buffer order: `linear` (BTINT = 1, or drained), `circular` (BTINT = 0:
    /// the oldest record is at the index once the buffer wrapped), or `auto`:
    /// circular when the interrupt threshold lies beyond the absolute
    /// maximum, as the SDM asks of circular buffers.
    #[arg(long, default_value = "auto", value_parser = ["auto", "linear", "circular"])]
    order: String,
    /// One JSON object per branch.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    symbols: SymbolArgs,
}

/// Runs `hwtrace bts`.
pub fn run(args: BtsArgs) -> Result<ExitCode> {
    match args.command {
        BtsCommand::Decode(args) => decode(args),
    }
}

fn decode(args: DecodeArgs) -> Result<ExitCode> {
    let format = if args.format == "32" {
        DsFormat::Bits32
    } else {
        DsFormat::Bits64
    };
    let symbols = args.symbols.load()?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match (&args.ds, &args.buffer, &args.records) {
        (_, _, Some(path)) => {
            let file = MappedFile::open(path)?;
            let dump = BtsDump::raw(file.bytes(), format)
                .with_context(|| format!("{}", path.display()))?;
            print(&dump, args.json, &symbols, &mut out)?;
        }
        (Some(ds), Some(buffer), None) => {
            let ds_file = MappedFile::open(ds)?;
            let area = DsManagementArea::parse(ds_file.bytes(), format)
                .with_context(|| format!("{}", ds.display()))?;
            let order = match args.order.as_str() {
                "linear" => BtsOrder::Linear,
                "circular" => BtsOrder::Circular,
                _ if area.bts_interrupt_threshold > area.bts_absolute_maximum => BtsOrder::Circular,
                _ => BtsOrder::Linear,
            };
            let buf_file = MappedFile::open(buffer)?;
            let dump = BtsDump::new(&area, buf_file.bytes(), format, order)
                .with_context(|| format!("{} with {}", buffer.display(), ds.display()))?;
            print(&dump, args.json, &symbols, &mut out)?;
        }
        _ => bail!("give --ds DSFILE --buffer BUFFILE, or --records RAWFILE"),
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn print(dump: &BtsDump<'_>, json: bool, symbols: &Symbolizer, out: &mut dyn Write) -> Result<()> {
    for BtsEntry { slot, record } in dump.records() {
        let (from, to) = (record.from.0, record.to.0);
        if json {
            let mut line = json!({
                "slot": slot,
                "from": format!("{from:#x}"),
                "to": format!("{to:#x}"),
                "predicted": record.predicted,
            });
            if !symbols.is_empty() {
                line["from_sym"] = json!(symbols.symbolize(from));
                line["to_sym"] = json!(symbols.symbolize(to));
            }
            writeln!(out, "{line}")?;
        } else {
            let flag = if record.predicted {
                "predicted"
            } else {
                "mispredicted"
            };
            writeln!(
                out,
                "{} -> {} {flag}",
                symbols.address(from),
                symbols.address(to)
            )?;
        }
    }
    Ok(())
}
