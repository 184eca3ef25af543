//! `hwtrace mem`: page tables of a physical memory dump made readable:
//! translate addresses with the full walk, list the mappings, find the
//! self-map, find the address spaces (CR3s) the dump holds.

use anyhow::{Context, Result, bail};
use hwtrace_mem::paging::{
    DEFAULT_MAX_TABLES, DEFAULT_MAX_TABLES_FOUND, MergeBy, Merged, PageTables, PagingConfig,
    PagingMode, TopTableKind, VaIndices, WalkError, find_top_tables, region_pages, summarize_user,
};
use hwtrace_mem::phys::Dump;
use hwtrace_mem::selfmap::SelfMap;
use hwtrace_types::{Cr3, Ip, PhysAddr};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Page tables of a physical memory dump: translate, maps, selfmap, cr3s.
#[derive(Debug, clap::Args)]
pub struct MemArgs {
    #[command(subcommand)]
    command: MemCommand,
}

#[derive(Debug, clap::Subcommand)]
enum MemCommand {
    /// Translate linear addresses, printing every paging-structure entry on
    /// the way (SDM vol. 3A, §4.5).
    Translate(TranslateArgs),
    /// List the mapped ranges with their rights, like QEMU's `info mem`.
    Maps(MapsArgs),
    /// Find the self-referencing top-level entry and the table bases it gives.
    Selfmap(SelfmapArgs),
    /// Find the address spaces in the dump: every top-level table sharing
    /// the kernel half of the known CR3, with what its user half maps.
    Cr3s(Cr3sArgs),
}

/// Where the page tables come from.
#[derive(Debug, clap::Args)]
struct SpaceArgs {
    /// The physical memory dump: a raw file (FILE, or FILE@PHYSBASE if it
    /// does not start at physical 0) or a QEMU `dump-guest-memory` ELF core.
    #[arg(long)]
    dump: String,
    /// CR3 (hex, 0x optional). Default: vCPU 0's CR3 from an ELF core.
    #[arg(long, value_parser = parse_hex)]
    cr3: Option<u64>,
    /// 5-level paging (CR4.LA57 = 1). Default: from an ELF core's CR4.
    #[arg(long)]
    la57: bool,
    /// The processor's MAXPHYADDR: entry bits from it to 51 are reserved.
    #[arg(long, default_value_t = 52)]
    max_phys_addr: u8,
}

#[derive(Debug, clap::Args)]
struct TranslateArgs {
    #[command(flatten)]
    space: SpaceArgs,
    /// One line per address: `VA PA`, or `VA -` if it does not translate.
    #[arg(long)]
    short: bool,
    /// Linear addresses (hex; WinDbg's `fffff803`7888e000` works too).
    #[arg(required = true, value_parser = parse_hex)]
    addrs: Vec<u64>,
}

#[derive(Debug, clap::Args)]
struct MapsArgs {
    #[command(flatten)]
    space: SpaceArgs,
    /// Exactly QEMU's `info mem`: rights `u`/`-`, `r`, `w`/`-` (XD ignored,
    /// so ranges differing only in XD merge).
    #[arg(long)]
    qemu: bool,
}

#[derive(Debug, clap::Args)]
struct SelfmapArgs {
    #[command(flatten)]
    space: SpaceArgs,
    /// Also print where the entries mapping these addresses appear.
    #[arg(long = "va", value_parser = parse_hex)]
    vas: Vec<u64>,
}

#[derive(Debug, clap::Args)]
struct Cr3sArgs {
    /// The dump; `--cr3` names the known table whose kernel half the others
    /// share (default: vCPU 0's CR3 from an ELF core).
    #[command(flatten)]
    space: SpaceArgs,
    /// One CR3 per line, nothing else.
    #[arg(long)]
    short: bool,
    /// Report at most this many tables.
    #[arg(long, default_value_t = DEFAULT_MAX_TABLES_FOUND)]
    max: usize,
}

/// Parses hex with or without `0x`, ignoring `_` and WinDbg's backtick.
fn parse_hex(s: &str) -> Result<u64, String> {
    let digits: String = s.chars().filter(|c| *c != '_' && *c != '`').collect();
    let hex = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
        .unwrap_or(&digits);
    u64::from_str_radix(hex, 16).map_err(|e| format!("{s:?} is not a hex number: {e}"))
}

