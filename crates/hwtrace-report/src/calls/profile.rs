//! Per-function and per-thread totals: what `hwtrace report` ranks.
//!
//! A function's *total* counts each of its activations once even when it
//! recurses (only the outermost activation on a stack adds its total), so
//! totals never exceed what the thread ran. Its time is measured between
//! points mapped by [`TimeMap`] (the time spread between the trace's
//! timestamps by instructions), so a function shorter than the gap between
//! two timestamps takes its share, not nothing; each activation is added
//! once the timestamp after its end has come, and the rest at
//! [`CallSink::finish`].

use super::functions::FuncId;
use super::timemap::TimeMap;
use super::tracker::{CallSink, Context, ExitHow, Frame, Stamp, ThreadKey};
use hwtrace_types::hash::BuildIntHasher;
use std::collections::HashMap;
use std::io;

/// Totals of one function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FunctionStats {
    /// Calls the trace shows (entries by a call).
    pub calls: u64,
    /// Instructions executed in the function itself.
    pub self_insns: u64,
    /// Instructions executed in it and what it called.
    pub total_insns: u64,
    /// TSC ticks spent in it and what it called (when the trace has
    /// timestamps).
    pub total_ticks: u64,
}

/// Totals of one thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadStats {
    /// Instructions it executed.
    pub insns: u64,
    /// The most frames open at once.
    pub max_depth: usize,
    /// Calls it made.
    pub calls: u64,
}

/// Function and thread totals.
#[derive(Debug, Default)]
pub struct Profile {
    /// Per function.
    pub functions: HashMap<FuncId, FunctionStats, BuildIntHasher>,
    /// Per thread.
    pub threads: HashMap<ThreadKey, ThreadStats, BuildIntHasher>,
    /// Frames ended by a return to a frame further down (longjmp-like).
    pub unwound: u64,
    /// Synthetic callers: returns above the frame the trace began in.
    pub callers: u64,
    /// How many activations of each function are open, per thread (for
    /// counting recursive totals once).
    active: HashMap<(ThreadKey, FuncId), u32, BuildIntHasher>,
    /// The time at any point.
    times: TimeMap,
    /// Outermost activations ended whose time waits for the timestamp
    /// after them: the function, where it began and ended.
    timing: std::collections::VecDeque<(FuncId, Stamp, Stamp)>,
}

impl Profile {
    /// Nothing counted yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Functions by total instructions, largest first (ties by id).
    pub fn by_total(&self) -> Vec<(FuncId, FunctionStats)> {
        let mut v: Vec<_> = self.functions.iter().map(|(&f, &s)| (f, s)).collect();
        v.sort_by(|a, b| b.1.total_insns.cmp(&a.1.total_insns).then(a.0.cmp(&b.0)));
        v
    }

    /// Functions by their own instructions, largest first.
    pub fn by_self(&self) -> Vec<(FuncId, FunctionStats)> {
        let mut v: Vec<_> = self.functions.iter().map(|(&f, &s)| (f, s)).collect();
        v.sort_by(|a, b| b.1.self_insns.cmp(&a.1.self_insns).then(a.0.cmp(&b.0)));
        v
    }

    fn opened(&mut self, cx: &Context<'_>, stack: &[Frame]) {
        let Some(top) = stack.last() else { return };
        *self.active.entry((cx.thread, top.func)).or_default() += 1;
        let t = self.threads.entry(cx.thread).or_default();
        t.max_depth = t.max_depth.max(stack.len());
    }
}

impl CallSink for Profile {
    fn thread(&mut self, cx: &Context<'_>) -> io::Result<()> {
        self.threads.entry(cx.thread).or_default();
        Ok(())
    }

    fn begin(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        self.opened(cx, stack);
        Ok(())
    }

    fn enter(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        self.opened(cx, stack);
        if let Some(top) = stack.last() {
            self.functions.entry(top.func).or_default().calls += 1;
        }
        self.threads.entry(cx.thread).or_default().calls += 1;
        Ok(())
    }

    fn caller(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        self.callers += 1;
        self.opened(cx, stack);
        Ok(())
    }

    fn exit(&mut self, cx: &Context<'_>, stack: &[Frame], how: ExitHow) -> io::Result<()> {
        let Some(top) = stack.last() else {
            return Ok(());
        };
        if how == ExitHow::Unwound {
            self.unwound += 1;
        }
        let key = (cx.thread, top.func);
        let active = self.active.entry(key).or_default();
        *active = active.saturating_sub(1);
        let outermost = *active == 0;
        if outermost {
            self.active.remove(&key);
        }
        let f = self.functions.entry(top.func).or_default();
        f.self_insns += top.self_insns(cx.thread_insns);
        if outermost {
            f.total_insns += top.total_insns(cx.thread_insns);
            if top.entered.tsc.is_some() && cx.now.tsc.is_some() {
                self.timing.push_back((top.func, top.entered, cx.now));
                self.settle(false);
            }
        }
        let t = self.threads.entry(cx.thread).or_default();
        t.insns = t.insns.max(cx.thread_insns);
        Ok(())
    }

    fn time(&mut self, now: Stamp) -> io::Result<()> {
        self.times.note(now);
        self.settle(false);
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        self.settle(true);
        Ok(())
    }
}

impl Profile {
    /// Adds the time of the activations whose end the timestamps have
    /// passed (all of them when `all`).
    fn settle(&mut self, all: bool) {
        while let Some(&(func, start, end)) = self.timing.front() {
            if !self.times.settled(end, self.timing.len(), all) {
                break;
            }
            self.timing.pop_front();
            if let Some(ticks) = self.times.span(start, end) {
                self.functions.entry(func).or_default().total_ticks += ticks;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::tracker::tests::Flow;
    use crate::calls::{CallTracker, HexNames};

    #[test]
    fn recursion_counts_totals_once() {
        // f (0x200) calls itself once; main at 0x100.
        let flow = Flow::default()
            .time(100)
            .call(0x100)
            .run(0x200, 1)
            .call(0x201)
            .run(0x200, 2)
            .ret(0x202)
            .ret(0x206)
            .time(500)
            .run(0x105, 1);
        let mut tracker = CallTracker::new(Box::new(HexNames));
        let mut p = Profile::new();
        for e in &flow.0 {
            tracker.feed(e, &mut p).unwrap();
        }
        tracker.finish(&mut p).unwrap();
        let funcs = tracker.functions();
        let by_total = p.by_total();
        let names: Vec<(&str, u64, u64, u64)> = by_total
            .iter()
            .map(|(f, s)| (funcs.name(*f), s.calls, s.self_insns, s.total_insns))
            .collect();
        assert_eq!(names, [("0x100", 0, 2, 8), ("0x200", 2, 6, 6)]);
        let t = p.threads[&ThreadKey::default()];
        assert_eq!((t.insns, t.calls, t.max_depth), (8, 2, 3));
        // TSC 100 before the first instruction and 500 after the seventh:
        // 0x200 ran from after the call (1) to after its return (7), six
        // of the seven instructions: 400 · 6/7 ticks (the start rounded
        // down).
        assert_eq!(
            p.functions[&by_total[1].0].total_ticks,
            500 - (100 + 400 / 7)
        );
    }
}
