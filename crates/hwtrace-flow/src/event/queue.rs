//! Pending events, grouped by the packet they wait for.
//!
//! Some packets announce an event whose IP comes later: MODE.Exec binds to
//! the next TIP, PTW/EXSTOP/MODE.TSX to the next FUP, status packets of a
//! PSB+ to PSBEND, MWAIT to the EXSTOP after it. Each binding is a small
//! FIFO.

use super::Event;
use std::collections::VecDeque;

/// The packet a queued event waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// PSBEND (or an OVF ending the PSB+).
    Psbend,
    /// The next TIP, TIP.PGE or TIP.PGD.
    Tip,
    /// The next FUP.
    Fup,
    /// The next EXSTOP.
    Exstop,
}

/// How many events one binding may hold before the trace is treated as
/// corrupt (bounded memory on hostile input).
const LIMIT: usize = 64;

/// The four FIFOs.
#[derive(Clone, Debug, Default)]
pub struct EventQueue {
    lists: [VecDeque<Event>; 4],
}

const fn index(b: Binding) -> usize {
    match b {
        Binding::Psbend => 0,
        Binding::Tip => 1,
        Binding::Fup => 2,
        Binding::Exstop => 3,
    }
}

impl EventQueue {
    /// Empty queues.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        for l in &mut self.lists {
            l.clear();
        }
    }

    /// Appends `ev`; `false` if the binding is full.
    pub fn push(&mut self, b: Binding, ev: Event) -> bool {
        let l = &mut self.lists[index(b)];
        if l.len() >= LIMIT {
            return false;
        }
        l.push_back(ev);
        true
    }

    /// Takes the oldest event of `b`.
    pub fn pop(&mut self, b: Binding) -> Option<Event> {
        self.lists[index(b)].pop_front()
    }

    /// How many events wait for `b`.
    pub fn len(&self, b: Binding) -> usize {
        self.lists[index(b)].len()
    }

    /// Whether `b` has no event.
    pub fn is_empty(&self, b: Binding) -> bool {
        self.lists[index(b)].is_empty()
    }

    /// Whether no event waits under any binding.
    pub fn all_empty(&self) -> bool {
        self.lists.iter().all(VecDeque::is_empty)
    }

    /// The position of the first event of `b` matching `pred`.
    pub fn find(&self, b: Binding, pred: impl Fn(&Event) -> bool) -> Option<usize> {
        self.lists[index(b)].iter().position(pred)
    }

    /// The first event of `b`, the next one handed out.
    pub fn front(&self, b: Binding) -> Option<&Event> {
        self.lists[index(b)].front()
    }

    /// Mutable access to the `i`-th event of `b`.
    pub fn get_mut(&mut self, b: Binding, i: usize) -> Option<&mut Event> {
        self.lists[index(b)].get_mut(i)
    }

    /// Swaps the `i`-th event of `b` to the front.
    pub fn swap_front(&mut self, b: Binding, i: usize) {
        self.lists[index(b)].swap(0, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;

    #[test]
    fn fifo_per_binding() {
        let mut q = EventQueue::new();
        assert!(q.push(Binding::Fup, Event::new(EventKind::Stop)));
        assert!(q.push(Binding::Fup, Event::new(EventKind::Mnt { payload: 1 })));
        assert!(q.is_empty(Binding::Tip));
        assert_eq!(
            q.find(Binding::Fup, |e| matches!(e.kind, EventKind::Mnt { .. })),
            Some(1)
        );
        assert_eq!(q.pop(Binding::Fup).map(|e| e.kind), Some(EventKind::Stop));
        assert!(!q.is_empty(Binding::Fup));
        q.clear();
        assert!(q.is_empty(Binding::Fup));
    }

    #[test]
    fn bounded() {
        let mut q = EventQueue::new();
        for _ in 0..LIMIT {
            assert!(q.push(Binding::Tip, Event::new(EventKind::Stop)));
        }
        assert!(!q.push(Binding::Tip, Event::new(EventKind::Stop)));
    }
}
