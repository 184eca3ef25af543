//! The real thing end to end: a program's real execution recorded with
//! qemu-user (hwtrace-sim), encoded as the Intel PT a CPU would write,
//! wrapped by our writer in a perf.data with one MMAP2 per code segment,
//! then decoded by Debian's `perf script --itrace`: perf must report
//! exactly the executed instructions, and a branch wherever control did not
//! fall through.
//!
//! perf reads code from the mapped files: each segment of the execution's
//! code image is written to a file of its own and mapped at its address
//! (offset 0). Skipped, with a printed reason, without `perf` or qemu-user.

use std::io::Cursor;
use std::path::Path;
use std::process::Command;

use hwtrace_perf::data::attr::{flag, sample};
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::write::{FeatureData, PerfDataWriter, RecordWriter, intel_pt_attr};
use hwtrace_perf::data::{IntelPtInfo, PerfData};
use hwtrace_perf::pevent::SampleId;
use hwtrace_sim::{Execution, Limits, PtConfig, PtEncoder};

const PID: u32 = 777;

fn have(tool: &str, arg: &str) -> bool {
    let ok = Command::new(tool)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "`{tool}` is not installed (scripts/setup.sh installs it)"
    );
    ok
}

fn write_perf_data(dir: &Path, execution: &Execution, pt: &[u8]) -> Vec<u8> {
    let mut attr = intel_pt_attr(8, 1 | 1 << 13);
    attr.sample_type &= !sample::TIME; // no TSC: perf decodes timeless
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    let attrs = [EventAttr { attr, ids: vec![1] }];
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    w.auxtrace_info_pt(&IntelPtInfo {
        ..IntelPtInfo::linux_pmu(8)
    })
    .unwrap();
    let sid = SampleId {
        pid_tid: Some((PID, PID)),
        cpu: Some(0),
        identifier: Some(1),
        ..SampleId::default()
    };
    w.comm(PID, PID, "true", true, &sid).unwrap();
    for seg in execution.memory().segments() {
        let path = dir.join(format!("code-{:x}.bin", seg.addr.0));
        std::fs::write(&path, &seg.bytes).unwrap();
        let path = path.to_str().unwrap();
        w.mmap2(
            2,
            PID,
            PID,
            seg.addr.0,
            seg.bytes.len() as u64,
            0,
            5,
            2,
            path,
            &sid,
        )
        .unwrap();
    }
    w.itrace_start(PID, PID, &sid).unwrap();
    w.auxtrace(pt, 0, 0, 0, PID, u32::MAX).unwrap();
    w.aux(0, pt.len() as u64, 0, &sid).unwrap();
    w.finished_round().unwrap();
    let f = FeatureData {
        arch: Some("x86_64".into()),
        nrcpus: Some((1, 1)),
        ..FeatureData::default()
    };
    w.finish(&f).unwrap().into_inner()
}

fn perf_script(file: &Path, extra: &[&str]) -> String {
    let out = Command::new("perf")
        .args(["script", "-f", "-i"])
        .arg(file)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "perf script {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn perf_script_decodes_a_qemu_recorded_execution_through_our_perf_data() {
    if !have("perf", "--version") || !have("qemu-x86_64", "--version") {
        return;
    }
    let limits = Limits {
        max_instructions: None,
        timeout: Some(std::time::Duration::from_secs(60)),
    };
    let rec = Execution::record_qemu("/bin/true", &[] as &[&str], limits)
        .unwrap_or_else(|e| panic!("qemu-user could not record /bin/true: {e}"));
    let execution = rec.execution;
    let trace = PtEncoder::new(PtConfig::default())
        .encode(&execution)
        .unwrap();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-perf-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("perf.data");
    let bytes = write_perf_data(&dir, &execution, &trace.bytes);
    // Our reader sees what we wrote.
    let parsed = PerfData::parse(&bytes).unwrap();
    assert!(parsed.records().all(|r| r.is_ok()));
    std::fs::write(&file, &bytes).unwrap();

    let executed: Vec<u64> = execution.insns().iter().map(|ip| ip.0).collect();
    let text = perf_script(&file, &["--itrace=i0ns", "-F", "ip"]);
    let decoded: Vec<u64> = text
        .lines()
        .filter_map(|l| u64::from_str_radix(l.trim(), 16).ok())
        .collect();
    let first_diff = decoded.iter().zip(&executed).position(|(a, b)| a != b);
    assert!(
        decoded == executed,
        "perf decoded {} instructions, qemu executed {}; first difference at {first_diff:?}",
        decoded.len(),
        executed.len()
    );

    // Every transfer that is not a fall-through appears among perf's branches.
    let text = perf_script(&file, &["--itrace=b"]);
    let branches: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|l| {
            // `comm pid 1 branches:u: FROM sym (dso) => TO sym (dso)`
            let (from, to) = l.split_once("=>")?;
            let from = from
                .split_once("branches")?
                .1
                .split_once(':')?
                .1
                .split_once(':')?
                .1;
            let hex = |s: &str| u64::from_str_radix(s.split_whitespace().next()?, 16).ok();
            Some((hex(from)?, hex(to)?))
        })
        .collect();
    let jumps = executed.windows(2).filter(|w| {
        let len = execution
            .memory()
            .bytes_at(hwtrace_types::Ip(w[0]))
            .map(|code| {
                let mut d =
                    iced_x86::Decoder::with_ip(64, code, w[0], iced_x86::DecoderOptions::NONE);
                d.decode().len() as u64
            });
        len.is_none_or(|n| w[0] + n != w[1])
    });
    let mut missing = 0;
    let mut taken = 0;
    for w in jumps {
        taken += 1;
        if !branches.contains(&(w[0], w[1])) {
            missing += 1;
        }
    }
    assert_eq!(
        missing, 0,
        "{missing} of {taken} taken transfers absent from perf's branches"
    );
    assert!(
        taken > 100 && branches.len() >= taken,
        "{taken} transfers, {} branches",
        branches.len()
    );
    eprintln!(
        "{} instructions and {taken} taken transfers decoded by perf as executed",
        executed.len()
    );
    std::fs::remove_dir_all(&dir).ok();
}
