//! The layout `hwtrace record` writes on Intel hardware, checked without it:
//! one AUX queue per CPU (tid -1), TSC packets in the trace, perf time = TSC
//! (time_mult 1, time_shift 0), context switches on the trace event
//! (have_sched_switch = 2) and a switch-in record telling perf which thread
//! the CPU runs. A qemu-recorded `/bin/true` (hwtrace-sim) must decode in
//! `perf script --itrace` to exactly the executed instructions. Skipped,
//! with a printed reason, without `perf` or qemu-user.

use std::io::Cursor;
use std::path::Path;
use std::process::Command;

use hwtrace_perf::data::attr::flag;
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::write::{FeatureData, PerfDataWriter, RecordWriter, intel_pt_attr};
use hwtrace_perf::data::{IntelPtInfo, TscConversion};
use hwtrace_perf::pevent::SampleId;
use hwtrace_perf::pevent::record::record_type;
use hwtrace_sim::{Execution, Limits, PtConfig, PtEncoder, TscModel};

const PID: u32 = 4321;
const CPU: u32 = 0;
const TSC_START: u64 = 1_000_000;

/// Fails the test when `tool` is missing: the oracle is the point.
fn need(tool: &str) {
    assert!(
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "`{tool}` is not installed (scripts/setup.sh installs it)"
    );
}

fn write(dir: &Path, execution: &Execution, pt: &[u8]) -> Vec<u8> {
    // pt | tsc | branch, as `hwtrace record` builds it from the format files.
    let mut attr = intel_pt_attr(8, 1 | 1 << 10 | 1 << 13);
    for f in [
        flag::MMAP2,
        flag::COMM,
        flag::TASK,
        flag::CONTEXT_SWITCH,
        flag::INHERIT,
    ] {
        attr.set(f, true);
    }
    let attrs = [EventAttr {
        attr,
        ids: vec![11],
    }];
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    w.auxtrace_info_pt(&IntelPtInfo {
        tsc: TscConversion {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
            cap_user_time_zero: true,
        },
        have_sched_switch: 2,
        per_cpu_mmaps: true,
        ..IntelPtInfo::linux_pmu(8)
    })
    .unwrap();
    let sid = |time| SampleId {
        pid_tid: Some((PID, PID)),
        time: Some(time),
        cpu: Some(CPU),
        identifier: Some(11),
        ..SampleId::default()
    };
    w.comm(PID, PID, "true", true, &sid(TSC_START - 100))
        .unwrap();
    for seg in execution.memory().segments() {
        let path = dir.join(format!("code-{:x}.bin", seg.addr.0));
        std::fs::write(&path, &seg.bytes).unwrap();
        let len = seg.bytes.len() as u64;
        w.mmap2(
            2,
            PID,
            PID,
            seg.addr.0,
            len,
            0,
            5,
            2,
            path.to_str().unwrap(),
            &sid(TSC_START - 90),
        )
        .unwrap();
    }
    // The kernel's switch-in for our thread on this CPU, then the trace.
    w.write_event(record_type::SWITCH, 0, &[], &sid(TSC_START - 10))
        .unwrap();
    w.itrace_start(PID, PID, &sid(TSC_START - 5)).unwrap();
    w.finished_round().unwrap();
    w.auxtrace(pt, 0, TSC_START, 0, u32::MAX, CPU).unwrap();
    w.aux(
        0,
        pt.len() as u64,
        0,
        &sid(TSC_START + 10 * execution.len() as u64),
    )
    .unwrap();
    w.finished_round().unwrap();
    let f = FeatureData {
        arch: Some("x86_64".into()),
        nrcpus: Some((1, 1)),
        ..FeatureData::default()
    };
    w.finish(&f).unwrap().into_inner()
}

#[test]
fn per_cpu_pt_with_timestamps_decodes_in_perf() {
    need("perf");
    need("qemu-x86_64");
    let limits = Limits {
        max_instructions: Some(30_000),
        timeout: Some(std::time::Duration::from_secs(60)),
    };
    let rec = Execution::record_qemu("/bin/true", &[] as &[&str], limits)
        .unwrap_or_else(|e| panic!("qemu-user could not record /bin/true: {e}"));
    let execution = rec.execution;
    let config = PtConfig {
        tsc: Some(TscModel {
            start: TSC_START,
            ticks_per_insn: 10,
        }),
        ..PtConfig::default()
    };
    let trace = PtEncoder::new(config).encode(&execution).unwrap();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-perf-percpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("perf.data");
    std::fs::write(&file, write(&dir, &execution, &trace.bytes)).unwrap();
    let out = Command::new("perf")
        .args(["script", "-f", "-i"])
        .arg(&file)
        .args(["--itrace=i1i", "-F", "tid,cpu,ip"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut decoded = Vec::new();
    for line in text.lines() {
        // `TID [CPU] IP`
        let mut w = line.split_whitespace();
        let (Some(tid), Some(cpu), Some(ip)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        assert_eq!((tid, cpu), (PID.to_string().as_str(), "[000]"), "{line}");
        decoded.push(u64::from_str_radix(ip, 16).unwrap());
    }
    let executed: Vec<u64> = execution.insns().iter().map(|ip| ip.0).collect();
    let first_diff = decoded.iter().zip(&executed).position(|(a, b)| a != b);
    assert!(
        decoded == executed,
        "perf decoded {} instructions, qemu executed {}; first difference at {first_diff:?}; stderr: {}",
        decoded.len(),
        executed.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}
