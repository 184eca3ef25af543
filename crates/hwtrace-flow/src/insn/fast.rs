//! [`FastDecoder`]: the instruction flow a block at a time, each block
//! decoded once ([`BlockCache`]) and followed by its successor links.
//!
//! It reports exactly what [`InsnDecoder`] reports — the same
//! instructions, events, errors and error offsets — but as [`BlockRun`]s:
//! a start IP and an instruction count for code executed straight through.
//! Where the trace is quiet (no event pending) a whole cached block is
//! run in one step: its non-branch instructions are skipped and its last
//! instruction goes through the instruction decoder's own branch code
//! (TNT bits, TIPs, the return stack). Anything else — events binding to
//! instructions, resynchronisation, the first steps after PSB+, code that
//! cannot be decoded — is stepped one instruction at a time by the
//! instruction decoder itself, so rare cases cannot differ.
//!
//! Same verbs as every decoder of the crate: `sync_forward`, `sync_set`,
//! `resync`, `offset`, `sync_offset`, `next`, and the state a seam of the
//! parallel decoder compares (`ip`, `address_space`, `time`). A run's
//! instructions are contiguous in memory (only its last one may branch);
//! [`FastDecoder::expand`] gives them one by one when a caller needs them.
//! A caller that only counts or places instructions never needs to expand.
//!
//! ```
//! use hwtrace_flow::Config;
//! use hwtrace_flow::insn::{FastDecoder, FastStep};
//! use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory};
//!
//! /// `nop; nop; hlt` at 0x1000.
//! struct Code;
//! impl ReadMemory for Code {
//!     fn read_memory(&self, _: AddressSpace, addr: Ip, buf: &mut [u8]) -> Result<usize, MemoryError> {
//!         let code = [0x90, 0x90, 0xf4];
//!         let off = addr.0.wrapping_sub(0x1000) as usize;
//!         let rest = code.get(off..).filter(|r| !r.is_empty()).ok_or(MemoryError::Unmapped { addr })?;
//!         let n = rest.len().min(buf.len());
//!         buf[..n].copy_from_slice(&rest[..n]);
//!         Ok(n)
//!     }
//! }
//!
//! // PSB, MODE.Exec 64-bit, FUP 0x1000, PSBEND, FUP 0x1002, TIP.PGD.
//! let trace = [
//!     0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
//!     0x02, 0x82, 0x99, 0x01, 0x7d, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x02, 0x23, 0x3d,
//!     0x02, 0x10, 0x01,
//! ];
//! let mut dec = FastDecoder::new(&trace, Config::default(), Code);
//! dec.sync_forward()?;
//! let mut ips = Vec::new();
//! while let Some(step) = dec.next()? {
//!     if let FastStep::Run(run) = step {
//!         dec.expand(&run, |insn| ips.push(insn.ip))?;
//!     }
//! }
//! assert_eq!(ips, [0x1000, 0x1001]);
//! # Ok::<(), hwtrace_flow::Error>(())
//! ```

use super::blockcache::{BlockCache, CachedBlock, NO_BLOCK, PathRun, TntPath};
use super::cache::InsnCache;
use super::classify::InsnClass;
use super::decoder::{BurstEnd, Insn, InsnDecoder, InsnState, RunSink};
use super::runs::RunBuffer;
use super::tally::{Counted, RunTally};
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::event::{Event, Status, TntState};
use crate::time::ClockState;
use hwtrace_packet::{ExecMode, LastIp};
use hwtrace_types::{AddressSpace, Ip, ReadMemory, TraceOffset};

/// Instructions executed one after the other, in consecutive memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRun {
    /// The first instruction's address.
    pub ip: Ip,
    /// How many instructions (at least one).
    pub insns: u32,
    /// The last instruction's address.
    pub end_ip: Ip,
    /// The class of the last instruction (how the run ends).
    pub end_class: InsnClass,
    /// The size of the last instruction (the run ends at `end_ip` plus
    /// this).
    pub end_size: u8,
    /// The trace offset after the run (of the packet the decoder is at).
    pub offset: TraceOffset,
    /// The address space the code ran in.
    pub space: AddressSpace,
    /// The execution mode.
    pub mode: Option<ExecMode>,
    /// Executed inside a transaction.
    pub speculative: bool,
}

