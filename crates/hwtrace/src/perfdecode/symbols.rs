//! `--sym`: addresses named `symbol+0xoff`. User addresses are looked up in
//! the function symbols of the files the process had mapped (through
//! [`crate::symbols::Symbolizer`], each file placed where its MMAP record
//! put the file offset it maps), kernel addresses in `--kallsyms`.
//! A process's files are read the first time one of its addresses is
//! named.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use hwtrace_mem::image::{ElfPlacement, ElfSpec, SegmentFilter};

use super::image::ImageOptions;
use super::kernel::{Kernel, is_kernel_addr};
use super::sideband::{Mapping, Sideband};
use crate::symbols::Symbolizer;

/// Names addresses of the processes of one perf.data.
pub struct Names<'s> {
    sb: &'s Sideband,
    opts: &'s ImageOptions,
    kernel: &'s Kernel,
    /// Per process, one symbolizer per mapped ELF file that could be read.
    user: HashMap<u32, Vec<(Mapping, Symbolizer)>>,
}

/// Where `m` puts the ELF file at `path`: the bias that makes the segment
/// holding file offset `m.pgoff` start its bytes at `m.addr`.
fn bias_of(path: &Path, m: &Mapping) -> Option<i128> {
    use object::{Object, ObjectSegment};
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let seg = file.segments().find(|s| {
        let (off, size) = s.file_range();
        off <= m.pgoff && m.pgoff < off.saturating_add(size.max(1))
    })?;
    let (off, _) = seg.file_range();
    let vaddr_of_pgoff = i128::from(seg.address()) + i128::from(m.pgoff - off);
    Some(i128::from(m.addr) - vaddr_of_pgoff)
}

impl<'s> Names<'s> {
    /// Names for the processes of `sb`, files found as `opts` says.
    pub fn new(sb: &'s Sideband, opts: &'s ImageOptions, kernel: &'s Kernel) -> Self {
        Self {
            sb,
            opts,
            kernel,
            user: HashMap::new(),
        }
    }

    fn path_of(&self, m: &Mapping) -> Option<PathBuf> {
        if m.filename == "[vdso]" {
            return self.opts.vdso.clone();
        }
        if m.filename.starts_with('[') || m.filename.starts_with("//") {
            return None;
        }
        let rel = Path::new(OsStr::from_bytes(m.filename.as_bytes()));
        Some(match &self.opts.sysroot {
            Some(root) => root.join(rel.strip_prefix("/").unwrap_or(rel)),
            None => rel.to_path_buf(),
        })
    }

    fn load(&self, pid: u32) -> Vec<(Mapping, Symbolizer)> {
        let mut out = Vec::new();
        for m in self.sb.mappings.iter().filter(|m| m.pid == pid) {
            let Some(path) = self.path_of(m) else {
                continue;
            };
            let Some(bias) = bias_of(&path, m) else {
                continue;
            };
            let spec = ElfSpec {
                path,
                // Two's complement: a negative bias wraps like an address.
                placement: ElfPlacement::Bias(bias as u64),
                segments: SegmentFilter::Executable,
            };
            if let Ok(s) = Symbolizer::load(&[spec]) {
                out.push((m.clone(), s));
            }
        }
        out
    }

    /// `name+0xoff` of `addr` in process `pid` (`None`: unknown process,
    /// or no symbol).
    pub fn name(&mut self, pid: Option<u32>, addr: u64) -> Option<String> {
        if is_kernel_addr(addr) {
            return self.kernel.symbolize(addr);
        }
        let pid = pid?;
        if !self.user.contains_key(&pid) {
            let loaded = self.load(pid);
            self.user.insert(pid, loaded);
        }
        let files = self.user.get(&pid)?;
        files
            .iter()
            .rev()
            .filter(|(m, _)| m.contains(addr))
            .find_map(|(_, s)| s.symbolize(addr))
    }

    /// The pid of thread `tid`, as the sideband says.
    pub fn pid_of(&self, tid: Option<u32>) -> Option<u32> {
        tid.and_then(|t| self.sb.pid_of.get(&t).copied())
    }
}
