//! `hwtrace flow --time`: the flow's lines stamped with times as libipt's
//! ptxed stamps them (`--time`, `--event:time`; `--ticks` is its
//! `--event:tick`), checked three ways:
//! - the libipt corpus cases whose expected ptxed output has times: the
//!   same events at the same times, the same instructions, each stamped
//!   with the time of the event before it;
//! - a real execution (qemu-user) encoded with TSC, MTC and CYC packets
//!   on a clock of one TSC tick per instruction: the times never go
//!   back, and every instruction's and tick's time is within one MTC
//!   period of the clock's time there;
//! - the same trace decoded on three threads with a seam at every PSB, and
//!   by the instruction decoder, prints the same bytes (text and JSON,
//!   instructions, blocks and branches).
//!
//! Needs `qemu-x86_64` (`scripts/setup.sh`) for the recorded execution.

mod common;

use anyhow::{Context, Result, bail, ensure};
use common::qemu::{Scratch, record, text};
use common::{hwtrace_in, shared};
use hwtrace_sim::{PtConfig, PtEncoder, Timing, TscModel};
use std::path::Path;

/// Our flow options for a ptxed option list that only asks for times and
/// ticks and gives the clock's ratios; `None` if it asks for anything else.
fn as_flow_options(ptxed: &[&str]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut args = ptxed.iter();
    while let Some(&arg) = args.next() {
        match arg {
            "--event:time" => out.push("--time".into()),
            "--event:tick" => out.push("--ticks".into()),
            "--insn:keep-tcal-on-ovf" | "--block:keep-tcal-on-ovf" => {
                if !out.iter().any(|o| o == "--keep-tcal-on-ovf") {
                    out.push("--keep-tcal-on-ovf".into());
                }
            }
            "--mtc-freq" | "--nom-freq" | "--cpuid-0x15.eax" | "--cpuid-0x15.ebx" => {
                out.push(arg.into());
                out.push((*args.next()?).into());
            }
            _ => return None,
        }
    }
    out.iter().any(|o| o == "--time").then_some(out)
}

/// A line of `hwtrace flow --time --no-disasm`: an instruction's time and
/// address, or any other line as it is.
enum Line<'a> {
    Insn { time: u64, ip: &'a str },
    Other(&'a str),
}

fn parse_line(line: &str) -> Result<Line<'_>> {
    if line.starts_with('[') {
        return Ok(Line::Other(line));
    }
    let (time, ip) = line
        .split_once("  ")
        .with_context(|| format!("no time on {line:?}"))?;
    let time = u64::from_str_radix(time, 16).with_context(|| format!("time of {line:?}"))?;
    Ok(Line::Insn { time, ip })
}

/// The time inside `[TIME  what]`, if the event line has one.
fn event_time(line: &str) -> Option<u64> {
    let inner = line.strip_prefix('[')?;
    let (time, _) = inner.split_once("  ")?;
    (time.len() == 16)
        .then(|| u64::from_str_radix(time, 16).ok())
        .flatten()
}

