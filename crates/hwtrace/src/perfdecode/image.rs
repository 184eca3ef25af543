//! The code image of a traced process, built from its executable mappings:
//! each mapped file is opened under `--sysroot`, its GNU build id checked
//! against the one perf recorded, and the mapped range of it added at the
//! mapping's address. The vDSO comes from `--vdso`. What cannot be mapped
//! is kept as a [`Missing`] entry so that decode errors inside it can be
//! blamed on it.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use hwtrace_mem::image::{Image, RawSpec};
use hwtrace_types::Ip;

use super::kernel::{Kernel, is_kernel_addr};
use super::sideband::{Mapping, Sideband};

/// Where to find the mapped files.
#[derive(Clone, Debug, Default)]
pub struct ImageOptions {
    /// Prefix for every absolute path the mappings name.
    pub sysroot: Option<PathBuf>,
    /// A dump of the vDSO (as mapped in the traced process).
    pub vdso: Option<PathBuf>,
}

/// Why a mapping is not in the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MissingReason {
    /// No such file (or it cannot be read).
    NotFound(String),
    /// The file's build id differs from the recorded one.
    BuildIdMismatch {
        /// What perf recorded.
        recorded: String,
        /// What the file on disk has (`none` without a build-id note).
        found: String,
    },
    /// `[vdso]` without `--vdso`.
    NoVdso,
    /// Kernel code without `--kcore`.
    Kernel,
    /// The file is shorter than the mapping says, or similar.
    Unusable(String),
}

impl std::fmt::Display for MissingReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFound(e) => write!(f, "file not found ({e})"),
            Self::BuildIdMismatch { recorded, found } => {
                write!(
                    f,
                    "build id mismatch: perf recorded {recorded}, the file has {found}"
                )
            }
            Self::NoVdso => write!(f, "vDSO not available: pass a dump of it with --vdso FILE"),
            Self::Kernel => write!(
                f,
                "kernel code: give --kcore DIR|FILE (perf record --kcore's directory, or /proc/kcore)"
            ),
            Self::Unusable(e) => write!(f, "{e}"),
        }
    }
}

/// A mapping whose code is not available.
#[derive(Clone, Debug)]
pub struct Missing {
    /// The mapping.
    pub mapping: Mapping,
    /// The path that was tried (after `--sysroot`).
    pub path: String,
    /// Why.
    pub reason: MissingReason,
}

/// The image of one decoding context and what is missing from it.
#[derive(Debug, Default)]
pub struct ProcessImage {
    /// The code that could be mapped.
    pub image: Image,
    /// The mappings that could not.
    pub missing: Vec<Missing>,
}

