//! Printing [`Item`]s: text lines (`ip  disassembly`, events in brackets as
//! ptxed shows them) or one JSON object per line.

use super::disasm::{Disassembler, Syntax, push_hex, push_hex16};
use super::items::Item;
use super::shape::{Block, Branch, BranchKind};
use hwtrace_flow::Error;
use hwtrace_flow::event::{Event, EventKind};
use hwtrace_flow::insn::{Insn, InsnClass};
use std::fmt::Write as _;
use std::io::{self, Write};

/// Text or JSON lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `0000000000401000  mov eax,1`, `[enabled]`, `[error: ...]`.
    Text,
    /// One JSON object per line, with a `"type"` field.
    Json,
}

/// Counters of what was decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Instructions (counted by the caller: blocks and branches fold
    /// them away).
    pub insns: u64,
    /// Blocks.
    pub blocks: u64,
    /// Taken branches.
    pub branches: u64,
    /// Events shown.
    pub events: u64,
    /// Errors.
    pub errors: u64,
    /// Bytes of trace skipped after errors.
    pub skipped: u64,
    /// Errors that are PSB+ status updates contradicting the decoded
    /// state (what `--lenient` decodes through).
    pub status_errors: u64,
}

impl Stats {
    /// Counts `item` (not instructions); `trace_len` bounds a gap that
    /// reaches the end.
    pub fn count(&mut self, item: &Item, trace_len: u64) {
        match item {
            Item::Insn { .. } => {}
            Item::Block(_) => self.blocks += 1,
            Item::Branch(_) => self.branches += 1,
            Item::Event { event, .. } => self.events += u64::from(!event.status_update),
            Item::Error(e) => {
                self.errors += 1;
                if e.kind == hwtrace_flow::ErrorKind::BadStatusUpdate {
                    self.status_errors += 1;
                }
            }
            Item::Stuck { .. } => self.errors += 1,
            Item::Resync { from, to } => {
                self.skipped += to.unwrap_or(trace_len).saturating_sub(*from);
            }
        }
    }
}

/// Writes items; reuses its buffers, so printing allocates nothing per
/// instruction once warmed up.
pub struct Printer {
    format: Format,
    disasm: bool,
    /// Whether lines carry times ([`Printer::with_time`]).
    time: bool,
    /// The time of the last event seen (PSB+ status reports included):
    /// what the instructions after it are stamped with.
    now: u64,
    dis: Disassembler,
    text: String,
    line: String,
}

impl std::fmt::Debug for Printer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Printer")
            .field("format", &self.format)
            .field("disasm", &self.disasm)
            .field("time", &self.time)
            .finish_non_exhaustive()
    }
}

impl Printer {
    /// A printer in `format`, with disassembly when `disasm`.
    pub fn new(format: Format, disasm: bool) -> Self {
        Self {
            format,
            disasm,
            time: false,
            now: 0,
            dis: Disassembler::new(Syntax::Objdump),
            text: String::with_capacity(64),
            line: String::with_capacity(128),
        }
    }

    /// With `time`, lines carry times as ptxed's `--time` and
    /// `--event:time` print them: an instruction (or block) has the time
    /// (TSC) of the last event before it, PSB+ status reports included,
    /// which is when the decoder last learned the time; an event has its
    /// own; a branch that of its instruction. Text lines start with it
    /// (16 hex digits, inside the brackets for events), JSON objects have
    /// a `"tsc"` field (a number).
    pub fn with_time(mut self, time: bool) -> Self {
        self.time = time;
        self
    }

    /// The time `item` is printed with, with `--time`; `None` for items
    /// that carry none (errors, resynchronisations, stats).
    fn time_of(&self, item: &Item) -> Option<u64> {
        if !self.time {
            return None;
        }
        match item {
            Item::Event { event, .. } => Some(event.tsc),
            Item::Branch(b) => Some(b.time),
            Item::Insn { .. } | Item::Block(_) => Some(self.now),
            Item::Error(_) | Item::Resync { .. } | Item::Stuck { .. } => None,
        }
    }