#[test]
fn corpus_times_are_ptxed_times() -> Result<()> {
    let mut dirs: Vec<_> = std::fs::read_dir(shared().join("libipt"))
        .context("../shared/corpus/libipt")?
        .flatten()
        .map(|d| d.path())
        .collect();
    dirs.sort();
    let mut checked = Vec::new();
    for dir in dirs {
        let case: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json"))?)?;
        let Some(exp) = case["expected"]["flow"].as_array().and_then(|a| a.first()) else {
            continue;
        };
        let ptxed: Vec<&str> = case["ptxed_options"]
            .as_array()
            .context("ptxed_options")?
            .iter()
            .filter_map(|o| o.as_str())
            .collect();
        let Some(options) = as_flow_options(&ptxed) else {
            continue;
        };
        let name = case["name"].as_str().context("name")?;
        let image = &case["images"][0];
        let mut args = vec![
            "flow".to_string(),
            "--no-disasm".into(),
            "--image".into(),
            format!(
                "{}@{}",
                image["file"].as_str().context("image file")?,
                image["load_address"].as_str().context("load address")?
            ),
            case["trace"].as_str().context("trace")?.into(),
        ];
        args.extend(options);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = hwtrace_in(&dir, &args)?;
        let ours = String::from_utf8(out.stdout)?;
        let want = std::fs::read_to_string(dir.join(exp.as_str().context("expected file")?))?;
        // Instructions lose their time to compare with ptxed's lines (it
        // was not asked for it); the time must be the last event's.
        let mut now = None;
        let mut compared = Vec::new();
        for line in ours.lines() {
            match parse_line(line)? {
                Line::Insn { time, ip } => {
                    if let Some(now) = now {
                        ensure!(
                            time == now,
                            "{name}: {line:?} stamped {time:#x}, the last event said {now:#x}"
                        );
                    }
                    compared.push(ip.to_string());
                }
                Line::Other(l) => {
                    if let Some(t) = event_time(l) {
                        now = Some(t);
                    }
                    compared.push(l.to_string());
                }
            }
        }
        let want: Vec<&str> = want
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && *l != "[end of trace]")
            .collect();
        ensure!(
            compared == want,
            "{name} {args:?}:\nours:\n{}\nptxed:\n{}",
            compared.join("\n"),
            want.join("\n")
        );
        ensure!(
            compared.iter().any(|l| event_time(l).is_some()),
            "{name}: no event with a time"
        );
        checked.push(name.to_string());
    }
    // ptxed-tick, mtc-ovf_reset-cyc, mtc-ovf_keep-cyc (the last needs
    // --keep-tcal-on-ovf to keep its tick after the overflow).
    ensure!(checked.len() >= 3, "only {checked:?}");
    Ok(())
}

/// One TSC tick per instruction from 2^20; core 32 × bus clock, TSC
/// 24 × bus, 108 TSC ticks per crystal tick (`hwtrace sim pt`'s ratios).
const CLOCK: TscModel = TscModel {
    start: 1 << 20,
    ticks_per_insn: 1,
};
const MTC_FREQ: u8 = 3;
const TIMING: Timing = Timing {
    mtc_freq: Some(MTC_FREQ),
    cyc_thresh: Some(0),
    cbr: Some(32),
    tsc_bus_ratio: 24,
    tsc_ctc_ratio: Some((2, 216)),
};
/// One MTC period in TSC ticks: 2^MTC_FREQ crystal ticks of 108.
const MTC_PERIOD: u64 = (1 << MTC_FREQ) * 216 / 2;

/// The flow options that make the packets above time.
const TIMING_OPTIONS: [&str; 8] = [
    "--mtc-freq",
    "3",
    "--nom-freq",
    "24",
    "--cpuid-0x15.eax",
    "2",
    "--cpuid-0x15.ebx",
    "216",
];

