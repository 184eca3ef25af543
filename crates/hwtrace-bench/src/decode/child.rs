//! The decoders that are libraries (libipt through FFI, hwtrace-packet, the
//! Rust peers), each run by `hwtrace-bench decoder NAME TRACE CORPUS` in a
//! child process of its own, so that its wall time and peak RSS are
//! measured exactly as a command-line decoder's are. The child maps the
//! trace (as `hwtrace flow` does), decodes it, and prints one line of
//! `key=value` counts for the parent to check.

use super::corpus::{Corpus, Layout, load_or_build};
use super::iphash::IpHash;
use anyhow::{Context, Result, anyhow, bail};
use std::fmt::Write as _;
use std::path::Path;

/// The library decoders, by the name the parent passes.
pub const NAMES: &[&str] = &[
    "hwtrace-fast",
    "hwtrace-packet",
    "libipt-packet",
    "libipt-insn",
    "libipt-block",
    "libipt-insn-ips",
    "iptr-packet",
    "iptr-edge",
    "ptcov",
    "hwtrace-libxdc",
];

/// What a decoder reports; `None`: it cannot tell.
#[derive(Debug, Default)]
pub struct Counts {
    pub packets: Option<u64>,
    pub insns: Option<u64>,
    pub blocks: Option<u64>,
    pub errors: u64,
    pub ips_hash: Option<u64>,
    /// Why pieces failed (peers that stop at an error), one line per kind.
    pub note: Option<String>,
}

impl Counts {
    /// `key=value` pairs; the note last (it may hold spaces).
    pub fn to_line(&self) -> String {
        let mut s = String::new();
        for (k, v) in [
            ("packets", self.packets),
            ("insns", self.insns),
            ("blocks", self.blocks),
            ("errors", Some(self.errors)),
            ("ips_hash", self.ips_hash),
        ] {
            if let Some(v) = v {
                let _ = write!(s, "{k}={v} ");
            }
        }
        if let Some(n) = &self.note {
            let _ = write!(s, "note={}", n.replace('\n', "; "));
        }
        s.trim_end().to_owned()
    }

    /// Parses [`Counts::to_line`]'s output.
    pub fn parse(line: &str) -> Result<Counts> {
        let mut c = Counts::default();
        let (fields, note) = match line.split_once("note=") {
            Some((f, n)) => (f, Some(n.to_owned())),
            None => (line, None),
        };
        c.note = note;
        for kv in fields.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| anyhow!("bad decoder output {line:?}"))?;
            let v: u64 = v.parse().with_context(|| format!("in {line:?}"))?;
            match k {
                "packets" => c.packets = Some(v),
                "insns" => c.insns = Some(v),
                "blocks" => c.blocks = Some(v),
                "errors" => c.errors = v,
                "ips_hash" => c.ips_hash = Some(v),
                _ => bail!("unknown key {k} in {line:?}"),
            }
        }
        Ok(c)
    }
}

/// Maps a file read-only.
pub fn map(path: &Path) -> Result<memmap2::Mmap> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: the benchmark's corpus files are written once, before any
    // decoder runs, and never modified while mapped.
    #[allow(unsafe_code)]
    unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))
}

/// The entry point of `hwtrace-bench decoder NAME TRACE CORPUS_DIR`.
pub fn main(name: &str, trace: &Path, corpus_dir: &Path) -> Result<()> {
    let corpus = load_or_build(corpus_dir)?;
    let bytes = map(trace)?;
    let counts = run(name, &bytes, &corpus, Corpus::layout_of(trace))?;
    println!("{}", counts.to_line());
    Ok(())
}

fn libipt_image(corpus: &Corpus) -> Result<hwtrace_libipt::Image<'static>> {
    let mut image = hwtrace_libipt::Image::new().map_err(|e| anyhow!("libipt: {e:?}"))?;
    let dump = corpus.pages_dump();
    for s in &corpus.sections {
        image
            .add_file_cached(&dump, s.offset, s.size, s.addr)
            .map_err(|e| anyhow!("libipt: {}: {e:?}", dump.display()))?;
    }
    Ok(image)
}

/// `(instructions, errors)` of hwtrace-flow's block-cached decoder
/// (`FastDecoder`, one thread) over the corpus's page cache, driven as
/// ptxed drives a decoder ([`crate::flow::hwtrace_fast_count`]).
fn hwtrace_fast(trace: &[u8], corpus: &Corpus) -> Result<(u64, u64)> {
    let mut image = hwtrace_mem::image::Image::new();
    image
        .add_pages_dir(None, &corpus.pages_dir())
        .with_context(|| format!("loading {}", corpus.pages_dir().display()))?;
    Ok(crate::flow::hwtrace_fast_count(trace, &image))
}