    /// Appends `insn`'s disassembly (Intel syntax) to the line.
    fn push_disasm(&mut self, insn: &Insn) {
        let text = self.dis.text(insn.ip, insn.mode, insn.bytes());
        self.line.push_str(text.unwrap_or("(bad)"));
    }

    /// Writes `item` as one line (nothing for a PSB+ status report).
    pub fn item(&mut self, item: &Item, out: &mut dyn Write) -> io::Result<()> {
        if let Item::Event { event, .. } = item {
            self.now = event.tsc;
            if event.status_update {
                return Ok(());
            }
        }
        self.line.clear();
        match self.format {
            Format::Text => self.text_line(item),
            Format::Json => self.json_line(item),
        }
        self.line.push('\n');
        out.write_all(self.line.as_bytes())
    }

    /// Writes the counters.
    pub fn stats(&mut self, stats: &Stats, out: &mut dyn Write) -> io::Result<()> {
        let Stats {
            insns,
            blocks,
            branches,
            events,
            errors,
            skipped,
            status_errors: _,
        } = *stats;
        match self.format {
            Format::Text => writeln!(
                out,
                "[stats: {insns} instructions, {blocks} blocks, {branches} branches, {events} events, {errors} errors, {skipped} bytes skipped]"
            ),
            Format::Json => writeln!(
                out,
                r#"{{"type":"stats","insns":{insns},"blocks":{blocks},"branches":{branches},"events":{events},"errors":{errors},"skipped":{skipped}}}"#
            ),
        }
    }

    fn text_line(&mut self, item: &Item) {
        // Events carry theirs inside the brackets.
        if let (Some(time), false) = (self.time_of(item), matches!(item, Item::Event { .. })) {
            push_hex16(&mut self.line, time);
            self.line.push_str("  ");
        }
        match item {
            Item::Insn { insn, .. } => {
                if insn.speculative {
                    self.line.push_str("? ");
                }
                if !self.disasm {
                    push_hex16(&mut self.line, insn.ip);
                } else if let Some(line) = self.dis.line(insn.ip, insn.mode, insn.bytes()) {
                    // Address and text cached together.
                    self.line.push_str(line);
                } else {
                    push_hex16(&mut self.line, insn.ip);
                    self.line.push_str("  (bad)");
                }
            }
            Item::Event { event, .. } => {
                self.line.push('[');
                if let Some(time) = self.time_of(item) {
                    push_hex16(&mut self.line, time);
                    self.line.push_str("  ");
                }
                describe_event(event, &mut self.line);
                self.line.push(']');
            }
            Item::Error(e) => {
                let _ = write!(
                    self.line,
                    "[{:x}, {:x}: error: {}]",
                    e.offset.0,
                    e.ip.unwrap_or(0),
                    e.kind
                );
            }
            Item::Resync { from, to } => match to {
                Some(to) => {
                    let _ = write!(
                        self.line,
                        "[resync at {to:x}: {} bytes from {from:x} skipped]",
                        to.saturating_sub(*from)
                    );
                }
                None => {
                    let _ = write!(
                        self.line,
                        "[no PSB after {from:x}: rest of the trace skipped]"
                    );
                }
            },
            Item::Stuck { offset, ip, insns } => {
                let _ = write!(
                    self.line,
                    "[{offset:x}, {ip:x}: error: {insns} instructions without trace: an endless loop]"
                );
            }
            Item::Block(b) => self.block_text(b),
            Item::Branch(b) => branch_text(b, &mut self.line),
        }
    }

