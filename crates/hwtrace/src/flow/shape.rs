//! The instruction stream reshaped: basic blocks ([`Blocks`]) and taken
//! branches ([`Branches`]).

use super::items::Item;
use hwtrace_flow::event::EventKind;
use hwtrace_flow::insn::{Insn, InsnClass};
use std::collections::VecDeque;

/// Instructions executed one after the other, up to the first that may
/// change the flow in a way only the trace tells (libipt's block decoder:
/// a conditional or indirect branch, a return, a far transfer; direct
/// calls and jumps are followed inside the block). Events (PSB+ status
/// reports included, as in libipt) and errors end a block too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// The trace offset at the block's first instruction.
    pub offset: u64,
    /// The first instruction's address.
    pub ip: u64,
    /// The last instruction (its address, bytes and class).
    pub last: Insn,
    /// How many instructions.
    pub insns: u32,
}

/// Whether `insn` ends a block (ptxed's block decoder, default config).
fn ends_block(insn: &Insn) -> bool {
    match insn.class {
        InsnClass::Other | InsnClass::Ptwrite => false,
        InsnClass::Call | InsnClass::Jump => insn.target.is_none(),
        _ => true,
    }
}

/// A step of the flow as blocks need it: an item, or a run of
/// instructions handed out whole (only its last may end a block).
#[derive(Clone, Copy, Debug)]
pub enum Piece {
    /// An item of the flow (an instruction among them is folded alone).
    Item(Item),
    /// A run of `insns` instructions from `ip`, decoded at trace `offset`,
    /// ending with `last`.
    Run {
        offset: u64,
        ip: u64,
        insns: u32,
        last: Insn,
    },
}

/// [`Piece`]s with instructions grouped into [`Block`]s; other items pass
/// through, each ending the block before it. Over a per-instruction
/// stream: `Blocks::new(items.map(Piece::Item))`.
#[derive(Debug)]
pub struct Blocks<I> {
    inner: I,
    open: Option<Block>,
    queued: Option<Item>,
}

impl<I: Iterator<Item = Piece>> Blocks<I> {
    /// Groups the instructions of `inner`.
    pub fn new(inner: I) -> Self {
        Self {
            inner,
            open: None,
            queued: None,
        }
    }
}

impl<I: Iterator<Item = Piece>> Iterator for Blocks<I> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        if let Some(item) = self.queued.take() {
            return Some(item);
        }
        loop {
            let (offset, ip, insns, last) = match self.inner.next() {
                Some(Piece::Run {
                    offset,
                    ip,
                    insns,
                    last,
                }) => (offset, ip, insns, last),
                Some(Piece::Item(Item::Insn { offset, insn })) => (offset, insn.ip, 1, insn),
                Some(Piece::Item(other)) => {
                    return match self.open.take() {
                        Some(block) => {
                            self.queued = Some(other);
                            Some(Item::Block(block))
                        }
                        None => Some(other),
                    };
                }
                None => return self.open.take().map(Item::Block),
            };
            let block = self.open.get_or_insert(Block {
                offset,
                ip,
                last,
                insns: 0,
            });
            block.last = last;
            block.insns += insns;
            if ends_block(&last) {
                return self.open.take().map(Item::Block);
            }
        }
    }
}

/// What kind of control transfer a [`Branch`] is (the flags `perf script`
/// prints).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BranchKind {
    /// A near call.
    Call,
    /// A near return.
    Return,
    /// A near unconditional jump.
    Jump,
    /// A taken conditional jump.
    CondJump,
    /// A far call, software interrupt or SYSCALL.
    FarCall,
    /// A far return, IRET or SYSRET.
    FarReturn,
    /// A far jump.
    FarJump,
    /// An interrupt or exception (asynchronous).
    Interrupt,
    /// Tracing started (`from` is unknown).
    TraceBegin,
    /// Tracing stopped asynchronously (not at a branch).
    TraceEnd,
}

