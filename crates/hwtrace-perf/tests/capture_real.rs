//! Capture on this machine, for real: the exact refusal when Intel PT/BTS
//! or LBR are missing, and a software-event capture (sideband only) through
//! the real perf_event_open, data ring and perf.data writer.

use std::io::Cursor;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use hwtrace_perf::capture::session::system_page_size;
use hwtrace_perf::capture::{CaptureError, RecordOptions, Target, Tracer, plan, record};
use hwtrace_perf::data::{PerfData, PerfRecord};
use hwtrace_perf::pevent::record::Body;

fn vendor() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("vendor_id"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default()
}

#[test]
fn missing_intel_pmus_are_refused_with_the_cpu_named() {
    for tracer in [Tracer::IntelPt, Tracer::IntelBts] {
        let name = tracer.pmu_name().unwrap();
        if Path::new("/sys/bus/event_source/devices")
            .join(name)
            .exists()
        {
            eprintln!("skipped: this machine has {name}");
            continue;
        }
        let o = RecordOptions {
            tracer,
            ..RecordOptions::default()
        };
        let e = plan(&o, system_page_size()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, CaptureError::NoPmu { .. }), "{msg}");
        assert!(msg.contains(&vendor()), "{msg}");
        assert!(
            msg.contains(&format!(
                "/sys/bus/event_source/devices/{name} does not exist"
            )),
            "{msg}"
        );
        assert!(msg.contains("hwtrace record --portable"), "{msg}");
    }
}

#[test]
fn lbr_without_hardware_events_is_refused() {
    let o = RecordOptions {
        tracer: Tracer::Lbr,
        ..RecordOptions::default()
    };
    let p = match plan(&o, system_page_size()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let target = Target::Command(vec!["/bin/true".into()]);
    match record(
        &p,
        &o,
        &target,
        Cursor::new(Vec::new()),
        &AtomicBool::new(false),
    ) {
        Err(e @ CaptureError::NoLbr { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&vendor()) && msg.contains("--portable"),
                "{msg}"
            );
        }
        Err(CaptureError::PermissionDenied { .. }) => {
            eprintln!("skipped: perf_event_open not permitted")
        }
        Ok(_) => eprintln!("this machine has LBR: recorded"),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn software_event_capture_writes_sideband_we_read_back() {
    let o = RecordOptions {
        tracer: Tracer::Software,
        ..RecordOptions::default()
    };
    let p = match plan(&o, system_page_size()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let target = Target::Command(vec!["true".into(), "ignored-arg".into()]);
    let (summary, out) = match record(
        &p,
        &o,
        &target,
        Cursor::new(Vec::new()),
        &AtomicBool::new(false),
    ) {
        Ok(r) => r,
        Err(e @ CaptureError::PermissionDenied { .. }) => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(summary.exit_code, Some(0));
    assert!(summary.records >= 3, "{summary:?}");
    let bytes = out.into_inner();
    let file = PerfData::parse(&bytes).unwrap();
    assert_eq!(file.attrs.len(), 1);
    assert_eq!(file.attrs[0].ids.len(), 1);
    let mut comm_exec = false;
    let mut true_mapped = false;
    let mut exits = 0;
    let mut n = 0;
    for r in file.records() {
        let r = r.unwrap();
        n += 1;
        let PerfRecord::Event(ev) = r.record else {
            continue;
        };
        // Every sideband record carries the sample_id the attribute asked for.
        assert_eq!(
            ev.sample.pid_tid.map(|(p, _)| p),
            Some(summary.pid),
            "{ev:?}"
        );
        assert_eq!(ev.sample.identifier, Some(file.attrs[0].ids[0]));
        match ev.body {
            Body::Comm(c) if ev.is_comm_exec() => comm_exec |= c.comm == b"true",
            Body::Mmap2(m) => true_mapped |= m.filename.ends_with(b"/true") && m.prot & 4 != 0,
            Body::Exit(_) => exits += 1,
            _ => {}
        }
    }
    assert_eq!(n, summary.records);
    assert!(comm_exec, "a COMM exec record names `true`");
    assert!(true_mapped, "an executable MMAP2 of .../true");
    assert_eq!(exits, 1);
    assert_eq!(file.features.arch, Some(std::env::consts::ARCH.as_bytes()));
}

#[test]
fn a_missing_command_fails_before_anything_runs() {
    let o = RecordOptions {
        tracer: Tracer::Software,
        ..RecordOptions::default()
    };
    let Ok(p) = plan(&o, system_page_size()) else {
        return;
    };
    let target = Target::Command(vec!["/nonexistent/hwtrace-no-such-program".into()]);
    let e = record(
        &p,
        &o,
        &target,
        Cursor::new(Vec::new()),
        &AtomicBool::new(false),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("execv") || e.to_string().contains("No such file"),
        "{e}"
    );
    let target = Target::Command(vec!["hwtrace-no-such-program-on-path".into()]);
    let e = record(
        &p,
        &o,
        &target,
        Cursor::new(Vec::new()),
        &AtomicBool::new(false),
    )
    .unwrap_err();
    assert!(e.to_string().contains("command not found"), "{e}");
}

#[test]
fn attaching_to_a_running_process_synthesizes_its_sideband() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    let o = RecordOptions {
        tracer: Tracer::Software,
        ..RecordOptions::default()
    };
    let Ok(p) = plan(&o, system_page_size()) else {
        return;
    };
    let mut sleeper = std::process::Command::new("sleep")
        .arg("0.5")
        .spawn()
        .unwrap();
    let pid = sleeper.id();
    // Give it time to exec.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let stop = Arc::new(AtomicBool::new(false));
    let guard = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(10));
            stop.store(true, Ordering::Relaxed);
        })
    };
    let result = record(&p, &o, &Target::Pid(pid), Cursor::new(Vec::new()), &stop);
    sleeper.wait().unwrap();
    drop(guard);
    let (summary, out) = match result {
        Ok(r) => r,
        Err(e @ CaptureError::PermissionDenied { .. }) => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert!(
        !stop.load(Ordering::Relaxed),
        "the capture ended when the process exited"
    );
    assert_eq!(summary.pid, pid);
    let bytes = out.into_inner();
    let file = PerfData::parse(&bytes).unwrap();
    let (mut comm, mut sleep_mapped, mut exit) = (false, false, false);
    for r in file.records() {
        let PerfRecord::Event(ev) = r.unwrap().record else {
            continue;
        };
        match ev.body {
            Body::Comm(c) => comm |= c.comm == b"sleep" && c.pid == pid,
            Body::Mmap2(m) => sleep_mapped |= m.filename.ends_with(b"/sleep") && m.prot & 4 != 0,
            Body::Exit(t) => exit |= t.pid == pid,
            _ => {}
        }
    }
    assert!(comm && sleep_mapped, "synthesized COMM and MMAP2 of sleep");
    assert!(exit, "the kernel's EXIT record");
}