    fn block_text(&mut self, b: &Block) {
        push_hex16(&mut self.line, b.ip);
        self.line.push_str(" - ");
        push_hex16(&mut self.line, b.last.ip);
        let _ = write!(
            self.line,
            "  {:>4} insns  {}",
            b.insns,
            class_name(b.last.class)
        );
        if self.disasm {
            self.line.push_str("  ");
            self.push_disasm(&b.last);
        }
    }

    fn json_line(&mut self, item: &Item) {
        self.json_object(item);
        if let Some(time) = self.time_of(item)
            && self.line.ends_with('}')
        {
            // The time as the object's last field.
            self.line.pop();
            let _ = write!(self.line, r#","tsc":{time}}}"#);
        }
    }

    fn json_object(&mut self, item: &Item) {
        match item {
            Item::Insn { offset, insn } => {
                let _ = write!(self.line, r#"{{"type":"insn","offset":{offset},"ip":""#);
                push_hex(&mut self.line, insn.ip);
                let _ = write!(
                    self.line,
                    r#"","size":{},"class":"{}""#,
                    insn.size,
                    class_name(insn.class)
                );
                if insn.speculative {
                    self.line.push_str(r#","speculative":true"#);
                }
                if self.disasm {
                    self.line.push_str(r#","disasm":"#);
                    let text = self.dis.text(insn.ip, insn.mode, insn.bytes());
                    json_string(text.unwrap_or("(bad)"), &mut self.line);
                }
                self.line.push('}');
            }
            Item::Event { offset, event } => {
                self.text.clear();
                describe_event(event, &mut self.text);
                let _ = write!(self.line, r#"{{"type":"event","offset":{offset},"event":"#);
                json_string(&self.text, &mut self.line);
                if let Some(ip) = event_ip(event) {
                    let _ = write!(self.line, r#","ip":"{ip:#x}""#);
                }
                match event.kind {
                    EventKind::Paging { cr3, .. } | EventKind::AsyncPaging { cr3, .. } => {
                        let _ = write!(self.line, r#","cr3":"{cr3:#x}""#);
                    }
                    // Where an asynchronous event hit.
                    EventKind::AsyncDisabled { at, .. } => {
                        let _ = write!(self.line, r#","at":"{at:#x}""#);
                    }
                    EventKind::AsyncBranch { from, .. } => {
                        let _ = write!(self.line, r#","from":"{from:#x}""#);
                    }
                    _ => {}
                }
                self.line.push('}');
            }
            Item::Error(e) => json_error(e, &mut self.line),
            Item::Stuck { offset, ip, insns } => {
                let _ = write!(
                    self.line,
                    r#"{{"type":"error","offset":{offset},"ip":"{ip:#x}","error":"{insns} instructions without trace: an endless loop"}}"#
                );
            }
            Item::Resync { from, to } => {
                let _ = write!(self.line, r#"{{"type":"resync","from":{from},"to":"#);
                match to {
                    Some(to) => {
                        let _ =
                            write!(self.line, "{to},\"skipped\":{}}}", to.saturating_sub(*from));
                    }
                    None => self.line.push_str("null}"),
                }
            }
            Item::Block(b) => {
                let _ = write!(
                    self.line,
                    r#"{{"type":"block","offset":{},"ip":"{:#x}","end_ip":"{:#x}","insns":{},"end":"{}""#,
                    b.offset,
                    b.ip,
                    b.last.ip,
                    b.insns,
                    class_name(b.last.class)
                );
                if self.disasm {
                    let last = &b.last;
                    self.line.push_str(r#","disasm":"#);
                    let text = self.dis.text(last.ip, last.mode, last.bytes());
                    json_string(text.unwrap_or("(bad)"), &mut self.line);
                }
                self.line.push('}');
            }
            Item::Branch(b) => {
                let _ = write!(
                    self.line,
                    r#"{{"type":"branch","offset":{},"from":"#,
                    b.offset
                );
                json_addr(b.from, &mut self.line);
                self.line.push_str(r#","to":"#);
                json_addr(b.to, &mut self.line);
                let _ = write!(self.line, r#","kind":"{}""#, b.kind.name());
                if b.ends_trace {
                    self.line.push_str(r#","ends_trace":true"#);
                }
                self.line.push('}');
            }
        }
    }
}

fn json_error(e: &Error, line: &mut String) {
    let _ = write!(line, r#"{{"type":"error","offset":{},"ip":"#, e.offset.0);
    json_addr(e.ip, line);
    line.push_str(r#","error":"#);
    let mut what = String::new();
    let _ = write!(what, "{}", e.kind);
    json_string(&what, line);
    line.push('}');
}

/// `from => to  kind`, perf script's order; unknown ends print as 0 as
/// perf prints them.
fn branch_text(b: &Branch, line: &mut String) {
    push_hex16(line, b.from.unwrap_or(0));
    line.push_str(" => ");
    push_hex16(line, b.to.unwrap_or(0));
    line.push_str("  ");
    line.push_str(b.kind.name());
    if b.ends_trace && b.kind != BranchKind::TraceEnd {
        line.push_str(" (tr end)");
    }
}

fn json_addr(addr: Option<u64>, line: &mut String) {
    match addr {
        Some(a) => {
            let _ = write!(line, "\"{a:#x}\"");
        }
        None => line.push_str("null"),
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str, line: &mut String) {
    line.push('"');
    // Disassembly and event words need no escape: one copy.
    if !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        line.push_str(s);
        line.push('"');
        return;
    }
    for c in s.chars() {
        match c {
            '"' => line.push_str("\\\""),
            '\\' => line.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(line, "\\u{:04x}", u32::from(c));
            }
            c => line.push(c),
        }
    }
    line.push('"');
}

fn class_name(class: InsnClass) -> &'static str {
    match class {
        InsnClass::Other => "other",
        InsnClass::Call => "call",
        InsnClass::Return => "return",
        InsnClass::Jump => "jump",
        InsnClass::CondJump => "cond jump",
        InsnClass::FarCall => "far call",
        InsnClass::FarReturn => "far return",
        InsnClass::FarJump => "far jump",
        InsnClass::Ptwrite => "ptwrite",
        InsnClass::Unknown => "unknown",
    }
}

/// The IP an event names, when the trace gave one.
fn event_ip(ev: &Event) -> Option<u64> {
    if ev.ip_suppressed || ev.ip_hidden {
        return None;
    }
    match ev.kind {
        EventKind::Enabled { ip, .. }
        | EventKind::Disabled { ip }
        | EventKind::AsyncDisabled { ip, .. }
        | EventKind::AsyncBranch { to: ip, .. }
        | EventKind::AsyncPaging { ip, .. }
        | EventKind::Overflow { ip }
        | EventKind::ExecMode { ip, .. }
        | EventKind::Tsx { ip, .. }
        | EventKind::AsyncVmcs { ip, .. }
        | EventKind::Exstop { ip }
        | EventKind::Mwait { ip, .. }
        | EventKind::Ptwrite { ip, .. } => Some(ip),
        _ => None,
    }
}

/// An event in ptxed's words (without the brackets).
fn describe_event(ev: &Event, s: &mut String) {
    match ev.kind {
        EventKind::Enabled { resumed, .. } => {
            s.push_str(if resumed { "resumed" } else { "enabled" });
        }
        EventKind::Disabled { .. } | EventKind::AsyncDisabled { .. } => s.push_str("disabled"),
        EventKind::AsyncBranch { from, to } => {
            let _ = write!(s, "interrupt, from: {from:016x}");
            if !ev.ip_suppressed {
                let _ = write!(s, ", to: {to:016x}");
            }
        }
        EventKind::Paging { cr3, non_root } | EventKind::AsyncPaging { cr3, non_root, .. } => {
            let _ = write!(
                s,
                "paging, cr3: {cr3:016x}{}",
                if non_root { ", nr" } else { "" }
            );
        }
        EventKind::Overflow { .. } => s.push_str("overflow"),
        EventKind::ExecMode { mode, .. } => {
            let _ = write!(s, "exec mode: {}", crate::ptxed::print::mode_name(mode));
        }
        EventKind::Tsx {
            speculative,
            aborted,
            ..
        } => s.push_str(if aborted {
            "aborted"
        } else if speculative {
            "begin transaction"
        } else {
            "committed"
        }),
        EventKind::Stop => s.push_str("stopped"),
        EventKind::Vmcs { base } | EventKind::AsyncVmcs { base, .. } => {
            let _ = write!(s, "vmcs, base: {base:016x}");
        }
        EventKind::Exstop { .. } => s.push_str("exstop"),
        EventKind::Mwait { hints, ext, .. } => {
            let _ = write!(s, "mwait {hints:x} {ext:x}");
        }
        EventKind::Ptwrite { payload, .. } => {
            let _ = write!(s, "ptwrite: {payload:x}");
        }
        EventKind::Cbr { ratio } => {
            let _ = write!(s, "cbr: {ratio:x}");
        }
        // The rarer events (power, event trace, triggers) in ptxed's words.
        _ => {
            let line =
                crate::ptxed::print::event_line(ev, &crate::ptxed::print::Style::default(), 0);
            let inner = line.strip_prefix('[').and_then(|l| l.strip_suffix(']'));
            s.push_str(inner.unwrap_or(&line));
        }
    }
}

/// The hint for `n` errors that were PSB+ status updates contradicting
/// the decoded state: what causes them and what decodes through them;
/// `peers` names the decoders that go on there.
pub fn status_error_hint(n: u64, peers: &str) -> String {
    format!(
        "{n} of the errors are PSB+ saying tracing is on where it was off: seen after VM exits, and after overflows on processors with erratum SKD010 (--cpu F/M applies its workaround); {peers} on there, and so does --lenient"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_flow::ErrorKind;
    use hwtrace_packet::ExecMode;
    use hwtrace_types::TraceOffset;

    fn insn(ip: u64, bytes: &[u8], class: InsnClass) -> Insn {
        let mut i = Insn::empty(ip, Some(ExecMode::Bits64), false);
        i.size = bytes.len() as u8;
        i.raw[..bytes.len()].copy_from_slice(bytes);
        i.class = class;
        i
    }

    fn lines(printer: &mut Printer, items: &[Item]) -> Vec<String> {
        let mut out = Vec::new();
        for item in items {
            printer.item(item, &mut out).unwrap();
        }
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn sample() -> Vec<Item> {
        let mut enabled = Event::new(EventKind::Enabled {
            ip: 0x40_1000,
            resumed: false,
        });
        enabled.tsc = 5;
        vec![
            Item::Event {
                offset: 0x10,
                event: enabled,
            },
            Item::Insn {
                offset: 0x20,
                insn: insn(0x40_1000, &[0xb8, 1, 0, 0, 0], InsnClass::Other),
            },
            Item::Insn {
                offset: 0x20,
                insn: insn(0x40_1005, &[0xc3], InsnClass::Return),
            },
            Item::Error(Error {
                offset: TraceOffset(0x31),
                ip: Some(0x40_1006),
                kind: ErrorKind::BadOpcode,
            }),
            Item::Resync {
                from: 0x31,
                to: Some(0x100),
            },
        ]
    }

    #[test]
    fn text_lines() {
        let got = lines(&mut Printer::new(Format::Text, true), &sample());
        assert_eq!(
            got,
            [
                "[enabled]",
                "0000000000401000  mov eax,1",
                "0000000000401005  ret",
                "[31, 401006: error: unknown opcode]",
                "[resync at 100: 207 bytes from 31 skipped]",
            ]
        );
        let bare = lines(&mut Printer::new(Format::Text, false), &sample());
        assert_eq!(bare[1], "0000000000401000");
    }

    #[test]
    fn json_lines_parse_back() {
        let got = lines(&mut Printer::new(Format::Json, true), &sample());
        let values: Vec<serde_json::Value> = got
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(values[0]["type"], "event");
        assert_eq!(values[0]["event"], "enabled");
        assert_eq!(values[0]["ip"], "0x401000");
        assert_eq!(values[1]["disasm"], "mov eax,1");
        assert_eq!(values[2]["class"], "return");
        assert_eq!(values[3]["offset"], 0x31);
        assert_eq!(values[3]["ip"], "0x401006");
        assert_eq!(values[3]["error"], "unknown opcode");
        assert_eq!(values[4]["skipped"], 0x100 - 0x31);
        let mut s = String::new();
        json_string("a\"b\\c\u{1}", &mut s);
        assert_eq!(serde_json::from_str::<String>(&s).unwrap(), "a\"b\\c\u{1}");
    }

    #[test]
    fn times_are_the_last_events() {
        // A PSB+ status report prints nothing but brings the time.
        let mut status = Event::new(EventKind::Enabled {
            ip: 0x40_1005,
            resumed: false,
        });
        (status.status_update, status.tsc) = (true, 0x99);
        let mut items = sample();
        items.insert(
            2,
            Item::Event {
                offset: 0x30,
                event: status,
            },
        );
        let got = lines(
            &mut Printer::new(Format::Text, false).with_time(true),
            &items,
        );
        assert_eq!(
            got[..3],
            [
                "[0000000000000005  enabled]",
                "0000000000000005  0000000000401000",
                "0000000000000099  0000000000401005",
            ]
        );
        // Errors and resynchronisations are not stamped.
        assert_eq!(got[3], "[31, 401006: error: unknown opcode]");
        let json = lines(
            &mut Printer::new(Format::Json, false).with_time(true),
            &items,
        );
        let tsc: Vec<serde_json::Value> = json
            .iter()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["tsc"].clone())
            .collect();
        assert_eq!(tsc[..3], [5, 5, 0x99]);
        assert!(tsc[3].is_null() && tsc[4].is_null());
        // A branch has its own time, a block the last event's.
        let branch = Item::Branch(crate::flow::shape::Branch {
            offset: 0x40,
            from: Some(0x10),
            to: Some(0x20),
            kind: crate::flow::shape::BranchKind::Jump,
            ends_trace: false,
            time: 0x77,
            has_tsc: true,
        });
        let got = lines(
            &mut Printer::new(Format::Text, false).with_time(true),
            &[items[0], branch],
        );
        assert_eq!(
            got[1],
            "0000000000000077  0000000000000010 => 0000000000000020  jmp"
        );
        // Without --time, nothing changes.
        assert_eq!(
            lines(&mut Printer::new(Format::Text, false), &items)[0],
            "[enabled]"
        );
    }

    #[test]
    fn psb_status_reports_print_nothing() {
        let mut event = Event::new(EventKind::Enabled {
            ip: 0x40_1000,
            resumed: false,
        });
        event.status_update = true;
        let item = Item::Event { offset: 0, event };
        for format in [Format::Text, Format::Json] {
            assert!(lines(&mut Printer::new(format, true), &[item]).is_empty());
        }
        let mut stats = Stats::default();
        stats.count(&item, 0);
        assert_eq!(stats, Stats::default());
    }

    #[test]
    fn stats_count_what_was_printed() {
        let mut stats = Stats::default();
        for item in sample() {
            stats.count(&item, 0x200);
        }
        assert_eq!(
            (stats.insns, stats.events, stats.errors, stats.skipped),
            (0, 1, 1, 0xcf)
        );
        stats.count(
            &Item::Resync {
                from: 0x180,
                to: None,
            },
            0x200,
        );
        assert_eq!(stats.skipped, 0xcf + 0x80);
    }
}
