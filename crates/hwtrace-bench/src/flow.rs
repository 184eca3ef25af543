//! Instruction-flow decoding: hwtrace's fast (block-cached) and
//! instruction decoders (one thread) against libipt's instruction (`pt_insn_next`) and block (`pt_blk_next`)
//! decoders, on the same bytes over the same code files, in one run.
//!
//! Two traces, each repeated (every copy starts at a PSB, so the
//! concatenation is one valid trace):
//!
//! - `real/foo`, a trace from real hardware (kAFL/Nyx), over its page
//!   cache (`pages.dump` at the addresses of `pages.addr`);
//! - gzip compressing a small file, recorded with qemu-user and encoded as
//!   the PT a CPU would write (hwtrace-sim; return compression, a PSB every
//!   4 KiB), over the code the execution ran (written to a scratch file).
//!
//! Both decoders read the code from the same files: hwtrace through
//! `hwtrace_mem::image::Image`, libipt through its image section cache (the
//! path ptxed takes for `--raw`). The instruction counts must agree.

use crate::corpus::real_dir;
use crate::stats::{mb_per_s, median};
use anyhow::{Context, Result, anyhow, ensure};
use hwtrace_flow::insn::{FastDecoder, FastStep, Insn, InsnClass, InsnDecoder, RunTally};
use hwtrace_flow::{Config, ErrorKind, SyncProgress};
use hwtrace_mem::image::{Image, RawSpec};
use hwtrace_sim::{Execution, Limits, PtConfig, PtEncoder, RecordEnd};
use hwtrace_types::{Ip, ReadMemory, TraceOffset};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A code file mapped at `addr`: `size` bytes from `offset`.
struct Section {
    path: PathBuf,
    offset: u64,
    size: u64,
    addr: u64,
}

/// One benchmark input: a trace and the code it ran over.
struct Case {
    name: String,
    trace: Vec<u8>,
    sections: Vec<Section>,
}

/// `(instructions, errors)` of a decode with hwtrace's instruction decoder,
/// driven as ptxed drives it (events drained, resync at the next PSB after
/// an error). Nothing is allocated per instruction.
fn hwtrace_count<M: ReadMemory>(trace: &[u8], mem: M) -> (u64, u64) {
    let mut dec = InsnDecoder::new(trace, Config::default(), mem);
    let (mut insns, mut errors) = (0u64, 0u64);
    let mut progress = SyncProgress::new();
    let mut sync = dec.sync_forward();
    'sync: loop {
        let mut status = match sync {
            Ok(s) => s,
            Err(e) if e.kind == ErrorKind::Eos => break,
            Err(_) => {
                // A bad PSB+: on to the next one, if synchronisation moves.
                errors += 1;
                if !progress.moved(dec.offset()) {
                    break;
                }
                sync = dec.sync_forward();
                continue;
            }
        };
        loop {
            while status.event_pending {
                match dec.event() {
                    Ok((_, s)) => status = s,
                    Err(_) => {
                        errors += 1;
                        sync = dec.sync_forward();
                        continue 'sync;
                    }
                }
            }
            if status.eos {
                break 'sync;
            }
            let mut insn = Insn::empty(0, None, false);
            match dec.next_insn(&mut insn) {
                Ok(s) => {
                    insns += 1;
                    status = s;
                }
                Err(e) => {
                    if insn.class != InsnClass::Unknown {
                        insns += 1;
                    }
                    if e.kind == ErrorKind::Eos {
                        break 'sync;
                    }
                    errors += 1;
                    sync = dec.sync_forward();
                    continue 'sync;
                }
            }
        }
    }
    (insns, errors)
}