impl BranchKind {
    fn of(class: InsnClass) -> Option<Self> {
        Some(match class {
            InsnClass::Call => Self::Call,
            InsnClass::Return => Self::Return,
            InsnClass::Jump => Self::Jump,
            InsnClass::CondJump => Self::CondJump,
            InsnClass::FarCall => Self::FarCall,
            InsnClass::FarReturn => Self::FarReturn,
            InsnClass::FarJump => Self::FarJump,
            InsnClass::Other | InsnClass::Ptwrite | InsnClass::Unknown => return None,
        })
    }

    /// perf's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Call => "call",
            Self::Return => "return",
            Self::Jump => "jmp",
            Self::CondJump => "jcc",
            Self::FarCall => "far call",
            Self::FarReturn => "far return",
            Self::FarJump => "far jmp",
            Self::Interrupt => "interrupt",
            Self::TraceBegin => "tr strt",
            Self::TraceEnd => "tr end",
        }
    }
}

/// A taken branch: from → to. Unknown ends (tracing was off there) are
/// `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Branch {
    /// The trace offset where the target became known.
    pub offset: u64,
    /// The branch instruction (or where an interrupt hit).
    pub from: Option<u64>,
    /// Where execution went.
    pub to: Option<u64>,
    /// What kind of transfer.
    pub kind: BranchKind,
    /// Tracing stopped with this branch (a SYSCALL leaving user mode, say).
    pub ends_trace: bool,
    /// The time (TSC) of the last event before the branch instruction, as
    /// ptxed stamps instructions; for a trace begin or end, an interrupt,
    /// the event's own.
    pub time: u64,
    /// Whether that time is wall-clock time (a TSC packet was seen:
    /// [`Event::has_tsc`](hwtrace_flow::event::Event::has_tsc)).
    pub has_tsc: bool,
}

/// [`Item`]s reduced to taken branches, as `perf script --itrace=b` shows
/// them: instructions disappear into the branches they take; enable and
/// disable events become trace begin/end branches; other events and errors
/// pass through.
#[derive(Debug)]
pub struct Branches<I> {
    inner: I,
    /// The last instruction, if it was a branch whose target the next
    /// instruction (or event) will tell, and the time it was executed at.
    pending: Option<(Insn, (u64, bool))>,
    queued: VecDeque<Item>,
    /// The time of the last event (PSB+ status reports included, though
    /// they are not passed on): what an instruction is stamped with, and
    /// whether it is wall-clock time.
    now: (u64, bool),
}

impl<I: Iterator<Item = Item>> Branches<I> {
    /// Branches of `inner`.
    pub fn new(inner: I) -> Self {
        Self {
            inner,
            pending: None,
            queued: VecDeque::with_capacity(4),
            now: (0, false),
        }
    }

    /// The pending branch, resolved by execution going on at `to`
    /// (`None`: tracing stopped); whether a branch was taken (and queued).
    fn resolve(&mut self, offset: u64, to: Option<u64>, ends_trace: bool) -> bool {
        let Some((b, (time, has_tsc))) = self.pending.take() else {
            return false;
        };
        let Some(kind) = BranchKind::of(b.class) else {
            return false;
        };
        let fall_through = b.ip.wrapping_add(u64::from(b.size));
        if kind == BranchKind::CondJump && to == Some(fall_through) {
            return false;
        }
        self.queued.push_back(Item::Branch(Branch {
            offset,
            from: Some(b.ip),
            to,
            kind,
            ends_trace,
            time,
            has_tsc,
        }));
        true
    }

    /// A branch an event stands for (at the event's time, `self.now`).
    fn branch(&mut self, offset: u64, from: Option<u64>, to: Option<u64>, kind: BranchKind) {
        self.queued.push_back(Item::Branch(Branch {
            offset,
            from,
            to,
            kind,
            ends_trace: kind == BranchKind::TraceEnd,
            time: self.now.0,
            has_tsc: self.now.1,
        }));
    }

