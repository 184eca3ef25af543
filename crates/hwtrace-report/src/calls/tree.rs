//! The indented call trace, written as the flow is decoded.
//!
//! The layout follows ftrace's function graph, because it can be written
//! without buffering: a function that called nothing is one line with its
//! counts; one that did opens with `name {` and closes with
//! `} name` and its counts, its callees indented between. Each line that
//! ends a frame says how many instructions ran in it (and, for an open
//! `{`, how many in itself), and how long it took when the trace has
//! timestamps, measured on the time spread between them ([`TimeMap`]):
//! the text after such a line waits until the timestamp after its end has
//! come.
//!
//! ```text
//! main {
//!   f  12 insns
//!   g {
//!     h  3 insns
//!   } g  40 insns (self 37)
//! } main  60 insns (self 8)
//! ```
//!
//! Indentation is the depth in the stack as known at the time the line is
//! written. When the flow returns above the frame the trace began in, the
//! caller (entered before the trace began) is announced with a
//! `<- caller` line at the outermost level, and the lines that follow are
//! indented from it.

use super::timemap::TimeMap;
use super::tracker::{CallSink, Context, ExitHow, Frame, FrameKind, Stamp, ThreadKey};
use crate::exec::GapKind;
use hwtrace_types::TraceOffset;
use hwtrace_types::hash::BuildIntHasher;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};

/// How TSC ticks become seconds: the TSC frequency, if known.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct TscRate(pub Option<f64>);

impl TscRate {
    /// A duration of `ticks` TSC ticks, in words (`1.234 µs`, or
    /// `5678 ticks` when the frequency is not known).
    pub fn duration(self, ticks: u64) -> String {
        match self.0 {
            Some(hz) if hz > 0.0 => {
                let us = ticks as f64 * 1e6 / hz;
                if us >= 1000.0 {
                    format!("{:.3} ms", us / 1000.0)
                } else {
                    format!("{us:.3} µs")
                }
            }
            _ => format!("{ticks} ticks"),
        }
    }
}

/// A piece of the output waiting for a duration before it.
enum Piece {
    Text(Vec<u8>),
    /// `, DURATION` of a frame from one point to another.
    Duration(Stamp, Stamp),
}

/// Writes the call trace to `out` as frames enter and exit.
pub struct TreeWriter<W: Write> {
    out: W,
    /// The text being written since the last duration.
    text: Vec<u8>,
    /// What waits for a duration to be known, in order.
    waiting: VecDeque<Piece>,
    /// How many durations wait.
    durations: usize,
    times: TimeMap,
    rate: TscRate,
    /// The frame whose `name {` is not written yet (it may turn out to
    /// call nothing and be a single line), per thread: its depth.
    open: HashMap<ThreadKey, usize, BuildIntHasher>,
    /// The last thread written, to label lines when threads interleave.
    last_thread: Option<ThreadKey>,
}

impl<W: Write> std::fmt::Debug for TreeWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeWriter").finish_non_exhaustive()
    }
}

impl<W: Write> TreeWriter<W> {
    /// A writer to `out`; durations use `rate`.
    pub fn new(out: W, rate: TscRate) -> Self {
        Self {
            out,
            text: Vec::new(),
            waiting: VecDeque::new(),
            durations: 0,
            times: TimeMap::new(),
            rate,
            open: HashMap::default(),
            last_thread: None,
        }
    }

    /// The output, everything written and flushed.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.release(true)?;
        self.out.flush()?;
        Ok(self.out)
    }

    /// Writes the text whose durations are known (all when `ending`).
    fn release(&mut self, ending: bool) -> io::Result<()> {
        while let Some(piece) = self.waiting.front() {
            match piece {
                Piece::Text(t) => self.out.write_all(t)?,
                &Piece::Duration(start, end) => {
                    if !self.times.settled(end, self.durations, ending) {
                        break;
                    }
                    if let Some(ticks) = self.times.span(start, end) {
                        write!(self.out, ", {}", self.rate.duration(ticks))?;
                    }
                    self.durations -= 1;
                }
            }
            self.waiting.pop_front();
        }
        if self.waiting.is_empty() {
            self.out.write_all(&self.text)?;
            self.text.clear();
        }
        Ok(())
    }

    /// Starts a line at `depth`: a thread header when the thread changed.
    fn line(&mut self, thread: ThreadKey, depth: usize) -> io::Result<()> {
        if self.last_thread != Some(thread) {
            // Records without thread information are one unnamed thread.
            if thread != ThreadKey::default() || self.last_thread.is_some() {
                writeln!(self.text, "[{thread}]")?;
            }
            self.last_thread = Some(thread);
        }
        for _ in 0..depth {
            self.text.extend_from_slice(b"  ");
        }
        Ok(())
    }

    /// Writes the pending `name {` of `thread`, if any.
    fn flush_open(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        if let Some(depth) = self.open.remove(&cx.thread)
            && let Some(frame) = stack.get(depth)
        {
            self.line(cx.thread, depth)?;
            writeln!(
                self.text,
                "{}{} {{",
                marker(frame),
                cx.funcs.name(frame.func)
            )?;
        }
        Ok(())
    }

    fn counts(&mut self, cx: &Context<'_>, frame: &Frame, leaf: bool) -> io::Result<()> {
        let total = frame.total_insns(cx.thread_insns);
        write!(self.text, "  {total} insns")?;
        if !leaf {
            write!(self.text, " (self {})", frame.self_insns(cx.thread_insns))?;
        }
        if frame.entered.tsc.is_some() && cx.now.tsc.is_some() {
            // The duration once the timestamp after the end has come.
            let text = std::mem::take(&mut self.text);
            self.waiting.push_back(Piece::Text(text));
            self.waiting
                .push_back(Piece::Duration(frame.entered, cx.now));
            self.durations += 1;
        }
        Ok(())
    }
}