/// Splits `FILE@PHYSBASE`; a suffix that is not a number stays in the name.
fn parse_dump_arg(arg: &str) -> (PathBuf, Option<PhysAddr>) {
    if let Some((file, base)) = arg.rsplit_once('@')
        && let Ok(base) = parse_hex(base)
    {
        return (PathBuf::from(file), Some(PhysAddr(base)));
    }
    (PathBuf::from(arg), None)
}

/// The dump, CR3 and configuration to walk with.
struct Space {
    dump: Dump,
    cr3: Cr3,
    config: PagingConfig,
}

impl Space {
    fn open(args: &SpaceArgs) -> Result<Self> {
        let (path, base) = parse_dump_arg(&args.dump);
        let dump = Dump::open(&path, base).context("opening the dump")?;
        let cpu = dump.cpus().first().copied();
        let cr3 = match (args.cr3, cpu) {
            (Some(cr3), _) => Cr3(cr3),
            (None, Some(cpu)) => cpu.cr3(),
            (None, None) => bail!("{}: no CPU state in the dump: give --cr3", path.display()),
        };
        let mode = if args.la57 {
            PagingMode::Level5
        } else {
            cpu.map_or(PagingMode::Level4, |c| c.paging_mode())
        };
        let config = PagingConfig {
            mode,
            max_phys_addr: args.max_phys_addr,
            nxe: true,
        };
        Ok(Self { dump, cr3, config })
    }

    fn tables(&self) -> PageTables<&Dump> {
        PageTables::new(&self.dump, self.cr3, self.config)
    }
}