fn run(dir: &Path, args: &[&str]) -> Result<String> {
    let out = hwtrace_in(dir, args)?;
    ensure!(
        out.status.success(),
        "hwtrace {args:?}: {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

#[test]
fn times_of_a_real_execution_follow_its_clock() -> Result<()> {
    let scratch = Scratch::new("flow-time", "sort")?;
    let input = scratch.file("input.txt", text(40, &["tsc", "mtc", "cyc"], 4).as_bytes())?;
    let rec = record(
        "/usr/bin/sort",
        &[input.to_str().context("UTF-8 path")?],
        250_000,
    )?;
    let execution = &rec.execution;
    let config = PtConfig {
        tsc: Some(CLOCK),
        timing: TIMING,
        psb_period: 1024,
        ..PtConfig::default()
    };
    let trace = PtEncoder::new(config).encode(execution)?;
    ensure!(trace.stats.cycs > 0 && trace.stats.mtcs > 0, "no timing");
    scratch.file("trace.pt", &trace.bytes)?;
    let mut base: Vec<String> = vec!["flow".into(), "trace.pt".into()];
    for (n, seg) in execution.memory().segments().iter().enumerate() {
        let name = format!("seg{n}.bin");
        scratch.file(&name, &seg.bytes)?;
        base.extend(["--image".into(), format!("{name}@{:x}", seg.addr.0)]);
    }
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let dir = &scratch.0;

    let text = run(
        dir,
        &[
            &base[..],
            &TIMING_OPTIONS,
            &["--time", "--ticks", "--no-disasm"],
        ]
        .concat(),
    )?;
    let executed = execution.insns();
    let (mut index, mut last, mut ticks) = (0usize, 0u64, 0usize);
    let (mut ahead, mut behind) = (i128::MIN, 0i128);
    for line in text.lines() {
        let time = match parse_line(line)? {
            Line::Insn { time, ip } => {
                let want = executed.get(index).context("more instructions than ran")?;
                ensure!(
                    u64::from_str_radix(ip, 16)? == want.0,
                    "instruction {index}: {line:?}, ran {:#x}",
                    want.0
                );
                // Stamped with the time of the event before it. PT times a
                // packet when it is written (a TNT packet after the last
                // of its branches, so ahead of the ones before), and CYC
                // estimates calibrated by MTCs trail the clock by up to a
                // period: within one MTC period either way (sort: 63
                // behind to 110 ahead). Without the ticks' CYC time the
                // error grows to the instructions between two PSBs'
                // TSCs, thousands here.
                let clock = CLOCK.start + index as u64;
                ensure!(
                    time.abs_diff(clock) <= MTC_PERIOD,
                    "instruction {index} stamped {time:#x}, the clock {clock:#x}"
                );
                index += 1;
                time
            }
            Line::Other(l) => {
                let time = event_time(l).with_context(|| format!("no time on {l:?}"))?;
                if l.ends_with("  tick]") {
                    // A tick comes before the instruction after its branch.
                    let clock = (CLOCK.start + index as u64) as i128;
                    let err = i128::from(time) - clock;
                    (ahead, behind) = (ahead.max(err), behind.min(err));
                    ensure!(
                        err.unsigned_abs() <= u128::from(MTC_PERIOD),
                        "tick before instruction {index} at {time:#x}, the clock {clock:#x}"
                    );

                    ticks += 1;
                }
                time
            }
        };
        ensure!(time >= last, "time went back at {line:?} after {last:#x}");
        last = time;
    }
    ensure!(
        index == executed.len(),
        "{index} of {} instructions",
        executed.len()
    );
    ensure!(ticks > 1000, "only {ticks} ticks");
    eprintln!(
        "{index} instructions, {ticks} ticks: {} TSC ticks behind to {ahead} ahead of the clock",
        -behind
    );

    // The same bytes from three threads (a seam at every PSB) and from the
    // instruction decoder, in every shape of output. With the nominal
    // ratio CYC is calibrated from each PSB+'s CBR at once; without it,
    // from MTC periods, which a work unit starting at its PSB learns
    // again from the packets before it.
    let mtc_only: Vec<&str> = TIMING_OPTIONS
        .chunks(2)
        .filter(|o| o[0] != "--nom-freq")
        .flatten()
        .copied()
        .collect();
    for timing in [&TIMING_OPTIONS[..], &mtc_only] {
        for shape in [
            &["--time", "--ticks", "--no-disasm"][..],
            &["--time", "--json"],
            &["--time", "--blocks"],
            &["--time", "--ticks", "--branches", "--json"],
        ] {
            let args = [&base[..], timing, shape].concat();
            let one = run(dir, &[&args[..], &["--jobs", "1"]].concat())?;
            ensure!(one.lines().count() > 1000, "{shape:?}: little printed");
            let many = run(
                dir,
                &[&args[..], &["--jobs", "3", "--unit-bytes", "1"]].concat(),
            )?;
            if one != many {
                let at = one.lines().zip(many.lines()).position(|(a, b)| a != b);
                bail!("{timing:?} {shape:?}: --jobs 3 differs from --jobs 1 at line {at:?}");
            }
            let insn = run(dir, &[&args[..], &["--decoder", "insn"]].concat())?;
            ensure!(
                one == insn,
                "{timing:?} {shape:?}: the instruction decoder differs"
            );
        }
    }
    Ok(())
}
