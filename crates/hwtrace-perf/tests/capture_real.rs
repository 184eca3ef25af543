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
    // One event per online CPU.
    let cpus = hwtrace_perf::capture::session::online_cpus(Path::new("/sys"));
    assert_eq!(file.attrs[0].ids.len(), cpus.len());
    let mut comm_exec = false;
    let mut true_mapped = false;
    let mut exits = 0;
    let mut n = 0;
    for r in file.records() {
        let r = r.unwrap();
        let PerfRecord::Event(ev) = r.record else {
            assert!(matches!(r.record, PerfRecord::FinishedRound), "{r:?}");
            continue;
        };
        n += 1;
        // Every sideband record carries the sample_id the attribute asked for.
        assert_eq!(
            ev.sample.pid_tid.map(|(p, _)| p),
            Some(summary.pid),
            "{ev:?}"
        );
        assert!(file.attrs[0].ids.contains(&ev.sample.identifier.unwrap()));
        assert!(cpus.contains(&ev.sample.cpu.unwrap()));
        match ev.body {
            Body::Comm(c) if ev.is_comm_exec() => comm_exec |= c.comm == b"true",
            Body::Mmap2(m) => true_mapped |= m.filename.ends_with(b"/true") && m.prot & 4 != 0,
            Body::Exit(_) => exits += 1,
            _ => {}
        }
    }
    assert_eq!(n, summary.records, "every kernel record, and only those");
    assert!(comm_exec, "a COMM exec record names `true`");
    assert!(true_mapped, "an executable MMAP2 of .../true");
    assert_eq!(exits, 1);
    assert_eq!(file.features.arch, Some(std::env::consts::ARCH.as_bytes()));
    // The build id of the program, as its ELF note says (readelf -n).
    let exe = std::fs::canonicalize("/bin/true").unwrap();
    let note = std::fs::read(&exe).unwrap();
    let want = {
        use object::Object;
        object::File::parse(&*note).unwrap().build_id().unwrap()
    };
    if let Some(want) = want {
        let got = file
            .features
            .build_ids
            .iter()
            .find(|b| Path::new(std::str::from_utf8(b.filename).unwrap()) == exe);
        assert_eq!(
            got.map(|b| b.build_id),
            Some(want),
            "{:?}",
            file.features.build_ids
        );
    }
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

/// The data ring wraps many times: a one-page ring, a workload that execs
/// 100 times. Every record read across the wrap parses, and each exec is
/// either seen or accounted for by a LOST record.
#[test]
fn a_one_page_data_ring_wraps_without_corruption() {
    let o = RecordOptions {
        tracer: Tracer::Software,
        data_size: system_page_size(),
        ..RecordOptions::default()
    };
    let Ok(p) = plan(&o, system_page_size()) else {
        return;
    };
    let script = "i=0; while [ $i -lt 100 ]; do /bin/true; i=$((i+1)); done";
    let target = Target::Command(vec!["/bin/sh".into(), "-c".into(), script.into()]);
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
    let bytes = out.into_inner();
    let file = PerfData::parse(&bytes).unwrap();
    let mut execs = 0;
    let mut lost = 0;
    for r in file.records() {
        let PerfRecord::Event(ev) = r.unwrap().record else {
            continue;
        };
        match ev.body {
            Body::Comm(c) if ev.is_comm_exec() && c.comm == b"true" => execs += 1,
            Body::Lost(l) => lost += l.lost,
            _ => {}
        }
    }
    assert!(
        bytes.len() as u64 > 3 * system_page_size(),
        "the ring wrapped: {} bytes",
        bytes.len()
    );
    assert!(
        execs == 100 || lost > 0,
        "{execs} execs seen, {lost} events lost"
    );
    assert_eq!(lost, summary.lost_events);
}

/// Real kernel refusals on this machine, through our wrappers: an AUX area
/// on an event without one, and an address filter on a software event.
#[test]
fn kernel_refusals_are_typed() {
    use hwtrace_perf::capture::sys::{PerfEvent, Rings};
    let o = RecordOptions {
        tracer: Tracer::Software,
        ..RecordOptions::default()
    };
    let Ok(p) = plan(&o, system_page_size()) else {
        return;
    };
    // On CPU 0: the kernel maps inherited events only when bound to a CPU.
    let ev = match PerfEvent::open(&p.attr, 0, 0) {
        Ok(ev) => ev,
        Err(e) => {
            eprintln!("skipped: perf_event_open: {e}");
            return;
        }
    };
    let mut rings = Rings::map(&ev, 2 * system_page_size() as usize).unwrap();
    let e = rings
        .map_aux(&ev, system_page_size() as usize, false)
        .unwrap_err();
    assert!(matches!(e, CaptureError::AuxMmap { .. }), "{e}");
    assert!(e.to_string().contains("AUX area failed"), "{e}");
    assert!(ev.set_filter("filter 0x1000/0x10@/bin/true").is_err());
    // The header page is live: no data yet, and the TSC conversion is readable.
    let (data, tail, head) = rings.data().unwrap();
    assert_eq!((data.len() as u64, tail), (head, 0));
    let _ = rings.tsc_conversion();
}

#[test]
fn the_commands_exit_code_is_reported() {
    let o = RecordOptions {
        tracer: Tracer::Software,
        ..RecordOptions::default()
    };
    let Ok(p) = plan(&o, system_page_size()) else {
        return;
    };
    let target = Target::Command(vec!["/bin/sh".into(), "-c".into(), "exit 7".into()]);
    match record(
        &p,
        &o,
        &target,
        Cursor::new(Vec::new()),
        &AtomicBool::new(false),
    ) {
        Ok((summary, _)) => assert_eq!(summary.exit_code, Some(7)),
        Err(e @ CaptureError::PermissionDenied { .. }) => eprintln!("skipped: {e}"),
        Err(e) => panic!("{e}"),
    }
}
