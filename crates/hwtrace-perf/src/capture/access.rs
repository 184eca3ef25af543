//! Who may record what: `perf_event_paranoid` and capabilities, read from
//! a procfs root so tests can fake them.
//!
//! `kernel.perf_event_paranoid` (Linux `Documentation/admin-guide/sysctl/
//! kernel.rst`) limits unprivileged users: at 2 only user-space profiling
//! of their own processes, at 1 also kernel profiling, at 0 also CPU-wide
//! events, at -1 everything; Debian adds 3, which forbids everything.
//! CAP_PERFMON (or CAP_SYS_ADMIN) bypasses all of it.

use std::path::Path;

use super::error::CaptureError;

/// `CAP_SYS_ADMIN`.
pub const CAP_SYS_ADMIN: u32 = 21;
/// `CAP_PERFMON`.
pub const CAP_PERFMON: u32 = 38;

/// What a capture needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// Kernel-space tracing.
    pub kernel: bool,
    /// CPU-wide events (not following one process).
    pub cpu_wide: bool,
}

impl Needs {
    /// The highest `perf_event_paranoid` that allows it without privileges.
    pub fn max_paranoid(&self) -> i32 {
        if self.cpu_wide {
            0
        } else if self.kernel {
            1
        } else {
            2
        }
    }

    fn what(&self) -> &'static str {
        if self.cpu_wide {
            "CPU-wide tracing"
        } else if self.kernel {
            "kernel tracing"
        } else {
            "tracing your own process"
        }
    }
}

/// `/proc/sys/kernel/perf_event_paranoid`, if readable.
pub fn paranoid(procfs_root: &Path) -> Option<i32> {
    std::fs::read_to_string(procfs_root.join("sys/kernel/perf_event_paranoid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The effective capability set of this process (`CapEff` in
/// `/proc/self/status`).
pub fn effective_caps(procfs_root: &Path) -> Option<u64> {
    let status = std::fs::read_to_string(procfs_root.join("self/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
}

/// Whether this process has CAP_PERFMON or CAP_SYS_ADMIN.
pub fn privileged(procfs_root: &Path) -> bool {
    effective_caps(procfs_root)
        .is_some_and(|c| c & (1 << CAP_PERFMON) != 0 || c & (1 << CAP_SYS_ADMIN) != 0)
}

/// Fails with [`CaptureError::Paranoid`] when the capture is sure to be
/// refused. An unreadable paranoid file is not an error: the kernel decides.
pub fn check(procfs_root: &Path, needs: Needs) -> Result<(), CaptureError> {
    if privileged(procfs_root) {
        return Ok(());
    }
    match paranoid(procfs_root) {
        Some(value) if value > needs.max_paranoid() => Err(CaptureError::Paranoid {
            value,
            needed: needs.max_paranoid(),
            what: needs.what(),
        }),
        _ => Ok(()),
    }
}
