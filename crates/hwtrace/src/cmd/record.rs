//! `hwtrace record`: record a command or a running process with Intel PT,
//! BTS or LBR through perf_event_open, into a perf.data file.

use std::ffi::OsString;
use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use hwtrace_perf::capture::plan::parse_size;
use hwtrace_perf::capture::session::{stop_on_sigint, system_page_size};
use hwtrace_perf::capture::{CaptureError, RecordOptions, Target, Tracer, plan, record};

use super::record_portable::{PortableRequest, describe, record_portable};

/// Record branch traces with perf_event_open into perf.data.
///
/// Exit codes: 0 recorded; 2 the trace hardware is missing on this machine
/// (no intel_pt/intel_bts PMU, no LBR); 3 not permitted
/// (perf_event_paranoid, CAP_PERFMON); 1 anything else. No output file is
/// left behind when recording fails.
///
/// Without the trace hardware (no intel_pt/intel_bts PMU, no LBR), the
/// command is recorded with qemu-user instead (`--portable`, said on
/// stderr) unless `--no-fallback` is given.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Record with qemu-user and write what the trace hardware would have:
    /// works on any x86-64 Linux machine, user space only. Slow: every
    /// instruction is single-stepped and logged (a few hundred thousand
    /// instructions per second), so keep to small programs.
    #[arg(long, conflicts_with_all = ["pid", "sideband_only"])]
    portable: bool,
    /// Without the trace hardware, fail (exit code 2) instead of recording
    /// with qemu-user.
    #[arg(long, conflicts_with = "portable")]
    no_fallback: bool,
    /// Intel Processor Trace (the default).
    #[arg(long, group = "tracer")]
    pt: bool,
    /// Intel Branch Trace Store.
    #[arg(long, group = "tracer")]
    bts: bool,
    /// Last Branch Records: cycles samples with branch stacks.
    #[arg(long, group = "tracer")]
    lbr: bool,
    /// Sideband only (mmap, comm, task, switch records of a software event):
    /// no branch data, but works on any Linux machine.
    #[arg(long, group = "tracer")]
    sideband_only: bool,
    /// Intel PT address filter: trace only ADDR/SIZE of FILE
    /// (e.g. 0x1130/0x40@/usr/bin/true).
    #[arg(long, value_name = "ADDR/SIZE@FILE")]
    filter: Option<String>,
    /// Trace user space (the default when neither --user nor --kernel).
    #[arg(long)]
    user: bool,
    /// Trace the kernel.
    #[arg(long)]
    kernel: bool,
    /// AUX area size: bytes, or with K/M/G, or pages with p (e.g. 4M, 64p).
    #[arg(
        short = 'm',
        long = "mmap-pages",
        value_name = "SIZE",
        default_value = "4M"
    )]
    mmap: String,
    /// Snapshot mode: the AUX area is overwritten, the newest data is kept
    /// when recording ends.
    #[arg(long)]
    snapshot: bool,
    /// PMU config terms instead of the defaults (e.g. tsc,mtc,cyc,noretcomp,branch).
    /// With --portable (Intel PT): the same terms, simulated, timing
    /// included (the simulator's clock: a nanosecond per instruction).
    #[arg(long, value_name = "TERMS")]
    terms: Option<String>,
    /// LBR branch filter, perf record -j names (any, any_call, any_ret, cond, u, k, ...).
    #[arg(short = 'j', long = "branch-filter", value_name = "FILTER")]
    branch_filter: Option<String>,
    /// Output file.
    #[arg(short = 'o', long, default_value = "perf.data")]
    output: PathBuf,
    /// Attach to a running process instead of starting a command (Ctrl-C stops).
    #[arg(short = 'p', long, value_name = "PID", conflicts_with = "command")]
    pid: Option<u32>,
    /// Where sysfs is (tests point this at fake PMU trees).
    #[arg(long, hide = true, default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Where procfs is (tests point this at fake paranoid/capability files).
    #[arg(long, hide = true, default_value = "/proc")]
    procfs_root: PathBuf,
    /// The command to record.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

