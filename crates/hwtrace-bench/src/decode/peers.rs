//! The Rust peers from crates.io, driven over the benchmark corpus.
//!
//! - `iptr-decoder` is a packet-level decoder (callbacks per packet, no
//!   instruction flow): it is timed against the packet decoders and
//!   reports its packet count.
//! - `iptr-edge-analyzer` (same project) follows the control flow over
//!   code memory and reports basic-block transitions (no instruction
//!   counts); run in its `cache` mode, its fastest. It stops at its first
//!   error, so it is given the corpus piece by piece.
//! - `ptcov` computes an AFL-style edge bitmap (no instruction or block
//!   counts); it also stops at its first error, so it is given the corpus
//!   piece by piece, carrying its state from one piece to the next as a
//!   continuous trace.

use super::child::Counts;
use super::corpus::Corpus;
use anyhow::Result;
use iptr_decoder::{DecodeOptions, packet_handler::packet_counter::PacketCounter};
use iptr_edge_analyzer::control_flow_handler::{ControlFlowTransitionKind, HandleControlFlow};
use iptr_edge_analyzer::memory_reader::libxdc::LibxdcMemoryReader;
use std::collections::BTreeMap;
use std::convert::Infallible;

/// Failed pieces by piece and error, counted: the note the report prints.
#[derive(Default)]
struct Failures(BTreeMap<(usize, String), u64>);

impl Failures {
    fn add(&mut self, trace: usize, error: String) {
        *self.0.entry((trace, error)).or_default() += 1;
    }

    fn total(&self) -> u64 {
        self.0.values().sum()
    }

    fn note(&self, corpus: &Corpus) -> Option<String> {
        let lines: Vec<String> = self
            .0
            .iter()
            .map(|((trace, e), n)| {
                let name = corpus.traces.get(*trace).map_or("?", |t| t.name.as_str());
                format!("{n}x {name}: {e}")
            })
            .collect();
        (!lines.is_empty()).then(|| lines.join("\n"))
    }
}

/// iptr-decoder's own packet counter over the whole trace.
pub fn iptr_packets(trace: &[u8], c: &mut Counts) {
    let mut counter = PacketCounter::new();
    match iptr_decoder::decode(trace, DecodeOptions::default(), &mut counter) {
        Ok(()) => {}
        Err(e) => {
            c.errors = 1;
            c.note = Some(format!("stopped: {e}"));
        }
    }
    c.packets = Some(counter.packet_count() as u64);
}

/// Counts the basic blocks the edge analyser reports, cached runs included.
#[derive(Default)]
struct BlockCounter {
    blocks: u64,
    /// Blocks folded into the cache entry being built.
    pending: u64,
}

impl HandleControlFlow for BlockCounter {
    type Error = Infallible;
    /// How many blocks the cached run stands for.
    type CachedKey = u64;

    fn at_decode_begin(&mut self) -> Result<(), Infallible> {
        self.pending = 0;
        Ok(())
    }

    fn on_new_block(
        &mut self,
        _block_addr: u64,
        _kind: ControlFlowTransitionKind,
        cache: bool,
    ) -> Result<(), Infallible> {
        self.blocks += 1;
        if cache {
            self.pending += 1;
        }
        Ok(())
    }

    fn cache_prev_cached_key(&mut self, key: u64) -> Result<(), Infallible> {
        self.pending += key;
        Ok(())
    }

    fn take_cache(&mut self) -> Result<Option<u64>, Infallible> {
        Ok(Some(std::mem::take(&mut self.pending)))
    }

    fn clear_current_cache(&mut self) -> Result<(), Infallible> {
        self.pending = 0;
        Ok(())
    }

    fn on_reused_cache(&mut self, key: &u64, _new_bb: u64) -> Result<(), Infallible> {
        self.blocks += key;
        Ok(())
    }

    fn should_clear_all_cache(&mut self) -> Result<bool, Infallible> {
        Ok(false)
    }
}

/// iptr-edge-analyzer over the corpus's page cache, piece by piece.
pub fn iptr_edges<'t>(
    pieces: impl Iterator<Item = (usize, &'t [u8])>,
    corpus: &Corpus,
    c: &mut Counts,
) -> Result<()> {
    let pages = corpus.pages_dir();
    let reader = LibxdcMemoryReader::new(&pages.join("pages.dump"), &pages.join("pages.addr"))?;
    let mut analyzer = iptr_edge_analyzer::EdgeAnalyzer::new(BlockCounter::default(), reader);
    let mut failed = Failures::default();
    for (i, piece) in pieces {
        if let Err(e) = iptr_decoder::decode(piece, DecodeOptions::default(), &mut analyzer) {
            let e = match e {
                iptr_decoder::error::DecoderError::PacketHandler(inner) => inner.to_string(),
                other => other.to_string(),
            };
            failed.add(i, e);
        }
    }
    c.blocks = Some(analyzer.handler().blocks);
    c.errors = failed.total();
    c.note = failed.note(corpus);
    Ok(())
}

/// ptcov over the corpus's code, piece by piece.
pub fn ptcov<'t>(
    pieces: impl Iterator<Item = (usize, &'t [u8])>,
    corpus: &Corpus,
    c: &mut Counts,
) -> Result<()> {
    let dump = super::child::map(&corpus.pages_dump())?;
    let images: Vec<ptcov::PtImage<'_>> = corpus
        .sections
        .iter()
        .map(|s| {
            let at = s.offset as usize;
            ptcov::PtImage::new(&dump[at..at + s.size as usize], s.addr)
        })
        .collect();
    let mut decoder = ptcov::PtCoverageDecoderBuilder::new()
        .images(&images)
        .build();
    let mut bitmap = vec![0u8; 1 << 16];
    let mut failed = Failures::default();
    for (i, piece) in pieces {
        if let Err(e) = decoder.coverage(piece, &mut bitmap) {
            let e = match e {
                ptcov::PtDecoderError::InvalidPacketSequence { packets } => {
                    format!("InvalidPacketSequence ({} packets)", packets.len())
                }
                ptcov::PtDecoderError::MissingImage { .. } => "MissingImage".to_owned(),
                other => format!("{other:?}"),
            };
            failed.add(i, e);
        }
    }
    let edges = bitmap.iter().filter(|b| **b != 0).count();
    c.errors = failed.total();
    let mut note = format!("{edges} bitmap entries set");
    if let Some(f) = failed.note(corpus) {
        note = format!("{note}\n{f}");
    }
    c.note = Some(note);
    Ok(())
}
