//! Linux perf as a peer: the same trace bytes wrapped as a perf.data file
//! by hwtrace-perf's writer, the way `hwtrace record --portable` writes
//! its captures (COMM, one MMAP2 per contiguous run of code pointing into
//! the corpus's `pages.dump` at that run's file offset, ITRACE_START, one
//! per-thread AUXTRACE stream), then decoded by `perf script --itrace`.
//! perf reads the code from the file each MMAP2 names.

use super::corpus::Corpus;
use anyhow::{Context, Result};
use hwtrace_perf::data::IntelPtInfo;
use hwtrace_perf::data::attr::{Attr, flag, sample};
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::write::{FeatureData, PerfDataWriter, RecordWriter, intel_pt_attr};
use hwtrace_perf::pevent::SampleId;
use std::path::{Path, PathBuf};

/// perf's PMU type number for intel_pt on the machines it was recorded
/// on; any value works as long as AUXTRACE_INFO says the same.
const PT_PMU_TYPE: u32 = 8;
/// `pt=1`, `branch=1` (bits 0 and 13 of the PMU config).
const PT_CONFIG: u64 = 1 | 1 << 13;
const EVENT_ID: u64 = 1;
const PID: u32 = 4242;

fn attr() -> Attr {
    let mut attr = intel_pt_attr(PT_PMU_TYPE, PT_CONFIG);
    attr.sample_type &= !sample::TIME; // no TSC in the sidebands: timeless decoding
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    attr.set(flag::COMM_EXEC, true);
    attr
}

/// Writes `<trace>.perf.data` beside the trace (reused when newer).
pub fn wrap(corpus: &Corpus, trace: &Path) -> Result<PathBuf> {
    let out = trace.with_extension("perf.data");
    let fresh = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(a), Some(b)) = (fresh(&out), fresh(trace))
        && a >= b
    {
        return Ok(out);
    }
    let bytes = std::fs::read(trace).with_context(|| format!("reading {}", trace.display()))?;
    let attrs = [EventAttr {
        attr: attr(),
        ids: vec![EVENT_ID],
    }];
    let tmp = out.with_extension("tmp");
    let file = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    let mut w = PerfDataWriter::new(file, &attrs)?;
    w.auxtrace_info_pt(&IntelPtInfo {
        ..IntelPtInfo::linux_pmu(PT_PMU_TYPE)
    })?;
    let sid = SampleId {
        pid_tid: Some((PID, PID)),
        time: Some(0),
        cpu: Some(0),
        identifier: Some(EVENT_ID),
        id: Some(EVENT_ID),
        ..SampleId::default()
    };
    w.comm(PID, PID, "bench", true, &sid)?;
    let dump = corpus.pages_dump();
    let dump = dump.to_string_lossy();
    for s in &corpus.sections {
        // PROT_READ|PROT_EXEC, MAP_PRIVATE; a user-mode record (misc 2).
        w.mmap2(2, PID, PID, s.addr, s.size, s.offset, 5, 2, &dump, &sid)?;
    }
    w.itrace_start(PID, PID, &sid)?;
    // One per-thread stream (cpu -1), in AUXTRACE records of at most
    // 64 MiB, as perf's own reader expects buffers of bounded size.
    let mut offset = 0u64;
    for chunk in bytes.chunks(64 << 20) {
        w.auxtrace(chunk, offset, 0, 0, PID, u32::MAX)?;
        w.aux(offset, chunk.len() as u64, 0, &sid)?;
        offset += chunk.len() as u64;
    }
    w.finished_round()?;
    w.finish(&FeatureData {
        nrcpus: Some((1, 1)),
        arch: Some("x86_64".into()),
        ..FeatureData::default()
    })?;
    std::fs::rename(&tmp, &out)?;
    Ok(out)
}

/// The `perf script` command line decoding every instruction's address.
/// `--guest-code`: the real traces were recorded inside a VM (their PIP
/// packets set NR), so perf looks for their code in a guest machine;
/// this option points it at the traced process's own maps.
pub fn script_command(data: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new("perf");
    cmd.args([
        "script",
        "-f",
        "--guest-code",
        "--itrace=i0ns",
        "-F",
        "ip",
        "-i",
    ])
    .arg(data);
    cmd
}
