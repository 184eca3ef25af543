//! `hwtrace ptdump`: a drop-in for libipt's ptdump.
//!
//! It takes ptdump's command line and prints what ptdump prints (column
//! layout, error lines, resynchronisation, timing columns, errata), so
//! existing users can alias it. The packets come from `hwtrace-packet`,
//! timing from `hwtrace-flow`'s time module; this module only decides what
//! to show and how.

pub(crate) mod cpu;
mod dump;
mod format;
mod line;
mod options;
mod quirks;

use std::io::Write;

use anyhow::{Context, bail};

use crate::input::MappedRange;
use hwtrace_flow::TimeConfig;
use hwtrace_perf::pevent::Session;
use hwtrace_types::Tsc;

pub use dump::SidebandSink;
pub use options::{Invocation, Options, parse};

use cpu::{Cpu, Errata};
use dump::{DumpConfig, Dumper};
use options::{CpuChoice, FileRange, HELP};

/// Maps a file or the `from..to` part of it, with ptdump's checks.
pub fn load_range(range: &FileRange) -> anyhow::Result<MappedRange> {
    let whole = MappedRange::whole(&range.path)
        .with_context(|| format!("failed to open {}", range.path.display()))?;
    let size = whole.file_len();
    if range.from >= size {
        bail!("bad offset {:#x} into {}", range.from, range.path.display());
    }
    let end = range.to.unwrap_or(size);
    match whole.narrowed(range.from..end) {
        Some(part) => Ok(part),
        None => bail!("bad range {end:#x} in {}", range.path.display()),
    }
}

/// The errata for `--cpu`, or the diagnostic ptdump prints when the
/// processor is unknown (decoding then goes on without workarounds).
fn errata(choice: CpuChoice, out: &mut dyn Write) -> std::io::Result<Errata> {
    let cpu = match choice {
        CpuChoice::None => return Ok(Errata::default()),
        CpuChoice::Auto => Cpu::current(),
        CpuChoice::Model(cpu) => Some(cpu),
    };
    match cpu.map(Cpu::errata) {
        Some(Ok(errata)) => Ok(errata),
        _ => {
            writeln!(out, "[0: failed to determine errata: unknown cpu]")?;
            Ok(Errata::default())
        }
    }
}

/// Prints a session's records as the trace's time reaches them.
struct SessionSink(Session);

impl SidebandSink for SessionSink {
    fn dump_until(&mut self, tsc: Tsc, out: &mut dyn Write) -> std::io::Result<()> {
        self.0.dump_due(tsc, out)
    }
}

/// Runs ptdump with the given options, printing to `out`.
pub fn dump(options: &Options, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut session = if options.sideband.files.is_empty() {
        None
    } else {
        let session = options.sideband.clone().into_session();
        Some(SessionSink(session.context("error loading sideband")?))
    };
    let errata = errata(options.cpu, out)?;
    let trace = load_range(&options.trace)?;
    if let Some(SessionSink(session)) = session.as_mut() {
        // Diagnostics about unreadable sideband come before the trace.
        session.start(out)?;
    }
    let time = TimeConfig {
        mtc_freq: options.mtc_freq,
        nom_freq: options.nom_freq,
        cpuid_0x15_eax: options.cpuid_0x15_eax,
        cpuid_0x15_ebx: options.cpuid_0x15_ebx,
        skl168: errata.skl168,
    };
    let config = DumpConfig {
        options,
        errata,
        time,
    };
    let sideband = session.as_mut().map(|s| s as &mut dyn SidebandSink);
    Dumper::new(config, out, sideband).run(trace.bytes())?;
    Ok(())
}

/// Runs a whole ptdump command line (without the program name).
pub fn main(args: &[String], out: &mut dyn Write) -> anyhow::Result<()> {
    match parse(args)? {
        Invocation::Help => out.write_all(HELP.as_bytes())?,
        Invocation::Version => writeln!(out, "hwtrace ptdump {}", env!("CARGO_PKG_VERSION"))?,
        Invocation::Dump(options) => dump(&options, out)?,
    }
    Ok(())
}
