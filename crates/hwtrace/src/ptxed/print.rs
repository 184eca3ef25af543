//! ptxed's event and instruction lines.

use crate::flow::Disassembler;
use hwtrace_flow::event::{Event, EventKind};
use hwtrace_flow::insn::Insn;
use hwtrace_packet::ExecMode;
use std::fmt::Write as _;

/// What decides how lines look.
#[derive(Debug, Clone, Copy, Default)]
pub struct Style {
    pub print_offset: bool,
    pub print_time: bool,
    pub print_event_time: bool,
    pub print_event_ip: bool,
}

/// An execution mode as ptxed names it (also used by `hwtrace flow`).
pub fn mode_name(mode: ExecMode) -> &'static str {
    match mode {
        ExecMode::Bits16 => "16-bit",
        ExecMode::Bits32 => "32-bit",
        ExecMode::Bits64 => "64-bit",
        ExecMode::Reserved => "<invalid>",
    }
}

/// How an instruction line looks beyond its address.
#[derive(Debug, Clone, Copy, Default)]
pub struct InsnText {
    /// `--raw-insn`: the bytes, padded to 15.
    pub raw: bool,
    /// Disassembly (ptxed without `--no-inst`; Intel syntax from iced-x86,
    /// where ptxed uses XED, so the text may differ in detail).
    pub disassembly: bool,
}

/// One instruction line, into `s` (cleared first); disassembled by `dis`
/// (iced-x86's syntax, [`Syntax::Iced`](crate::flow::Syntax::Iced)).
pub fn insn_line(
    s: &mut String,
    dis: &mut Disassembler,
    insn: &Insn,
    style: &Style,
    offset: u64,
    time: u64,
    text: InsnText,
) {
    s.clear();
    if style.print_offset {
        let _ = write!(s, "{offset:016x}  ");
    }
    if style.print_time {
        let _ = write!(s, "{time:016x}  ");
    }
    if insn.speculative {
        s.push_str("? ");
    }
    let _ = write!(s, "{:016x}", insn.ip);
    if text.disassembly {
        if text.raw {
            for b in insn.bytes() {
                let _ = write!(s, " {b:02x}");
            }
            for _ in insn.bytes().len()..15 {
                s.push_str("   ");
            }
        }
        match dis.text(insn.ip, insn.mode, insn.bytes()) {
            Some(t) => {
                s.push_str("  ");
                s.push_str(t);
            }
            None => s.push_str(" [decode error]"),
        }
    }
}

