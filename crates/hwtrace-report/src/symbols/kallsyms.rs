//! Kernel function names from `/proc/kallsyms` text (`ADDRESS TYPE NAME
//! [MODULE]` per line), for traces that enter the kernel: perf's
//! `--kallsyms`, the answers' kernel symbols.
//!
//! Only text symbols are kept (`t`/`T`, weak `w`/`W`): data symbols would
//! name code addresses after the nearest variable. `_stext` (or `_text`)
//! and `_etext` are remembered whatever their type, as they bound the
//! kernel's code.

use super::file::Func;
use hwtrace_types::Ip;
use std::num::ParseIntError;
use std::path::{Path, PathBuf};

/// Why a kallsyms file could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KallsymsError {
    /// The file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The file's text is not kallsyms.
    #[error("{}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What was wrong, and on which line.
        #[source]
        source: Box<KallsymsError>,
    },
    /// A line has fewer than three fields.
    #[error("line {line}: not `ADDRESS TYPE NAME`: {text:?}")]
    NotASymbol {
        /// The line number, from 1.
        line: usize,
        /// The line.
        text: String,
    },
    /// A line's address is not hexadecimal.
    #[error("line {line}: bad address {addr:?}")]
    BadAddress {
        /// The line number, from 1.
        line: usize,
        /// The address field.
        addr: String,
        /// Why it did not parse.
        #[source]
        source: ParseIntError,
    },
    /// Every address is zero.
    #[error(
        "every address is 0: kernel.kptr_restrict hid them (read /proc/kallsyms as root with kptr_restrict 0 or 1)"
    )]
    Hidden,
}

/// A text symbol.
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
pub const LAST_SYMBOL_REACH: u64 = 0x1000;

impl Kallsyms {
    /// Reads the file at `path`; errors name it (and the line).
    pub fn load(path: &Path) -> Result<Self, KallsymsError> {
        let text = std::fs::read_to_string(path).map_err(|source| KallsymsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| KallsymsError::InFile {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Parses kallsyms text: text symbols are kept, a module's named
    /// `name [module]`. Blank lines are skipped; fields past the module
    /// are ignored.
    pub fn parse(text: &str) -> Result<Self, KallsymsError> {
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
                return Err(KallsymsError::NotASymbol {
                    line: n + 1,
                    text: line.to_owned(),
                });
            };
            let addr =
                u64::from_str_radix(addr, 16).map_err(|source| KallsymsError::BadAddress {
                    line: n + 1,
                    addr: addr.to_owned(),
                    source,
                })?;
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
            return Err(KallsymsError::Hidden);
        }
        out.syms
            .sort_by(|a, b| (a.addr, &a.name).cmp(&(b.addr, &b.name)));
        Ok(out)
    }

    /// How many text symbols.
    pub fn len(&self) -> usize {
        self.syms.len()
    }

    /// Whether there is no text symbol.
    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
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

    /// The symbols as functions for the symboliser, each reaching the
    /// next symbol (the last one [`LAST_SYMBOL_REACH`] bytes): the names
    /// [`Self::symbolize`] gives (at an address with several symbols, the
    /// one it picks comes first).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::{Space, Symbolizer};

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
    fn text_addresses_are_named_and_the_text_spanned() {
        let k = Kallsyms::parse(TEXT).unwrap();
        assert_eq!(k.len(), 7, "the data symbol left out");
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
    fn functions_name_what_symbolize_names() {
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
    fn bad_text_is_named_with_its_line() {
        let e = Kallsyms::parse("ffffffff81000000 T f\nzz T x\n").unwrap_err();
        assert!(
            matches!(&e, KallsymsError::BadAddress { line: 2, addr, .. } if addr == "zz"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "line 2: bad address \"zz\"");
        let e = Kallsyms::parse("ffff T\n").unwrap_err();
        assert_eq!(e.to_string(), "line 1: not `ADDRESS TYPE NAME`: \"ffff T\"");
        let e = Kallsyms::parse("0000000000000000 T _stext\n0000000000000000 T f\n").unwrap_err();
        assert!(matches!(e, KallsymsError::Hidden), "{e:?}");
        assert!(Kallsyms::parse("").unwrap().is_empty());
        assert!(Kallsyms::parse("\n  \n").unwrap().is_empty());
    }

    #[test]
    fn a_file_error_names_the_file_once() {
        let dir = std::env::temp_dir().join(format!("hwtrace-kallsyms-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("kallsyms");
        std::fs::write(&bad, "ffffffff81000000 T f\nnot-an-address T g\n").unwrap();
        let e = Kallsyms::load(&bad).unwrap_err();
        let chain = anyhow_like_chain(&e);
        assert_eq!(
            chain,
            format!(
                "{}: line 2: bad address \"not-an-address\": invalid digit found in string",
                bad.display()
            )
        );
        let missing = dir.join("missing");
        let e = Kallsyms::load(&missing).unwrap_err();
        assert!(matches!(e, KallsymsError::Read { .. }), "{e:?}");
        assert!(e.to_string().contains("missing"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Each message in the error's source chain, joined by `: `.
    fn anyhow_like_chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            out.push_str(": ");
            out.push_str(&s.to_string());
            source = s.source();
        }
        out
    }

    #[test]
    fn the_real_proc_kallsyms_is_read_whole() {
        // The tests run as root (scripts/test.sh), so /proc/kallsyms shows
        // real addresses: the parser must take the whole real file.
        let k = Kallsyms::load(Path::new("/proc/kallsyms"))
            .expect("/proc/kallsyms is readable (Linux, tests run as root)");
        assert!(k.len() > 1000, "{} text symbols", k.len());
        let (start, _) = k.text_range().expect("_stext and _etext");
        assert!(start.0 >= 0xffff_8000_0000_0000, "{start}");
        assert!(k.symbolize(start.0).is_some());
    }
}
