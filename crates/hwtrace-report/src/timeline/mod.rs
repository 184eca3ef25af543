//! Function entries and exits on a time axis, as Chrome trace event JSON
//! (the "JSON Object Format" of the Trace Event Format), which Perfetto's
//! UI and `chrome://tracing` open.
//!
//! Each frame becomes one complete event (`"ph":"X"`, with `ts` and `dur`)
//! written when the frame ends, so the file is produced while the trace is
//! decoded and memory holds only the open frames, never the event list.
//! Complete events rather than `B`/`E` pairs because a caller found late
//! (a return above the frame the trace began in) began before events
//! already written: an `X` event states its own interval, so it nests
//! correctly wherever it lands in the file. Viewers sort by `ts`, and
//! among events starting together put the longer (the caller) outside.
//!
//! One track per thread: `pid` is the process id (or the thread id when
//! the trace does not say), `tid` the thread id, and `M` metadata events
//! name the processes and threads. Gaps in the trace are instant events
//! (`"ph":"i"`) on their thread's track.
//!
//! The clock: with timestamps in the trace, `ts` is microseconds since the
//! first timestamp (TSC ticks divided by the TSC frequency; if that is not
//! known, 1 GHz is assumed and the metadata says so), spread between the
//! trace's timestamps by instructions executed ([`TimeMap`]: an event is
//! written once the timestamp after it has come). Without timestamps,
//! `ts` counts executed instructions (all threads, in trace order), one
//! instruction per microsecond. Which clock was used is written in the
//! file's `otherData` and in the process names. In [`Clock::Auto`] the
//! first few thousand events wait for a timestamp to appear before the
//! clock is chosen (a PT trace gives one in its first PSB+).

use crate::calls::{CallSink, Context, ExitHow, Frame, FrameKind, Stamp, ThreadKey, TimeMap};
use crate::exec::GapKind;
use hwtrace_types::{TraceOffset, Tsc};
use std::collections::HashSet;
use std::io::{self, Write};

/// Which time axis the timeline uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Clock {
    /// TSC when the trace has timestamps, instruction counts otherwise.
    #[default]
    Auto,
    /// Instruction counts, even when the trace has timestamps.
    Instructions,
    /// TSC (events before the first timestamp are at 0).
    Tsc,
}

/// How the timeline is written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimelineOptions {
    /// The time axis.
    pub clock: Clock,
    /// The TSC frequency in Hz, if known.
    pub tsc_hz: Option<f64>,
    /// What the trace is of (a file name), for the process names.
    pub title: String,
}

/// How many events [`Clock::Auto`] holds back waiting for a timestamp.
const AUTO_WINDOW: usize = 4096;

/// The chosen axis.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Axis {
    Insns,
    Tsc,
}

/// An event held back until the clock is chosen.
#[derive(Debug)]
struct Held {
    thread: ThreadKey,
    start: Stamp,
    end: Stamp,
    body: Body,
}

#[derive(Debug)]
enum Body {
    Frame {
        name: String,
        kind: FrameKind,
        how: ExitHow,
        insns: u64,
        self_insns: u64,
    },
    Gap {
        offset: TraceOffset,
        why: GapKind,
    },
}

/// Writes the timeline as frames end.
#[derive(Debug)]
pub struct TimelineWriter<W: Write> {
    out: W,
    options: TimelineOptions,
    axis: Option<Axis>,
    first_tsc: Option<Tsc>,
    /// Events not written yet, in the order they ended.
    held: std::collections::VecDeque<Held>,
    /// The time at any point, from the timestamps so far.
    times: TimeMap,
    pids: HashSet<u32>,
    wrote_any: bool,
    events: u64,
}

/// The `pid` of the process that holds one track per CPU, for streams
/// whose thread is not known (pid 0 would be the idle task).
const CPUS_PID: u32 = 0x7fff_0000;

/// The `pid`/`tid` pair of a thread's track.
fn track(thread: ThreadKey) -> (u32, u32) {
    match (thread.pid, thread.tid, thread.cpu) {
        (pid, Some(tid), _) => (pid.unwrap_or(tid), tid),
        (_, None, Some(cpu)) => (CPUS_PID, CPUS_PID + 1 + cpu % 0xffff),
        (Some(pid), None, None) => (pid, pid),
        // Records without thread information: one track, not the idle
        // task 0.
        (None, None, None) => (1, 1),
    }
}