    /// Turns one item of the instruction stream into what it means for
    /// branches (queued).
    fn feed(&mut self, item: Item) {
        match item {
            Item::Insn { offset, insn } => {
                self.resolve(offset, Some(insn.ip), false);
                if BranchKind::of(insn.class).is_some() {
                    self.pending = Some((insn, self.now));
                }
            }
            // PSB+ status reports change nothing but the time.
            Item::Event { event, .. } if event.status_update => {
                self.now = (event.tsc, event.has_tsc);
            }
            Item::Event { offset, event } => {
                self.now = (event.tsc, event.has_tsc);
                let known = |ip| (!event.ip_suppressed).then_some(ip);
                match event.kind {
                    EventKind::Enabled { ip, .. } => {
                        self.pending = None;
                        self.branch(offset, None, Some(ip), BranchKind::TraceBegin);
                    }
                    EventKind::Disabled { ip } => {
                        // Tracing stops with the branch before, or (a
                        // conditional jump not taken, no branch) by itself.
                        if !self.resolve(offset, known(ip), true) {
                            self.branch(offset, None, known(ip), BranchKind::TraceEnd);
                        }
                    }
                    EventKind::AsyncDisabled { at, ip } => {
                        self.resolve(offset, Some(at), false);
                        self.branch(offset, Some(at), known(ip), BranchKind::TraceEnd);
                    }
                    EventKind::AsyncBranch { from, to } => {
                        self.resolve(offset, Some(from), false);
                        self.branch(offset, Some(from), known(to), BranchKind::Interrupt);
                    }
                    EventKind::Overflow { .. } => {
                        // Where the branch before the lost packets went is
                        // unknown.
                        self.pending = None;
                        self.queued.push_back(item);
                    }
                    _ => self.queued.push_back(item),
                }
            }
            Item::Error(_) | Item::Resync { .. } | Item::Stuck { .. } => {
                self.pending = None;
                self.queued.push_back(item);
            }
            Item::Block(_) | Item::Branch(_) => self.queued.push_back(item),
        }
    }
}

