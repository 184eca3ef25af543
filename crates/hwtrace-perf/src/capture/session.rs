//! Running a capture: start the workload held at the door, open and map
//! the event, let the workload exec (the event enables itself on exec),
//! drain the rings into a perf.data writer until the workload exits.

use std::ffi::{CString, OsString};
use std::io::{self, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::access;
use super::error::{CaptureError, Tracer};
use super::plan::{Plan, RecordOptions};
use super::procfs;
use super::sys::{PerfEvent, Rings, page_size, tsc_now};
use crate::data::attr::flag;
use crate::data::auxtrace::{IntelBtsInfo, IntelPtInfo};
use crate::data::header::EventAttr;
use crate::data::write::{FeatureData, PerfDataWriter, RecordWriter};
use crate::pevent::record::{SampleId, record_type};

/// Whom to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Start this command (argv) and record it from its exec.
    Command(Vec<OsString>),
    /// Attach to a running process.
    Pid(u32),
}

/// What a capture produced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The recorded process.
    pub pid: u32,
    /// Its exit code (for a started command that exited normally).
    pub exit_code: Option<i32>,
    /// Sideband/sample records written.
    pub records: u64,
    /// AUXTRACE buffers written.
    pub aux_buffers: u64,
    /// AUX bytes written.
    pub aux_bytes: u64,
    /// Events the kernel reported lost (LOST records).
    pub lost_events: u64,
}

fn sys_err(call: &'static str) -> impl FnOnce(io::Error) -> CaptureError {
    move |source| CaptureError::Sys { call, source }
}

