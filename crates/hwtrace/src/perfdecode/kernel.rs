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
use hwtrace_report::symbols::Func;
use hwtrace_types::Ip;

use super::image::is_kernel;
use super::sideband::Sideband;

/// The first kernel address: the upper half of the canonical space.
pub const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// Whether `addr` is a kernel address.
pub fn is_kernel_addr(addr: u64) -> bool {
    addr >= KERNEL_START
}

/// A text symbol of `/proc/kallsyms`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct KSym {
    addr: u64,
    name: String,
}

/// The text symbols of a kallsyms file, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct Kallsyms {
    syms: Vec<KSym>,
    /// `_stext` (or `_text`) and `_etext`.
    text: (Option<u64>, Option<u64>),
}

/// How far past the last symbol an address is still named after it.
const LAST_SYMBOL_REACH: u64 = 0x1000;

impl Kallsyms {
    /// Reads `path`; fails naming the file and line.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--kallsyms: cannot read {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("--kallsyms: {}", path.display()))
    }

    /// Parses kallsyms text: text symbols (`t`/`T`, weak `w`/`W`) are
    /// kept, module symbols named `name [module]`.
    pub fn parse(text: &str) -> Result<Self> {
        let mut out = Self::default();
        let mut any_nonzero = false;
        let mut lines = 0;
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            lines += 1;
            let mut f = line.split_whitespace();
            let (Some(addr), Some(kind), Some(name)) = (f.next(), f.next(), f.next()) else {
                bail!("line {}: not `ADDRESS TYPE NAME`: {line:?}", n + 1);
            };
            let addr = u64::from_str_radix(addr, 16)
                .with_context(|| format!("line {}: bad address {addr:?}", n + 1))?;
            any_nonzero |= addr != 0;
            match name {
                "_stext" => out.text.0 = Some(addr),
                "_text" if out.text.0.is_none() => out.text.0 = Some(addr),
                "_etext" => out.text.1 = Some(addr),
                _ => {}
            }
            if !matches!(kind, "t" | "T" | "w" | "W") {
                continue;
            }
            let name = match f.next() {
                Some(module) => format!("{name} {module}"),
                None => name.to_owned(),
            };
            out.syms.push(KSym { addr, name });
        }
        if lines > 0 && !any_nonzero {
            bail!(
                "every address is 0: kernel.kptr_restrict hid them (read /proc/kallsyms as root with kptr_restrict 0 or 1)"
            );
        }
        out.syms
            .sort_by(|a, b| (a.addr, &a.name).cmp(&(b.addr, &b.name)));
        Ok(out)
    }

    /// `name+0xoff` of the symbol at or below `addr` (up to the next
    /// symbol; the last one reaches [`LAST_SYMBOL_REACH`] bytes).
    pub fn symbolize(&self, addr: u64) -> Option<String> {
        let n = self.syms.partition_point(|s| s.addr <= addr);
        let s = self.syms.get(n.checked_sub(1)?)?;
        if n == self.syms.len() && addr - s.addr >= LAST_SYMBOL_REACH {
            return None;
        }
        Some(format!("{}+{:#x}", s.name, addr - s.addr))
    }

    /// The symbols as functions for the answers' symboliser, each reaching
    /// the next symbol (the last one [`LAST_SYMBOL_REACH`] bytes): the
    /// names [`Self::symbolize`] gives (at an address with several
    /// symbols, the one it picks comes first).
    pub fn functions(&self) -> Vec<Func> {
        let mut next = None;
        let mut out = Vec::with_capacity(self.syms.len());
        for s in self.syms.iter().rev() {
            let end = match next {
                Some(n) if n > s.addr => n,
                Some(_) => out.last().map_or(s.addr + 1, |f: &Func| f.addr + f.size),
                None => s.addr.saturating_add(LAST_SYMBOL_REACH),
            };
            out.push(Func {
                addr: s.addr,
                size: end - s.addr,
                name: s.name.as_str().into(),
            });
            next = Some(s.addr);
        }
        out
    }

    /// The kernel text, `_stext` (or `_text`) to `_etext` inclusive, with
    /// the module text above it (up to the last module symbol).
    pub fn text_range(&self) -> Option<(Ip, Ip)> {
        let (Some(start), Some(end)) = self.text else {
            return None;
        };
        let last = self
            .syms
            .last()
            .map_or(end, |s| s.addr.saturating_add(LAST_SYMBOL_REACH))
            .max(end);
        (start < last).then(|| (Ip(start), Ip(last - 1)))
    }
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
        let kallsyms = kallsyms_path.as_deref().map(Kallsyms::load).transpose()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81000100 t secondary_startup