impl<W: Write> TimelineWriter<W> {
    /// Starts the JSON document on `out`.
    pub fn new(mut out: W, options: TimelineOptions) -> io::Result<Self> {
        out.write_all(b"{\"traceEvents\":[\n")?;
        let axis = match options.clock {
            Clock::Auto => None,
            Clock::Instructions => Some(Axis::Insns),
            Clock::Tsc => Some(Axis::Tsc),
        };
        Ok(Self {
            out,
            options,
            axis,
            first_tsc: None,
            held: std::collections::VecDeque::new(),
            times: TimeMap::new(),
            pids: HashSet::new(),
            wrote_any: false,
            events: 0,
        })
    }

    /// Writes what is held back, the metadata, and closes the document;
    /// returns the output and how many events it holds (metadata
    /// included).
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        self.choose(true);
        self.release(true)?;
        let axis = self.axis.unwrap_or(Axis::Insns);
        self.out
            .write_all(b"\n],\"displayTimeUnit\":\"ns\",\"otherData\":{\"clock\":")?;
        let clock = self.clock_words(axis);
        json_str(&mut self.out, &clock)?;
        if let Some(hz) = self.options.tsc_hz {
            write!(self.out, ",\"tsc_hz\":{hz}")?;
        }
        if let Some(Tsc(t)) = self.first_tsc {
            write!(self.out, ",\"first_tsc\":{t}")?;
        }
        self.out.write_all(b",\"source\":")?;
        json_str(&mut self.out, &self.options.title)?;
        self.out
            .write_all(b",\"writer\":\"hwtrace timeline\"}}\n")?;
        self.out.flush()?;
        Ok((self.out, self.events))
    }

    fn clock_words(&self, axis: Axis) -> String {
        match (axis, self.options.tsc_hz) {
            (Axis::Insns, _) => {
                "instructions: the trace has no timestamps (or they were not used); \
                 1 us on the time axis is 1 executed instruction"
                    .to_owned()
            }
            (Axis::Tsc, Some(hz)) => format!("TSC at {hz} Hz, from the first timestamp"),
            (Axis::Tsc, None) => {
                "TSC, frequency unknown: 1 GHz assumed (1 us = 1000 ticks), from the first timestamp"
                    .to_owned()
            }
        }
    }

    /// Chooses the clock in [`Clock::Auto`]: TSC as soon as one is known,
    /// instructions when none is and the waiting is over (`ending`, or
    /// [`AUTO_WINDOW`] events held).
    fn choose(&mut self, ending: bool) {
        if self.axis.is_none() {
            if self.first_tsc.is_some() {
                self.axis = Some(Axis::Tsc);
            } else if ending || self.held.len() >= AUTO_WINDOW {
                self.axis = Some(Axis::Insns);
            }
        }
    }

    fn note_tsc(&mut self, tsc: Option<Tsc>) {
        if self.first_tsc.is_none() {
            self.first_tsc = tsc;
        }
    }

    /// A point on the chosen axis, in nanoseconds. Whole nanoseconds,
    /// rounded the same way for every event, keep children inside their
    /// parents exactly (rounding is monotonic), which floating-point
    /// microseconds with separately rounded `dur`s would not.
    fn ns(&self, point: Stamp) -> u64 {
        match self.axis {
            Some(Axis::Tsc) => {
                let first = self.first_tsc.map_or(0, |t| t.0);
                let ticks = self
                    .times
                    .ticks(point)
                    .map_or(0, |t| t.saturating_sub(first));
                let hz = self.options.tsc_hz.filter(|hz| *hz > 0.0).unwrap_or(1e9);
                (ticks as f64 * 1e9 / hz).round() as u64
            }
            _ => point.insns.saturating_mul(1000),
        }
    }

    fn push(&mut self, held: Held) -> io::Result<()> {
        self.note_tsc(held.start.tsc);
        self.note_tsc(held.end.tsc);
        self.held.push_back(held);
        self.choose(false);
        self.release(false)
    }

    /// Writes the held events once the clock is known and, on the TSC
    /// axis, the timestamp after each is (all of them when `ending`).
    fn release(&mut self, ending: bool) -> io::Result<()> {
        let Some(axis) = self.axis else {
            return Ok(());
        };
        while let Some(held) = self.held.front() {
            if axis == Axis::Tsc && !self.times.settled(held.end, self.held.len(), ending) {
                break;
            }
            let held = self.held.pop_front().expect("looked at");
            self.write_event(&held)?;
        }
        Ok(())
    }

    fn separator(&mut self) -> io::Result<()> {
        if self.wrote_any {
            self.out.write_all(b",\n")?;
        }
        self.wrote_any = true;
        self.events += 1;
        Ok(())
    }

    fn write_event(&mut self, held: &Held) -> io::Result<()> {
        let (pid, tid) = track(held.thread);
        let start = self.ns(held.start);
        let end = self.ns(held.end).max(start);
        let (ts, dur) = (Micros(start), Micros(end - start));
        self.separator()?;
        match &held.body {
            Body::Frame {
                name,
                kind,
                how,
                insns,
                self_insns,
            } => {
                self.out.write_all(b"{\"name\":")?;
                json_str(&mut self.out, name)?;
                write!(
                    self.out,
                    ",\"cat\":\"call\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{dur},\"pid\":{pid},\"tid\":{tid},\"args\":{{\"insns\":{insns},\"self_insns\":{self_insns}"
                )?;
                match kind {
                    FrameKind::Called => {}
                    FrameKind::Resumed => {
                        self.out
                            .write_all(b",\"entered\":\"before the trace (began inside)\"")?;
                    }
                    FrameKind::Caller => {
                        self.out
                            .write_all(b",\"entered\":\"before the trace (returned into)\"")?;
                    }
                }
                let ended = match how {
                    ExitHow::Return => "",
                    ExitHow::Unwound => "unwound",
                    ExitHow::Gap(_) => "trace data lost",
                    ExitHow::End => "trace ends",
                    ExitHow::DepthLimit => "stack too deep",
                };
                if !ended.is_empty() {
                    write!(self.out, ",\"ended\":\"{ended}\"")?;
                }
                self.out.write_all(b"}}")
            }
            Body::Gap { offset, why } => {
                write!(
                    self.out,
                    "{{\"name\":\"gap: {}\",\"cat\":\"trace\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{ts},\"pid\":{pid},\"tid\":{tid},\"args\":{{\"offset\":\"{offset}\"}}}}",
                    crate::calls::gap_words(*why)
                )
            }
        }
    }

    fn metadata(&mut self, what: &str, pid: u32, tid: Option<u32>, name: &str) -> io::Result<()> {
        self.separator()?;
        write!(self.out, "{{\"name\":\"{what}\",\"ph\":\"M\",\"pid\":{pid}")?;
        if let Some(tid) = tid {
            write!(self.out, ",\"tid\":{tid}")?;
        }
        self.out.write_all(b",\"args\":{\"name\":")?;
        json_str(&mut self.out, name)?;
        self.out.write_all(b"}}")
    }
}

