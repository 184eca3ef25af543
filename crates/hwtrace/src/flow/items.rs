//! [`Items`]: the instruction decoder driven to the end of the trace, one
//! [`Item`] at a time.

use super::shape::{Block, Branch};
use hwtrace_flow::Error;
use hwtrace_flow::event::Event;
use hwtrace_flow::insn::Insn;
use hwtrace_flow::parallel::{Flow, FlowItem, PassedRun, StepSource};
use hwtrace_types::TraceOffset;

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

impl From<FlowItem> for Item {
    fn from(item: FlowItem) -> Self {
        match item {
            FlowItem::Insn { offset, insn } => Item::Insn {
                offset: offset.0,
                insn,
            },
            FlowItem::Event { offset, event } => Item::Event {
                offset: offset.0,
                event,
            },
            FlowItem::Error(e) => Item::Error(e),
            FlowItem::Resync { from, to } => Item::Resync {
                from: from.0,
                to: to.map(|t| t.0),
            },
            FlowItem::Stuck { offset, ip, insns } => Item::Stuck {
                offset: offset.0,
                ip: ip.0,
                insns,
            },
        }
    }
}

/// A decoder (the instruction decoder, or the fast one through
/// [`hwtrace_flow::parallel::FastSource`]) driven as ptxed drives it, as
/// an iterator of instructions, events, errors and resynchronisations:
/// hwtrace-flow's [`Flow`], the sequential decode the parallel one
/// reproduces.
#[derive(Debug)]
pub struct Items<S> {
    flow: Flow<S>,
}

impl<S: StepSource> Items<S> {
    /// Decodes `src`'s trace from its first PSB.
    pub fn new(src: S) -> Self {
        Self {
            flow: Flow::new(src),
        }
    }

    /// Passes over the runs of plain code the source can hand out whole
    /// ([`Flow::visit_runs`]), handing each to `visit`; the items that
    /// follow are those [`Iterator::next`] would have made after them.
    pub fn visit_runs(&mut self, visit: &mut dyn FnMut(&PassedRun)) -> u64 {
        self.flow.visit_runs(TraceOffset(u64::MAX), visit)
    }

    /// Gives up after `max` instructions without trace instead of
    /// [`hwtrace_flow::parallel::MAX_STALL`].
    pub fn with_max_stall(mut self, max: u64) -> Self {
        self.flow = self.flow.with_max_stall(max);
        self
    }
}

impl<S: StepSource> Iterator for Items<S> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        self.flow.next().map(Item::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_flow::Config;
    use hwtrace_flow::insn::InsnDecoder;
    use hwtrace_packet::{Packet, Tnt, TraceBuilder};
    use hwtrace_types::{BytesAt, Ip};

    /// `code` at 0x1000.
    fn code_at(bytes: &'static [u8]) -> BytesAt<'static> {
        BytesAt::new(Ip(0x1000), bytes)
    }

    /// PSB+ with tracing on at 0x1000 and a TNT after it (trace the code
    /// never asks for: without it the decoder would see the end), twice.
    fn two_psbs() -> Vec<u8> {
        let mut t = TraceBuilder::new();
        for _ in 0..2 {
            t.psb_plus_64(0x1000).unwrap();
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
        let dec = InsnDecoder::new(&trace, Config::default(), code_at(&[0x90, 0xeb, 0xfd]));
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
