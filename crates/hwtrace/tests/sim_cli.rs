//! `hwtrace sim pt|bts|lbr` run as the built binary on `/bin/true`
//! recorded with qemu-user, and the output stage it uses checked at the
//! library level: a trace read back from single-range or ToPA output
//! decodes, with hwtrace-flow over the execution's code, to exactly the
//! executed instructions (the CLI cannot be checked that way, since its
//! trace file does not carry the code bytes).
//!
//! Needs `qemu-x86_64` (`scripts/setup.sh`).

use anyhow::{Context, Result, ensure};
use hwtrace_flow::Config;
use hwtrace_flow::insn::{Insn, InsnDecoder};
use hwtrace_packet::{Packet, PacketDecoder};
use hwtrace_regs::topa::{TopaEntry, TopaSize};
use hwtrace_sim::{Execution, Limits, OutputTarget, PtConfig, PtEncoder, TopaTable, write_output};
use hwtrace_types::{PhysAddr, TraceOffset};
use std::path::PathBuf;

mod common;
use common::{fails, hwtrace, ok};

/// A scratch path unique to this test process and `name`.
fn scratch(name: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// Every packet of a trace that must decode from its first byte.
fn packets(bytes: &[u8]) -> Vec<Packet> {
    let mut dec = PacketDecoder::new(bytes);
    let mut out = Vec::new();
    while let Some(p) = dec.next_packet().expect("every packet decodes") {
        out.push(p.packet);
    }
    out
}

/// The number before `word` in `text` (e.g. "12 PSBs").
fn count_before(text: &str, word: &str) -> u64 {
    let words: Vec<&str> = text.split([' ', ',', '\n']).collect();
    let at = words
        .iter()
        .position(|w| *w == word)
        .unwrap_or_else(|| panic!("no `{word}` in {text}"));
    words[at - 1].parse().expect("a number")
}

/// The value column of `field` in the explanation of `register`.
fn field_value(text: &str, register: &str, field: &str) -> String {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(register));
    lines
        .next()
        .unwrap_or_else(|| panic!("no {register} in {text}"));
    let line = lines
        .take_while(|l| l.starts_with(' '))
        .find(|l| l.split_whitespace().nth(1) == Some(field))
        .unwrap_or_else(|| panic!("no {field} under {register}"));
    line.split_whitespace().nth(2).expect("value").to_string()
}

#[test]
fn sim_pt_writes_a_trace_that_dump_reads_without_errors() {
    let path = scratch("t.pt");
    let p = path.to_str().expect("UTF-8 path");
    let out = ok(&["sim", "pt", "--qemu", "-o", p, "--", "/bin/true"]);
    let bytes = std::fs::read(&path).expect("the trace was written");
    assert_eq!(count_before(&out, "trace"), bytes.len() as u64);
    let dump = hwtrace(&["dump", p, "--stats"]);
    assert!(
        dump.status.success(),
        "dump failed: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let all = packets(&bytes);
    assert!(matches!(all.first(), Some(Packet::Psb)));
    let psbs = all.iter().filter(|p| matches!(p, Packet::Psb)).count() as u64;
    assert_eq!(psbs, count_before(&out, "PSBs"));
    // /bin/true ends in exit_group: its SYSCALL leaves user mode.
    assert!(
        matches!(all.last(), Some(Packet::TipPgd(_))),
        "{:?}",
        all.last()
    );
    // No output stage: IA32_RTIT_CTL is explained, with ToPA = 0.
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "ToPA"), "0x0");
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "TraceEn"), "0x1");
}

/// `--code-out` writes the code the program ran as a page cache: `hwtrace
/// flow` decodes the trace over it, every instruction the simulator
/// encoded and no error, with and without return compression.
#[test]
fn sim_pt_code_out_lets_flow_decode_the_trace() {
    for extra in [&[][..], &["--no-retcomp", "--psb-period", "512"]] {
        let path = scratch("code-out.pt");
        let code = scratch("code-out");
        let (p, c) = (
            path.to_str().expect("UTF-8 path"),
            code.to_str().expect("UTF-8 path"),
        );
        let args = [
            &["sim", "pt", "--qemu", "-o", p, "--code-out", c][..],
            extra,
            &["--", "/bin/true"],
        ]
        .concat();
        let out = ok(&args);
        let insns = count_before(&out, "instructions");
        assert!(insns > 10_000, "{out}");
        assert!(out.contains(&format!("--pages {c}")), "{out}");
        let flow = ok(&["flow", p, "--pages", c, "--quiet", "--stats"]);
        assert!(
            flow.starts_with(&format!("[stats: {insns} instructions,"))
                && flow.contains(" 0 errors,"),
            "{extra:?}: {flow}"
        );
        let _ = std::fs::remove_dir_all(&code);
    }
}