impl<W: Write> CallSink for TimelineWriter<W> {
    fn thread(&mut self, cx: &Context<'_>) -> io::Result<()> {
        let (pid, tid) = track(cx.thread);
        if self.pids.insert(pid) {
            let name = match (cx.thread.pid, cx.thread.tid) {
                (Some(p), _) => format!("{} (pid {p})", self.options.title),
                (None, None) if cx.thread.cpu.is_some() => {
                    format!("{} (per CPU, threads not known)", self.options.title)
                }
                _ => self.options.title.clone(),
            };
            self.metadata("process_name", pid, None, &name)?;
        }
        self.metadata("thread_name", pid, Some(tid), &cx.thread.to_string())
    }

    fn exit(&mut self, cx: &Context<'_>, stack: &[Frame], how: ExitHow) -> io::Result<()> {
        let Some(top) = stack.last() else {
            return Ok(());
        };
        self.push(Held {
            thread: cx.thread,
            start: top.entered,
            end: cx.now,
            body: Body::Frame {
                name: cx.funcs.name(top.func).to_owned(),
                kind: top.kind,
                how,
                insns: top.total_insns(cx.thread_insns),
                self_insns: top.self_insns(cx.thread_insns),
            },
        })
    }

    fn time(&mut self, now: Stamp) -> io::Result<()> {
        self.times.note(now);
        self.release(false)
    }