/// One event line, `[...]`.
pub fn event_line(ev: &Event, style: &Style, offset: u64) -> String {
    let mut s = String::from("[");
    if style.print_offset {
        let _ = write!(s, "{offset:016x}  ");
    }
    if style.print_event_time && ev.has_tsc {
        let _ = write!(s, "{:016x}  ", ev.tsc);
    }
    let show_ip = style.print_event_ip && !ev.ip_suppressed && !ev.ip_hidden;
    let ip = |s: &mut String, ip: u64| {
        if show_ip {
            let _ = write!(s, ", ip: {ip:016x}");
        }
    };
    match ev.kind {
        EventKind::Enabled { ip: at, resumed } => {
            s.push_str(if resumed { "resumed" } else { "enabled" });
            if style.print_event_ip {
                let _ = write!(s, ", ip: {at:016x}");
            }
        }
        EventKind::Disabled { ip: at } => {
            s.push_str("disabled");
            ip(&mut s, at);
        }
        EventKind::AsyncDisabled { at, ip: to } => {
            s.push_str("disabled");
            if style.print_event_ip {
                let _ = write!(s, ", at: {at:016x}");
                if !ev.ip_suppressed {
                    let _ = write!(s, ", ip: {to:016x}");
                }
            }
        }
        EventKind::AsyncBranch { from, to } => {
            s.push_str("interrupt");
            if style.print_event_ip {
                let _ = write!(s, ", from: {from:016x}");
                if !ev.ip_suppressed {
                    let _ = write!(s, ", to: {to:016x}");
                }
            }
        }
        EventKind::Paging { cr3, non_root } => {
            let _ = write!(
                s,
                "paging, cr3: {cr3:016x}{}",
                if non_root { ", nr" } else { "" }
            );
        }
        EventKind::AsyncPaging {
            cr3,
            non_root,
            ip: at,
        } => {
            let _ = write!(
                s,
                "paging, cr3: {cr3:016x}{}",
                if non_root { ", nr" } else { "" }
            );
            if style.print_event_ip {
                let _ = write!(s, ", ip: {at:016x}");
            }
        }
        EventKind::Overflow { ip: at } => {
            s.push_str("overflow");
            ip(&mut s, at);
        }
        EventKind::ExecMode { mode, ip: at } => {
            let _ = write!(s, "exec mode: {}", mode_name(mode));
            ip(&mut s, at);
        }
        EventKind::Tsx {
            speculative,
            aborted,
            ip: at,
        } => {
            s.push_str(if aborted {
                "aborted"
            } else if speculative {
                "begin transaction"
            } else {
                "committed"
            });
            ip(&mut s, at);
        }
        EventKind::Stop => s.push_str("stopped"),
        EventKind::Vmcs { base } => {
            let _ = write!(s, "vmcs, base: {base:016x}");
        }
        EventKind::AsyncVmcs { base, ip: at } => {
            let _ = write!(s, "vmcs, base: {base:016x}");
            if style.print_event_ip {
                let _ = write!(s, ", ip: {at:016x}");
            }
        }
        EventKind::Exstop { ip: at } => {
            s.push_str("exstop");
            ip(&mut s, at);
        }
        EventKind::Mwait { hints, ext, ip: at } => {
            let _ = write!(s, "mwait {hints:x} {ext:x}");
            ip(&mut s, at);
        }
        EventKind::Pwre {
            state,
            sub_state,
            hw,
        } => {
            let _ = write!(
                s,
                "pwre c{}.{}",
                (u32::from(state) + 1) & 0xf,
                (u32::from(sub_state) + 1) & 0xf
            );
            if hw {
                s.push_str(" hw");
            }
        }
        EventKind::Pwrx {
            last,
            deepest,
            interrupt,
            store,
            autonomous,
        } => {
            s.push_str("pwrx ");
            if interrupt {
                s.push_str("int: ");
            }
            if store {
                s.push_str("st: ");
            }
            if autonomous {
                s.push_str("hw: ");
            }
            let _ = write!(
                s,
                "c{} (c{})",
                (u32::from(last) + 1) & 0xf,
                (u32::from(deepest) + 1) & 0xf
            );
        }
        EventKind::Ptwrite {
            ip: at, payload, ..
        } => {
            let _ = write!(s, "ptwrite: {payload:x}");
            ip(&mut s, at);
        }
        EventKind::Tick { ip: at } => {
            s.push_str("tick");
            ip(&mut s, at);
        }
        EventKind::Cbr { ratio } => {
            let _ = write!(s, "cbr: {ratio:x}");
        }
        EventKind::Mnt { payload } => {
            let _ = write!(s, "mnt: {payload:x}");
        }
        EventKind::Tip { ip: at } => {
            let _ = write!(s, "tip: {at:x}");
        }
        EventKind::Tnt { bits, size } => {
            s.push_str("tnt: ");
            for i in (0..size).rev() {
                s.push(if (bits >> i) & 1 != 0 { '!' } else { '.' });
            }
        }
        EventKind::Iflags { iflag, ip: at } => {
            let _ = write!(
                s,
                "interrupts {}",
                if iflag { "enabled" } else { "disabled" }
            );
            ip(&mut s, at);
        }
        EventKind::Interrupt {
            vector,
            cr2,
            ip: at,
        } => {
            let _ = write!(s, "interrupt {vector}");
            if let Some(cr2) = cr2 {
                let _ = write!(s, ", cr2: {cr2:016x}");
            }
            ip(&mut s, at);
        }
        EventKind::Swintr { vector, ip: at } => {
            let _ = write!(s, "swintr {vector}");
            ip(&mut s, at);
        }
        EventKind::Syscall { ip: at } => {
            s.push_str("syscall");
            ip(&mut s, at);
        }
        EventKind::Iret { ip: at } => {
            s.push_str("iret");
            ip(&mut s, at);
        }
        EventKind::Smi { ip: at } => {
            s.push_str("smi");
            ip(&mut s, at);
        }
        EventKind::Rsm { ip: at } => {
            s.push_str("rsm");
            ip(&mut s, at);
        }
        EventKind::Sipi { vector } => {
            let _ = write!(s, "sipi: {vector:x}");
        }
        EventKind::Init { ip: at } => {
            s.push_str("init");
            ip(&mut s, at);
        }
        EventKind::Vmentry { ip: at } => {
            s.push_str("vmentry");
            ip(&mut s, at);
        }
        EventKind::Vmexit {
            vector,
            vmxr,
            vmxq,
            ip: at,
        } => {
            s.push_str("vmexit");
            if let Some(v) = vector {
                let _ = write!(s, ", intr: {v}");
            }
            if let Some(r) = vmxr {
                let _ = write!(s, ", vmxr: {r:016x}");
            }
            if let Some(q) = vmxq {
                let _ = write!(s, ", vmxq: {q:016x}");
            }
            ip(&mut s, at);
        }
        EventKind::Shutdown { ip: at } => {
            s.push_str("shutdown");
            ip(&mut s, at);
        }
        EventKind::Uintr { vector, ip: at } => {
            let _ = write!(s, "uintr {vector}");
            ip(&mut s, at);
        }
        EventKind::Uiret { ip: at } => {
            s.push_str("uiret");
            ip(&mut s, at);
        }
        EventKind::Trig {
            trbv,
            mult,
            icnt,
            ip: at,
        } => {
            let _ = write!(s, "trig {trbv:02x}");
            if mult {
                s.push_str(", mult");
            }
            ip(&mut s, at);
            if icnt != 0 {
                let _ = write!(s, ", icnt: {icnt}");
            }
        }
    }
    s.push(']');
    s
}