/// Seed 000's shape: two 4 KiB regions, INT and STOP on the last. The
/// trace (every RET a TIP, PSB every 256 bytes, TSC) is longer than 8 KiB,
/// so STOP fires: the file is the first 8 KiB and STATUS.Stopped is set.
#[test]
fn sim_pt_through_a_topa_with_stop() {
    let path = scratch("topa.pt");
    let p = path.to_str().expect("UTF-8 path");
    let out = ok(&[
        "sim",
        "pt",
        "--qemu",
        "--no-retcomp",
        "--psb-period",
        "256",
        "--tsc",
        "--topa",
        "4K,4K,int,stop",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    assert!(count_before(&out, "trace") > 8192, "{out}");
    let bytes = std::fs::read(&path).expect("written");
    assert_eq!(bytes.len(), 8192);
    assert!(hwtrace_packet::is_psb_at(&bytes, 0));
    assert!(out.contains("PMI after byte 8192"), "{out}");
    assert_eq!(field_value(&out, "IA32_RTIT_STATUS", "Stopped"), "0x1");
    assert_eq!(field_value(&out, "IA32_RTIT_STATUS", "TriggerEn"), "0x0");
    assert_eq!(
        field_value(&out, "IA32_RTIT_OUTPUT_MASK_PTRS", "MaskOrTableOffset"),
        "0x1"
    );
    assert_eq!(
        field_value(&out, "IA32_RTIT_OUTPUT_MASK_PTRS", "OutputOffset"),
        "0x1000"
    );
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "ToPA"), "0x1");
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "DisRETC"), "0x1");
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "TSCEn"), "0x1");
}

