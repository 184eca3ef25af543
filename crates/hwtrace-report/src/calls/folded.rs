//! Folded stacks (`main;f;g 42`): for each distinct call stack, the
//! instructions executed with it on top. This is the input format of
//! flame graph tools (Brendan Gregg's `flamegraph.pl`, inferno,
//! speedscope).
//!
//! Memory grows with the number of distinct stacks, not with the trace.
//! A synthetic caller ([`FrameKind::Caller`](super::FrameKind::Caller))
//! found later encloses what was counted before it: the counts of the
//! thread's current stack (since it began) are kept apart and get the
//! caller prefixed when it shows up.

use super::functions::{FuncId, Functions};
use super::tracker::{CallSink, Context, ExitHow, Frame, ThreadKey};
use hwtrace_types::hash::BuildIntHasher;
use std::collections::HashMap;
use std::io::{self, Write};

/// Instruction counts per distinct call stack.
#[derive(Debug, Default)]
pub struct FoldedStacks {
    done: HashMap<Vec<FuncId>, u64, BuildIntHasher>,
    /// Per thread: counts of the stack that is still open, whose
    /// outermost callers may not be known yet.
    open: HashMap<ThreadKey, HashMap<Vec<FuncId>, u64, BuildIntHasher>, BuildIntHasher>,
}

impl FoldedStacks {
    /// No stacks yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn close(&mut self, thread: ThreadKey) {
        if let Some(counts) = self.open.remove(&thread) {
            for (stack, n) in counts {
                *self.done.entry(stack).or_default() += n;
            }
        }
    }

    /// The stacks with their counts, `main;f;g` style, sorted by stack
    /// (as `flamegraph.pl`'s collapse scripts sort them). Call after the
    /// tracker's `finish`. Names have `;` replaced by `:` and line breaks
    /// by spaces so that every line parses.
    pub fn lines(&mut self, funcs: &Functions) -> Vec<String> {
        let threads: Vec<ThreadKey> = self.open.keys().copied().collect();
        for t in threads {
            self.close(t);
        }
        let mut lines: Vec<String> = self
            .done
            .iter()
            .filter(|&(_, &n)| n > 0)
            .map(|(stack, n)| {
                let names: Vec<String> = stack
                    .iter()
                    .map(|&f| funcs.name(f).replace(';', ":").replace(['\n', '\r'], " "))
                    .collect();
                format!("{} {n}", names.join(";"))
            })
            .collect();
        lines.sort_unstable();
        lines
    }

    /// Writes [`Self::lines`] to `out`, one per line.
    pub fn write(&mut self, funcs: &Functions, out: &mut dyn Write) -> io::Result<()> {
        for line in self.lines(funcs) {
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

impl CallSink for FoldedStacks {
    fn begin(&mut self, cx: &Context<'_>, _stack: &[Frame]) -> io::Result<()> {
        self.close(cx.thread);
        Ok(())
    }

    fn exit(&mut self, cx: &Context<'_>, stack: &[Frame], _how: ExitHow) -> io::Result<()> {
        let Some(top) = stack.last() else {
            return Ok(());
        };
        let n = top.self_insns(cx.thread_insns);
        if n > 0 {
            let key: Vec<FuncId> = stack.iter().map(|f| f.func).collect();
            *self
                .open
                .entry(cx.thread)
                .or_default()
                .entry(key)
                .or_default() += n;
        }
        Ok(())
    }

    fn caller(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        let Some(caller) = stack.first().map(|f| f.func) else {
            return Ok(());
        };
        if let Some(counts) = self.open.get_mut(&cx.thread) {
            *counts = std::mem::take(counts)
                .into_iter()
                .map(|(mut stack, n)| {
                    stack.insert(0, caller);
                    (stack, n)
                })
                .collect();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::tracker::tests::Flow;
    use crate::calls::{CallTracker, HexNames};
    use crate::exec::GapKind;

    fn folded(flow: Flow) -> Vec<String> {
        let mut tracker = CallTracker::new(Box::new(HexNames));
        let mut f = FoldedStacks::new();
        for e in &flow.0 {
            tracker.feed(e, &mut f).unwrap();
        }
        tracker.finish(&mut f).unwrap();
        f.lines(tracker.functions())
    }

    #[test]
    fn each_stack_counts_its_own_instructions() {
        let flow = Flow::default()
            .call(0x100)
            .run(0x200, 3)
            .ret(0x203)
            .call(0x105)
            .run(0x200, 1)
            .ret(0x201)
            .run(0x10a, 2);
        assert_eq!(folded(flow), ["0x100 4", "0x100;0x200 6"]);
    }

    #[test]
    fn a_caller_found_later_encloses_what_came_before() {
        let flow = Flow::default()
            .call(0x200)
            .run(0x300, 1)
            .ret(0x301)
            .ret(0x205)
            .run(0x1234, 2)
            .gap(GapKind::Lost)
            .run(0x9000, 1);
        assert_eq!(
            folded(flow),
            [
                "0x1234 2",
                "0x1234;0x200 2",
                "0x1234;0x200;0x300 2",
                "0x9000 1"
            ]
        );
    }
}
