//! The decode benchmark's corpus, built once under the target folder and
//! reused: the real hardware traces of `../shared/corpus/real/` and a real
//! execution (gzip, recorded with qemu-user and encoded as the PT a CPU
//! would write by hwtrace-sim), concatenated into one *unit* and the unit
//! repeated to the sizes asked for.
//!
//! All pieces run in disjoint address ranges (foo in a Linux user space
//! at 0x7fff_f7xx_xxxx, Unzip at 0x40_0000, icelake_tip in a kernel,
//! gzip where qemu-user loads guests, 0x40_0000_0000), so one code image
//! serves the whole trace: a page cache (`pages.addr` + `pages.dump`, the
//! layout of the real traces) holding every piece's code. Every piece
//! starts with a PSB, so each copy is where a decoder can synchronise.
//!
//! A repeated trace is kind to decoders that remember what they did over
//! the same bytes (hwtrace's leaps, iptr-edge-analyzer's cache), and a
//! trace that is decoded once is not. So a second, one-piece corpus
//! ([`load_or_build_once`]) holds a longer execution that is never
//! repeated: `sort` of a text (qsort's comparisons through function
//! pointers and PLT calls, a TIP every few bytes, as ordinary user code
//! writes), with its own page cache, since sort runs where gzip does.

use crate::corpus::real_dir;
use anyhow::{Context, Result, anyhow, ensure};
use hwtrace_mem::pagecache::PageCacheWriter;
use hwtrace_sim::{Execution, Limits, PtConfig, PtEncoder, RecordEnd};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bumped when the corpus layout or content changes, so a stale corpus is
/// rebuilt instead of reused.
const VERSION: u32 = 3;

/// How many times a unit holds the real traces, after one gzip trace.
/// gzip's trace (hwtrace-sim, return compression, no timing packets) holds
/// about 29 instructions a byte, the real ones 4 to 7: with the real traces
/// four times, about 85% of the bytes are from real hardware and the
/// instructions split about half and half.
const REAL_COPIES: usize = 4;

const PAGE: u64 = 4096;

/// One of the traces the unit is made of.
#[derive(Clone, Debug)]
pub struct Trace {
    /// What it is, for the report.
    pub name: String,
    /// For the real traces, libipt 2.3's instruction addresses
    /// (`reference/ptxed-insn.txt`).
    pub reference: Option<PathBuf>,
    /// How many times the unit holds it.
    pub copies: u64,
}

/// Which pieces a benchmark trace repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layout {
    /// gzip's trace and the real ones: the corpus.
    Mixed,
    /// The real hardware traces alone (what peers without return
    /// compression can decode).
    Real,
}

/// One trace's place inside the unit.
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    /// Which of [`Corpus::traces`].
    pub trace: usize,
    /// Its offset in the unit.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
}

/// A contiguous run of code: `size` bytes of `pages.dump` from `offset`
/// mapped at `addr`.
#[derive(Clone, Copy, Debug)]
pub struct Section {
    pub offset: u64,
    pub size: u64,
    pub addr: u64,
}

/// The built corpus.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// Where its files are.
    pub dir: PathBuf,
    /// The distinct traces.
    pub traces: Vec<Trace>,
    /// The pieces of one unit, in order.
    pub pieces: Vec<Piece>,
    /// The unit's length.
    pub unit_len: u64,
    /// The code's contiguous runs, ascending by address.
    pub sections: Vec<Section>,
}

impl Corpus {
    /// The folder holding `pages.addr` and `pages.dump`.
    pub fn pages_dir(&self) -> PathBuf {
        self.dir.join("pages")
    }

    /// The code file the sections point into.
    pub fn pages_dump(&self) -> PathBuf {
        self.pages_dir().join("pages.dump")
    }

    /// The pieces of one unit of `layout` (offsets from the unit's start)
    /// and the unit's length. [`Layout::Real`] is the unit without its
    /// first piece (gzip's trace).
    pub fn layout(&self, layout: Layout) -> (Vec<Piece>, u64) {
        match layout {
            Layout::Mixed => (self.pieces.clone(), self.unit_len),
            Layout::Real => {
                let skip = self.pieces.first().map_or(0, |p| p.len);
                let pieces = self.pieces[1.min(self.pieces.len())..]
                    .iter()
                    .map(|p| Piece {
                        offset: p.offset - skip,
                        ..*p
                    })
                    .collect();
                (pieces, self.unit_len - skip)
            }
        }
    }