    fn gap(&mut self, cx: &Context<'_>, offset: TraceOffset, why: GapKind) -> io::Result<()> {
        if why.flow_goes_on() {
            return Ok(());
        }
        self.push(Held {
            thread: cx.thread,
            start: cx.now,
            end: cx.now,
            body: Body::Gap { offset, why },
        })
    }
}

/// Nanoseconds written as microseconds with three decimals, exactly.
struct Micros(u64);

impl std::fmt::Display for Micros {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 % 1000 {
            0 => write!(f, "{}", self.0 / 1000),
            ns => write!(f, "{}.{ns:03}", self.0 / 1000),
        }
    }
}

/// Writes `s` as a JSON string.
fn json_str(out: &mut dyn Write, s: &str) -> io::Result<()> {
    serde_json::to_writer(out, s).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::timemap::MAX_KNOTS;
    use crate::calls::tracker::tests::Flow;
    use crate::calls::{CallTracker, HexNames};
    use crate::exec::Exec;

    fn timeline(flow: Flow, clock: Clock) -> serde_json::Value {
        let mut tracker = CallTracker::new(Box::new(HexNames));
        let options = TimelineOptions {
            clock,
            tsc_hz: Some(2e9),
            title: "t\"est".to_owned(),
        };
        let mut w = TimelineWriter::new(Vec::new(), options).unwrap();
        for e in &flow.0 {
            tracker.feed(e, &mut w).unwrap();
        }
        tracker.finish(&mut w).unwrap();
        let (bytes, events) = w.finish().unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(doc["traceEvents"].as_array().unwrap().len() as u64, events);
        doc
    }

    fn frames(doc: &serde_json::Value) -> Vec<(String, f64, f64)> {
        doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["ts"].as_f64().unwrap(),
                    e["dur"].as_f64().unwrap(),
                )
            })
            .collect()
    }

    fn flow() -> Flow {
        Flow::default()
            .thread(5)
            .time(1000)
            .call(0x100)
            .run(0x200, 2)
            .time(3000)
            .ret(0x202)
            .run(0x105, 1)
            .gap(GapKind::Overflow)
    }

    #[test]
    fn frames_are_complete_events_on_the_tsc_axis() {
        let doc = timeline(flow(), Clock::Auto);
        // TSC 1000 before the first instruction, 3000 after the third: 2000
        // ticks (1 us at 2 GHz) over 3 instructions, a third of a us each,
        // the same rate after the last timestamp. 0x200 runs from after the
        // call (1) to after its return (4), 0x100 from 0 to the end (5).
        assert_eq!(
            frames(&doc),
            [
                ("0x200".to_owned(), 0.333, 1.0),
                ("0x100".to_owned(), 0.0, 1.667)
            ]
        );
        let events = doc["traceEvents"].as_array().unwrap();
        assert_eq!(events[0]["name"], "process_name");
        assert_eq!(events[0]["args"]["name"], "t\"est (pid 1)");
        assert_eq!(events[1]["name"], "thread_name");
        assert_eq!(events[1]["tid"], 5);
        let gap = events.iter().find(|e| e["ph"] == "i").unwrap();
        assert_eq!(gap["args"]["offset"], "0x40");
        assert!(
            doc["otherData"]["clock"]
                .as_str()
                .unwrap()
                .starts_with("TSC at 2000000000 Hz")
        );
    }

    #[test]
    fn between_timestamps_the_time_is_spread_by_instructions() {
        // Ten calls of 0x200, 12 instructions a round; TSC 10000 at the
        // start, 11200 after five rounds (60 instructions), 12400 after
        // ten: 20 ticks (10 ns at 2 GHz) an instruction throughout.
        let mut f = Flow::default().thread(5).time(10_000);
        for i in 0..10u64 {
            let at = 0x100 + 0x10 * i;
            f = f.call(at).run(0x200, 9).ret(0x209).run(at + 5, 1);
            if i == 4 {
                f = f.time(11_200);
            }
        }
        let doc = timeline(f.time(12_400), Clock::Auto);
        let calls: Vec<(f64, f64)> = frames(&doc)
            .into_iter()
            .filter(|(name, ..)| name == "0x200")
            .map(|(_, ts, dur)| (ts, dur))
            .collect();
        // Each from after its call (12i + 1) to after its return (12i + 11).
        let want: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(12 * i + 1) * 0.01, 0.1))
            .collect();
        assert_eq!(calls.len(), 10);
        for (got, want) in calls.iter().zip(&want) {
            assert!(
                (got.0 - want.0).abs() < 1e-9 && (got.1 - want.1).abs() < 1e-9,
                "{calls:?}"
            );
        }
    }

    #[test]
    fn old_timestamps_are_thinned_and_frames_still_nest() {
        // A frame open across more timestamps than are kept, with short
        // calls inside it throughout, 6 instructions a round.
        let mut f = Flow::default().thread(5).time(1_000).call(0x100);
        for i in 0..(MAX_KNOTS as u64 + 100) {
            f = f.call(0x200).run(0x300, 3).ret(0x303).run(0x205, 1);
            f = f.time(2_000 + 10 * i);
        }
        let mut tracker = CallTracker::new(Box::new(HexNames));
        let mut w = TimelineWriter::new(std::io::sink(), TimelineOptions::default()).unwrap();
        for e in &f.ret(0x203).run(0x105, 1).0 {
            tracker.feed(e, &mut w).unwrap();
        }
        assert!(w.times.len() <= MAX_KNOTS, "{}", w.times.len());
        assert!(w.times.rising());
        // The early rounds' points, in order, within the outer frame.
        let at = |insns, tsc| Stamp {
            insns,
            tsc: Some(Tsc(tsc)),
        };
        let end = w.ns(at(u64::MAX / 2, 1));
        let mut last = w.ns(at(1, 1_000));
        for i in 0..1000u64 {
            let at = w.ns(at(2 + 6 * i, 1));
            assert!(at >= last && at <= end, "{i}: {at}");
            last = at;
        }
    }

    #[test]
    fn time_going_back_between_timestamps_stays_put() {
        // A second stream (per-CPU queues decode one after another) whose
        // clock starts earlier: no interpolation across, frames still whole.
        let f = Flow::default()
            .thread(5)
            .time(5_000)
            .call(0x100)
            .run(0x200, 4)
            .ret(0x204)
            .time(1_000)
            .call(0x110)
            .run(0x300, 4)
            .ret(0x304)
            .run(0x115, 1);
        let doc = timeline(f, Clock::Tsc);
        for (name, ts, dur) in frames(&doc) {
            assert!(ts >= 0.0 && dur >= 0.0, "{name} {ts} {dur}");
        }
    }

    #[test]
    fn nanoseconds_print_as_exact_microseconds() {
        let shown: Vec<String> = [0, 5, 1234, 2000, 10_050]
            .into_iter()
            .map(|ns| Micros(ns).to_string())
            .collect();
        assert_eq!(shown, ["0", "0.005", "1.234", "2", "10.050"]);
    }

    #[test]
    fn without_timestamps_instructions_are_the_clock() {
        let mut untimed = flow();
        untimed.0.retain(|e| !matches!(e, Exec::Time(_)));
        let auto = timeline(untimed, Clock::Auto);
        let doc = timeline(flow(), Clock::Instructions);
        assert_eq!(frames(&auto), frames(&doc));
        assert_eq!(
            frames(&doc),
            [
                ("0x200".to_owned(), 1.0, 3.0),
                ("0x100".to_owned(), 0.0, 5.0)
            ]
        );
        assert!(
            doc["otherData"]["clock"]
                .as_str()
                .unwrap()
                .starts_with("instructions")
        );
    }
}