impl RecordArgs {
    fn options(&self) -> Result<RecordOptions, CaptureError> {
        let tracer = if self.bts {
            Tracer::IntelBts
        } else if self.lbr {
            Tracer::Lbr
        } else if self.sideband_only {
            Tracer::Software
        } else {
            Tracer::IntelPt
        };
        let page = system_page_size();
        let aux_size = parse_size(&self.mmap, page).ok_or_else(|| {
            CaptureError::BadOption(format!("-m {}: not a size (try 4M or 64p)", self.mmap))
        })?;
        Ok(RecordOptions {
            tracer,
            user: self.user || !self.kernel,
            kernel: self.kernel,
            filter: self.filter.clone(),
            aux_size,
            snapshot: self.snapshot,
            terms: self.terms.clone(),
            branch_filter: self.branch_filter.clone(),
            sysfs_root: self.sysfs_root.clone(),
            procfs_root: self.procfs_root.clone(),
            ..RecordOptions::default()
        })
    }

    fn target(&self) -> Result<Target, CaptureError> {
        match (self.pid, self.command.is_empty()) {
            (Some(p), _) => Ok(Target::Pid(p)),
            (None, false) => Ok(Target::Command(self.command.clone())),
            (None, true) => Err(CaptureError::BadOption(
                "give a command after `--`, or -p PID".into(),
            )),
        }
    }
}

fn exit_code(e: &CaptureError) -> u8 {
    match e {
        CaptureError::NoPmu { .. } | CaptureError::NoLbr { .. } => 2,
        CaptureError::Paranoid { .. } | CaptureError::PermissionDenied { .. } => 3,
        _ => 1,
    }
}

/// Records into a temporary file beside the output, renamed on success.
fn run_capture(args: &RecordArgs) -> Result<hwtrace_perf::capture::Summary, CaptureError> {
    let opts = args.options()?;
    let target = args.target()?;
    let plan = plan(&opts, system_page_size())?;
    let mut tmp = args.output.clone().into_os_string();
    tmp.push(".hwtrace-partial");
    let tmp = PathBuf::from(tmp);
    let file = File::create(&tmp).map_err(CaptureError::Output)?;
    let stop = stop_on_sigint();
    let result =
        record(&plan, &opts, &target, BufWriter::new(file), stop).and_then(|(summary, out)| {
            out.into_inner()
                .map_err(|e| CaptureError::Output(e.into_error()))?;
            std::fs::rename(&tmp, &args.output).map_err(CaptureError::Output)?;
            Ok(summary)
        });
    if result.is_err() {
        std::fs::remove_file(&tmp).ok();
    }
    result
}

/// Runs `hwtrace record`.
pub fn run(args: RecordArgs) -> Result<ExitCode> {
    if args.portable {
        return portable(&args);
    }
    match run_capture(&args) {
        Ok(s) => {
            let status = s
                .exit_code
                .map_or(String::new(), |c| format!(", the command exited with {c}"));
            eprintln!(
                "hwtrace record: wrote {} ({} records, {} AUX bytes in {} buffers, {} events lost{status})",
                args.output.display(),
                s.records,
                s.aux_bytes,
                s.aux_buffers,
                s.lost_events
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ (CaptureError::NoPmu { .. } | CaptureError::NoLbr { .. }))
            if !args.no_fallback && args.pid.is_none() =>
        {
            let (tracer, cpu) = match &e {
                CaptureError::NoPmu { tracer, cpu, .. } => (*tracer, cpu.as_str()),
                CaptureError::NoLbr { cpu, .. } => (Tracer::Lbr, cpu.as_str()),
                _ => (Tracer::IntelPt, ""),
            };
            eprintln!(
                "hwtrace record: no {} on this {cpu}: recording with qemu-user instead (--portable)",
                tracer.hardware()
            );
            portable(&args)
        }
        Err(e) => {
            eprintln!("hwtrace record: error: {e}");
            Ok(ExitCode::from(exit_code(&e)))
        }
    }
}

fn portable(args: &RecordArgs) -> Result<ExitCode> {
    let req = PortableRequest {
        tracer: args.options()?.tracer,
        kernel: args.kernel,
        filter: args.filter.clone(),
        terms: args.terms.clone(),
        branch_filter: args.branch_filter.clone(),
        inapplicable: [(args.snapshot, "--snapshot"), (args.pid.is_some(), "-p")]
            .into_iter()
            .filter_map(|(given, name)| given.then_some(name))
            .collect(),
        output: args.output.clone(),
        command: args.command.clone(),
    };
    match record_portable(&req) {
        Ok(s) => {
            eprintln!("{}", describe(&s, &args.output, req.tracer));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("hwtrace record --portable: error: {e:#}");
            Ok(ExitCode::FAILURE)
        }
    }
}