/// `(instructions, errors)` of a decode with hwtrace's fast (block-cached)
/// decoder, driven the same way; a run's instruction count is all it
/// needs, so nothing is expanded. Plain code comes a burst of runs at a
/// time, counted ([`FastDecoder::tally_runs`], passing over TIP.PGD/TIP.PGE
/// pairs as `hwtrace flow` does); PSB+ status updates the decoder takes
/// without a question are passed over in a batch
/// ([`FastDecoder::pass_status_events`], as `hwtrace flow` counts them);
/// anything else (events, errors, the end) one step at a time.
pub fn hwtrace_fast_count<M: ReadMemory>(trace: &[u8], mem: M) -> (u64, u64) {
    let mut dec = FastDecoder::new(trace, Config::default(), mem);
    let mut runs = RunTally::new();
    // As `hwtrace flow` counts: the disable/enable pairs of IP-filtered
    // traces are passed over inside the burst.
    runs.set_passes_toggles(true);
    let (mut insns, mut errors) = (0u64, 0u64);
    let mut progress = SyncProgress::new();
    let mut sync = dec.sync_forward();
    'sync: loop {
        match sync {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::Eos => break,
            Err(_) => {
                errors += 1;
                if !progress.moved(dec.offset()) {
                    break;
                }
                sync = dec.sync_forward();
                continue;
            }
        }
        loop {
            if dec.tally_runs(&mut runs, TraceOffset(u64::MAX)) > 0 {
                insns += runs.insns();
                continue;
            }
            match dec.pass_status_events() {
                Some((_, None)) => continue,
                Some((_, Some(_))) => {
                    errors += 1;
                    sync = dec.sync_forward();
                    continue 'sync;
                }
                None => {}
            }
            match dec.next() {
                Ok(Some(FastStep::Run(run))) => insns += u64::from(run.insns),
                Ok(Some(FastStep::Event(_))) => {}
                Ok(None) => break 'sync,
                Err(_) => {
                    errors += 1;
                    sync = dec.sync_forward();
                    continue 'sync;
                }
            }
        }
    }
    (insns, errors)
}

/// `one` repeated to at least `min_bytes`.
fn repeat(one: &[u8], min_bytes: usize) -> Vec<u8> {
    let copies = min_bytes.div_ceil(one.len().max(1)).max(1);
    let mut out = Vec::with_capacity(copies * one.len());
    for _ in 0..copies {
        out.extend_from_slice(one);
    }
    out
}

/// real/foo repeated, over its page cache; contiguous pages are one section.
fn foo(min_bytes: usize) -> Result<Case> {
    let dir = real_dir().join("foo");
    let one = std::fs::read(dir.join("trace.pt")).context("reading real/foo/trace.pt")?;
    let addrs = std::fs::read(dir.join("pages.addr")).context("reading real/foo/pages.addr")?;
    let dump = dir.join("pages.dump");
    let mut sections: Vec<Section> = Vec::new();
    for (i, chunk) in addrs.chunks_exact(8).enumerate() {
        let mut le = [0u8; 8];
        le.copy_from_slice(chunk);
        let addr = u64::from_le_bytes(le);
        let offset = i as u64 * 4096;
        match sections.last_mut() {
            Some(s) if s.addr + s.size == addr && s.offset + s.size == offset => s.size += 4096,
            _ => sections.push(Section {
                path: dump.clone(),
                offset,
                size: 4096,
                addr,
            }),
        }
    }
    ensure!(!sections.is_empty(), "real/foo has no pages");
    Ok(Case {
        name: "real/foo (Nyx, real hardware)".into(),
        trace: repeat(&one, min_bytes),
        sections,
    })
}

/// Deterministic text for gzip to compress.
fn text(lines: usize) -> String {
    const WORDS: [&str; 8] = [
        "branch", "trace", "packet", "return", "syscall", "psb", "tnt", "tip",
    ];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut out = String::new();
    for i in 0..lines {
        for _ in 0..4 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            out += WORDS[(x >> 61) as usize];
            out.push(' ');
        }
        out += &format!("{}\n", x % 1000 + i as u64);
    }
    out
}

/// gzip recorded with qemu-user, encoded to PT and repeated; its code is
/// written to one scratch file in `scratch`.
fn gzip(min_bytes: usize, scratch: &Path) -> Result<Case> {
    let input = scratch.join("gzip-input.txt");
    std::fs::write(&input, text(200))?;
    let input = input
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 temp dir"))?;
    let limits = Limits {
        max_instructions: None,
        timeout: Some(Duration::from_secs(300)),
    };
    let rec = Execution::record_qemu("/usr/bin/gzip", &["-c", "-9", input], limits)
        .context("recording gzip with qemu-x86_64 (scripts/setup.sh installs it)")?;
    ensure!(
        matches!(rec.end, RecordEnd::Exited(s) if s.success()),
        "gzip under qemu: {:?}",
        rec.end
    );
    let encoded = PtEncoder::new(PtConfig::default()).encode(&rec.execution)?;
    let code = scratch.join("gzip-code.bin");
    let mut bytes = Vec::new();
    let mut sections = Vec::new();
    for seg in rec.execution.memory().segments() {
        sections.push(Section {
            path: code.clone(),
            offset: bytes.len() as u64,
            size: seg.bytes.len() as u64,
            addr: seg.addr.0,
        });
        bytes.extend_from_slice(&seg.bytes);
    }
    std::fs::write(&code, &bytes)?;
    Ok(Case {
        name: format!(
            "gzip -9 (qemu-user, {} instructions, hwtrace-sim PT)",
            rec.execution.len()
        ),
        trace: repeat(&encoded.bytes, min_bytes),
        sections,
    })
}