/// What a frame's first line says about how it began.
fn marker(frame: &Frame) -> &'static str {
    match frame.kind {
        FrameKind::Called => "",
        FrameKind::Resumed => "(trace begins in) ",
        FrameKind::Caller => "<- caller ",
    }
}

impl<W: Write> CallSink for TreeWriter<W> {
    fn begin(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        if let Some(depth) = stack.len().checked_sub(1) {
            self.open.insert(cx.thread, depth);
        }
        Ok(())
    }

    fn enter(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        self.flush_open(cx, stack)?;
        if let Some(depth) = stack.len().checked_sub(1) {
            self.open.insert(cx.thread, depth);
        }
        Ok(())
    }

    fn exit(&mut self, cx: &Context<'_>, stack: &[Frame], how: ExitHow) -> io::Result<()> {
        let Some(depth) = stack.len().checked_sub(1) else {
            return Ok(());
        };
        let frame = stack[depth];
        let name = cx.funcs.name(frame.func);
        let leaf = self.open.get(&cx.thread) == Some(&depth);
        if leaf {
            self.open.remove(&cx.thread);
            self.line(cx.thread, depth)?;
            write!(self.text, "{}{name}", marker(&frame))?;
        } else {
            self.flush_open(cx, stack)?;
            self.line(cx.thread, depth)?;
            write!(self.text, "}} {name}")?;
        }
        self.counts(cx, &frame, leaf)?;
        match how {
            ExitHow::Return => writeln!(self.text),
            ExitHow::Unwound => writeln!(self.text, " [unwound]"),
            ExitHow::Gap(why) => writeln!(self.text, " [trace data lost: {}]", gap_words(why)),
            ExitHow::End => writeln!(self.text, " [trace ends]"),
            ExitHow::DepthLimit => writeln!(self.text, " [stack too deep]"),
        }?;
        self.release(false)
    }

    fn time(&mut self, now: Stamp) -> io::Result<()> {
        self.times.note(now);
        self.release(false)
    }

    fn finish(&mut self) -> io::Result<()> {
        self.release(true)
    }

    fn caller(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        // A caller always encloses what came before: it opens now, and
        // closes with `}` when it ends.
        let Some(frame) = stack.first() else {
            return Ok(());
        };
        self.line(cx.thread, 0)?;
        writeln!(
            self.text,
            "{}{} {{ (entered before the trace began)",
            marker(frame),
            cx.funcs.name(frame.func)
        )?;
        self.release(false)
    }

    fn gap(&mut self, cx: &Context<'_>, offset: TraceOffset, why: GapKind) -> io::Result<()> {
        if why.flow_goes_on() {
            return Ok(());
        }
        self.line(cx.thread, 0)?;
        writeln!(
            self.text,
            "[gap at trace offset {offset}: {}]",
            gap_words(why)
        )?;
        self.release(false)
    }
}

/// A gap's cause in words.
pub(crate) fn gap_words(why: GapKind) -> &'static str {
    match why {
        GapKind::Disabled => "tracing disabled",
        GapKind::Interrupted => "tracing interrupted",
        GapKind::Overflow => "internal buffer overflow",
        GapKind::DecodeError => "decode error, resynchronised",
        GapKind::Lost => "data lost before it was written",
        GapKind::Stuck => "decoder stuck without trace, resynchronised",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::tracker::tests::Flow;
    use crate::calls::{CallTracker, HexNames};
    use crate::exec::GapKind;

    fn tree(flow: Flow) -> String {
        let mut tracker = CallTracker::new(Box::new(HexNames));
        let mut w = TreeWriter::new(Vec::new(), TscRate(Some(1e9)));
        for e in &flow.0 {
            tracker.feed(e, &mut w).unwrap();
        }
        tracker.finish(&mut w).unwrap();
        String::from_utf8(w.into_inner().unwrap()).unwrap()
    }

    #[test]
    fn leaves_are_one_line_and_callers_enclose_their_callees() {
        let flow = Flow::default()
            .time(1000)
            .call(0x100)
            .call(0x200)
            .run(0x300, 2)
            .ret(0x302)
            .time(3000)
            .run(0x205, 1)
            .ret(0x206)
            .run(0x105, 1);
        // TSC 1000 before the first instruction, 3000 after the fifth: 400
        // ticks (0.4 µs at 1 GHz) an instruction, and so on after it.
        assert_eq!(
            tree(flow),
            "(trace begins in) 0x100 {\n  \
             0x200 {\n    \
             0x300  3 insns, 1.200 µs\n  \
             } 0x200  6 insns (self 3), 2.400 µs\n\
             } 0x100  8 insns (self 2), 3.200 µs [trace ends]\n"
        );
    }

    #[test]
    fn callers_gaps_and_threads_are_marked() {
        let flow = Flow::default()
            .thread(7)
            .run(0x200, 1)
            .ret(0x201)
            .run(0x1234, 1)
            .gap(GapKind::Overflow)
            .thread(8)
            .run(0x900, 1);
        assert_eq!(
            tree(flow),
            "[thread 1/7]\n\
             (trace begins in) 0x200  2 insns\n\
             <- caller 0x1234 { (entered before the trace began)\n\
             } 0x1234  3 insns (self 1) [trace data lost: internal buffer overflow]\n\
             [gap at trace offset 0x40: internal buffer overflow]\n\
             [thread 1/8]\n\
             (trace begins in) 0x900  1 insns [trace ends]\n"
        );
    }
}