/// hwtrace-report's [`LibxdcMap`](hwtrace_report::coverage::libxdc::LibxdcMap)
/// over the corpus's page cache, piece by piece as a fuzzer decodes one
/// trace per execution (the code learned kept between pieces), as ptcov
/// is given them: instructions, errors, and the counters set as the note.
fn hwtrace_libxdc<'t>(
    pieces: impl Iterator<Item = (usize, &'t [u8])>,
    corpus: &Corpus,
    c: &mut Counts,
) -> Result<()> {
    use hwtrace_report::coverage::libxdc::LibxdcMap;
    let mut image = hwtrace_mem::image::Image::new();
    image
        .add_pages_dir(None, &corpus.pages_dir())
        .with_context(|| format!("loading {}", corpus.pages_dir().display()))?;
    let mut map = LibxdcMap::new(1 << 16)?;
    let (mut insns, mut errors) = (0, 0);
    for (_, piece) in pieces {
        let s = map.decode(piece, hwtrace_flow::Config::default(), &image);
        insns += s.insns;
        errors += s.errors;
    }
    c.insns = Some(insns);
    c.errors = errors;
    let set = map.map().iter().filter(|&&v| v != 0).count();
    c.note = Some(format!("{set} bitmap entries set"));
    Ok(())
}

/// The pieces of every copy of the unit, in order, each with the index of
/// its trace: the peers that stop at their first error decode piece by
/// piece.
fn pieces<'t>(
    trace: &'t [u8],
    corpus: &'t Corpus,
    layout: Layout,
) -> impl Iterator<Item = (usize, &'t [u8])> {
    let (pieces, unit) = corpus.layout(layout);
    let unit = unit as usize;
    (0..trace.len() / unit.max(1)).flat_map(move |copy| {
        pieces.clone().into_iter().map(move |p| {
            let at = copy * unit + p.offset as usize;
            (p.trace, &trace[at..at + p.len as usize])
        })
    })
}

fn run(name: &str, trace: &[u8], corpus: &Corpus, layout: Layout) -> Result<Counts> {
    let cfg = hwtrace_libipt::Config::default();
    let mut c = Counts::default();
    match name {
        "hwtrace-fast" => {
            let (i, e) = hwtrace_fast(trace, corpus)?;
            c.insns = Some(i);
            c.errors = e;
        }
        "hwtrace-packet" => {
            let (p, e) = crate::packets::hwtrace_count(trace);
            c.packets = Some(p);
            c.errors = e;
        }
        "libipt-packet" => {
            let (p, e) =
                hwtrace_libipt::count_packets(trace, &cfg).map_err(|e| anyhow!("libipt: {e:?}"))?;
            c.packets = Some(p);
            c.errors = e;
        }
        "libipt-insn" => {
            let image = libipt_image(corpus)?;
            let (i, e) = hwtrace_libipt::count_insns(trace, &cfg, &image)
                .map_err(|e| anyhow!("libipt: {e:?}"))?;
            c.insns = Some(i);
            c.errors = e;
        }
        "libipt-block" => {
            let image = libipt_image(corpus)?;
            let b = hwtrace_libipt::count_blocks(trace, &cfg, &image)
                .map_err(|e| anyhow!("libipt: {e:?}"))?;
            c.insns = Some(b.insns);
            c.blocks = Some(b.blocks);
            c.errors = b.errors;
        }
        "libipt-insn-ips" => {
            let image = libipt_image(corpus)?;
            let (ips, errors) = hwtrace_libipt::insn_addresses(trace, &cfg, &image)
                .map_err(|e| anyhow!("libipt: {e:?}"))?;
            let mut h = IpHash::default();
            ips.iter().for_each(|ip| h.add(*ip));
            c.insns = Some(h.count());
            c.ips_hash = Some(h.value());
            c.errors = errors.len() as u64;
        }
        "iptr-packet" => super::peers::iptr_packets(trace, &mut c),
        "iptr-edge" => super::peers::iptr_edges(pieces(trace, corpus, layout), corpus, &mut c)?,
        "ptcov" => super::peers::ptcov(pieces(trace, corpus, layout), corpus, &mut c)?,
        "hwtrace-libxdc" => hwtrace_libxdc(pieces(trace, corpus, layout), corpus, &mut c)?,
        other => bail!("unknown decoder {other}; known: {}", NAMES.join(", ")),
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_round_trip_through_their_line() {
        let c = Counts {
            packets: Some(7),
            insns: None,
            blocks: Some(3),
            errors: 2,
            ips_hash: Some(u64::MAX),
            note: Some("piece gzip: Eof\nsecond".into()),
        };
        let line = c.to_line();
        assert_eq!(
            line,
            "packets=7 blocks=3 errors=2 ips_hash=18446744073709551615 note=piece gzip: Eof; second"
        );
        let back = Counts::parse(&line).unwrap();
        assert_eq!(
            (
                back.packets,
                back.insns,
                back.blocks,
                back.errors,
                back.ips_hash
            ),
            (Some(7), None, Some(3), 2, Some(u64::MAX))
        );
        assert_eq!(back.note.as_deref(), Some("piece gzip: Eof; second"));
        assert!(Counts::parse("insns=x").is_err());
        assert!(Counts::parse("what=1").is_err());
    }
}
