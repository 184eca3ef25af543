//! libxdc's bitmap straight from raw Intel PT, for a fuzzer that decodes
//! one trace per execution: what kAFL/Nyx get from libxdc
//! (`libxdc_decode`, `libxdc_bitmap_get_hash`, `libxdc_bitmap_reset`,
//! `libxdc_reset_trace_cache`), from hwtrace's decoder.
//!
//! A [`LibxdcMap`] decodes each trace with the block-cached decoder,
//! counting runs whole, and adds one to the counter of each conditional
//! branch's outcome ([`afl::edge_slot`]: the branch to the next
//! instruction executed), as libxdc's bitmap mode does; nothing else is
//! counted. What the decoder learned of the code is kept from one trace to
//! the next (as libxdc keeps its trace cache), so hot code is disassembled
//! once: the code must stay the same between traces, or
//! [`forget_code`](LibxdcMap::forget_code) be called.
//!
//! Where the map may differ from `hwtrace coverage --afl-map` (whose edges
//! come from its blocks): the address space is not looked at (libxdc has
//! one; coverage keeps a chain per CR3), so an outcome across a CR3
//! change still counts. Decoding with [`Config::lenient_status`] reads
//! tracing's on/off status as libxdc does.

use super::afl::{self, MAX_MAP_SIZE};
use hwtrace_flow::Config;
use hwtrace_flow::event::EventKind;
use hwtrace_flow::insn::{DecodedCode, FastDecoder, InsnClass};
use hwtrace_flow::parallel::{FastSource, Flow, FlowItem, MAX_STALL, PassedRun};
use hwtrace_types::{Ip, ReadMemory, TraceOffset};

/// A map size that is not a power of two from 256 bytes to
/// [`MAX_MAP_SIZE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a map of {0} bytes: libxdc's maps are powers of two from 256 bytes to 16 MiB")]
pub struct MapSizeError(pub usize);

/// What one trace added ([`LibxdcMap::decode`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceSummary {
    /// Instructions decoded.
    pub insns: u64,
    /// Conditional branches' outcomes counted.
    pub edges: u64,
    /// Decode errors (each skips to the next PSB) and endless loops.
    pub errors: u64,
    /// Overflows (the processor lost trace).
    pub overflows: u64,
}

/// libxdc's bitmap, filled from traces decoded one after the other.
#[derive(Debug)]
pub struct LibxdcMap {
    map: Vec<u8>,
    code: DecodedCode,
}

impl LibxdcMap {
    /// An empty map of `size` bytes (libxdc's `bitmap_size`; kAFL's is
    /// 64 KiB, [`afl::MAP_SIZE`]).
    pub fn new(size: usize) -> Result<Self, MapSizeError> {
        if !size.is_power_of_two() || !(256..=MAX_MAP_SIZE).contains(&size) {
            return Err(MapSizeError(size));
        }
        Ok(Self {
            map: vec![0; size],
            code: DecodedCode::new(),
        })
    }

    /// Decodes `trace` (raw Intel PT, from its first PSB) over the code in
    /// `memory` and adds its conditional branches' outcomes to the map.
    /// An outcome spans a disable/enable pair (the branch to where tracing
    /// resumed, as the program went on); after an error or an overflow the
    /// flow starts afresh.
    pub fn decode<M: ReadMemory>(
        &mut self,
        trace: &[u8],
        config: Config,
        memory: M,
    ) -> TraceSummary {
        let code = std::mem::take(&mut self.code);
        let dec = FastDecoder::with_code(trace, config, memory, code);
        let mut flow = Flow::new(FastSource::runs(dec, MAX_STALL));
        let mut edges = Edges {
            map: &mut self.map,
            pending: None,
            summary: TraceSummary::default(),
        };
        loop {
            edges.summary.insns += flow.visit_runs(TraceOffset(u64::MAX), &mut |r: &PassedRun| {
                edges.next(r.run.ip);
                edges.ends(r.run.end_class, r.run.end_ip);
            });
            match flow.next() {
                None => break,
                Some(FlowItem::Insn { insn, .. }) => {
                    edges.summary.insns += 1;
                    edges.next(Ip(insn.ip));
                    edges.ends(insn.class, Ip(insn.ip));
                }
                Some(FlowItem::Event { event, .. }) => {
                    if matches!(event.kind, EventKind::Overflow { .. }) {
                        edges.summary.overflows += 1;
                        edges.pending = None;
                    }
                }
                Some(FlowItem::Error(_) | FlowItem::Stuck { .. }) => {
                    edges.summary.errors += 1;
                    edges.pending = None;
                }
                Some(FlowItem::Resync { .. }) => edges.pending = None,
            }
        }
        let summary = edges.summary;
        self.code = flow.into_source().into_decoder().into_code();
        summary
    }

    /// The map.
    pub fn map(&self) -> &[u8] {
        &self.map
    }

    /// libxdc's hash of the map ([`afl::libxdc_hash`]).
    pub fn hash(&self) -> u64 {
        afl::libxdc_hash(&self.map)
    }

    /// Clears the map (libxdc's `libxdc_bitmap_reset`); the code learned
    /// is kept.
    pub fn reset_map(&mut self) {
        self.map.fill(0);
    }

    /// Forgets the code learned (libxdc's `libxdc_reset_trace_cache`): for
    /// when the code in memory changed.
    pub fn forget_code(&mut self) {
        self.code = DecodedCode::new();
    }

    /// How many blocks of code it has learned.
    pub fn known_blocks(&self) -> usize {
        self.code.blocks()
    }
}

/// The map being added to, and the conditional branch whose outcome is
/// the next instruction.
struct Edges<'m> {
    map: &'m mut [u8],
    pending: Option<Ip>,
    summary: TraceSummary,
}

impl Edges<'_> {
    /// The next instruction executed is at `ip`.
    #[inline]
    fn next(&mut self, ip: Ip) {
        if let Some(from) = self.pending.take() {
            let size = self.map.len();
            if let Some(c) = self.map.get_mut(afl::edge_slot(from, ip, size)) {
                *c = c.wrapping_add(1);
                self.summary.edges += 1;
            }
        }
    }

    /// The instructions just executed end with one of `class` at `ip`.
    #[inline]
    fn ends(&mut self, class: InsnClass, ip: Ip) {
        self.pending = (class == InsnClass::CondJump).then_some(ip);
    }
}