impl BlockRun {
    /// The run's last instruction as far as the run knows it: address,
    /// mode, class and size (no bytes, no branch target).
    pub fn last_insn(&self) -> Insn {
        let mut last = Insn::empty(self.end_ip.0, self.mode, self.speculative);
        last.class = self.end_class;
        last.size = self.end_size;
        last
    }
}

/// One step of [`FastDecoder::next`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastStep {
    /// Instructions that were executed.
    Run(BlockRun),
    /// Something the trace reported, between runs.
    Event(Event),
}

/// The instruction flow in [`BlockRun`]s, with hot code decoded once.
#[derive(Debug)]
pub struct FastDecoder<'a, M> {
    dec: InsnDecoder<'a, M>,
    cache: BlockCache,
    /// The status of the last step.
    last: Status,
    /// An error found after the instructions of the run just returned.
    pending: Option<Error>,
    /// The end of the trace was met inside the run just returned.
    done: bool,
    /// The block the current IP starts, when known from a successor link.
    hint: u32,
    /// The block run last, to link to the next one.
    from: u32,
    /// The address space `space_id` interns.
    space: AddressSpace,
    space_id: u32,
}

/// What a [`FastDecoder`] learned of the code it decoded: blocks, their
/// successor links and TNT paths, and single instructions. Handed from one
/// decoder to the next over the same code ([`FastDecoder::into_code`],
/// [`FastDecoder::with_code`]), so that hot code is disassembled once
/// across many short traces, as a fuzzer decodes one per execution.
#[derive(Clone, Debug, Default)]
pub struct DecodedCode {
    blocks: BlockCache,
    insns: InsnCache,
}

impl DecodedCode {
    /// Nothing decoded yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many blocks it holds.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }
}

impl<'a, M: ReadMemory> FastDecoder<'a, M> {
    /// A decoder over `trace`, reading code from `mem`.
    pub fn new(trace: &'a [u8], config: Config, mem: M) -> Self {
        Self::with_code(trace, config, mem, DecodedCode::default())
    }

    /// A decoder over `trace` that starts from `code`, what an earlier
    /// decoder learned of the code in `mem` ([`into_code`](Self::into_code)).
    /// The memory must hold the same code there: nothing is read again
    /// where `code` has it.
    pub fn with_code(trace: &'a [u8], config: Config, mem: M, code: DecodedCode) -> Self {
        let DecodedCode {
            blocks: mut cache,
            insns,
        } = code;
        let space_id = cache.space_id(AddressSpace::UNKNOWN);
        let mut dec = InsnDecoder::new(trace, config, mem);
        dec.set_insn_cache(insns);
        Self {
            dec,
            cache,
            last: Status::default(),
            pending: None,
            done: false,
            hint: NO_BLOCK,
            from: NO_BLOCK,
            space: AddressSpace::UNKNOWN,
            space_id,
        }
    }