impl<I: Iterator<Item = Item>> Iterator for Branches<I> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        loop {
            if let Some(item) = self.queued.pop_front() {
                return Some(item);
            }
            let item = self.inner.next()?;
            self.feed(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_flow::event::Event;

    fn insn(ip: u64, size: u8, class: InsnClass, target: Option<u64>) -> Item {
        let mut i = Insn::empty(ip, None, false);
        i.size = size;
        i.class = class;
        i.target = target;
        Item::Insn { offset: 0, insn: i }
    }

    fn event(kind: EventKind, suppressed: bool) -> Item {
        let mut event = Event::new(kind);
        event.ip_suppressed = suppressed;
        Item::Event { offset: 7, event }
    }

    /// A small run: enable, a loop's jcc taken once then not, a direct
    /// call followed inside the block, a return, a syscall that disables.
    fn run() -> Vec<Item> {
        vec![
            event(
                EventKind::Enabled {
                    ip: 0x100,
                    resumed: false,
                },
                false,
            ),
            insn(0x100, 2, InsnClass::Other, None),
            insn(0x102, 2, InsnClass::CondJump, Some(0x100)),
            insn(0x100, 2, InsnClass::Other, None),
            insn(0x102, 2, InsnClass::CondJump, Some(0x100)),
            insn(0x104, 5, InsnClass::Call, Some(0x200)),
            insn(0x200, 1, InsnClass::Return, None),
            insn(0x109, 2, InsnClass::FarCall, None),
            event(EventKind::Disabled { ip: 0 }, true),
        ]
    }

    #[test]
    fn branches_are_the_taken_ones() {
        let got: Vec<(Option<u64>, Option<u64>, BranchKind, bool)> =
            Branches::new(run().into_iter())
                .map(|item| match item {
                    Item::Branch(b) => (b.from, b.to, b.kind, b.ends_trace),
                    other => panic!("not a branch: {other:?}"),
                })
                .collect();
        assert_eq!(
            got,
            [
                (None, Some(0x100), BranchKind::TraceBegin, false),
                (Some(0x102), Some(0x100), BranchKind::CondJump, false),
                (Some(0x104), Some(0x200), BranchKind::Call, false),
                (Some(0x200), Some(0x109), BranchKind::Return, false),
                (Some(0x109), None, BranchKind::FarCall, true),
            ]
        );
    }

    #[test]
    fn branches_are_stamped_at_their_instruction() {
        let timed = |mut item: Item, tsc: u64| {
            if let Item::Event { event, .. } = &mut item {
                event.tsc = tsc;
            }
            item
        };
        let mut items = run();
        items[0] = timed(items[0], 10);
        // A status report between a jump and its target: the branch keeps
        // the time its instruction had.
        let mut status = Event::new(EventKind::Enabled {
            ip: 0x100,
            resumed: false,
        });
        (status.status_update, status.tsc) = (true, 20);
        items.insert(
            3,
            Item::Event {
                offset: 8,
                event: status,
            },
        );
        let last = items.len() - 1;
        items[last] = timed(items[last], 30);
        let times: Vec<(BranchKind, u64)> = Branches::new(items.into_iter())
            .map(|item| match item {
                Item::Branch(b) => (b.kind, b.time),
                other => panic!("not a branch: {other:?}"),
            })
            .collect();
        assert_eq!(
            times,
            [
                (BranchKind::TraceBegin, 10),
                (BranchKind::CondJump, 10),
                (BranchKind::Call, 20),
                (BranchKind::Return, 20),
                (BranchKind::FarCall, 20),
            ]
        );
    }

    #[test]
    fn blocks_end_at_branches_the_trace_decides_and_at_events() {
        let got: Vec<(u64, u64, u32)> = Blocks::new(run().into_iter().map(Piece::Item))
            .filter_map(|item| match item {
                Item::Block(b) => Some((b.ip, b.last.ip, b.insns)),
                _ => None,
            })
            .collect();
        // The direct call at 0x104 stays inside the block it starts.
        assert_eq!(
            got,
            [
                (0x100, 0x102, 2),
                (0x100, 0x102, 2),
                (0x104, 0x200, 2),
                (0x109, 0x109, 1)
            ]
        );
        let total: u32 = got.iter().map(|b| b.2).sum();
        assert_eq!(total, 7);
    }

    #[test]
    fn a_psb_status_report_ends_a_block_but_is_no_branch() {
        let mut status = Event::new(EventKind::Enabled {
            ip: 0x102,
            resumed: false,
        });
        status.status_update = true;
        let status = Item::Event {
            offset: 9,
            event: status,
        };
        let items = vec![
            insn(0x100, 2, InsnClass::Other, None),
            status,
            insn(0x102, 2, InsnClass::Return, None),
        ];
        let blocks: Vec<Item> = Blocks::new(items.clone().into_iter().map(Piece::Item)).collect();
        assert_eq!(blocks.len(), 3);
        assert!(matches!(blocks[0], Item::Block(b) if b.insns == 1 && b.ip == 0x100));
        assert_eq!(blocks[1], status);
        assert!(matches!(blocks[2], Item::Block(b) if b.insns == 1 && b.ip == 0x102));
        let branches: Vec<Item> = Branches::new(items.into_iter()).collect();
        assert!(branches.is_empty(), "{branches:?}");
    }

    #[test]
    fn an_interrupt_resolves_the_branch_before_it() {
        let items = vec![
            insn(0x10, 2, InsnClass::CondJump, Some(0x40)),
            event(
                EventKind::AsyncBranch {
                    from: 0x40,
                    to: 0xffff_1000,
                },
                false,
            ),
        ];
        let got: Vec<Item> = Branches::new(items.into_iter()).collect();
        assert_eq!(got.len(), 2);
        assert!(
            matches!(got[0], Item::Branch(b) if b.kind == BranchKind::CondJump && b.to == Some(0x40))
        );
        assert!(
            matches!(got[1], Item::Branch(b) if b.kind == BranchKind::Interrupt && b.from == Some(0x40) && b.to == Some(0xffff_1000))
        );
    }
}
