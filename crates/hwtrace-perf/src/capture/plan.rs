//! From what the user asked to what will be opened: PMU discovery,
//! privilege checks, config terms, filters and sizes, all before any
//! system call, so every refusal is tested against fake sysfs/procfs trees.

use std::path::PathBuf;

use super::access::{self, Needs};
use super::error::{CaptureError, Tracer};
use super::pmu::{Pmu, cpu_description, parse_u64, pmu_dir};
use crate::data::attr::{Attr, SW_DUMMY, attr_type, branch, flag, sample};

/// What to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordOptions {
    /// The tracer.
    pub tracer: Tracer,
    /// Trace user space.
    pub user: bool,
    /// Trace the kernel.
    pub kernel: bool,
    /// `--filter ADDR/SIZE@FILE` (Intel PT address filter).
    pub filter: Option<String>,
    /// AUX area size in bytes (`-m`), a power of two number of pages.
    pub aux_size: u64,
    /// Data ring size in bytes, a power of two number of pages.
    pub data_size: u64,
    /// Snapshot mode (the AUX area is overwritten; the newest data is kept).
    pub snapshot: bool,
    /// PMU config terms replacing the defaults (`tsc,mtc,cyc,noretcomp,...`).
    pub terms: Option<String>,
    /// LBR branch filter (`perf record -j` names: `any,u`).
    pub branch_filter: Option<String>,
    /// Where sysfs is (`/sys`).
    pub sysfs_root: PathBuf,
    /// Where procfs is (`/proc`).
    pub procfs_root: PathBuf,
}

impl Default for RecordOptions {
    fn default() -> Self {
        Self {
            tracer: Tracer::IntelPt,
            user: true,
            kernel: false,
            filter: None,
            aux_size: 4 << 20,
            data_size: 512 << 10,
            snapshot: false,
            terms: None,
            branch_filter: None,
            sysfs_root: PathBuf::from("/sys"),
            procfs_root: PathBuf::from("/proc"),
        }
    }
}

/// What will be opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The tracer.
    pub tracer: Tracer,
    /// The attribute.
    pub attr: Attr,
    /// The PMU (Intel PT/BTS).
    pub pmu: Option<Pmu>,
    /// The AUX area size (0 without AUX).
    pub aux_size: u64,
    /// The data ring size.
    pub data_size: u64,
    /// Snapshot mode.
    pub snapshot: bool,
    /// The kernel filter string for PERF_EVENT_IOC_SET_FILTER.
    pub filter: Option<String>,
    /// The CPU, for messages.
    pub cpu: String,
}

fn check_size(what: &str, size: u64, page: u64) -> Result<(), CaptureError> {
    let pages = size / page;
    if !size.is_multiple_of(page) || !pages.is_power_of_two() {
        return Err(CaptureError::BadOption(format!(
            "{what} size {size} is not a power-of-two number of {page}-byte pages"
        )));
    }
    Ok(())
}

/// Parses a size: `4M`, `512K`, `64k`, `1G`, bytes, or `N` pages when it
/// ends in `p` (`-m 16p`).
pub fn parse_size(s: &str, page: u64) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        'p' | 'P' => (&s[..s.len() - 1], page),
        _ => (s, 1),
    };
    parse_u64(num)?.checked_mul(mult)
}

/// Validates `ADDR/SIZE@FILE` (or `ADDR/SIZE` for a kernel address) and
/// returns the kernel's filter string (`filter ADDR/SIZE@FILE`).
pub fn kernel_filter(filter: &str) -> Result<String, CaptureError> {
    let bad = |reason: &str| CaptureError::UnsupportedFilter {
        filter: filter.to_string(),
        reason: reason.to_string(),
    };
    let (range, file) = match filter.split_once('@') {
        Some((r, f)) => (r, Some(f)),
        None => (filter, None),
    };
    let (addr, size) = range
        .split_once('/')
        .ok_or_else(|| bad("want ADDR/SIZE@FILE, e.g. 0x1000/0x200@/usr/bin/true"))?;
    parse_u64(addr.trim()).ok_or_else(|| bad("ADDR is not a number"))?;
    let size = parse_u64(size.trim()).ok_or_else(|| bad("SIZE is not a number"))?;
    if size == 0 {
        return Err(bad("SIZE is 0"));
    }
    match file {
        Some(f) if !f.starts_with('/') => Err(bad("FILE must be an absolute path")),
        Some(f) => Ok(format!("filter {}/{}@{f}", addr.trim(), size)),
        None => Ok(format!("filter {}/{}", addr.trim(), size)),
    }
}

fn sideband(a: &mut Attr, user: bool, kernel: bool) {
    for f in [
        flag::DISABLED,
        flag::SAMPLE_ID_ALL,
        flag::MMAP,
        flag::MMAP2,
        flag::COMM,
        flag::COMM_EXEC,
        flag::TASK,
        flag::CONTEXT_SWITCH,
    ] {
        a.set(f, true);
    }
    a.set(flag::EXCLUDE_USER, !user);
    a.set(flag::EXCLUDE_KERNEL, !kernel);
    a.set(flag::EXCLUDE_HV, true);
    a.sample_type |= sample::TID | sample::TIME | sample::CPU | sample::IDENTIFIER;
}