impl ProcessImage {
    /// The missing mapping holding `ip`, if any.
    pub fn missing_at(&self, ip: u64) -> Option<usize> {
        self.missing.iter().rposition(|m| m.mapping.contains(ip))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Kernel mappings: in the upper half of the canonical address space, or
/// named so by perf.
pub fn is_kernel(m: &Mapping) -> bool {
    is_kernel_addr(m.addr) || m.filename.starts_with("[kernel")
}

/// The GNU build id of each file already read (`None`: it has none), so
/// that each file is read once however many streams map it.
pub type BuildIdCache = std::collections::HashMap<PathBuf, Option<Vec<u8>>>;

/// Builds the image of the mappings `pids` owns (`None`: every
/// process's), with the kernel's code when `--kcore` gave it (adding it
/// can fail: a kcore range that cannot be read; without it kernel
/// mappings are [`MissingReason::Kernel`]).
pub fn build_with_kernel(
    sb: &Sideband,
    pids: Option<&BTreeSet<u32>>,
    opts: &ImageOptions,
    kernel: &Kernel,
    cache: &mut BuildIdCache,
) -> anyhow::Result<ProcessImage> {
    let keep = |m: &Mapping| pids.is_none_or(|p| p.contains(&m.pid));
    build_filtered(sb, keep, opts, kernel, cache)
}

/// The image of one program of process `pid`: the mappings made between
/// its `generation`-th exec and the next (see
/// [`Sideband::generation_at`]), untimed ones, and the kernel's.
pub fn build_program(
    sb: &Sideband,
    pid: u32,
    generation: usize,
    opts: &ImageOptions,
    kernel: &Kernel,
    cache: &mut BuildIdCache,
) -> anyhow::Result<ProcessImage> {
    let keep = |m: &Mapping| m.pid == pid && sb.generation_of(m).is_none_or(|g| g == generation);
    build_filtered(sb, keep, opts, kernel, cache)
}

fn build_filtered(
    sb: &Sideband,
    keep: impl Fn(&Mapping) -> bool,
    opts: &ImageOptions,
    kernel: &Kernel,
    cache: &mut BuildIdCache,
) -> anyhow::Result<ProcessImage> {
    let mut out = ProcessImage::default();
    // Kernel code first: the process's own mappings override it.
    kernel.add_to(&mut out.image)?;
    for m in &sb.mappings {
        if !keep(m) && !is_kernel(m) {
            continue;
        }
        if is_kernel(m) && kernel.has_code() {
            continue;
        }
        let (path, reason) = add_mapping(&mut out.image, sb, m, opts, cache);
        if let Some(reason) = reason {
            out.missing.push(Missing {
                mapping: m.clone(),
                path,
                reason,
            });
        }
    }
    Ok(out)
}

/// Adds one mapping; returns the path tried and, when it failed, why.
fn add_mapping(
    image: &mut Image,
    sb: &Sideband,
    m: &Mapping,
    opts: &ImageOptions,
    cache: &mut BuildIdCache,
) -> (String, Option<MissingReason>) {
    if is_kernel(m) {
        return (m.filename.clone(), Some(MissingReason::Kernel));
    }
    let path: PathBuf = if m.filename == "[vdso]" {
        match &opts.vdso {
            Some(p) => p.clone(),
            None => return (m.filename.clone(), Some(MissingReason::NoVdso)),
        }
    } else if m.filename.starts_with('[') || m.filename.starts_with("//anon") {
        return (
            m.filename.clone(),
            Some(MissingReason::Unusable(
                "anonymous or special mapping: its code was not recorded".into(),
            )),
        );
    } else {
        let rel = Path::new(OsStr::from_bytes(m.filename.as_bytes()));
        match &opts.sysroot {
            Some(root) => root.join(rel.strip_prefix("/").unwrap_or(rel)),
            None => rel.to_path_buf(),
        }
    };
    let shown = path.display().to_string();
    if let Err(e) = std::fs::metadata(&path) {
        return (shown, Some(MissingReason::NotFound(e.to_string())));
    }
    if m.filename != "[vdso]" {
        let recorded = m
            .build_id
            .clone()
            .or_else(|| sb.build_ids.get(&m.filename).cloned());
        if let Some(recorded) = recorded {
            let found = cache
                .entry(path.clone())
                .or_insert_with(|| {
                    let set = BTreeSet::from([path.as_os_str().as_bytes().to_vec()]);
                    hwtrace_perf::capture::session::build_ids(&set)
                        .into_iter()
                        .next()
                        .map(|(_, id, _)| id)
                })
                .clone();
            if found.as_deref() != Some(&recorded[..]) {
                let found = found.map_or("none".into(), |f| hex(&f));
                return (
                    shown,
                    Some(MissingReason::BuildIdMismatch {
                        recorded: hex(&recorded),
                        found,
                    }),
                );
            }
        }
    }
    let spec = RawSpec {
        path,
        offset: m.pgoff,
        size: Some(m.len),
        addr: Ip(m.addr),
        truncate: true,
    };
    match image.add_raw(None, &spec) {
        Ok(()) => (shown, None),
        Err(e) => (shown, Some(MissingReason::Unusable(e.to_string()))),
    }
}