    /// The instruction decoder underneath (its state is the flow's).
    pub fn insn_decoder(&self) -> &InsnDecoder<'a, M> {
        &self.dec
    }

    /// The memory code is read from.
    pub fn memory(&self) -> &M {
        self.dec.memory()
    }

    /// Replaces the memory (a sideband switch); forgets decoded code.
    pub fn set_memory(&mut self, mem: M) {
        self.dec.set_memory(mem);
        self.forget();
    }

    /// Forgets decoded code (the memory behind it changed).
    pub fn invalidate(&mut self) {
        self.dec.invalidate();
        self.forget();
    }

    /// What this decoder learned of the code, for the next decoder over the
    /// same code ([`with_code`](Self::with_code)).
    pub fn into_code(self) -> DecodedCode {
        DecodedCode {
            blocks: self.cache,
            insns: self.dec.into_insn_cache(),
        }
    }

    /// Takes `warm`'s caches (decoded blocks and instructions, TNT paths)
    /// if this decoder has decoded nothing yet: both read the same code
    /// (a parallel decode's decoders, all made alike), so what one decoded
    /// is what the other would. Nothing else of `warm` is taken.
    pub fn warm_from(&mut self, warm: &Self) {
        if !self.cache.is_empty() || warm.cache.is_empty() {
            return;
        }
        self.cache = warm.cache.clone();
        self.dec.warm_from(&warm.dec);
        self.unhinted();
    }

    fn forget(&mut self) {
        self.cache.clear();
        self.unhinted();
    }

    /// No block known for the current IP or the last one, the address
    /// space unknown: after the cache was replaced.
    fn unhinted(&mut self) {
        self.hint = NO_BLOCK;
        self.from = NO_BLOCK;
        self.space = AddressSpace::UNKNOWN;
        self.space_id = self.cache.space_id(AddressSpace::UNKNOWN);
    }

    /// How many blocks are cached.
    pub fn cached_blocks(&self) -> usize {
        self.cache.len()
    }

    /// How many TNT paths (blocks run for the bits of a TNT packet, see
    /// [`TntPath`]) are cached for bursts.
    pub fn cached_paths(&self) -> usize {
        self.cache.paths()
    }

    /// How many of the cached TNT paths stop before using all their bits
    /// ([`TntPath::used`]).
    pub fn cached_partial_paths(&self) -> usize {
        self.cache.partial_paths()
    }

    /// How many runs of eight TNT-8 packets counting bursts have
    /// remembered together (taken with one lookup when they come again
    /// from the same block).
    pub fn cached_octets(&self) -> usize {
        self.cache.octets()
    }

    /// How many leaps counting bursts have remembered: the steps from a
    /// conditional jump over the next few bytes of trace, taken with one
    /// lookup when the same block, last IP and bytes come again.
    pub fn cached_leaps(&self) -> usize {
        self.cache.leaps()
    }

    /// The offset of the packet being processed.
    pub fn offset(&self) -> TraceOffset {
        self.dec.offset()
    }

    /// The offset of the last PSB synchronised to.
    pub fn sync_offset(&self) -> Option<TraceOffset> {
        self.dec.sync_offset()
    }

    /// The current IP (where the next instruction is).
    pub const fn ip(&self) -> u64 {
        self.dec.ip()
    }

    /// The address space (CR3, VMCS) last reported.
    pub const fn address_space(&self) -> AddressSpace {
        self.dec.address_space()
    }

    /// The time at the last query: estimated TSC and whether it is
    /// wall-clock time (as [`InsnDecoder::time`]).
    pub fn time(&self) -> (u64, bool) {
        self.dec.time()
    }

    /// The timing state that decides the times to come
    /// ([`InsnDecoder::clock_state`]).
    pub fn clock_state(&self) -> ClockState {
        self.dec.clock_state()
    }

    /// The instruction layer's own state ([`InsnDecoder::insn_state`]).
    pub fn insn_state(&self) -> InsnState {
        self.dec.insn_state()
    }

    /// Whether no error waits to be returned after the run just handed out
    /// and nothing waits in the instruction decoder
    /// ([`InsnDecoder::nothing_pending`]): where a parallel decode may
    /// splice.
    pub fn nothing_waiting(&self) -> bool {
        self.pending.is_none() && self.dec.nothing_pending()
    }

    /// The last IP, the reference of compressed IPs
    /// ([`InsnDecoder::last_ip`]).
    pub fn last_ip(&self) -> LastIp {
        self.dec.last_ip()
    }

    /// The TNT bits held for the branches to come, between steps
    /// ([`InsnDecoder::tnt_state`]).
    pub fn tnt_state(&self) -> TntState {
        self.dec.tnt_state()
    }

    /// What the instruction decoder returned for the last instruction of
    /// the step just taken: its status, or the error (the end of the
    /// trace included) met after it. A driver that hands a run out one
    /// instruction at a time, as [`InsnDecoder::next_insn`] would, gives
    /// this with the run's last instruction.
    pub fn step_result(&self) -> Result<Status, Error> {
        match self.pending {
            Some(e) => Err(e),
            None if self.done => Err(Error {
                offset: self.dec.offset(),
                ip: None,
                kind: ErrorKind::Eos,
            }),
            None => Ok(self.last),
        }
    }

    fn restart(&mut self, status: Status) -> Status {
        self.pending = None;
        self.done = false;
        self.hint = NO_BLOCK;
        self.from = NO_BLOCK;
        self.last = status;
        status
    }

    /// Synchronises at the next PSB.
    pub fn sync_forward(&mut self) -> Result<Status, Error> {
        self.pending = None;
        let status = self.dec.sync_forward()?;
        Ok(self.restart(status))
    }

    /// Makes the next [`sync_set`](Self::sync_set) warm its clock
    /// ([`InsnDecoder::warm_clock`]).
    pub fn warm_clock(&mut self, window: u64) {
        self.dec.warm_clock(window);
    }

    /// Synchronises at the PSB at `offset`.
    pub fn sync_set(&mut self, offset: TraceOffset) -> Result<Status, Error> {
        self.pending = None;
        let status = self.dec.sync_set(offset)?;
        Ok(self.restart(status))
    }

    /// After an error: goes on at the next IP the trace gives (see
    /// [`InsnDecoder::resync`]).
    pub fn resync(&mut self) -> Result<Status, Error> {
        self.pending = None;
        let status = self.dec.resync()?;
        Ok(self.restart(status))
    }

    /// Takes the pending events, as many [`next`](Self::next) would hand
    /// out one by one, while they are PSB+ status updates the decoder
    /// takes without a question (those of PSB+ written while tracing is
    /// off, as an IP-filtered trace has between a TIP.PGD and the next
    /// TIP.PGE; with tracing on, those reporting the IP and mode the
    /// decoder is at), without handing them out: for callers that only
    /// count events. `None` when the pending event is no such report
    /// (nothing was done); otherwise how many `next` would have handed
    /// out, then, where `next` would have failed, the error it would have
    /// returned after them.
    pub fn pass_status_events(&mut self) -> Option<(u64, Option<Error>)> {
        if self.pending.is_some()
            || self.done
            || !self.last.event_pending
            || !self.dec.status_passable()
        {
            return None;
        }
        self.hint = NO_BLOCK;
        self.from = NO_BLOCK;
        match self.dec.pass_status_events() {
            Ok((n, status)) => {
                self.last = status;
                Some((n, None))
            }
            Err((n, e)) => Some((n, Some(e))),
        }
    }

    /// The next run of instructions or event, in execution order;
    /// `Ok(None)` at the end of the trace. After an error, call
    /// [`sync_forward`](Self::sync_forward) (or [`resync`](Self::resync))
    /// to go on. An instruction that was decoded but whose branch failed
    /// ends the run returned before the error, as ptxed counts it.
    #[allow(
        clippy::should_implement_trait,
        reason = "the decoder verb of every layer; an Iterator could not report errors with a resync point"
    )]
    #[inline]
    pub fn next(&mut self) -> Result<Option<FastStep>, Error> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        if self.done {
            return Ok(None);
        }
        if self.last.event_pending {
            self.hint = NO_BLOCK;
            self.from = NO_BLOCK;
            let (ev, status) = self.dec.event()?;
            self.last = status;
            return Ok(Some(FastStep::Event(ev)));
        }
        if self.last.eos {
            return Ok(None);
        }
        if self.dec.fast_ready() {
            if let Some(step) = self.fast_step() {
                return Ok(Some(step));
            }
        } else if self.dec.disable_pending()
            && let Some(step) = self.step_to_disable()?
        {
            return Ok(Some(step));
        }
        self.slow_step()
    }

    /// The block starting at the current IP, from the successor link or
    /// the cache (decoding it if new).
    #[inline]
    fn current_block(&mut self, mode: ExecMode) -> Option<u32> {
        let ip = Ip(self.dec.ip());
        let space = self.dec.address_space();
        if space != self.space {
            self.space = space;
            self.space_id = self.cache.space_id(space);
            self.hint = NO_BLOCK;
        }
        if let Some(b) = self.cache.get(self.hint)
            && b.ip == ip
            && b.mode == mode
            && b.space == self.space_id
        {
            return Some(self.hint);
        }
        let before = self.cache.len();
        let dec = &mut self.dec;
        let idx = self
            .cache
            .get_or_build(self.space_id, mode, ip, |at| {
                dec.decode_insn(space, at, mode)
            })
            .ok()?;
        if self.cache.len() < before {
            // The cache started over: older indices are gone.
            self.from = NO_BLOCK;
        }
        if self.from != NO_BLOCK {
            self.cache.link(self.from, idx);
        }
        Some(idx)
    }

    /// One block run by the fast path; `None` to step instead.
    #[inline]
    fn fast_step(&mut self) -> Option<FastStep> {
        let mode = self.dec.exec_mode()?;
        let idx = self.current_block(mode)?;
        let speculative = self.dec.speculative();
        if !self.dec.query_config().tick_events {
            let mut one = OneRun(None);
            let end = self.dec.run_burst(&mut self.cache, idx, &mut one, false);
            if let Some((r, offset)) = one.0 {
                self.burst_ended(end);
                return Some(FastStep::Run(BlockRun {
                    ip: r.ip,
                    insns: r.insns,
                    end_ip: r.end_ip,
                    end_class: r.class,
                    end_size: r.end_size,
                    offset,
                    space: self.space,
                    mode: Some(mode),
                    speculative,
                }));
            }
        }
        let block = *self.cache.get(idx)?;
        let last = *self.cache.last_insn(idx)?;
        let result = self.dec.run_block(&block, &last);
        let successor = block.successor(Ip(self.dec.ip()));
        let mut run = BlockRun {
            ip: block.ip,
            insns: block.insns,
            end_ip: block.last_ip,
            end_class: block.end_class(),
            end_size: block.as_run().end_size,
            offset: TraceOffset(0),
            space: self.space,
            mode: Some(mode),
            speculative,
        };
        match result {
            Ok(Some(status)) => {
                self.last = status;
                self.from = idx;
                self.hint = successor;
            }
            Ok(None) => return None,
            Err(e) => self.stop_after_run(e),
        }
        run.offset = self.dec.offset();
        Some(FastStep::Run(run))
    }

    /// The decoder's state after a burst that ran at least one block.
    #[inline]
    fn burst_ended(&mut self, end: BurstEnd) {
        self.from = end.last;
        self.hint = end.next;
        match end.result {
            None => self.last = self.dec.plain_status(),
            Some(Ok(status)) => self.last = status,
            Some(Err(e)) => self.stop_after_run(e),
        }
    }

    /// The run just taken ended in `e` (its last instruction ran): the
    /// end of the trace, or an error the next step returns. No block
    /// follows it.
    fn stop_after_run(&mut self, e: Error) {
        self.hint = NO_BLOCK;
        self.from = NO_BLOCK;
        if e.kind == ErrorKind::Eos {
            self.done = true;
        } else {
            self.pending = Some(e);
        }
    }

    /// Many runs at once: empties `out` and fills it with the runs
    /// [`next`](Self::next) would return one after the other, for as long
    /// as the flow is plain code (TNT bits, TIPs of indirect branches and
    /// returns, direct branches) and `out` has room. Returns how many; `0`
    /// means the next step is something else (an event, an error, the
    /// end, code the instruction decoder must step): call `next`.
    ///
    /// Afterwards the decoder is where `next` would have left it after
    /// the last run: [`step_result`](Self::step_result) is that run's
    /// result (every earlier run's is `Ok(Status::default())`: nothing
    /// pending, no error), [`offset`](Self::offset) and
    /// [`ip`](Self::ip) are the state after it, and each run's `offset`
    /// is the offset after it (the one before it is the previous run's,
    /// or `offset()` before the call for the first). An error met right
    /// after the last run comes from the next call of `next`, as it would
    /// have.
    pub fn next_runs(&mut self, out: &mut RunBuffer) -> usize {
        self.next_runs_until(out, TraceOffset(u64::MAX))
    }

    /// As [`next_runs`](Self::next_runs), but the burst stops after the
    /// first run taken at or past trace offset `until` (a TNT path's runs
    /// all at once): for a caller that hands out what comes from there on
    /// one run at a time (a parallel decode looks for a seam there).
    pub fn next_runs_until(&mut self, out: &mut RunBuffer, until: TraceOffset) -> usize {
        out.clear();
        let Some(mode) = self.burst_mode() else {
            return 0;
        };
        let Some(idx) = self.current_block(mode) else {
            return 0;
        };
        out.start(self.space, mode, self.dec.speculative());
        let mut sink = UntilBuffer {
            runs: out,
            until,
            reached: false,
        };
        let end = self.dec.run_burst(&mut self.cache, idx, &mut sink, true);
        if !out.is_empty() {
            self.burst_ended(end);
        }
        out.len()
    }

    /// The runs [`next_runs`](Self::next_runs) would return, counted into
    /// `out` instead of copied ([`RunTally`]: a TNT path's runs are added
    /// up in one step): for callers that only count instructions. The
    /// burst stops after the first run taken at or past trace offset
    /// `until`; that run and the burst's last single block are kept
    /// whole ([`RunTally::kept`]). With
    /// [`RunTally::set_passes_toggles`], the burst also goes on past a
    /// TIP.PGD right followed by a TIP.PGE, counting their disable and
    /// enable events in [`RunTally::events`] (the decoder is then where
    /// `next` would have left it after reporting the enable). Returns how
    /// many runs.
    pub fn tally_runs(&mut self, out: &mut RunTally, until: TraceOffset) -> usize {
        let found = self
            .burst_mode()
            .and_then(|mode| Some((mode, self.current_block(mode)?)));
        let Some((mode, idx)) = found else {
            out.clear();
            return 0;
        };
        let before = self.dec.offset();
        out.start(self.space, mode, self.dec.speculative(), before, until);
        let end = self.dec.run_burst(&mut self.cache, idx, out, true);
        if !out.is_empty() {
            self.burst_ended(end);
        }
        out.len()
    }

    /// The execution mode a burst may start in: `None` when the next step
    /// is not plain code (see [`next_runs`](Self::next_runs)).
    #[inline]
    fn burst_mode(&self) -> Option<ExecMode> {
        let ready = self.pending.is_none()
            && !self.done
            && !self.last.event_pending
            && !self.last.eos
            && !self.dec.query_config().tick_events
            && self.dec.fast_ready();
        self.dec.exec_mode().filter(|_| ready)
    }

    /// A block up to the branch a pending disable binds to; `None` to step
    /// instead.
    fn step_to_disable(&mut self) -> Result<Option<FastStep>, Error> {
        let Some(mode) = self.dec.exec_mode() else {
            return Ok(None);
        };
        let Some(idx) = self.current_block(mode) else {
            return Ok(None);
        };
        self.hint = NO_BLOCK;
        self.from = NO_BLOCK;
        let Some(block) = self.cache.get(idx) else {
            return Ok(None);
        };
        let space = self.space;
        let mut insn = Insn::empty(0, None, false);
        let Some(result) = self.dec.run_block_to_disable(block, &mut insn) else {
            return Ok(None);
        };
        let run = BlockRun {
            ip: block.ip,
            insns: block.insns,
            end_ip: Ip(insn.ip),
            end_class: insn.class,
            end_size: insn.size,
            offset: self.dec.offset(),
            space,
            mode: Some(mode),
            speculative: insn.speculative,
        };
        match result {
            Ok(status) => {
                self.last = status;
                if !status.event_pending {
                    // The disable waits for a later branch: the block went
                    // where its branch took it, as a block run plainly
                    // does, so the next one is looked up by its link.
                    self.from = idx;
                    self.hint = self
                        .cache
                        .get(idx)
                        .map_or(NO_BLOCK, |b| b.successor(Ip(self.dec.ip())));
                }
            }
            Err(e) => self.stop_after_run(e),
        }
        Ok(Some(FastStep::Run(run)))
    }

    /// One instruction through the instruction decoder.
    fn slow_step(&mut self) -> Result<Option<FastStep>, Error> {
        self.hint = NO_BLOCK;
        self.from = NO_BLOCK;
        let space = self.dec.address_space();
        let mut insn = Insn::empty(0, None, false);
        let result = self.dec.next_insn(&mut insn);
        let run = BlockRun {
            ip: Ip(insn.ip),
            insns: 1,
            end_ip: Ip(insn.ip),
            end_class: insn.class,
            end_size: insn.size,
            offset: self.dec.offset(),
            space,
            mode: insn.mode,
            speculative: insn.speculative,
        };
        match result {
            Ok(status) => {
                self.last = status;
                Ok(Some(FastStep::Run(run)))
            }
            Err(e) => {
                let eos = e.kind == ErrorKind::Eos;
                if insn.class == InsnClass::Unknown {
                    return if eos { Ok(None) } else { Err(e) };
                }
                self.stop_after_run(e);
                Ok(Some(FastStep::Run(run)))
            }
        }
    }

    /// The instructions of `run`, one by one, to `f` (decoded through the
    /// instruction cache; `run` must come from this decoder, with the
    /// memory unchanged since).
    pub fn expand(&mut self, run: &BlockRun, mut f: impl FnMut(&Insn)) -> Result<(), Error> {
        let mut ip = run.ip;
        for _ in 0..run.insns {
            let mut insn = Insn::empty(ip.0, run.mode, run.speculative);
            let mode = run.mode.ok_or(ErrorKind::BadInsn);
            let c = mode
                .and_then(|m| self.dec.decode_insn(run.space, ip, m))
                .map_err(|kind| Error {
                    offset: run.offset,
                    ip: Some(ip.0),
                    kind,
                })?;
            insn.size = c.decoded.size;
            insn.class = c.decoded.class;
            insn.target = c.decoded.target;
            insn.raw = c.raw;
            f(&insn);
            ip = Ip(ip.0.wrapping_add(u64::from(c.decoded.size)));
        }
        Ok(())
    }
}