fn hwtrace_image(case: &Case) -> Result<Image> {
    let mut image = Image::new();
    for s in &case.sections {
        let spec = RawSpec {
            path: s.path.clone(),
            offset: s.offset,
            size: Some(s.size),
            addr: Ip(s.addr),
            truncate: false,
        };
        image
            .add_raw(None, &spec)
            .with_context(|| format!("{}", s.path.display()))?;
    }
    Ok(image)
}

fn libipt_image(case: &Case) -> Result<hwtrace_libipt::Image<'static>> {
    let mut image = hwtrace_libipt::Image::new().map_err(|e| anyhow!("{e:?}"))?;
    for s in &case.sections {
        image
            .add_file_cached(&s.path, s.offset, s.size, s.addr)
            .map_err(|e| anyhow!("libipt: {}: {e:?}", s.path.display()))?;
    }
    Ok(image)
}

fn bench(case: &Case, runs: usize) -> Result<()> {
    let trace = &case.trace;
    let mib = trace.len() as f64 / f64::from(1u32 << 20);
    println!(
        "flow: {} repeated to {mib:.0} MiB, median of {runs} runs",
        case.name
    );
    let image = hwtrace_image(case)?;
    let ipt_image = libipt_image(case)?;
    let cfg = hwtrace_libipt::Config::default();

    let (ours_t, ours) = median(runs, || hwtrace_count(trace, &image));
    let (fast_t, fast) = median(runs, || hwtrace_fast_count(trace, &image));
    ensure!(
        fast == ours,
        "hwtrace's fast decoder decoded {fast:?} (instructions, errors), its instruction decoder {ours:?}"
    );
    let (insn_t, insn) = median(runs, || {
        hwtrace_libipt::count_insns(trace, &cfg, &ipt_image)
    });
    let insn = insn.map_err(|e| anyhow!("libipt insn decoder: {e:?}"))?;
    let (blk_t, blk) = median(runs, || {
        hwtrace_libipt::count_blocks(trace, &cfg, &ipt_image)
    });
    let blk = blk.map_err(|e| anyhow!("libipt block decoder: {e:?}"))?;
    ensure!(
        ours == insn,
        "hwtrace decoded {ours:?} (instructions, errors), libipt's instruction decoder {insn:?}"
    );
    if (blk.insns, blk.errors) != insn {
        println!(
            "  note: libipt's block decoder counted {blk:?}, its instruction decoder {insn:?}"
        );
    }
    ensure!(ours.0 > 0, "nothing decoded");

    println!(
        "  {:<34} {:>9} {:>14} {:>10} {:>8}",
        "decoder", "MB/s", "instructions", "Minsn/s", "errors"
    );
    let rows = [
        ("hwtrace FastDecoder (1 thread)", fast_t),
        ("hwtrace InsnDecoder (1 thread)", ours_t),
        ("libipt pt_insn_next (2.0.5)", insn_t),
        ("libipt pt_blk_next (2.0.5)", blk_t),
    ];
    for (name, t) in rows {
        println!(
            "  {name:<34} {:>9.1} {:>14} {:>10.1} {:>8}",
            mb_per_s(trace.len(), t),
            ours.0,
            ours.0 as f64 / t.as_secs_f64() / 1e6,
            ours.1
        );
    }
    let ratio = |t: Duration, ours: Duration| t.as_secs_f64() / ours.as_secs_f64();
    println!(
        "  ratio hwtrace InsnDecoder / libipt insn: {:.2}x, / libipt block: {:.2}x ({} blocks)",
        ratio(insn_t, ours_t),
        ratio(blk_t, ours_t),
        blk.blocks
    );
    println!(
        "  ratio hwtrace FastDecoder / libipt insn: {:.2}x, / libipt block: {:.2}x, / InsnDecoder: {:.2}x",
        ratio(insn_t, fast_t),
        ratio(blk_t, fast_t),
        ratio(ours_t, fast_t)
    );
    Ok(())
}

/// A scratch folder, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs both cases: foo repeated to `size_mib`, gzip's trace to
/// `exec_size_mib` (its trace is denser, about 29 instructions per byte
/// against foo's 4, so fewer bytes hold as many instructions).
pub fn run(size_mib: usize, exec_size_mib: usize, runs: usize) -> Result<()> {
    bench(&foo(size_mib << 20)?, runs)?;
    let scratch =
        Scratch(std::env::temp_dir().join(format!("hwtrace-bench-flow-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0)?;
    bench(&gzip(exec_size_mib << 20, &scratch.0)?, runs)
}
