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
//! [`LibxdcMap::decode_with_edges`] also lists every edge as libxdc's
//! trace mode does (its edge callback; kAFL's edge lists), libxdc's ways
//! with the trace included: where it takes a FUP for a TIP, and the walk
//! through the code it makes at an asynchronous disable. On the real
//! traces of `../shared/corpus/real` the list is libxdc's line for line.
//!
//! Where the map may differ from `hwtrace coverage --afl-map` (whose edges
//! come from its blocks): the address space is not looked at (libxdc has
//! one; coverage keeps a chain per CR3), so an outcome across a CR3
//! change still counts. A conditional branch that leaves the IP filter is
//! not counted by either (libxdc sees no TNT bit for it; coverage keeps
//! the edge to where tracing resumed but marks it,
//! [`Edge::left_filter`](super::Edge::left_filter)). Decoding with
//! [`Config::lenient_status`] reads tracing's on/off status as libxdc does.

use super::afl::{self, MAX_MAP_SIZE};
use hwtrace_flow::Config;
use hwtrace_flow::event::EventKind;
use hwtrace_flow::insn::{Decoded, DecodedCode, FastDecoder, InsnClass, read_insn};
use hwtrace_flow::parallel::{FastSource, Flow, FlowItem, MAX_STALL, PassedRun};
use hwtrace_packet::ExecMode;
use hwtrace_types::{AddressSpace, Ip, ReadMemory, TraceOffset};

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
    /// After an error or an overflow the flow starts afresh.
    pub fn decode<M: ReadMemory>(
        &mut self,
        trace: &[u8],
        config: Config,
        memory: M,
    ) -> TraceSummary {
        self.run::<M, false>(trace, config, memory, |_, _| {})
    }

    /// [`decode`](Self::decode), also handing `on_edge` every edge in
    /// order, as libxdc's trace mode does (its edge callback, the
    /// `src->dst` lines of its edge lists): each branch to the next
    /// instruction executed (a conditional branch's not taken too),
    /// [`TRACING_OFF`] to where tracing was switched on, and where a branch
    /// switching it off went to [`TRACING_OFF`].
    pub fn decode_with_edges<M: ReadMemory>(
        &mut self,
        trace: &[u8],
        config: Config,
        memory: M,
        on_edge: impl FnMut(u64, u64),
    ) -> TraceSummary {
        self.run::<M, true>(trace, config, memory, on_edge)
    }

    /// Decodes `trace`; `LISTING` when the edges are listed (what libxdc
    /// does with a FUP before an asynchronous disable then depends on
    /// whether the jumps and calls before it were direct, so those are
    /// looked at, in the code of the last run's address space and mode;
    /// the map alone needs none of it, and its decode is compiled
    /// without).
    fn run<M: ReadMemory, const LISTING: bool>(
        &mut self,
        trace: &[u8],
        config: Config,
        memory: M,
        on_edge: impl FnMut(u64, u64),
    ) -> TraceSummary {
        let code = std::mem::take(&mut self.code);
        let dec = FastDecoder::with_code(trace, config, &memory, code);
        let mut flow = Flow::new(FastSource::runs(dec, MAX_STALL));
        let mut edges = Edges::<_, _, LISTING> {
            map: &mut self.map,
            last: None,
            summary: TraceSummary::default(),
            on_edge,
            memory: &memory,
            space: AddressSpace::UNKNOWN,
            mode: ExecMode::Bits64,
            jcc_since_tip: false,
            psb_fup: None,
            last_ip: TRACING_OFF,
        };
        loop {
            edges.summary.insns += flow.visit_runs(TraceOffset(u64::MAX), &mut |r: &PassedRun| {
                edges.next(r.run.ip.0);
                edges.last = Some((r.run.end_ip.0, r.run.end_class));
                if LISTING {
                    edges.space = r.run.space;
                    if let Some(mode) = r.run.mode {
                        edges.mode = mode;
                    }
                }
            });
            match flow.next() {
                None => break,
                Some(FlowItem::Insn { insn, .. }) => {
                    edges.summary.insns += 1;
                    edges.next(insn.ip);
                    edges.last = Some((insn.ip, insn.class));
                    if let (true, Some(mode)) = (LISTING, insn.mode) {
                        edges.mode = mode;
                    }
                }
                // A PSB+ restating the status is no edge; libxdc takes
                // its FUP for the next TIP ([`Edges::branch`]).
                Some(FlowItem::Event { event, .. }) if event.status_update => {
                    if let EventKind::Enabled { ip, .. } = event.kind {
                        // The branch before went to the FUP's address; the
                        // TIP saying so came before the PSB.
                        edges.next(ip);
                        edges.psb_fup = Some(ip);
                        edges.last_ip = ip;
                    }
                }
                Some(FlowItem::Event { event, .. }) => match event.kind {
                    EventKind::Enabled { ip, .. } => edges.enabled(ip),
                    // Without an address in the TIP.PGD, libxdc's is the
                    // last one the trace gave.
                    EventKind::Disabled { ip } => {
                        let ip = if event.ip_suppressed {
                            edges.last_ip
                        } else {
                            ip
                        };
                        edges.disabled(ip)
                    }
                    EventKind::AsyncDisabled { at, ip } => {
                        let ip = if event.ip_suppressed { at } else { ip };
                        edges.async_disabled(at, ip)
                    }
                    EventKind::Overflow { .. } => {
                        edges.summary.overflows += 1;
                        edges.last = None;
                    }
                    _ => {}
                },
                Some(FlowItem::Error(_) | FlowItem::Stuck { .. }) => {
                    edges.summary.errors += 1;
                    edges.last = None;
                }
                Some(FlowItem::Resync { .. }) => edges.last = None,
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

/// The address libxdc's edges give for "tracing off": an edge from it
/// enters traced code, an edge to it leaves it.
pub const TRACING_OFF: u64 = u64::MAX;

/// The map being added to, the edges' callback, and the last instruction
/// executed (its address and class), whose branch the next instruction
/// ends.
struct Edges<'m, F, M, const LISTING: bool> {
    map: &'m mut [u8],
    last: Option<(u64, InsnClass)>,
    summary: TraceSummary,
    on_edge: F,
    /// The code, and the address space and mode the last run ran in, for
    /// [`async_disabled`](Self::async_disabled)'s walk.
    memory: &'m M,
    space: AddressSpace,
    mode: ExecMode,
    /// Whether a conditional branch ran since the last branch whose target
    /// the trace gave (or since tracing was switched on): where libxdc's
    /// walk through the code stops, waiting for a TNT bit or a TIP
    /// ([`async_disabled`](Self::async_disabled)).
    jcc_since_tip: bool,
    /// The FUP of a PSB+ with tracing on, not yet taken by an indirect
    /// branch.
    psb_fup: Option<u64>,
    /// The last address the trace gave (a TIP's, a FUP's).
    last_ip: u64,
}

/// How many instructions [`Edges::async_disabled`] walks at most (a jump
/// to itself would never end).
const WALK_LIMIT: usize = 4096;

impl<F: FnMut(u64, u64), M: ReadMemory, const LISTING: bool> Edges<'_, F, M, LISTING> {
    /// The next instruction executed is at `ip`.
    #[inline]
    fn next(&mut self, ip: u64) {
        if let Some((from, class)) = self.last.take() {
            self.branch(from, class, ip);
        }
    }

    /// The instruction at `from`, of `class`, went to `to`: an edge when it
    /// is a branch, counted when it is a conditional one.
    #[inline]
    fn branch(&mut self, from: u64, class: InsnClass, to: u64) {
        match class {
            InsnClass::CondJump => {
                let size = self.map.len();
                if let Some(c) = self.map.get_mut(afl::edge_slot(Ip(from), Ip(to), size)) {
                    *c = c.wrapping_add(1);
                    self.summary.edges += 1;
                }
            }
            InsnClass::Other | InsnClass::Ptwrite | InsnClass::Unknown => return,
            _ => {}
        }
        if LISTING {
            let indirect = match class {
                InsnClass::CondJump => {
                    self.jcc_since_tip = true;
                    false
                }
                InsnClass::Jump | InsnClass::Call => {
                    !self.decode_at(from).is_some_and(|d| d.is_direct())
                }
                _ => true,
            };
            if indirect {
                self.jcc_since_tip = false;
                self.last_ip = to;
                // libxdc takes a PSB+'s FUP for the target of the next
                // branch the trace decides by address, walks on from
                // there, and takes the TIP for the next one it reaches
                // (at a conditional branch, with no TNT bit left, it goes
                // on from the TIP without an edge).
                if let Some(fup) = self.psb_fup.take() {
                    (self.on_edge)(from, fup);
                    if let Some(waiting) = self.walk(fup) {
                        (self.on_edge)(waiting, to);
                    }
                    return;
                }
            }
        }
        (self.on_edge)(from, to);
    }

    /// Tracing was switched on at `ip`.
    fn enabled(&mut self, ip: u64) {
        self.last = None;
        self.jcc_since_tip = false;
        self.psb_fup = None;
        self.last_ip = ip;
        (self.on_edge)(TRACING_OFF, ip);
    }

    /// A branch switched tracing off, going to `ip` (without an address in
    /// the TIP.PGD, the last one the trace gave, as libxdc takes it). A
    /// conditional branch leaving the IP filter writes no TNT bit (the
    /// TIP.PGD, without an address, stands for it): libxdc's walk stops
    /// there, so it is neither an edge nor counted.
    fn disabled(&mut self, ip: u64) {
        if let Some((from, class)) = self.last.take()
            && class != InsnClass::CondJump
        {
            self.branch(from, class, ip);
        }
        (self.on_edge)(ip, TRACING_OFF);
        self.psb_fup = None;
    }

    /// Tracing was switched off asynchronously (an interrupt, a VM exit)
    /// before the instruction at `at` (where the branch before it went),
    /// the event going to `ip`. libxdc does not bind the FUP and the
    /// TIP.PGD to each other: it walks the code from the last address the
    /// trace gave to the next branch the trace must decide, following
    /// direct jumps and calls (each an edge), and takes either packet's
    /// address for that branch's target when it is an indirect branch or
    /// a return (an edge), or stops when it is a conditional branch
    /// (whose TNT bits it applies only when a TIP-like packet comes).
    /// So: when it waited at an indirect branch when the FUP came (no
    /// conditional branch since the last TIP), the FUP's `at` is taken
    /// for its target and the walk goes on from there; then the TIP.PGD's
    /// `ip` is taken for the target of the next indirect branch from
    /// `at`. Its map, whose counted edges are conditional branches', is
    /// not changed by the walk.
    fn async_disabled(&mut self, at: u64, ip: u64) {
        // The branch before went to `at`, where the event came.
        self.next(at);
        if LISTING {
            if !self.jcc_since_tip
                && let Some(waiting) = self.walk(at)
            {
                (self.on_edge)(waiting, at);
            }
            if let Some(branch) = self.walk(at) {
                (self.on_edge)(branch, ip);
            }
        }
        (self.on_edge)(ip, TRACING_OFF);
        self.psb_fup = None;
    }

    /// Walks the code from `pc` as libxdc does without trace: over
    /// straight-line code and direct jumps and calls (listing each), to
    /// the next indirect branch or return (its address returned) or
    /// conditional branch (`None`, as for code that cannot be read).
    fn walk(&mut self, mut pc: u64) -> Option<u64> {
        for _ in 0..WALK_LIMIT {
            let d = self.decode_at(pc)?;
            match (d.class, d.target) {
                (InsnClass::Other | InsnClass::Ptwrite, _) => {
                    pc = pc.wrapping_add(u64::from(d.size))
                }
                (InsnClass::Jump | InsnClass::Call, Some(target)) => {
                    (self.on_edge)(pc, target);
                    pc = target;
                }
                (InsnClass::Jump | InsnClass::Call | InsnClass::Return, None) => return Some(pc),
                _ => return None,
            }
        }
        None
    }

    /// The instruction at `pc`, in the address space and mode of the last
    /// run, read as the decoder reads it (across mappings: a page cache's
    /// instruction may straddle two pages).
    fn decode_at(&self, pc: u64) -> Option<Decoded> {
        read_insn(self.memory, self.space, Ip(pc), self.mode)
            .ok()
            .map(|c| c.decoded)
    }
}
