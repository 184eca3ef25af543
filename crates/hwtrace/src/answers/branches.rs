//! BTS buffers and LBR MSR dumps: branches only, as `Exec::Branch`.
//!
//! The records are read whole at open: a BTS buffer holds at most what a
//! driver allotted (its records are 24 bytes; the list costs 16 bytes per
//! record), an LBR stack at most 32 entries.

use super::source::SourceArgs;
use crate::input::MappedFile;
use anyhow::{Context, Result, anyhow, bail};
use hwtrace_flow::insn::{InsnClass, MAX_INSN_SIZE, classify};
use hwtrace_packet::ExecMode;
use hwtrace_regs::Uarch;
use hwtrace_regs::ds::{DsFormat, DsManagementArea};
use hwtrace_regs::dump::{BtsDump, BtsOrder, LbrMsrDump};
use hwtrace_regs::explain::parse_number;
use hwtrace_regs::lbr::LbrFormat;
use hwtrace_types::{AddressSpace, Ip, ReadMemory};
use std::path::Path;

/// The branches of `--bts` or `--bts-ds`/`--bts-buffer`, oldest first,
/// and the buffer's size in bytes. The buffer order is as `hwtrace bts
/// decode --order auto` reads it.
pub fn bts(args: &SourceArgs) -> Result<(Vec<(Ip, Ip)>, u64)> {
    let format = if args.bts_format == "32" {
        DsFormat::Bits32
    } else {
        DsFormat::Bits64
    };
    let collect = |dump: &BtsDump<'_>| -> Vec<(Ip, Ip)> {
        dump.records()
            .map(|e| (e.record.from, e.record.to))
            .collect()
    };
    match (&args.bts, &args.bts_ds, &args.bts_buffer) {
        (Some(path), _, _) => {
            let file = MappedFile::open(path)?;
            let dump = BtsDump::raw(file.bytes(), format)
                .with_context(|| format!("--bts: {}", path.display()))?;
            Ok((collect(&dump), file.bytes().len() as u64))
        }
        (None, Some(ds), Some(buffer)) => {
            let ds_file = MappedFile::open(ds)?;
            let area = DsManagementArea::parse(ds_file.bytes(), format)
                .with_context(|| format!("--bts-ds: {}", ds.display()))?;
            let order = if area.bts_interrupt_threshold > area.bts_absolute_maximum {
                BtsOrder::Circular
            } else {
                BtsOrder::Linear
            };
            let buf_file = MappedFile::open(buffer)?;
            let dump = BtsDump::new(&area, buf_file.bytes(), format, order).with_context(|| {
                format!("--bts-buffer: {} with {}", buffer.display(), ds.display())
            })?;
            Ok((collect(&dump), buf_file.bytes().len() as u64))
        }
        _ => bail!("give --bts RAWFILE, or --bts-ds DSFILE --bts-buffer BUFFILE"),
    }
}

fn number(flag: &str, s: &str) -> Result<u64> {
    parse_number(s).ok_or_else(|| anyhow!("{flag} `{s}` is not a number"))
}

/// The entries of the LBR MSR dump at `path`, oldest first.
pub fn lbr(args: &SourceArgs, path: &Path) -> Result<Vec<(Ip, Ip)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--lbr: cannot read {}", path.display()))?;
    let dump = LbrMsrDump::parse(&text).with_context(|| format!("--lbr: {}", path.display()))?;
    let uarch = args
        .lbr_uarch
        .as_deref()
        .map(Uarch::from_name)
        .transpose()
        .context("--lbr-uarch")?;
    let format = match (
        &args.lbr_format,
        dump.format(),
        uarch.and_then(Uarch::lbr_format),
    ) {
        (Some(s), _, _) => {
            let n = number("--lbr-format", s)?;
            LbrFormat::from_encoding(u8::try_from(n).unwrap_or(u8::MAX))?
        }
        (None, Some(f), _) => f.context("IA32_PERF_CAPABILITIES in the LBR dump")?,
        (None, None, Some(f)) => f,
        (None, None, None) => bail!(
            "--lbr: {}: no LBR format: give --lbr-format N, --lbr-uarch NAME, or IA32_PERF_CAPABILITIES in the dump",
            path.display()
        ),
    };
    let tos = match (&args.lbr_tos, dump.tos) {
        (Some(s), _) => number("--lbr-tos", s)?,
        (None, Some(t)) => t,
        (None, None) => bail!(
            "--lbr: {}: no TOS: give --lbr-tos N or MSR_LASTBRANCH_TOS in the dump",
            path.display()
        ),
    };
    let values = dump
        .values(dump.depth())
        .with_context(|| format!("--lbr: {}", path.display()))?;
    let stack = values
        .stack(tos, format)
        .with_context(|| format!("--lbr: {}", path.display()))?;
    Ok(stack.entries().map(|e| (e.from.ip, e.to.ip)).collect())
}

/// The class of the instruction at `ip` in the images or dump given
/// (64-bit code), `InsnClass::Unknown` without code there.
pub fn class_at<M: ReadMemory>(memory: Option<&M>, ip: Ip) -> InsnClass {
    let Some(memory) = memory else {
        return InsnClass::Unknown;
    };
    let mut buf = [0u8; MAX_INSN_SIZE];
    let Ok(n) = memory.read_memory(AddressSpace::UNKNOWN, ip, &mut buf) else {
        return InsnClass::Unknown;
    };
    classify(&buf[..n], ip.0, ExecMode::Bits64).map_or(InsnClass::Unknown, |d| d.class)
}