/// Seed 000's single range with a 4 KiB mask: the file is the newest
/// 4 KiB, and OutputOffset is the trace length modulo 4 KiB.
#[test]
fn sim_pt_through_a_4k_single_range() {
    let path = scratch("single.pt");
    let p = path.to_str().expect("UTF-8 path");
    let out = ok(&[
        "sim",
        "pt",
        "--qemu",
        "--single-range",
        "4K",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    let len = count_before(&out, "trace");
    assert!(len > 4096, "{out}");
    assert_eq!(std::fs::read(&path).expect("written").len(), 4096);
    let offset = field_value(&out, "IA32_RTIT_OUTPUT_MASK_PTRS", "OutputOffset");
    assert_eq!(offset, format!("{:#x}", len % 4096));
}

#[test]
fn sim_pt_refuses_bad_options() {
    let p = scratch("bad.pt");
    let p = p.to_str().expect("UTF-8 path");
    let err = fails(&[
        "sim",
        "pt",
        "--qemu",
        "--topa",
        "5K",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    assert!(err.contains("not a ToPA size"), "{err}");
    let err = fails(&[
        "sim",
        "pt",
        "--qemu",
        "--filter",
        "0x20-0x10",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    assert!(err.contains("START is above END"), "{err}");
    let err = fails(&[
        "sim",
        "pt",
        "--qemu",
        "--filter",
        "0x1000-1g00",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    assert!(err.contains("`1g00` is not a hex address"), "{err}");
    let err = fails(&[
        "sim",
        "pt",
        "--qemu",
        "--single-range",
        "3000",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    assert!(err.contains("power of two"), "{err}");
}

#[test]
fn sim_bts_prints_one_record_per_branch() {
    let out = ok(&[
        "sim",
        "bts",
        "--qemu",
        "--records",
        "512",
        "--",
        "/bin/true",
    ]);
    let records = out.lines().filter(|l| l.contains(" -> ")).count() as u64;
    let written = count_before(&out, "records");
    let branches = out
        .split("records written (")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .expect("branch count");
    assert!(branches > 1000, "{out}");
    assert_eq!(written, branches);
    assert_eq!(records, branches);
    assert!(count_before(&out, "threshold") > 0, "{out}");
}

/// The LBR MSRs at the end read back with `hwtrace lbr decode`.
#[test]
fn sim_lbr_prints_msrs_that_lbr_decode_reads() {
    let out = ok(&[
        "sim",
        "lbr",
        "--qemu",
        "--uarch",
        "skylake",
        "--select",
        "0x1C4",
        "--",
        "/bin/true",
    ]);
    assert!(out.contains("MSR_LASTBRANCH_TOS"), "{out}");
    let path = scratch("lbr.txt");
    std::fs::write(&path, &out).expect("write");
    let decoded = ok(&[
        "lbr",
        "decode",
        path.to_str().expect("UTF-8 path"),
        "--json",
    ]);
    let entries = decoded.lines().filter(|l| l.starts_with('{')).count();
    assert_eq!(entries, 32, "Skylake's stack is full after /bin/true");
}

/// Decodes `trace` with hwtrace-flow over `execution`'s code, from its
/// first PSB; every instruction until the end, and no errors.
fn flow_decode(execution: &Execution, trace: &[u8]) -> Result<Vec<u64>> {
    let mut dec = InsnDecoder::new(trace, Config::default(), execution.memory());
    let mut status = dec.sync_forward()?;
    let mut ips = Vec::new();
    loop {
        while status.event_pending {
            status = dec.event()?.1;
        }
        if status.eos {
            return Ok(ips);
        }
        let mut insn = Insn::empty(0, None, false);
        match dec.next_insn(&mut insn) {
            Ok(s) => {
                ips.push(insn.ip);
                status = s;
            }
            Err(e) if e.kind == hwtrace_flow::ErrorKind::Eos => return Ok(ips),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The output stage `hwtrace sim pt` uses, checked where the code bytes
/// are at hand: a single range large enough reads back the whole trace,
/// and a wrapping ToPA ring reads back its newest bytes, which decode from
/// their first PSB to exactly the instructions executed from there.
#[test]
fn read_back_output_decodes_to_the_executed_instructions() -> Result<()> {
    let rec = Execution::record_qemu("/bin/true", &[] as &[&str], Limits::default())
        .context("recording /bin/true under qemu-x86_64")?;
    let execution = &rec.execution;
    let trace = PtEncoder::new(PtConfig::default()).encode(execution)?;
    let executed: Vec<u64> = execution.insns().iter().map(|ip| ip.0).collect();

    let whole = write_output(
        &trace.bytes,
        &OutputTarget::SingleRange {
            base: PhysAddr(1 << 32),
            size: 1 << 20,
        },
        None,
    )?;
    ensure!(whole.read_back() == trace.bytes);
    ensure!(flow_decode(execution, &whole.read_back())? == executed);

    // One 4 KiB region, END back to the table: it wraps.
    let table = PhysAddr(0x1000);
    let ring = write_output(
        &trace.bytes,
        &OutputTarget::Topa {
            tables: vec![TopaTable {
                base: table,
                entries: vec![
                    TopaEntry::output(PhysAddr(0x10_0000), TopaSize::SIZE_4K, true, false),
                    TopaEntry::end_link(table),
                ],
            }],
        },
        None,
    )?;
    let back = ring.read_back();
    let cut = trace.bytes.len() - back.len();
    ensure!(cut > 0, "the trace must wrap the 4 KiB ring");
    ensure!(back == trace.bytes[cut..]);
    let psb = trace
        .psbs
        .iter()
        .find(|m| m.offset.0 as usize >= cut)
        .context("a PSB in the newest 4 KiB")?;
    let from = psb.offset.0 as usize - cut;
    let mut dec = PacketDecoder::new(&back);
    ensure!(dec.sync_forward()? == TraceOffset(from as u64));
    ensure!(flow_decode(execution, &back[from..])? == executed[psb.insn_index..]);
    Ok(())
}

/// A consumer draining 64 bytes per KiB behind a 4 KiB single range: the
/// tracer loses packets, each loss ends with OVF before a PSB, and the file
/// (everything the consumer read) decodes packet by packet.
#[test]
fn sim_pt_slow_consumer_loses_packets_behind_ovf() {
    let path = scratch("slow.pt");
    let p = path.to_str().expect("UTF-8 path");
    let out = ok(&[
        "sim",
        "pt",
        "--qemu",
        "--no-retcomp",
        "--psb-period",
        "256",
        "--single-range",
        "4K",
        "--consumer",
        "64/1024",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    let reported = out
        .lines()
        .filter(|l| l.contains("; OVF at output offset"))
        .count();
    assert!(reported > 0, "{out}");
    let bytes = std::fs::read(&path).expect("written");
    let all = packets(&bytes);
    let ovfs: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p, Packet::Ovf))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(ovfs.len(), reported);
    for i in ovfs {
        assert!(matches!(all.get(i + 1), Some(Packet::Psb)), "OVF then PSB");
    }
}

/// Packets of each kind in `all`.
fn count_kind(all: &[Packet], kind: hwtrace_packet::PacketKind) -> u64 {
    all.iter().filter(|p| p.kind() == kind).count() as u64
}

/// `--tsc --mtc-freq --cyc --psb-freq`: MTC, CYC, CBR and TMA packets, as
/// many as reported, `dump --stats` reads them, and IA32_RTIT_CTL says
/// MTCEn/MTCFreq, CYCEn/CYCThresh and PSBFreq; `--cr3-filter match` traces
/// (a PIP in each PSB+), `mismatch` writes no control flow at all, and
/// `--no-branches` writes no TNT/TIP with BranchEn = 0.
#[test]
fn sim_pt_timing_cr3_filter_and_no_branches() {
    use hwtrace_packet::PacketKind as K;
    let path = scratch("timing.pt");
    let p = path.to_str().expect("UTF-8 path");
    let out = ok(&[
        "sim",
        "pt",
        "--qemu",
        "--tsc",
        "--mtc-freq",
        "3",
        "--cyc",
        "1",
        "--psb-freq",
        "1",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    let bytes = std::fs::read(&path).expect("written");
    let all = packets(&bytes);
    for (word, kind) in [
        ("MTCs", K::Mtc),
        ("CYCs", K::Cyc),
        ("CBRs", K::Cbr),
        ("TMAs", K::Tma),
    ] {
        let n = count_kind(&all, kind);
        assert!(n > 0, "no {kind:?} in {out}");
        assert_eq!(n, count_before(&out, word), "{word}");
    }
    assert_eq!(count_kind(&all, K::Tma), count_kind(&all, K::Psb));
    let dump = hwtrace(&["dump", p, "--stats"]);
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "MTCEn"), "0x1");
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "MTCFreq"), "0x3");
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "CYCEn"), "0x1");
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "CYCThresh"), "0x1");
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "PSBFreq"), "0x1");

    let traced = |filter: &str, name: &str| {
        let path = scratch(name);
        let p = path.to_str().expect("UTF-8 path").to_string();
        let out = ok(&[
            "sim",
            "pt",
            "--qemu",
            "--cr3-filter",
            filter,
            "-o",
            &p,
            "--",
            "/bin/true",
        ]);
        (out, packets(&std::fs::read(&path).expect("written")))
    };
    let (out, all) = traced("match", "cr3-match.pt");
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "CR3Filter"), "0x1");
    assert!(count_kind(&all, K::TipPge) > 0, "{out}");
    assert_eq!(count_kind(&all, K::Pip), count_kind(&all, K::Psb));
    let (out, all) = traced("mismatch", "cr3-mismatch.pt");
    assert!(out.contains("does not match"), "{out}");
    let kinds: Vec<K> = all.iter().map(Packet::kind).collect();
    assert_eq!(kinds, [K::Psb, K::Psbend], "{out}");

    let path = scratch("nobranch.pt");
    let p = path.to_str().expect("UTF-8 path");
    let out = ok(&[
        "sim",
        "pt",
        "--qemu",
        "--no-branches",
        "--tsc",
        "--mtc-freq",
        "0",
        "--psb-period",
        "512",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    assert_eq!(field_value(&out, "IA32_RTIT_CTL", "BranchEn"), "0x0");
    let all = packets(&std::fs::read(&path).expect("written"));
    for kind in [K::Tnt8, K::Tnt64, K::Tip, K::TipPge, K::TipPgd, K::Fup] {
        assert_eq!(count_kind(&all, kind), 0, "{kind:?} with BranchEn = 0");
    }
    assert!(count_kind(&all, K::Mtc) > 0 && count_kind(&all, K::Psb) > 1);

    let err = fails(&[
        "sim",
        "pt",
        "--qemu",
        "--mtc-freq",
        "16",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    assert!(err.contains("MTCFreq 16"), "{err}");
}

/// hwtrace-flow on the encoder's timing packets (TSC, TMA, CBR, MTC, CYC):
/// exactly the executed instructions, and the time at each enable and
/// disable never decreases and is the simulated clock's within the CYC
/// resolution `hwtrace_sim::clock` documents
/// (`3 · ticks_per_insn + 3 + ⌈cycles per MTC period / 256⌉`).
#[test]
fn flow_time_follows_the_simulated_clock() -> Result<()> {
    use hwtrace_flow::event::EventKind;
    use hwtrace_sim::{Timing, TscModel};

    let rec = Execution::record_qemu("/bin/true", &[] as &[&str], Limits::default())
        .context("recording /bin/true under qemu-x86_64")?;
    let execution = &rec.execution;
    let tsc = TscModel {
        start: 1 << 40,
        ticks_per_insn: 2,
    };
    let timing = Timing {
        mtc_freq: Some(4),
        cyc_thresh: Some(1),
        cbr: Some(40),
        tsc_bus_ratio: 20,
        tsc_ctc_ratio: Some((2, 125)),
    };
    let config = PtConfig {
        tsc: Some(tsc),
        timing,
        ..PtConfig::default()
    };
    let trace = PtEncoder::new(config).encode(execution)?;
    ensure!(
        trace.stats.mtcs > 0 && trace.stats.cycs > 0,
        "{:?}",
        trace.stats
    );
    let flow_config = Config {
        time: common::decoder_time(&timing),
        ..Config::default()
    };
    let mut dec = InsnDecoder::new(&trace.bytes, flow_config, execution.memory());
    let mut status = dec.sync_forward()?;
    let mut ips = Vec::new();
    let (mut last, mut checkpoints, mut worst) = (0u64, 0usize, 0u64);
    // The decoder recalibrates cycles against MTC once per period (with 8
    // fraction bits), so its estimate may drift within a period but is
    // pulled back at every MTC: one MTC period in TSC ticks (2^4 ART ticks
    // of 125/2 TSC ticks) plus one instruction bounds the error for any
    // program. (A tighter bound fitted to one recording failed on another:
    // the program's path depends on its environment.)
    let period_ticks = (16 * 125_u64).div_ceil(2);
    let tolerance = period_ticks + tsc.ticks_per_insn;
    loop {
        while status.event_pending {
            let (event, s) = dec.event()?;
            status = s;
            ensure!(event.has_tsc, "no wall-clock time at {event:?}");
            ensure!(event.tsc >= last, "time went backwards at {event:?}");
            last = event.tsc;
            let index = match event.kind {
                EventKind::Enabled { .. } => ips.len(),
                EventKind::Disabled { .. } if !ips.is_empty() => ips.len() - 1,
                _ => continue,
            };
            let want = tsc.start + tsc.ticks_per_insn * index as u64;
            ensure!(
                event.tsc.abs_diff(want) <= tolerance,
                "instruction {index}: time {:#x}, the clock {want:#x}",
                event.tsc
            );
            worst = worst.max(event.tsc.abs_diff(want));
            checkpoints += 1;
        }
        if status.eos {
            break;
        }
        let mut insn = Insn::empty(0, None, false);
        match dec.next_insn(&mut insn) {
            Ok(s) => {
                ips.push(insn.ip);
                status = s;
            }
            Err(e) if e.kind == hwtrace_flow::ErrorKind::Eos => break,
            Err(e) => return Err(e.into()),
        }
    }
    let executed: Vec<u64> = execution.insns().iter().map(|ip| ip.0).collect();
    ensure!(
        ips == executed,
        "decoded {} of {} instructions",
        ips.len(),
        executed.len()
    );
    ensure!(checkpoints >= 4, "only {checkpoints} checkpoints");
    eprintln!("{checkpoints} checkpoints, worst error {worst} TSC ticks (tolerance {tolerance})");
    Ok(())
}

/// The real Skylake trace `foo` and its page cache (`../shared/corpus/real/`).
fn foo_dir() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/real/foo")
}

fn hex_field(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex")
}

/// Every taken branch `hwtrace flow --branches` finds in `trace` over
/// `pages`, `(from, to)` in order; enables (`tr strt`, from 0) are not
/// branches the CPU took.
fn flow_branches(trace: &str, pages: &str) -> Vec<(u64, u64)> {
    ok(&["flow", trace, "--pages", pages, "--branches", "--no-disasm"])
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (from, arrow, to) = (w.next()?, w.next()?, w.next()?);
            (arrow == "=>").then(|| (hex_field(from), hex_field(to)))
        })
        .filter(|&(from, _)| from != 0)
        .collect()
}

/// The instruction addresses `hwtrace flow` decodes from `trace`.
fn flow_ips(trace: &str, pages: &str) -> Vec<u64> {
    ok(&["flow", trace, "--pages", pages, "--no-disasm"])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.len() == 16 && w.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(hex_field)
        .collect()
}

#[test]
fn sim_lbr_from_a_real_trace_holds_its_last_taken_branches() {
    let dir = foo_dir();
    let trace = dir.join("trace.pt");
    let (t, d) = (trace.to_str().expect("UTF-8"), dir.to_str().expect("UTF-8"));
    let out = ok(&[
        "sim",
        "lbr",
        "--from-trace",
        t,
        "--pages",
        d,
        "--uarch",
        "skylake",
    ]);
    let path = scratch("foo-lbr.txt");
    std::fs::write(&path, &out).expect("write");
    let entries: Vec<(u64, u64)> = ok(&["lbr", "decode", path.to_str().expect("UTF-8"), "--json"])
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON line");
            (
                hex_field(v["from"].as_str().expect("from")),
                hex_field(v["to"].as_str().expect("to")),
            )
        })
        .collect();
    assert_eq!(entries.len(), 32, "{out}");
    let taken = flow_branches(t, d);
    for e in &entries {
        assert!(
            taken.contains(e),
            "{e:x?} is not a taken branch of the trace"
        );
    }
    // LBR_SELECT 0 filters nothing: the stack holds the newest 32, oldest first.
    assert_eq!(entries, taken[taken.len() - 32..]);

    let err = fails(&["sim", "lbr", "--from-trace", t, "--uarch", "skylake"]);
    assert!(
        err.contains(&format!("--from-trace {t}: give the code")),
        "{err}"
    );
    let err = fails(&[
        "sim",
        "lbr",
        "--uarch",
        "skylake",
        "--cpu",
        "6/85",
        "--qemu",
        "--",
        "/bin/true",
    ]);
    assert!(err.contains("--from-trace"), "{err}");
}

#[test]
fn sim_pt_from_a_real_trace_re_encodes_every_instruction() {
    let dir = foo_dir();
    let trace = dir.join("trace.pt");
    let (t, d) = (trace.to_str().expect("UTF-8"), dir.to_str().expect("UTF-8"));
    let path = scratch("foo-re.pt");
    let p = path.to_str().expect("UTF-8");
    let out = ok(&[
        "sim",
        "pt",
        "--from-trace",
        t,
        "--pages",
        d,
        "--cpu",
        "6/94",
        "-o",
        p,
    ]);
    let original = flow_ips(t, d);
    let again = flow_ips(p, d);
    // The count libipt's ptxed and perf report for foo.
    assert_eq!(original.len(), 117_967);
    assert_eq!(count_before(&out, "instructions"), original.len() as u64);
    assert_eq!(again.len(), original.len());
    assert!(
        again == original,
        "the re-encoded trace decodes to other instructions"
    );
    let bytes = std::fs::read(&path).expect("the trace was written");
    let psbs = packets(&bytes)
        .iter()
        .filter(|p| matches!(p, Packet::Psb))
        .count() as u64;
    assert_eq!(psbs, count_before(&out, "PSBs"));
    // One clock per stretch would run backwards: timing is refused.
    let err = fails(&[
        "sim",
        "pt",
        "--from-trace",
        t,
        "--pages",
        d,
        "--tsc",
        "-o",
        p,
    ]);
    assert!(err.contains("one continuous execution"), "{err}");
}

/// The children of process `pid` (from every process's `/proc/PID/stat`).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                // "pid (comm) state ppid ...": comm may hold spaces.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// The state letter of process `pid` (`R`, `S`, `Z`...), `None` once gone.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether process `pid` is gone (or a zombie nobody reaps yet).
fn gone(pid: u32) -> bool {
    matches!(state(pid), None | Some('Z'))
}

/// A recorder killed outright (SIGKILL: nothing of it runs) takes its
/// qemu-user with it. An orphaned qemu died only when it next wrote its
/// log (SIGPIPE, the log's reader gone), so it lived on while the
/// program was quiet, and for good when the program handled SIGPIPE
/// itself (qemu hands signals to the guest: xz does). Here the program
/// sleeps, so qemu writes nothing once it is asleep.
#[test]
fn sim_pt_killed_leaves_no_qemu_behind() {
    let out = scratch("killed.pt");
    // Its own temporary directory, to see that nothing is left in it (a
    // named FIFO in a directory of its own was, until the log went
    // through a pipe).
    let tmp = scratch("killed-tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .env("TMPDIR", &tmp)
        .args(["sim", "pt", "--qemu", "-o"])
        .arg(&out)
        .args(["--", "/bin/sleep", "60"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("hwtrace runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // Its qemu.
    let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let qemu = loop {
        let kids = children_of(child.id());
        if let Some(&q) = kids.iter().find(|&&k| comm(k).starts_with("qemu")) {
            break q;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no qemu child of hwtrace sim after 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // Asleep in the program's sleep, past the start-up it logs: blocked
    // in clock_nanosleep (230) or nanosleep (35), x86-64's numbers.
    let sleeping = || {
        std::fs::read_to_string(format!("/proc/{qemu}/syscall"))
            .is_ok_and(|s| matches!(s.split_whitespace().next(), Some("230" | "35")))
    };
    while !sleeping() {
        assert!(
            !gone(qemu) && std::time::Instant::now() < deadline,
            "qemu ({qemu}) did not fall asleep in /bin/sleep within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gone(qemu) {
        assert!(
            std::time::Instant::now() < deadline,
            "qemu ({qemu}) still runs 10 s after its recorder was killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "left in TMPDIR by the killed recorder: {left:?}"
    );
}

/// `--filter` addresses are hex, with or without `0x`, as the command's
/// other addresses (they were read as decimal without it, and a range
/// meant for the program then traced nothing, silently); a range that
/// misses every instruction executed is said to.
#[test]
fn sim_pt_filter_ranges_are_hex_and_a_range_that_misses_is_told() {
    let p = scratch("filter.pt");
    let p = p.to_str().unwrap();
    let inside = |out: &str| -> u64 {
        let line = out
            .lines()
            .find(|l| l.contains("inside the --filter ranges"))
            .unwrap_or_else(|| panic!("no filter line in {out}"));
        line.split_whitespace().next().unwrap().parse().unwrap()
    };
    // qemu-user runs guests from 0x40_0000_0000: all of it, with and
    // without the prefix.
    for range in ["4000000000-7fffffffffff", "0x4000000000-0x7fffffffffff"] {
        let out = hwtrace(&[
            "sim",
            "pt",
            "--qemu",
            "--filter",
            range,
            "-o",
            p,
            "--",
            "/bin/true",
        ]);
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let total = count_before(&stdout, "instructions");
        assert!(total > 1000, "{stdout}");
        assert_eq!(inside(&stdout), total, "{range}: {stdout}");
        assert!(out.stderr.is_empty(), "{range}: {out:?}");
    }
    let out = hwtrace(&[
        "sim",
        "pt",
        "--qemu",
        "--filter",
        "1000-1fff",
        "-o",
        p,
        "--",
        "/bin/true",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(inside(&String::from_utf8_lossy(&out.stdout)), 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("none of the") && stderr.contains("inside the --filter ranges"),
        "{stderr}"
    );
}
