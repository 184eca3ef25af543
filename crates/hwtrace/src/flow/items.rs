//! [`Items`]: the instruction decoder driven to the end of the trace, one
//! [`Item`] at a time.

use super::shape::{Block, Branch};
use hwtrace_flow::event::{Event, Status};
use hwtrace_flow::insn::{Insn, InsnClass, InsnDecoder};
use hwtrace_flow::{Error, ErrorKind};
use hwtrace_types::ReadMemory;

/// One thing the trace says happened, in trace order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    /// An executed instruction; `offset` is that of the packet being
    /// processed when it was decoded.
    Insn { offset: u64, insn: Insn },
    /// An event (enabled, disabled, paging, overflow, ...) between
    /// instructions, at the offset of the packet that reported it; PSB+
    /// status reports have `event.status_update` set.
    Event { offset: u64, event: Event },
    /// Decoding failed: trace offset, IP (when known) and what. Decoding
    /// goes on at the next PSB; a [`Item::Resync`] follows.
    Error(Error),
    /// Decoding resumed after an error: the bytes from `from` (the error's
    /// offset) to `to` (the PSB synchronised to; `None`: no PSB was left,
    /// the rest of the trace is lost) were not decoded.
    Resync { from: u64, to: Option<u64> },
    /// A block of sequentially executed instructions ([`super::Blocks`]).
    Block(Block),
    /// A taken branch ([`super::Branches`]).
    Branch(Branch),
    /// `insns` instructions in a row were decoded without reading any
    /// trace (at `offset`; the last at `ip`): code that loops through
    /// direct branches only never ends, so the trace cannot be describing
    /// it. Decoding goes on at the next PSB, like after an error.
    Stuck { offset: u64, ip: u64, insns: u64 },
}

/// How many instructions may follow each other without the trace offset
/// moving. Only a cycle of direct jumps and calls decodes on without
/// trace; any real run without a conditional or indirect branch is
/// bounded by the size of straight-line code, far below this.
pub const MAX_STALL: u64 = 1 << 24;

#[derive(Clone, Copy, Debug)]
enum State {
    /// Synchronise at the next PSB; `after_error` is the offset of the
    /// error that made it necessary.
    Sync { after_error: Option<u64> },
    /// Synchronised: decode on.
    Run(Status),
    /// The end of the trace.
    Done,
}

/// The instruction decoder driven as ptxed drives it, as an iterator of
/// instructions, events, errors and resynchronisations.
#[derive(Debug)]
pub struct Items<'a, M> {
    dec: InsnDecoder<'a, M>,
    state: State,
    /// An item to hand out before decoding on (the error after a
    /// partially decoded instruction).
    queued: Option<Item>,
    /// The offset of the last PSB synchronised to, or of the last failed
    /// attempt: synchronisation must move forward.
    last_sync: Option<u64>,
    /// The trace offset at the last instruction, and how many instructions
    /// in a row were decoded there.
    stall_offset: u64,
    stall: u64,
    max_stall: u64,
}

impl<'a, M: ReadMemory> Items<'a, M> {
    /// Decodes `dec`'s trace from its first PSB.
    pub fn new(dec: InsnDecoder<'a, M>) -> Self {
        Self {
            dec,
            state: State::Sync { after_error: None },
            queued: None,
            last_sync: None,
            stall_offset: u64::MAX,
            stall: 0,
            max_stall: MAX_STALL,
        }
    }

    /// Gives up after `max` instructions without trace instead of
    /// [`MAX_STALL`].
    #[cfg(test)]
    fn with_max_stall(mut self, max: u64) -> Self {
        self.max_stall = max;
        self
    }

    /// Counts an instruction decoded at trace `offset`; `Some` when too
    /// many came without trace.
    fn stalled(&mut self, offset: u64, ip: u64) -> Option<Item> {
        if offset != self.stall_offset {
            self.stall_offset = offset;
            self.stall = 0;
        }
        self.stall += 1;
        if self.stall < self.max_stall {
            return None;
        }
        let insns = std::mem::take(&mut self.stall);
        self.stall_offset = u64::MAX;
        self.state = State::Sync {
            after_error: Some(offset),
        };
        Some(Item::Stuck { offset, ip, insns })
    }

    /// Reports `e` and arranges to resynchronise at the next PSB.
    fn fail(&mut self, e: Error) -> Item {
        self.state = State::Sync {
            after_error: Some(e.offset.0),
        };
        Item::Error(e)
    }

    /// One synchronisation attempt; `None` when there is nothing to report
    /// and decoding goes on.
    fn sync(&mut self, after_error: Option<u64>) -> Option<Item> {
        match self.dec.sync_forward() {
            Ok(status) => {
                let to = self.dec.sync_offset().map(|o| o.0);
                if to.is_some() && to <= self.last_sync {
                    // The same PSB again: a decoder that cannot move on.
                    self.state = State::Done;
                    return after_error.map(|from| Item::Resync { from, to: None });
                }
                self.last_sync = to;
                self.state = State::Run(status);
                after_error.map(|from| Item::Resync { from, to })
            }
            Err(e) if e.kind == ErrorKind::Eos => {
                self.state = State::Done;
                after_error.map(|from| Item::Resync { from, to: None })
            }
            Err(e) => {
                // PSB+ itself is bad: report it and try the PSB after it.
                let at = Some(e.offset.0);
                if at <= self.last_sync {
                    self.state = State::Done;
                } else {
                    self.last_sync = at;
                    self.state = State::Sync {
                        after_error: after_error.or(at),
                    };
                }
                Some(Item::Error(e))
            }
        }
    }
}