ffffffff81000200 D some_data
ffffffff81001000 W weak_fn
ffffffff82000000 T _etext
ffffffffc0000000 t mod_init\t[e1000]
";

    #[test]
    fn kallsyms_name_text_addresses_and_span_the_text() {
        let k = Kallsyms::parse(TEXT).unwrap();
        assert_eq!(k.syms.len(), 7, "the data symbol left out");
        assert_eq!(
            k.symbolize(0xffff_ffff_8100_0010).as_deref(),
            Some("startup_64+0x10")
        );
        assert_eq!(
            k.symbolize(0xffff_ffff_8100_0234).as_deref(),
            Some("secondary_startup+0x134")
        );
        assert_eq!(
            k.symbolize(0xffff_ffff_8100_1001).as_deref(),
            Some("weak_fn+0x1")
        );
        assert_eq!(
            k.symbolize(0xffff_ffff_c000_0004).as_deref(),
            Some("mod_init [e1000]+0x4")
        );
        assert_eq!(k.symbolize(0xffff_ffff_c000_2000), None, "past the last");
        assert_eq!(k.symbolize(0xffff_ffff_8000_0000), None, "below the first");
        assert_eq!(
            k.text_range(),
            Some((Ip(0xffff_ffff_8100_0000), Ip(0xffff_ffff_c000_0fff)))
        );
    }

    #[test]
    fn kallsyms_functions_name_what_symbolize_names() {
        use hwtrace_report::symbols::{Space, Symbolizer};
        let k = Kallsyms::parse(TEXT).unwrap();
        let mut s = Symbolizer::new();
        s.add_symbol_list(Path::new("kallsyms"), Space::ANY, k.functions());
        let mut probes = vec![0xffff_ffff_8000_0000, 0xffff_ffff_c000_2000];
        for sym in &k.syms {
            probes.extend([sym.addr, sym.addr + 1, sym.addr - 1, sym.addr + 0xfff]);
        }
        for at in probes {
            assert_eq!(s.name(Space::ANY, Ip(at)), k.symbolize(at), "at {at:#x}");
        }
    }

    #[test]
    fn bad_kallsyms_are_named() {
        let e = format!("{:#}", Kallsyms::parse("zz T x\n").unwrap_err());
        assert!(e.contains("line 1") && e.contains("zz"), "{e}");
        let e = format!("{:#}", Kallsyms::parse("ffff T\n").unwrap_err());
        assert!(e.contains("ADDRESS TYPE NAME"), "{e}");
        let e = format!(
            "{:#}",
            Kallsyms::parse("0000000000000000 T _stext\n0000000000000000 T f\n").unwrap_err()
        );
        assert!(e.contains("kptr_restrict"), "{e}");
        assert!(Kallsyms::parse("").unwrap().syms.is_empty());
    }

    #[test]
    fn the_real_proc_kallsyms_is_read_whole() {
        // The tests run as root (scripts/test.sh), so /proc/kallsyms shows
        // real addresses: the parser must take the whole real file.
        let text = std::fs::read_to_string("/proc/kallsyms")
            .expect("/proc/kallsyms is readable (Linux, tests run as root)");
        let k = Kallsyms::parse(&text).unwrap();
        assert!(k.syms.len() > 1000, "{} text symbols", k.syms.len());
        let (start, _) = k.text_range().expect("_stext and _etext");
        assert!(is_kernel_addr(start.0));
        assert!(k.symbolize(start.0).is_some());
    }
}