/// Loads the PMU of an AUX tracer, or says this CPU has none.
pub fn load_pmu(opts: &RecordOptions, tracer: Tracer) -> Result<Pmu, CaptureError> {
    let name = tracer.pmu_name().unwrap_or("cpu");
    Pmu::load(&opts.sysfs_root, name)?.ok_or_else(|| CaptureError::NoPmu {
        tracer,
        cpu: cpu_description(&opts.procfs_root),
        path: pmu_dir(&opts.sysfs_root, name),
    })
}

/// Checks everything that can be checked without the kernel and builds
/// the attribute. `page` is the page size.
pub fn plan(opts: &RecordOptions, page: u64) -> Result<Plan, CaptureError> {
    let cpu = cpu_description(&opts.procfs_root);
    if !opts.user && !opts.kernel {
        return Err(CaptureError::BadOption(
            "neither user nor kernel space is traced".into(),
        ));
    }
    check_size("data ring", opts.data_size, page)?;
    let mut attr = Attr::default();
    let mut pmu = None;
    let mut aux_size = 0;
    let mut filter = None;
    match opts.tracer {
        Tracer::IntelPt | Tracer::IntelBts => {
            let p = load_pmu(opts, opts.tracer)?;
            check_size("AUX area", opts.aux_size, page)?;
            aux_size = opts.aux_size;
            attr.kind = p.kind;
            attr.sample_period = 1;
            if opts.tracer == Tracer::IntelPt {
                let terms = match &opts.terms {
                    Some(t) => t.clone(),
                    None => default_pt_terms(&p),
                };
                let c = p.build_config(&terms)?;
                (attr.config, attr.config1, attr.config2, attr.config3) =
                    (c.config, c.config1, c.config2, c.config3);
            } else if let Some(t) = &opts.terms {
                let c = p.build_config(t)?;
                attr.config = c.config;
            }
            if let Some(f) = &opts.filter {
                let ranges = p.cap("num_address_ranges").unwrap_or(0);
                if opts.tracer != Tracer::IntelPt || ranges == 0 {
                    return Err(CaptureError::UnsupportedFilter {
                        filter: f.clone(),
                        reason: format!(
                            "{} on this CPU has no address filter ranges (caps/num_address_ranges = {ranges})",
                            p.name
                        ),
                    });
                }
                filter = Some(kernel_filter(f)?);
            }
            pmu = Some(p);
        }
        Tracer::Lbr => {
            if opts.filter.is_some() {
                return Err(CaptureError::BadOption(
                    "--filter applies to Intel PT only".into(),
                ));
            }
            attr.kind = attr_type::HARDWARE;
            attr.config = 0; // PERF_COUNT_HW_CPU_CYCLES
            attr.sample_period = 100_003;
            attr.sample_type = sample::IP | sample::BRANCH_STACK;
            attr.branch_sample_type = branch_filter(opts)?;
        }
        Tracer::Software => {
            attr.kind = attr_type::SOFTWARE;
            attr.config = SW_DUMMY;
        }
    }
    sideband(&mut attr, opts.user, opts.kernel);
    // Follow the workload's children: events are opened per CPU (see
    // `session`), where the kernel allows inherited events to be mapped.
    attr.set(flag::INHERIT, true);
    access::check(
        &opts.procfs_root,
        Needs {
            kernel: opts.kernel,
            cpu_wide: false,
        },
    )?;
    Ok(Plan {
        tracer: opts.tracer,
        attr,
        pmu,
        aux_size,
        data_size: opts.data_size,
        snapshot: opts.snapshot,
        filter,
        cpu,
    })
}

/// perf's default Intel PT terms, limited to what this PMU has:
/// `pt,branch,tsc`, and `mtc,mtc_period=3` when MTC is supported.
pub fn default_pt_terms(p: &Pmu) -> String {
    let mut terms: Vec<&str> = ["pt", "branch", "tsc"]
        .into_iter()
        .filter(|t| p.formats.contains_key(*t))
        .collect();
    if p.cap("mtc").unwrap_or(0) != 0
        && p.formats.contains_key("mtc")
        && p.formats.contains_key("mtc_period")
    {
        terms.extend(["mtc", "mtc_period=3"]);
    }
    terms.join(",")
}

/// The `branch_sample_type` for LBR: the `-j` names given (default `any`),
/// plus `u`/`k` from the user/kernel choice when no privilege level is named.
pub fn branch_filter(opts: &RecordOptions) -> Result<u64, CaptureError> {
    let names = opts.branch_filter.as_deref().unwrap_or("any");
    let mut bits = 0;
    for n in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        bits |= branch::by_name(n).ok_or_else(|| {
            let known: Vec<&str> = branch::NAMES.iter().map(|(n, _)| *n).collect();
            CaptureError::BadOption(format!(
                "unknown branch filter `{n}` (known: {})",
                known.join(",")
            ))
        })?;
    }
    if bits & (branch::USER | branch::KERNEL | (1 << 2)) == 0 {
        if opts.user {
            bits |= branch::USER;
        }
        if opts.kernel {
            bits |= branch::KERNEL;
        }
    }
    Ok(bits)
}

/// The [`Needs`] of a plan (for messages after a refusal).
pub fn needs(opts: &RecordOptions) -> Needs {
    Needs {
        kernel: opts.kernel,
        cpu_wide: false,
    }
}