impl<M: ReadMemory> Iterator for Items<'_, M> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        if let Some(item) = self.queued.take() {
            return Some(item);
        }
        loop {
            let status = match self.state {
                State::Done => return None,
                State::Sync { after_error } => {
                    if let Some(item) = self.sync(after_error) {
                        return Some(item);
                    }
                    continue;
                }
                State::Run(status) => status,
            };
            if status.event_pending {
                let offset = self.dec.offset().0;
                match self.dec.event() {
                    Ok((event, status)) => {
                        self.state = State::Run(status);
                        // PSB+ status reports (`event.status_update`) are
                        // items too: they end blocks, as in libipt, though
                        // printers do not show them (ptxed does not).
                        return Some(Item::Event { offset, event });
                    }
                    Err(e) => return Some(self.fail(e)),
                }
            }
            if status.eos {
                self.state = State::Done;
                return None;
            }
            let offset = self.dec.offset().0;
            let mut insn = Insn::empty(0, None, false);
            match self.dec.next_insn(&mut insn) {
                Ok(status) => {
                    self.state = State::Run(status);
                    self.queued = self.stalled(offset, insn.ip);
                    return Some(Item::Insn { offset, insn });
                }
                Err(e) => {
                    let error = if e.kind == ErrorKind::Eos {
                        // The trace ended where more was needed: as in
                        // ptxed, the end, not an error.
                        self.state = State::Done;
                        None
                    } else {
                        Some(self.fail(e))
                    };
                    // An instruction decoded before the error was executed.
                    if insn.class != InsnClass::Unknown {
                        self.queued = error;
                        return Some(Item::Insn { offset, insn });
                    }
                    if error.is_some() {
                        return error;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_flow::Config;
    use hwtrace_packet::{ModeExec, Packet, Tnt, TraceBuilder};
    use hwtrace_types::{AddressSpace, Ip, MemoryError};

    /// `code` at 0x1000.
    struct Code(&'static [u8]);

    impl ReadMemory for Code {
        fn read_memory(
            &self,
            _: AddressSpace,
            addr: Ip,
            buf: &mut [u8],
        ) -> Result<usize, MemoryError> {
            let at = usize::try_from(addr.0.wrapping_sub(0x1000)).unwrap_or(usize::MAX);
            let rest = self.0.get(at..).filter(|r| !r.is_empty());
            let rest = rest.ok_or(MemoryError::Unmapped { addr })?;
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            Ok(n)
        }
    }

    /// PSB+ with tracing on at 0x1000 and a TNT after it (trace the code
    /// never asks for: without it the decoder would see the end), twice.
    fn two_psbs() -> Vec<u8> {
        let mut t = TraceBuilder::new();
        for _ in 0..2 {
            t.push(Packet::Psb).unwrap();
            t.push(Packet::ModeExec(ModeExec {
                csl: true,
                csd: false,
                iflag: false,
            }))
            .unwrap();
            t.ip(Packet::Fup, 0x1000).unwrap();
            t.push(Packet::Psbend).unwrap();
            t.push(Packet::Tnt(Tnt {
                bits: 1,
                len: 1,
                long: false,
            }))
            .unwrap();
        }
        t.finish()
    }

    #[test]
    fn an_endless_loop_without_trace_is_left_at_the_next_psb() {
        // 1000: nop; 1001: jmp 1000
        let trace = two_psbs();
        let dec = InsnDecoder::new(&trace, Config::default(), Code(&[0x90, 0xeb, 0xfd]));
        let all: Vec<Item> = Items::new(dec).with_max_stall(100).collect();
        // Each PSB+ reports its status (enabled, exec mode) first.
        let status = all
            .iter()
            .filter(|i| matches!(i, Item::Event { event, .. } if event.status_update))
            .count();
        assert!(status >= 2, "{status} status reports");
        let items: Vec<Item> = all
            .into_iter()
            .filter(|i| !matches!(i, Item::Event { .. }))
            .collect();
        let stuck: Vec<usize> = (0..items.len())
            .filter(|&i| matches!(items[i], Item::Stuck { .. }))
            .collect();
        // Once per PSB: each ends in the loop.
        assert_eq!(stuck, [100, 202]);
        assert!(matches!(
            items[100],
            Item::Stuck {
                insns: 100,
                ip: 0x1001,
                ..
            }
        ));
        let second_psb = items.iter().find_map(|i| match i {
            Item::Resync { to, .. } => Some(*to),
            _ => None,
        });
        assert!(matches!(second_psb, Some(Some(off)) if off > 0));
        assert!(matches!(items.last(), Some(Item::Resync { to: None, .. })));
        let insns = items
            .iter()
            .filter(|i| matches!(i, Item::Insn { .. }))
            .count();
        assert_eq!(insns, 200);
    }
}
