//! The call structure as JSON lines, one object per frame entry and exit,
//! for scripts (and for tests that check the entries against an
//! independent reading of the executed instructions).
//!
//! ```text
//! {"event":"begin","thread":"thread 1/2","depth":0,"ip":"0x401000","function":"main","image":"prog"}
//! {"event":"enter","thread":"thread 1/2","depth":1,"ip":"0x401200","function":"f","image":"prog"}
//! {"event":"exit","thread":"thread 1/2","depth":1,"ip":"0x401200","function":"f","insns":12,"self_insns":12,"how":"return"}
//! {"event":"caller",...}   a return above the first frame: the caller's frame (depth 0)
//! {"event":"gap","thread":...,"offset":"0x1234","why":"overflow"}
//! ```
//!
//! `depth` counts from the outermost frame (0). `ticks` (on exits) is the
//! frame's duration in TSC ticks when the trace has timestamps.

use super::tracker::{CallSink, Context, ExitHow, Frame, FrameKind};
use crate::exec::GapKind;
use hwtrace_types::{TraceOffset, Tsc};
use std::io::{self, Write};

/// Writes one JSON object per event.
#[derive(Debug)]
pub struct JsonLines<W: Write> {
    out: W,
}

impl<W: Write> JsonLines<W> {
    /// Lines go to `out`.
    pub fn new(out: W) -> Self {
        Self { out }
    }

    /// The output, flushed.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    fn frame(&mut self, event: &str, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        let Some(top) = stack.last() else {
            return Ok(());
        };
        write!(self.out, "{{\"event\":\"{event}\",\"thread\":")?;
        json_str(&mut self.out, &cx.thread.to_string())?;
        write!(
            self.out,
            ",\"depth\":{},\"ip\":\"{:#x}\",\"function\":",
            stack.len() - 1,
            top.ip
        )?;
        json_str(&mut self.out, cx.funcs.name(top.func))?;
        if let Some(image) = cx.funcs.image(top.func) {
            self.out.write_all(b",\"image\":")?;
            json_str(&mut self.out, image)?;
        }
        Ok(())
    }
}

fn json_str(out: &mut dyn Write, s: &str) -> io::Result<()> {
    serde_json::to_writer(out, s).map_err(io::Error::other)
}

impl<W: Write> CallSink for JsonLines<W> {
    fn begin(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        self.frame("begin", cx, stack)?;
        self.out.write_all(b"}\n")
    }

    fn enter(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        self.frame("enter", cx, stack)?;
        self.out.write_all(b"}\n")
    }

    fn caller(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        self.frame("caller", cx, stack)?;
        self.out.write_all(b"}\n")
    }

    fn exit(&mut self, cx: &Context<'_>, stack: &[Frame], how: ExitHow) -> io::Result<()> {
        let Some(top) = stack.last() else {
            return Ok(());
        };
        self.frame("exit", cx, stack)?;
        write!(
            self.out,
            ",\"insns\":{},\"self_insns\":{}",
            top.total_insns(cx.thread_insns),
            top.self_insns(cx.thread_insns)
        )?;
        if let (Some(Tsc(a)), Some(Tsc(b))) = (top.entered.tsc, cx.now.tsc) {
            write!(self.out, ",\"ticks\":{}", b.saturating_sub(a))?;
        }
        let kind = match top.kind {
            FrameKind::Called => "called",
            FrameKind::Resumed => "began inside",
            FrameKind::Caller => "returned into",
        };
        let how = match how {
            ExitHow::Return => "return",
            ExitHow::Unwound => "unwound",
            ExitHow::Gap(_) => "gap",
            ExitHow::End => "end",
            ExitHow::DepthLimit => "depth limit",
        };
        writeln!(self.out, ",\"kind\":\"{kind}\",\"how\":\"{how}\"}}")
    }

    fn gap(&mut self, cx: &Context<'_>, offset: TraceOffset, why: GapKind) -> io::Result<()> {
        self.out.write_all(b"{\"event\":\"gap\",\"thread\":")?;
        json_str(&mut self.out, &cx.thread.to_string())?;
        writeln!(
            self.out,
            ",\"offset\":\"{offset}\",\"why\":\"{}\"}}",
            super::gap_words(why)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::tracker::tests::Flow;
    use crate::calls::{CallTracker, HexNames};

    #[test]
    fn every_event_is_one_json_object() {
        let flow = Flow::default()
            .time(10)
            .call(0x100)
            .run(0x200, 1)
            .ret(0x201)
            .time(30)
            .run(0x105, 1)
            .gap(GapKind::Lost);
        let mut tracker = CallTracker::new(Box::new(HexNames));
        let mut w = JsonLines::new(Vec::new());
        for e in &flow.0 {
            tracker.feed(e, &mut w).unwrap();
        }
        tracker.finish(&mut w).unwrap();
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        let events: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let summary: Vec<String> = events
            .iter()
            .map(|e| format!("{} {} {}", e["event"], e["depth"], e["ip"]))
            .collect();
        assert_eq!(
            summary,
            [
                "\"begin\" 0 \"0x100\"",
                "\"enter\" 1 \"0x200\"",
                "\"exit\" 1 \"0x200\"",
                "\"exit\" 0 \"0x100\"",
                "\"gap\" null null",
            ]
        );
        assert_eq!(events[2]["insns"], 2);
        assert_eq!(events[2]["ticks"], 20);
        assert_eq!(events[2]["how"], "return");
        assert_eq!(events[3]["how"], "gap");
        assert_eq!(events[4]["why"], "data lost before it was written");
        assert_eq!(events[0]["thread"], "trace");
    }
}
