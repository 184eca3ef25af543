//! Kernel code and symbols for `hwtrace perf decode`: `--kallsyms FILE`
//! (the `/proc/kallsyms` text: `ADDRESS TYPE NAME [MODULE]` per line) names
//! kernel addresses, and `--kcore DIR|FILE` (perf's `kcore_dir` or an ELF
//! core like `/proc/kcore`) supplies their code, read through
//! [`hwtrace_mem::image::Kcore`].
//!
//! Which part of the kernel goes into the images: the kernel mappings the
//! sideband records (`[kernel.kallsyms]_text`, modules); without any, the
//! text `--kallsyms` spans (`_stext` to `_etext`, modules included); without
//! that either, every segment of a kcore that is a regular file (perf's
//! `kcore_dir/kcore` holds only text). A `/proc/kcore` spans all memory, so
//! it needs one of the first two.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use hwtrace_mem::image::{Image, Kcore};
use hwtrace_report::symbols::Kallsyms;
use hwtrace_types::Ip;

use super::image::is_kernel;
use super::sideband::Sideband;

/// The first kernel address: the upper half of the canonical space.
pub const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// Whether `addr` is a kernel address.
pub fn is_kernel_addr(addr: u64) -> bool {
    addr >= KERNEL_START
}

/// The kernel as `--kcore`/`--kallsyms` give it.
#[derive(Debug, Default)]
pub struct Kernel {
    /// Code.
    pub kcore: Option<Kcore>,
    /// Symbols.
    pub kallsyms: Option<Kallsyms>,
    /// Where the code goes, inclusive ranges (see the module doc).
    ranges: Vec<(Ip, Ip)>,
}

impl Kernel {
    /// Opens what was given. `mapped` are the kernel mappings the sideband
    /// recorded (`(first, last)`); a `kallsyms` file beside a kcore
    /// directory's `kcore` is read when `--kallsyms` is not given.
    pub fn open(
        kcore: Option<&Path>,
        kallsyms: Option<&Path>,
        mapped: &[(Ip, Ip)],
    ) -> Result<Self> {
        let kallsyms_path: Option<PathBuf> = kallsyms.map(Path::to_path_buf).or_else(|| {
            let beside = kcore.filter(|p| p.is_dir())?.join("kallsyms");
            beside.is_file().then_some(beside)
        });
        let kallsyms = kallsyms_path
            .as_deref()
            .map(Kallsyms::load)
            .transpose()
            .context("--kallsyms")?;
        let Some(kcore_path) = kcore else {
            return Ok(Self {
                kcore: None,
                kallsyms,
                ranges: Vec::new(),
            });
        };
        let k = Kcore::open(kcore_path).context("--kcore")?;
        let regular = std::fs::metadata(k.path()).is_ok_and(|m| m.is_file() && m.len() > 0);
        let ranges = if !mapped.is_empty() {
            mapped.to_vec()
        } else if let Some(r) = kallsyms.as_ref().and_then(Kallsyms::text_range) {
            vec![r]
        } else if regular {
            k.segments()
                .iter()
                .filter(|s| is_kernel_addr(s.vaddr.0))
                .map(|s| (s.vaddr, Ip(s.vaddr.0 + (s.size - 1))))
                .collect()
        } else {
            bail!(
                "--kcore {}: which kernel range to read is unknown: the perf.data has no kernel MMAP record; give --kallsyms FILE (its _stext.._etext is read)",
                kcore_path.display()
            );
        };
        Ok(Self {
            kcore: Some(k),
            kallsyms,
            ranges,
        })
    }

    /// [`Self::open`] with the kernel mappings `sb` recorded: what
    /// `--kcore`/`--kallsyms` mean for a perf.data file, wherever it is
    /// decoded.
    pub fn for_sideband(
        sb: &Sideband,
        kcore: Option<&Path>,
        kallsyms: Option<&Path>,
    ) -> Result<Self> {
        let mapped: Vec<(Ip, Ip)> = sb
            .mappings
            .iter()
            .filter(|m| is_kernel(m) && m.len > 0)
            .map(|m| (Ip(m.addr), Ip(m.addr.saturating_add(m.len - 1))))
            .collect();
        Self::open(kcore, kallsyms, &mapped)
    }

    /// Adds the kernel code to `image`; returns the bytes added.
    pub fn add_to(&self, image: &mut Image) -> Result<u64> {
        let Some(k) = &self.kcore else { return Ok(0) };
        let mut added = 0;
        for &(first, last) in &self.ranges {
            added += k
                .add_to(image, first, last)
                .with_context(|| format!("--kcore: kernel range {first}-{last}"))?;
        }
        Ok(added)
    }

    /// Whether `--kcore` was given.
    pub fn has_code(&self) -> bool {
        self.kcore.is_some()
    }

    /// `name+0xoff` of a kernel address, from `--kallsyms`.
    pub fn symbolize(&self, addr: u64) -> Option<String> {
        self.kallsyms.as_ref()?.symbolize(addr)
    }
}
