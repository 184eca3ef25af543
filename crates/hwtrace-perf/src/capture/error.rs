//! Capture errors: one typed kind per missing capability, each with a
//! message that says what is missing on this machine and what to do.

use std::path::PathBuf;

use thiserror::Error;

/// What the user asked to record with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracer {
    /// Intel Processor Trace (`intel_pt` PMU).
    IntelPt,
    /// Intel Branch Trace Store (`intel_bts` PMU).
    IntelBts,
    /// Last Branch Records (samples with `PERF_SAMPLE_BRANCH_STACK`).
    Lbr,
    /// A software event (sideband only; no branch data).
    Software,
}

impl Tracer {
    /// The sysfs PMU name, for the AUX tracers.
    pub fn pmu_name(self) -> Option<&'static str> {
        match self {
            Self::IntelPt => Some("intel_pt"),
            Self::IntelBts => Some("intel_bts"),
            Self::Lbr | Self::Software => None,
        }
    }

    /// The hardware's name, for messages.
    pub fn hardware(self) -> &'static str {
        match self {
            Self::IntelPt => "Intel PT",
            Self::IntelBts => "Intel BTS",
            Self::Lbr => "LBR (last branch records)",
            Self::Software => "software events",
        }
    }
}

/// Said whenever trace hardware is missing.
pub const PORTABLE_HINT: &str = "use `hwtrace record --portable` to record with qemu-user instead (user space only, no trace hardware needed)";

/// What went wrong while preparing or running a capture.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The PMU does not exist on this machine.
    #[error("this CPU ({cpu}) has no {}: {} does not exist; {PORTABLE_HINT}", tracer.hardware(), path.display())]
    NoPmu {
        /// What was asked for.
        tracer: Tracer,
        /// The vendor and model of this CPU.
        cpu: String,
        /// The sysfs directory that is missing.
        path: PathBuf,
    },
    /// The kernel refuses branch stacks (no LBR, or not exposed to this VM).
    #[error(
        "this CPU ({cpu}) offers no LBR branch stacks to perf (perf_event_open: {errno_text}); {PORTABLE_HINT}"
    )]
    NoLbr {
        /// The vendor and model of this CPU.
        cpu: String,
        /// The errno text.
        errno_text: String,
    },
    /// The kernel refused the AUX tracer's event although sysfs lists the PMU.
    #[error(
        "the kernel rejected the {} event (PMU type {pmu_type}, from {}): {errno_text}; \
         check the config terms (--terms) against {}",
        tracer.hardware(), dir.join("type").display(), dir.join("format").display()
    )]
    PmuRejected {
        /// What was asked for.
        tracer: Tracer,
        /// The PMU type used.
        pmu_type: u32,
        /// The PMU's sysfs directory.
        dir: PathBuf,
        /// The errno text.
        errno_text: String,
    },
    /// `perf_event_paranoid` forbids this capture for an unprivileged user.
    #[error(
        "/proc/sys/kernel/perf_event_paranoid is {value}, {what} needs {needed} or lower (or CAP_PERFMON): \
         run `sudo sysctl kernel.perf_event_paranoid={needed}` or grant CAP_PERFMON"
    )]
    Paranoid {
        /// The current value.
        value: i32,
        /// The highest value that allows it.
        needed: i32,
        /// What was asked for.
        what: &'static str,
    },
    /// The kernel said EACCES/EPERM.
    #[error(
        "perf_event_open({what}) was refused ({errno_text}): this needs CAP_PERFMON (or CAP_SYS_ADMIN), \
         or a lower kernel.perf_event_paranoid (now {paranoid})"
    )]
    PermissionDenied {
        /// What was being opened.
        what: String,
        /// The errno text.
        errno_text: String,
        /// The paranoid level, or "unknown".
        paranoid: String,
    },
    /// The AUX area could not be mapped.
    #[error(
        "mapping the {size}-byte AUX area failed ({errno_text}); try a smaller -m, or raise \
         /proc/sys/kernel/perf_event_mlock_kb (the locked-memory limit for perf buffers)"
    )]
    AuxMmap {
        /// The size asked for.
        size: u64,
        /// The errno text.
        errno_text: String,
    },
    /// The PMU cannot filter addresses, or rejected the filter.
    #[error("address filter `{filter}` is not supported: {reason}")]
    UnsupportedFilter {
        /// The filter as given.
        filter: String,
        /// Why.
        reason: String,
    },
    /// A `format/*` file of a PMU could not be parsed.
    #[error("{}: bad format `{text}`: {reason}", path.display())]
    BadFormat {
        /// The file.
        path: PathBuf,
        /// Its content.
        text: String,
        /// What was wrong.
        reason: &'static str,
    },
    /// A config term the PMU has no format for.
    #[error("{pmu} has no config term `{term}` (it has: {known})")]
    UnknownTerm {
        /// The PMU.
        pmu: String,
        /// The term.
        term: String,
        /// The terms it has.
        known: String,
    },
    /// A config term's value does not fit its bits.
    #[error("{pmu} term `{term}={value}` does not fit its {bits} bits")]
    TermValue {
        /// The PMU.
        pmu: String,
        /// The term.
        term: String,
        /// The value.
        value: u64,
        /// The field width.
        bits: u32,
    },
    /// A bad option value (sizes, filters, branch filters).
    #[error("{0}")]
    BadOption(String),
    /// A file under sysfs/procfs could not be read.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A system call failed for a reason without its own kind.
    #[error("{call} failed")]
    Sys {
        /// The call.
        call: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The ring buffer was overrun: the reader fell more than a buffer behind.
    #[error(
        "ring buffer overrun: head {head:#x} is {behind:#x} bytes ahead of tail {tail:#x} in a {size:#x}-byte buffer"
    )]
    Overrun {
        /// The head.
        head: u64,
        /// The tail.
        tail: u64,
        /// head - tail.
        behind: u64,
        /// The buffer size.
        size: u64,
    },
    /// Writing the perf.data file failed.
    #[error("writing the perf.data output: {0}")]
    Output(std::io::Error),
}