/// The sink of a one-run burst ([`FastDecoder::next`]).
struct OneRun(Option<(PathRun, TraceOffset)>);

impl RunSink for OneRun {
    #[inline]
    fn is_full(&self) -> bool {
        self.0.is_some()
    }

    #[inline]
    fn push(&mut self, b: &CachedBlock, offset: TraceOffset) {
        self.0 = Some((b.as_run(), offset));
    }

    #[inline]
    fn room(&self) -> usize {
        usize::from(self.0.is_none())
    }

    #[inline]
    fn push_path(&mut self, _: &TntPath, runs: &[PathRun], offset: TraceOffset) {
        if let [r] = runs {
            self.0 = Some((*r, offset));
        }
    }

    #[inline]
    fn takes_path_at(&self, _: TraceOffset) -> bool {
        true
    }
}

/// The sink of [`FastDecoder::next_runs_until`]: runs copied into a
/// buffer until one is taken at or past `until`.
struct UntilBuffer<'b> {
    runs: &'b mut RunBuffer,
    until: TraceOffset,
    reached: bool,
}

impl RunSink for UntilBuffer<'_> {
    #[inline]
    fn is_full(&self) -> bool {
        self.reached || self.runs.is_full()
    }

    #[inline]
    fn push(&mut self, b: &CachedBlock, offset: TraceOffset) {
        self.runs.push(&b.as_run(), offset);
        self.reached |= offset >= self.until;
    }

    #[inline]
    fn room(&self) -> usize {
        if self.reached {
            0
        } else {
            self.runs.capacity() - self.runs.len()
        }
    }

    #[inline]
    fn push_path(&mut self, _: &TntPath, runs: &[PathRun], offset: TraceOffset) {
        self.runs.push_path(runs, offset);
        self.reached |= offset >= self.until;
    }

    #[inline]
    fn takes_path_at(&self, offset: TraceOffset) -> bool {
        offset < self.until
    }
}