    /// The layout a trace file of [`Corpus::trace`] holds, by its name.
    pub fn layout_of(path: &Path) -> Layout {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| n.starts_with("real-")) {
            Layout::Real
        } else {
            Layout::Mixed
        }
    }

    /// The trace of at least `bytes` bytes: whole units of `layout`,
    /// written when missing.
    pub fn trace(&self, layout: Layout, bytes: u64) -> Result<PathBuf> {
        let (_, unit_len) = self.layout(layout);
        let copies = bytes.div_ceil(unit_len).max(1);
        let prefix = match layout {
            Layout::Mixed => "trace",
            Layout::Real => "real",
        };
        let path = self.dir.join(format!("{prefix}-{copies}u.pt"));
        let want = copies * unit_len;
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == want) {
            return Ok(path);
        }
        let whole = std::fs::read(self.dir.join("unit.pt")).context("reading unit.pt")?;
        let unit = &whole[(self.unit_len - unit_len) as usize..];
        let tmp = path.with_extension("tmp");
        let mut out = std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?,
        );
        for _ in 0..copies {
            out.write_all(unit)?;
        }
        out.into_inner()
            .map_err(|e| anyhow!("writing {}: {}", tmp.display(), e.error()))?
            .sync_all()?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// The file holding trace `i` alone.
    pub fn trace_file(&self, i: usize) -> PathBuf {
        self.dir.join(format!("piece-{i}.pt"))
    }
}

/// The folder the corpus lives in: `HWTRACE_BENCH_CORPUS`, else
/// `bench-corpus` in the target folder this binary was built into (never
/// inside the repository's sources).
pub fn default_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("HWTRACE_BENCH_CORPUS") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("locating hwtrace-bench")?;
    // <target>/<profile>/hwtrace-bench
    let target = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| anyhow!("{} has no target folder", exe.display()))?;
    Ok(target.join("bench-corpus"))
}

/// Loads the corpus in `dir` (the folder [`default_dir`] names, or a
/// built corpus folder itself, [`Corpus::dir`]), building it first when
/// missing or stale.
pub fn load_or_build(dir: &Path) -> Result<Corpus> {
    if let Ok(c) = load(dir) {
        return Ok(c);
    }
    load_or(
        &dir.join(format!("v{VERSION}")),
        "the benchmark corpus (records gzip with qemu-user, once)",
        build,
    )
}

/// The corpus in `dir`; when missing or stale, `build` (saying it builds
/// `what`) first fills a scratch folder, which then takes `dir`'s place,
/// so an interrupted build never leaves a corpus that loads.
fn load_or(dir: &Path, what: &str, build: fn(&Path) -> Result<()>) -> Result<Corpus> {
    if let Ok(c) = load(dir) {
        return Ok(c);
    }
    eprintln!("building {what} in {}", dir.display());
    let tmp = dir.with_extension("building");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    build(&tmp)?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&tmp, dir)?;
    load(dir)
}

/// The single-pass corpus's trace file.
pub const ONCE_TRACE: &str = "sort-once.pt";

/// How many lines of text the single-pass corpus's `sort` sorts: about
/// 14.5 M instructions and 1.8 MB of trace, about a minute under qemu-user.
const SORT_LINES: usize = 6_000;

/// Loads the single-pass corpus in `dir` (see the module documentation),
/// building it first when missing or stale.
pub fn load_or_build_once(dir: &Path) -> Result<Corpus> {
    load_or(
        &dir.join(format!("v{VERSION}-once")),
        "the single-pass corpus (records sort with qemu-user, once)",
        build_once,
    )
}

/// Fills `tmp` with the single-pass corpus.
fn build_once(tmp: &Path) -> Result<()> {
    let input = tmp.join("sort-input.txt");
    std::fs::write(&input, text(SORT_LINES))?;
    let (exec, pt) = record("/usr/bin/sort", &[path_str(&input)?])?;
    let mut pages = Pages::default();
    for seg in exec.memory().segments() {
        pages.put(seg.addr.0, &seg.bytes, "sort")?;
    }
    let name = format!(
        "sort (qemu-user, hwtrace-sim PT, {} instructions, decoded once)",
        exec.len()
    );
    write(tmp, &[(name, "-".into(), pt)], &[0], &pages)?;
    // The unit under a name the benchmark's table can show.
    std::fs::copy(tmp.join("unit.pt"), tmp.join(ONCE_TRACE))?;
    Ok(())
}