/// Runs `hwtrace mem`.
pub fn run(args: MemArgs) -> Result<ExitCode> {
    let out = std::io::stdout().lock();
    let mut out = BufWriter::with_capacity(1 << 16, out);
    let ok = match &args.command {
        MemCommand::Translate(a) => translate(a, &mut out)?,
        MemCommand::Maps(a) => maps(a, &mut out)?,
        MemCommand::Selfmap(a) => selfmap(a, &mut out)?,
        MemCommand::Cr3s(a) => cr3s(a, &mut out)?,
    };
    out.flush()?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

fn translate(args: &TranslateArgs, out: &mut dyn Write) -> Result<bool> {
    let space = Space::open(&args.space)?;
    let tables = space.tables();
    let mode = space.config.mode;
    let mut all_ok = true;
    for &va in &args.addrs {
        let result = tables.translate(Ip(va));
        all_ok &= result.is_ok();
        if args.short {
            match result {
                Ok(t) => writeln!(out, "{va:#018x} {:#x}", t.pa)?,
                Err(_) => writeln!(out, "{va:#018x} -")?,
            }
            continue;
        }
        match result {
            Ok(t) => {
                writeln!(
                    out,
                    "{va:#018x} -> {:#x} ({} page, {})",
                    t.pa, t.page_size, t.perms
                )?;
                writeln!(out, "  {}", VaIndices::new(Ip(va), mode))?;
                for step in t.path.steps() {
                    writeln!(out, "  {step}  {}", step.entry.flags())?;
                }
            }
            Err(e) => {
                writeln!(out, "{va:#018x} -> error: {}", e.kind)?;
                if mode.is_canonical(va) {
                    writeln!(out, "  {}", VaIndices::new(Ip(va), mode))?;
                }
            }
        }
    }
    Ok(all_ok)
}

fn maps(args: &MapsArgs, out: &mut dyn Write) -> Result<bool> {
    let space = Space::open(&args.space)?;
    let tables = space.tables();
    let by = if args.qemu {
        MergeBy::UserWrite
    } else {
        MergeBy::Perms
    };
    let mut errors = 0usize;
    for item in Merged::new(tables.mappings(), by) {
        match item {
            Ok(r) => {
                let p = r.perms;
                let u = if p.user { 'u' } else { '-' };
                let w = if p.writable { 'w' } else { '-' };
                write!(
                    out,
                    "{:016x}-{:016x} {:016x} {u}r{w}",
                    r.start,
                    r.end(),
                    r.size
                )?;
                if !args.qemu {
                    write!(out, "{}", if p.no_execute { '-' } else { 'x' })?;
                }
                writeln!(out)?;
            }
            Err(e) => {
                errors += 1;
                report(&e);
            }
        }
    }
    Ok(errors == 0)
}

/// Problems met while listing go to stderr so stdout stays `info mem`-like.
fn report(e: &WalkError) {
    eprintln!("hwtrace: warning: {e}");
}

fn selfmap(args: &SelfmapArgs, out: &mut dyn Write) -> Result<bool> {
    let space = Space::open(&args.space)?;
    let tables = space.tables();
    let all = SelfMap::find_all(&tables)?;
    let Some(found) = SelfMap::find(&tables)? else {
        writeln!(
            out,
            "no self-referencing entry in the {} table at {}",
            space.config.mode.top().table_name(),
            tables.root()
        )?;
        return Ok(false);
    };
    let top = space.config.mode.top();
    let entry_addr = PhysAddr(tables.root().0 + u64::from(found.index()) * 8);
    writeln!(
        out,
        "self-map index {:#x} ({}[{:#05x}] at {} points to its own table)",
        found.index(),
        top.entry_name(),
        found.index(),
        entry_addr
    )?;
    for other in all.iter().filter(|s| s.index() != found.index()) {
        writeln!(out, "also self-referencing: index {:#x}", other.index())?;
    }
    for &level in space.config.mode.levels().iter().rev() {
        if let Some(base) = found.table_base(level) {
            writeln!(out, "{:<4} base {:#018x}", level.table_name(), base.0)?;
        }
    }
    for &va in &args.vas {
        writeln!(out, "{va:#018x}:")?;
        for &level in space.config.mode.levels() {
            if let Some(at) = found.entry_va(level, Ip(va)) {
                writeln!(out, "  {:<5} at {:#018x}", level.entry_name(), at.0)?;
            }
        }
    }
    Ok(true)
}

fn cr3s(args: &Cr3sArgs, out: &mut dyn Write) -> Result<bool> {
    let space = Space::open(&args.space)?;
    let scan = find_top_tables(
        &space.dump,
        region_pages(space.dump.regions()),
        &space.config,
        space.cr3,
        args.max,
    )
    .context("scanning the dump for top-level tables")?;
    let vcpus: Vec<u64> = space
        .dump
        .cpus()
        .iter()
        .map(|c| space.config.root_table(c.cr3()).0)
        .collect();
    let mut all_ok = true;
    for t in &scan.tables {
        if args.short {
            writeln!(out, "{:#x}", t.cr3.0)?;
            continue;
        }
        let tables = PageTables::new(&space.dump, t.cr3, space.config);
        let summary = summarize_user(&tables, DEFAULT_MAX_TABLES);
        let kind = match t.kind {
            TopTableKind::Process => "process".to_owned(),
            TopTableKind::KernelOnly => "kernel only".to_owned(),
            TopTableKind::PtiUser { kernel } => format!("PTI user copy of {:#x}", kernel.0),
        };
        write!(
            out,
            "{:#018x}  {kind}: {} user entries, {} user pages ({:#x} bytes), {} executable ranges",
            t.cr3.0,
            t.user_entries,
            summary.pages,
            summary.bytes,
            summary.exec_ranges.len()
        )?;
        if summary.supervisor_pages > 0 {
            write!(
                out,
                ", {} supervisor pages below the kernel half",
                summary.supervisor_pages
            )?;
        }
        for (n, _) in vcpus.iter().enumerate().filter(|(_, c)| **c == t.cr3.0) {
            write!(out, ", vCPU {n}")?;
        }
        writeln!(out)?;
        for r in &summary.exec_ranges {
            writeln!(
                out,
                "    {:016x}-{:016x} {:016x} {}",
                r.start,
                r.end(),
                r.size,
                r.perms
            )?;
        }
        for e in &summary.errors {
            all_ok = false;
            report(e);
        }
    }
    let totals = format!(
        "{} top-level tables in {} pages ({} with the kernel half rejected as tables){}",
        scan.tables.len(),
        scan.pages_scanned,
        scan.rejected,
        if scan.truncated {
            ", stopped at --max"
        } else {
            ""
        }
    );
    if args.short {
        // stdout stays one CR3 per line.
        eprintln!("hwtrace mem cr3s: {totals}");
    } else {
        writeln!(out, "{totals}")?;
    }
    Ok(all_ok && !scan.truncated)
}