impl RunSink for RunTally {
    #[inline]
    fn is_full(&self) -> bool {
        RunTally::is_full(self)
    }

    #[inline]
    fn push(&mut self, b: &CachedBlock, offset: TraceOffset) {
        RunTally::push(self, &b.as_run(), offset);
    }

    #[inline]
    fn room(&self) -> usize {
        RunTally::room(self)
    }

    #[inline(always)]
    fn push_path(&mut self, path: &TntPath, runs: &[PathRun], offset: TraceOffset) {
        RunTally::push_path(self, path, runs, offset);
    }

    #[inline]
    fn takes_path_at(&self, offset: TraceOffset) -> bool {
        RunTally::takes_path_at(self, offset)
    }

    #[inline]
    fn passes_toggles(&self) -> bool {
        RunTally::passes_toggles(self)
    }

    #[inline]
    fn pass_events(&mut self, n: u64, offset: TraceOffset) {
        RunTally::pass_events(self, n, offset);
    }

    #[inline(always)]
    fn count_room(&self) -> Option<(usize, TraceOffset)> {
        RunTally::count_room(self)
    }

    #[inline(always)]
    fn take_counted(&mut self) -> Counted {
        RunTally::take_counted(self)
    }

    #[inline(always)]
    fn put_counted(&mut self, counted: Counted, events: u64) {
        RunTally::put_counted(self, counted, events);
    }
}