/// A forked child that waits for a byte on a pipe before it execs.
#[derive(Debug)]
struct HeldChild {
    pid: i32,
    go: Option<OwnedFd>,
    exec_err: OwnedFd,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two fds into a live two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Resolves `prog` through `PATH` the way execvp would (done before fork,
/// so the child only makes async-signal-safe calls).
fn resolve(prog: &Path) -> Option<PathBuf> {
    if prog.as_os_str().as_bytes().contains(&b'/') {
        return Some(prog.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

impl HeldChild {
    fn spawn(argv: &[OsString]) -> Result<Self, CaptureError> {
        let first = argv
            .first()
            .ok_or_else(|| CaptureError::BadOption("no command to record".into()))?;
        let prog = resolve(Path::new(first)).ok_or_else(|| {
            CaptureError::BadOption(format!("{}: command not found", first.to_string_lossy()))
        })?;
        let cstr = |s: &[u8]| {
            CString::new(s).map_err(|_| CaptureError::BadOption("NUL byte in the command".into()))
        };
        let prog = cstr(prog.as_os_str().as_bytes())?;
        let args: Vec<CString> = argv
            .iter()
            .map(|a| cstr(a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let (go_r, go_w) = pipe().map_err(sys_err("pipe2"))?;
        let (err_r, err_w) = pipe().map_err(sys_err("pipe2"))?;
        // SAFETY: after fork the child only calls async-signal-safe functions
        // (close, read, execv, write, _exit) on data prepared before the fork
        // (`prog`, `ptrs`, the fds), and never returns into Rust code.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(CaptureError::Sys {
                call: "fork",
                source: io::Error::last_os_error(),
            });
        }
        if pid == 0 {
            // SAFETY: see above: the child's whole life, async-signal-safe.
            unsafe {
                libc::close(go_w.as_raw_fd());
                libc::close(err_r.as_raw_fd());
                let mut b = 0u8;
                if libc::read(go_r.as_raw_fd(), (&raw mut b).cast(), 1) != 1 {
                    libc::_exit(126);
                }
                libc::execv(prog.as_ptr(), ptrs.as_ptr());
                let errno = *libc::__errno_location();
                libc::write(err_w.as_raw_fd(), (&raw const errno).cast(), 4);
                libc::_exit(127);
            }
        }
        drop((go_r, err_w));
        Ok(Self {
            pid,
            go: Some(go_w),
            exec_err: err_r,
        })
    }

    /// Lets the child exec; fails if exec failed.
    fn release(&mut self) -> Result<(), CaptureError> {
        if let Some(go) = self.go.take() {
            let mut f = std::fs::File::from(go);
            f.write_all(&[1]).map_err(sys_err("write"))?;
        }
        let mut buf = [0u8; 4];
        let mut f = std::fs::File::from(self.exec_err.try_clone().map_err(sys_err("dup"))?);
        let n = io::Read::read(&mut f, &mut buf).map_err(sys_err("read"))?;
        if n == 4 {
            return Err(CaptureError::Sys {
                call: "execv",
                source: io::Error::from_raw_os_error(i32::from_ne_bytes(buf)),
            });
        }
        Ok(())
    }

    /// `Some(exit code)` once the child has exited (-signal if killed).
    fn try_wait(&self) -> Option<i32> {
        let mut status = 0;
        // SAFETY: waitpid writes the status into a live local.
        let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        if r != self.pid {
            return None;
        }
        if libc::WIFEXITED(status) {
            Some(libc::WEXITSTATUS(status))
        } else {
            Some(-libc::WTERMSIG(status))
        }
    }

    fn kill(&self) {
        // SAFETY: signals and reaps our own child; no memory is involved.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// Whether `pid` still runs (a zombie does not: it exited and waits for
/// its parent to reap it).
fn process_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks the process exists.
    let exists = unsafe { libc::kill(pid as i32, 0) == 0 };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // `pid (comm) S ...`: the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    exists && !matches!(state, Some('Z' | 'X'))
}

/// Turns a perf_event_open failure into the error that says why.
fn open_error(e: io::Error, plan: &Plan, opts: &RecordOptions) -> CaptureError {
    let code = e.raw_os_error().unwrap_or(0);
    match code {
        libc::EACCES | libc::EPERM => CaptureError::PermissionDenied {
            what: plan.tracer.hardware().to_string(),
            errno_text: e.to_string(),
            paranoid: access::paranoid(&opts.procfs_root)
                .map_or("unknown".into(), |v| v.to_string()),
        },
        libc::ENOENT | libc::EOPNOTSUPP | libc::EINVAL if plan.tracer == Tracer::Lbr => {
            CaptureError::NoLbr {
                cpu: plan.cpu.clone(),
                errno_text: e.to_string(),
            }
        }
        libc::ENOENT | libc::ENODEV | libc::EINVAL | libc::EOPNOTSUPP if plan.pmu.is_some() => {
            let pmu = plan.pmu.as_ref();
            CaptureError::PmuRejected {
                tracer: plan.tracer,
                pmu_type: plan.attr.kind,
                dir: pmu.map(|p| p.dir.clone()).unwrap_or_default(),
                errno_text: e.to_string(),
            }
        }
        _ => CaptureError::Sys {
            call: "perf_event_open",
            source: e,
        },
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The feature sections of a capture on this machine.
pub fn machine_features(procfs_root: &Path) -> FeatureData {
    let cpuinfo = std::fs::read_to_string(procfs_root.join("cpuinfo")).unwrap_or_default();
    let field = |key: &str| {
        cpuinfo
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let cpuid = match (
        field("vendor_id"),
        field("cpu family"),
        field("model"),
        field("stepping"),
    ) {
        (Some(v), Some(f), Some(m), Some(s)) => Some(format!("{v},{f},{m},{s}")),
        _ => None,
    };
    let n = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    FeatureData {
        hostname: read_trim(&procfs_root.join("sys/kernel/hostname")),
        osrelease: read_trim(&procfs_root.join("sys/kernel/osrelease")),
        version: Some(format!("hwtrace {}", env!("CARGO_PKG_VERSION"))),
        arch: Some(std::env::consts::ARCH.to_string()),
        nrcpus: Some((n, n)),
        cpudesc: field("model name"),
        cpuid,
        total_mem: None,
        cmdline: Some(std::env::args().collect()),
        build_ids: Vec::new(),
    }
}

/// The GNU build ids of the executable files a capture mapped (files that
/// are gone or carry no build id are left out), for `HEADER_BUILD_ID`.
pub fn build_ids(files: &std::collections::BTreeSet<Vec<u8>>) -> Vec<(i32, Vec<u8>, String)> {
    use object::Object;
    let mut out = Vec::new();
    for f in files {
        let path = Path::new(std::ffi::OsStr::from_bytes(f));
        let Ok(file) = std::fs::File::open(path) else {
            continue;
        };
        // Read only what the ELF headers and notes need: a whole library is
        // small, but a file could be anything; cap at 256 MiB.
        let Ok(meta) = file.metadata() else { continue };
        if meta.len() > 256 << 20 {
            continue;
        }
        let Ok(bytes) = std::fs::read(path) else {
            continue;
        };
        let Ok(obj) = object::File::parse(&*bytes) else {
            continue;
        };
        if let Ok(Some(id)) = obj.build_id() {
            // pid -1: perf's host machine; the id is what the file says.
            out.push((-1, id.to_vec(), path.to_string_lossy().into_owned()));
        }
    }
    out
}

/// TSC:CTC ratio (CPUID leaf 15H: EBX/EAX), `None` when the CPU says 0.
fn tsc_ctc_ratio() -> Option<(u64, u64)> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID is available on every x86-64 CPU and has no
        // memory effects (the intrinsic is safe on newer Rust).
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0x15) };
        (r.eax != 0 && r.ebx != 0).then_some((u64::from(r.ebx), u64::from(r.eax)))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// One CPU's event and its rings.
#[derive(Debug)]
struct CpuStream {
    cpu: u32,
    ev: PerfEvent,
    rings: Rings,
}

/// The online CPUs (`/sys/devices/system/cpu/online`: `0-3,6`), or
/// 0..available_parallelism when that file is missing.
pub fn online_cpus(sysfs_root: &Path) -> Vec<u32> {
    let text =
        std::fs::read_to_string(sysfs_root.join("devices/system/cpu/online")).unwrap_or_default();
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(lo), Ok(hi)) = (lo.trim().parse::<u32>(), hi.trim().parse::<u32>()) {
            cpus.extend(lo..=hi.min(lo.saturating_add(4095)));
        }
    }
    if cpus.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        cpus.extend(0..n);
    }
    cpus
}

struct Drain<'a, W: Write + Seek> {
    w: &'a mut PerfDataWriter<W>,
    summary: Summary,
    /// `sample_type` of the records' trailers, to read MMAP2 records.
    trailer_type: u64,
    /// Files mapped executable, for the build-id feature.
    exec_files: std::collections::BTreeSet<Vec<u8>>,
}

impl<W: Write + Seek> Drain<'_, W> {
    /// Copies the records of one data ring; returns how many.
    fn data(&mut self, rings: &Rings) -> Result<u64, CaptureError> {
        let (raw, tail, _) = rings.data()?;
        let (recs, used, _partial) = super::ring::records(&raw);
        for r in &recs {
            if r.kind == record_type::LOST && r.bytes.len() >= 24 {
                let mut n = [0u8; 8];
                n.copy_from_slice(&r.bytes[16..24]);
                self.summary.lost_events += u64::from_le_bytes(n);
            }
            self.w
                .write_raw_record(&r.bytes)
                .map_err(CaptureError::Output)?;
            if r.kind == record_type::MMAP2
                && let Ok(rec) =
                    crate::pevent::parse_record(&r.bytes, Default::default(), self.trailer_type)
                && let crate::pevent::Body::Mmap2(m) = rec.body
                && m.prot & 4 != 0
                && m.filename.starts_with(b"/")
            {
                self.exec_files.insert(m.filename.to_vec());
            }
        }
        self.summary.records += recs.len() as u64;
        rings.consume_data(tail.wrapping_add(used as u64));
        Ok(recs.len() as u64)
    }

    /// Copies one CPU's new AUX data as an AUXTRACE buffer of queue `idx`.
    fn aux(&mut self, s: &CpuStream, idx: u32) -> Result<u64, CaptureError> {
        let Some((raw, tail, head)) = s.rings.aux()? else {
            return Ok(0);
        };
        if raw.is_empty() {
            return Ok(0);
        }
        let (a, b) = raw.parts();
        // The TSC when the data was read, as perf writes it: perf's timed
        // decoding needs it ([`tsc_now`]).
        self.w
            .auxtrace_parts(&[a, b], tail, tsc_now(), idx, u32::MAX, s.cpu)
            .map_err(CaptureError::Output)?;
        self.summary.aux_buffers += 1;
        self.summary.aux_bytes += raw.len() as u64;
        s.rings.consume_aux(head);
        Ok(1)
    }

    /// One pass over every CPU; a FINISHED_ROUND after it when anything
    /// was written, so perf may sort each round's records by time.
    fn round(&mut self, streams: &[CpuStream], aux: bool) -> Result<(), CaptureError> {
        let mut n = 0;
        for (i, s) in streams.iter().enumerate() {
            n += self.data(&s.rings)?;
            if aux {
                n += self.aux(s, i as u32)?;
            }
        }
        if n > 0 {
            self.w.finished_round().map_err(CaptureError::Output)?;
        }
        Ok(())
    }
}

/// Writes what an attached process already has (as perf does when it
/// attaches): a COMM per thread and an MMAP2 per executable mapping, with
/// `sample_id` trailers naming the event `id` (time 0: before any record
/// the kernel writes).
fn synthesize(w: &mut impl RecordWriter, procfs_root: &Path, pid: u32, id: u64) -> io::Result<()> {
    let sid = |tid| SampleId {
        pid_tid: Some((pid, tid)),
        time: Some(0),
        cpu: Some(0),
        identifier: Some(id),
        ..SampleId::default()
    };
    for (tid, comm) in procfs::threads(procfs_root, pid) {
        w.comm(pid, tid, &comm, false, &sid(tid))?;
    }
    for m in procfs::exec_maps(procfs_root, pid) {
        // PERF_RECORD_MISC_USER: a user-space mapping.
        w.mmap2(
            2,
            pid,
            pid,
            m.start,
            m.end - m.start,
            m.pgoff,
            m.prot,
            m.flags,
            &m.path,
            &sid(pid),
        )?;
    }
    Ok(())
}

/// Records `target` as `plan` says into `out` (a perf.data file), until the
/// workload exits or `stop` is set. On error the output is incomplete: the
/// caller deletes it.
pub fn record<W: Write + Seek>(
    plan: &Plan,
    opts: &RecordOptions,
    target: &Target,
    out: W,
    stop: &AtomicBool,
) -> Result<(Summary, W), CaptureError> {
    let mut attr = plan.attr;
    let mut child = None;
    let pid = match target {
        Target::Command(argv) => {
            attr.set(flag::ENABLE_ON_EXEC, true);
            let c = HeldChild::spawn(argv)?;
            let pid = c.pid;
            child = Some(c);
            pid
        }
        Target::Pid(p) => {
            if !process_alive(*p) {
                return Err(CaptureError::BadOption(format!("no process {p}")));
            }
            *p as i32
        }
    };
    let result = record_pid(plan, opts, attr, pid, child.as_mut(), out, stop);
    if result.is_err()
        && let Some(c) = &child
    {
        c.kill();
    }
    result
}

fn record_pid<W: Write + Seek>(
    plan: &Plan,
    opts: &RecordOptions,
    attr: crate::data::attr::Attr,
    pid: i32,
    mut child: Option<&mut HeldChild>,
    out: W,
    stop: &AtomicBool,
) -> Result<(Summary, W), CaptureError> {
    // One event per CPU following the workload (and, with inherit, its
    // children), as perf records by default: the kernel refuses to mmap an
    // inherited event that is not bound to a CPU.
    let mut streams = Vec::new();
    for cpu in online_cpus(&opts.sysfs_root) {
        let ev = PerfEvent::open(&attr, pid, cpu as i32).map_err(|e| open_error(e, plan, opts))?;
        let mut rings =
            Rings::map(&ev, plan.data_size as usize).map_err(sys_err("mmap (data ring)"))?;
        if plan.aux_size != 0 {
            rings.map_aux(&ev, plan.aux_size as usize, plan.snapshot)?;
        }
        if let Some(f) = &plan.filter {
            ev.set_filter(f)
                .map_err(|e| CaptureError::UnsupportedFilter {
                    filter: opts.filter.clone().unwrap_or_default(),
                    reason: format!("the kernel refused `{f}`: {e}"),
                })?;
        }
        streams.push(CpuStream { cpu, ev, rings });
    }
    let ids = streams
        .iter()
        .map(|s| s.ev.id())
        .collect::<io::Result<Vec<u64>>>()
        .map_err(sys_err("PERF_EVENT_IOC_ID"))?;
    let id = ids.first().copied().unwrap_or(0);
    let attrs = [EventAttr { attr, ids }];
    let mut w = PerfDataWriter::new(out, &attrs).map_err(CaptureError::Output)?;
    let tsc = streams
        .first()
        .map(|s| s.rings.tsc_conversion())
        .unwrap_or_default();
    match plan.tracer {
        Tracer::IntelPt => {
            let p = plan.pmu.as_ref();
            let bits = |t: &str| p.map_or(0, |p| p.term_bits(t));
            let ratio = tsc_ctc_ratio();
            w.auxtrace_info_pt(&IntelPtInfo {
                pmu_type: attr.kind,
                tsc,
                tsc_bit: bits("tsc"),
                noretcomp_bit: bits("noretcomp"),
                // perf's values: 1 = a sched:sched_switch tracepoint event,
                // 2 = events with the context_switch flag (ours, per task:
                // PERF_RECORD_SWITCH), 3 = CPU-wide switch events.
                have_sched_switch: if attr.has(flag::CONTEXT_SWITCH) { 2 } else { 0 },
                snapshot_mode: plan.snapshot,
                per_cpu_mmaps: true,
                mtc_bit: Some(bits("mtc")),
                mtc_freq_bits: Some(bits("mtc_period")),
                tsc_ctc_ratio_n: Some(ratio.map_or(0, |r| r.0)),
                tsc_ctc_ratio_d: Some(ratio.map_or(0, |r| r.1)),
                cyc_bit: Some(bits("cyc")),
                max_non_turbo_ratio: Some(0),
                // The kernel's form (`filter ADDR/SIZE@FILE`): perf parses
                // this string with its address-filter grammar, which needs
                // the keyword (a bare range made perf 6.1 reject the record).
                filter: plan.filter.as_ref().map(|f| f.as_bytes().to_vec()),
            })
            .map_err(CaptureError::Output)?;
        }
        Tracer::IntelBts => w
            .auxtrace_info_bts(&IntelBtsInfo {
                pmu_type: attr.kind,
                tsc,
                snapshot_mode: plan.snapshot,
            })
            .map_err(CaptureError::Output)?,
        Tracer::Lbr | Tracer::Software => {}
    }
    if child.is_none() {
        synthesize(&mut w, &opts.procfs_root, pid as u32, id).map_err(CaptureError::Output)?;
    }
    let mut d = Drain {
        w: &mut w,
        summary: Summary {
            pid: pid as u32,
            ..Summary::default()
        },
        trailer_type: attr.sample_type,
        // An attached process's existing mappings (synthesized above); a
        // started command is still the forked hwtrace until it execs.
        exec_files: match child {
            Some(_) => Default::default(),
            None => procfs::exec_maps(&opts.procfs_root, pid as u32)
                .into_iter()
                .filter(|m| m.path.starts_with('/'))
                .map(|m| m.path.into_bytes())
                .collect(),
        },
    };
    match child.as_deref_mut() {
        Some(c) => c.release()?,
        None => {
            for s in &streams {
                s.ev.enable().map_err(sys_err("PERF_EVENT_IOC_ENABLE"))?;
            }
        }
    }
    loop {
        d.round(&streams, !plan.snapshot)?;
        let done = match child.as_deref() {
            Some(c) => c.try_wait().map(Some),
            None => (!process_alive(pid as u32)).then_some(None),
        };
        if let Some(code) = done {
            d.summary.exit_code = code;
            break;
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for s in &streams {
        s.ev.disable().map_err(sys_err("PERF_EVENT_IOC_DISABLE"))?;
    }
    // In snapshot mode this is the only AUX read: the newest window of each CPU.
    d.round(&streams, true)?;
    let summary = d.summary;
    let mut features = machine_features(&opts.procfs_root);
    features.build_ids = build_ids(&d.exec_files);
    let out = w.finish(&features).map_err(CaptureError::Output)?;
    Ok((summary, out))
}

/// The page size, for [`super::plan::plan`].
pub fn system_page_size() -> u64 {
    page_size() as u64
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Installs a SIGINT handler that sets the returned flag (pass it to
/// [`record`] so Ctrl-C ends an attached capture and still writes the file).
pub fn stop_on_sigint() -> &'static AtomicBool {
    let handler: extern "C" fn(libc::c_int) = on_sigint;
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; `signal` has no other memory effects.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
    }
    &STOP
}