/// A page cache being assembled: page address → 4 KiB of code.
#[derive(Default)]
struct Pages(BTreeMap<u64, Vec<u8>>);

impl Pages {
    /// Copies `bytes` to `addr`, page by page; overlapping pieces must agree.
    fn put(&mut self, addr: u64, bytes: &[u8], what: &str) -> Result<()> {
        let mut at = addr;
        let mut rest = bytes;
        while !rest.is_empty() {
            let base = at & !(PAGE - 1);
            let off = (at - base) as usize;
            let n = rest.len().min(PAGE as usize - off);
            let page = self.0.entry(base).or_insert_with(|| vec![0; PAGE as usize]);
            let dst = &mut page[off..off + n];
            ensure!(
                dst.iter().zip(&rest[..n]).all(|(a, b)| *a == 0 || a == b),
                "{what}: code at {at:#x} overlaps another piece's"
            );
            dst.copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            at += n as u64;
        }
        Ok(())
    }
}

/// Deterministic text for gzip to compress.
fn text(lines: usize) -> String {
    const WORDS: [&str; 8] = [
        "branch", "trace", "packet", "return", "syscall", "psb", "tnt", "tip",
    ];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = String::new();
    for i in 0..lines {
        for _ in 0..4 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            out += WORDS[(x >> 61) as usize];
            out.push(' ');
        }
        out += &format!("{}\n", x % 1000 + i as u64);
    }
    out
}

/// gzip -9 of a small text under qemu-user: the execution and its PT.
fn gzip(dir: &Path) -> Result<(Execution, Vec<u8>)> {
    let input = dir.join("gzip-input.txt");
    std::fs::write(&input, text(200))?;
    record("/usr/bin/gzip", &["-c", "-9", path_str(&input)?])
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 corpus folder {}", path.display()))
}

/// `program args` recorded under qemu-user, and the Intel PT a CPU would
/// write for it (hwtrace-sim's defaults: return compression, a PSB every
/// 4 KiB).
fn record(program: &str, args: &[&str]) -> Result<(Execution, Vec<u8>)> {
    let limits = Limits {
        max_instructions: None,
        timeout: Some(Duration::from_secs(300)),
    };
    let rec = Execution::record_qemu(program, args, limits).with_context(|| {
        format!("recording {program} with qemu-x86_64 (scripts/setup.sh installs qemu-user)")
    })?;
    ensure!(
        matches!(rec.end, RecordEnd::Exited(s) if s.success()),
        "{program} under qemu-user: {:?}",
        rec.end
    );
    let pt = PtEncoder::new(PtConfig::default())
        .encode(&rec.execution)
        .with_context(|| format!("encoding {program}'s execution as Intel PT"))?;
    Ok((rec.execution, pt.bytes))
}

/// Fills `tmp` with the benchmark corpus.
fn build(tmp: &Path) -> Result<()> {
    let mut pages = Pages::default();
    // The distinct traces: (name, reference or "-", bytes).
    let mut traces: Vec<(String, String, Vec<u8>)> = Vec::new();
    let (exec, pt) = gzip(tmp)?;
    for seg in exec.memory().segments() {
        pages.put(seg.addr.0, &seg.bytes, "gzip")?;
    }
    traces.push((
        format!(
            "gzip -9 (qemu-user, hwtrace-sim PT, {} instructions)",
            exec.len()
        ),
        "-".into(),
        pt,
    ));
    for case in ["foo", "Unzip", "icelake_tip"] {
        let cdir = real_dir().join(case);
        let trace = std::fs::read(cdir.join("trace.pt"))
            .with_context(|| format!("reading {}/trace.pt", cdir.display()))?;
        let addrs = std::fs::read(cdir.join("pages.addr"))?;
        let dump = std::fs::read(cdir.join("pages.dump"))?;
        ensure!(
            addrs.len() / 8 * PAGE as usize == dump.len(),
            "{case}: pages.addr and pages.dump disagree"
        );
        for (i, a) in addrs.chunks_exact(8).enumerate() {
            let addr = u64::from_le_bytes(a.try_into()?);
            if addr & (PAGE - 1) != 0 {
                continue; // an unmapped page (see ../shared/corpus/README.md)
            }
            let page = &dump[i * PAGE as usize..(i + 1) * PAGE as usize];
            pages.put(addr, page, case)?;
        }
        // Relative to the real traces' folder: the corpus outlives the
        // checkout it was built from.
        traces.push((
            format!("real/{case} (real hardware)"),
            format!("{case}/reference/ptxed-insn.txt"),
            trace,
        ));
    }
    // The unit: gzip, then the real traces REAL_COPIES times.
    let order: Vec<usize> = std::iter::once(0)
        .chain((0..REAL_COPIES).flat_map(|_| 1..traces.len()))
        .collect();
    write(tmp, &traces, &order, &pages)
}

/// Writes a corpus into `dir`: its distinct traces (name, reference or
/// "-", bytes), the unit as those traces in `order`, and the code.
fn write(
    dir: &Path,
    traces: &[(String, String, Vec<u8>)],
    order: &[usize],
    pages: &Pages,
) -> Result<()> {
    let mut unit = Vec::new();
    let mut pieces = String::new();
    for &k in order {
        let bytes = &traces[k].2;
        pieces += &format!("{}\t{}\t{k}\n", unit.len(), bytes.len());
        unit.extend_from_slice(bytes);
    }
    let mut list = String::new();
    for (k, (name, reference, bytes)) in traces.iter().enumerate() {
        list += &format!("{reference}\t{name}\n");
        std::fs::write(dir.join(format!("piece-{k}.pt")), bytes)?;
    }
    std::fs::write(dir.join("traces.tsv"), list)?;
    let mut cache = PageCacheWriter::new();
    for (addr, page) in &pages.0 {
        cache.add(*addr, page);
    }
    std::fs::create_dir_all(dir.join("pages"))?;
    cache.write(&dir.join("pages"))?;
    std::fs::write(dir.join("unit.pt"), &unit)?;
    std::fs::write(dir.join("pieces.tsv"), pieces)?;
    Ok(())
}

fn load(dir: &Path) -> Result<Corpus> {
    let unit_len = std::fs::metadata(dir.join("unit.pt"))?.len();
    let mut traces = Vec::new();
    for line in std::fs::read_to_string(dir.join("traces.tsv"))?.lines() {
        let (reference, name) = line
            .split_once('\t')
            .ok_or_else(|| anyhow!("bad traces.tsv line {line:?}"))?;
        traces.push(Trace {
            name: name.to_owned(),
            reference: (reference != "-").then(|| real_dir().join(reference)),
            copies: 0,
        });
    }
    let mut pieces = Vec::new();
    for line in std::fs::read_to_string(dir.join("pieces.tsv"))?.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let [off, len, k] = f[..] else {
            anyhow::bail!("bad pieces.tsv line {line:?}");
        };
        let piece = Piece {
            offset: off.parse()?,
            len: len.parse()?,
            trace: k.parse()?,
        };
        traces
            .get_mut(piece.trace)
            .ok_or_else(|| anyhow!("pieces.tsv names trace {k}, traces.tsv has fewer"))?
            .copies += 1;
        pieces.push(piece);
    }
    let addrs = std::fs::read(dir.join("pages/pages.addr"))?;
    let mut sections: Vec<Section> = Vec::new();
    for (i, a) in addrs.chunks_exact(8).enumerate() {
        let addr = u64::from_le_bytes(a.try_into()?);
        let offset = i as u64 * PAGE;
        match sections.last_mut() {
            Some(s) if s.addr + s.size == addr => s.size += PAGE,
            _ => sections.push(Section {
                offset,
                size: PAGE,
                addr,
            }),
        }
    }
    ensure!(
        !pieces.is_empty() && !sections.is_empty(),
        "empty corpus in {}",
        dir.display()
    );
    Ok(Corpus {
        dir: dir.to_path_buf(),
        traces,
        pieces,
        unit_len,
        sections,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A corpus of three pieces (traces 0, 1, 2) in a scratch folder.
    fn small(dir: &Path) -> Corpus {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("unit.pt"), b"aaaBBcccc").unwrap();
        let piece = |trace, offset, len| Piece { trace, offset, len };
        Corpus {
            dir: dir.to_path_buf(),
            traces: Vec::new(),
            pieces: vec![piece(0, 0, 3), piece(1, 3, 2), piece(2, 5, 4)],
            unit_len: 9,
            sections: Vec::new(),
        }
    }

    #[test]
    fn the_real_layout_is_the_unit_without_its_first_piece() {
        let dir = std::env::temp_dir().join(format!("hwtrace-bench-corpus-{}", std::process::id()));
        let c = small(&dir);
        let (pieces, len) = c.layout(Layout::Real);
        assert_eq!(len, 6);
        let got: Vec<(usize, u64, u64)> =
            pieces.iter().map(|p| (p.trace, p.offset, p.len)).collect();
        assert_eq!(got, [(1, 0, 2), (2, 2, 4)]);

        // Whole units, at least as many bytes as asked for, reused.
        let real = c.trace(Layout::Real, 7).unwrap();
        assert_eq!(Corpus::layout_of(&real), Layout::Real);
        assert_eq!(std::fs::read(&real).unwrap(), b"BBccccBBcccc");
        let mixed = c.trace(Layout::Mixed, 9).unwrap();
        assert_eq!(Corpus::layout_of(&mixed), Layout::Mixed);
        assert_eq!(std::fs::read(&mixed).unwrap(), b"aaaBBcccc");
        assert_eq!(c.trace(Layout::Mixed, 1).unwrap(), mixed);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn overlapping_code_must_agree() {
        let mut pages = Pages::default();
        pages.put(0x1ffe, &[1, 2, 3, 4], "a").unwrap();
        assert_eq!(pages.0.len(), 2, "the run crosses a page boundary");
        pages.put(0x1fff, &[2, 3], "b").unwrap();
        let e = pages.put(0x2000, &[9], "c").unwrap_err().to_string();
        assert!(e.contains("0x2000") && e.contains('c'), "{e}");
    }

    /// What `write` writes, `load` reads back: the traces, the unit as the
    /// order asks, and the code's sections; a built corpus folder is
    /// loaded as it is by `load_or_build` (the single-pass corpus's
    /// children are given it), never rebuilt.
    #[test]
    fn a_written_corpus_loads_back_and_is_not_rebuilt() {
        let dir = std::env::temp_dir().join(format!("hwtrace-bench-write-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut pages = Pages::default();
        pages.put(0x40_1000, &[0x90; 5000], "a").unwrap();
        pages.put(0x7f_0000, &[0xc3], "b").unwrap();
        let traces = [
            ("one".to_owned(), "-".to_owned(), b"xyz".to_vec()),
            (
                "two".to_owned(),
                "foo/reference/ptxed-insn.txt".to_owned(),
                b"pq".to_vec(),
            ),
        ];
        write(&dir, &traces, &[0, 1, 1], &pages).unwrap();
        let c = load_or_build(&dir).unwrap();
        assert_eq!(std::fs::read(dir.join("unit.pt")).unwrap(), b"xyzpqpq");
        assert_eq!(std::fs::read(c.trace_file(1)).unwrap(), b"pq");
        assert_eq!(c.unit_len, 7);
        let pieces: Vec<(usize, u64, u64)> = c
            .pieces
            .iter()
            .map(|p| (p.trace, p.offset, p.len))
            .collect();
        assert_eq!(pieces, [(0, 0, 3), (1, 3, 2), (1, 5, 2)]);
        let traces: Vec<(&str, u64, bool)> = c
            .traces
            .iter()
            .map(|t| (t.name.as_str(), t.copies, t.reference.is_some()))
            .collect();
        assert_eq!(traces, [("one", 1, false), ("two", 2, true)]);
        // Two pages from 0x401000 (5,000 bytes cross a boundary), one apart.
        let sections: Vec<(u64, u64, u64)> = c
            .sections
            .iter()
            .map(|s| (s.addr, s.offset, s.size))
            .collect();
        assert_eq!(
            sections,
            [(0x40_1000, 0, 2 * PAGE), (0x7f_0000, 2 * PAGE, PAGE)]
        );
        assert_eq!(c.dir, dir);
        assert!(!dir.join(format!("v{VERSION}")).exists(), "rebuilt");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
