//! ptxed's decode loop: synchronise, drain events, print instructions,
//! report errors and resynchronise, as ptxed does.

use super::options::{DecoderKind, Options};
use super::print::{Style, event_line, insn_line};
use hwtrace_flow::ErrorKind;
use hwtrace_flow::event::Status;
use hwtrace_flow::insn::{Insn, InsnClass, InsnDecoder};
use hwtrace_types::ReadMemory;
use std::io::{self, Write};

/// Counters for `--stat`.
#[derive(Debug, Default)]
struct Stats {
    insn: u64,
    blocks: u64,
}

/// Block boundaries as ptxed's block decoder draws them.
#[derive(Debug, Default)]
struct Blocks {
    open: bool,
}

fn ends_block(insn: &Insn, direct: bool, o: &Options) -> bool {
    match insn.class {
        InsnClass::Other | InsnClass::Ptwrite => false,
        InsnClass::Call => !direct || o.config.end_on_call,
        InsnClass::Jump => !direct || o.config.end_on_jump,
        _ => true,
    }
}

fn diagnose(
    out: &mut dyn Write,
    offset: u64,
    ip: u64,
    what: &str,
    kind: ErrorKind,
) -> io::Result<()> {
    writeln!(out, "[{offset:x}, {ip:x}: {what}: {kind}]")
}

struct Run<'o, 'w, M> {
    o: &'o Options,
    style: Style,
    out: &'w mut dyn Write,
    dec: InsnDecoder<'o, M>,
    stats: Stats,
    blocks: Blocks,
    time: u64,
}

impl<M: ReadMemory> Run<'_, '_, M> {
    fn drain(&mut self, mut status: Status) -> Result<Status, ErrorKind> {
        while status.event_pending {
            let offset = self.dec.offset().0;
            let (ev, s) = self.dec.event().map_err(|e| e.kind)?;
            status = s;
            self.time = ev.tsc;
            self.blocks.open = false;
            if !self.o.quiet && !ev.status_update {
                let line = event_line(&ev, &self.style, offset);
                writeln!(self.out, "{line}").map_err(|_| ErrorKind::Internal)?;
            }
        }
        Ok(status)
    }

    fn emit_insn(&mut self, insn: &Insn, offset: u64) -> io::Result<()> {
        if self.o.decoder == DecoderKind::Block && !self.blocks.open {
            self.blocks.open = true;
            self.stats.blocks += 1;
            if self.o.track_blocks && !self.o.quiet {
                if self.o.print_stats {
                    writeln!(self.out, "[block {:x}]", self.stats.blocks)?;
                } else {
                    writeln!(self.out, "[block]")?;
                }
            }
        }
        self.stats.insn += 1;
        if !self.o.quiet {
            let line = insn_line(
                insn,
                &self.style,
                offset,
                self.time,
                !self.o.dont_print_insn,
            );
            writeln!(self.out, "{line}")?;
        }
        if ends_block(insn, insn.target.is_some(), self.o) {
            self.blocks.open = false;
        }
        Ok(())
    }

    fn decode(&mut self) -> io::Result<()> {
        let mut sync = 0u64;
        loop {
            let mut insn_ip = 0u64;
            let status = match self.dec.sync_forward() {
                Ok(s) => s,
                Err(e) => {
                    if e.kind == ErrorKind::Eos {
                        break;
                    }
                    let at = self.dec.offset().0;
                    diagnose(self.out, at, 0, "sync error", e.kind)?;
                    if at <= sync {
                        break;
                    }
                    sync = at;
                    continue;
                }
            };
            self.blocks.open = false;
            let mut status = status;
            let err = 'inner: loop {
                status = match self.drain(status) {
                    Ok(s) => s,
                    Err(k) => break k,
                };
                if status.eos {
                    if !status.ip_suppressed && !self.o.quiet {
                        writeln!(self.out, "[end of trace]")?;
                    }
                    break ErrorKind::Eos;
                }
                let offset = self.dec.offset().0;
                let mut insn = Insn::empty(0, None, false);
                let r = self.dec.next_insn(&mut insn);
                insn_ip = insn.ip;
                match r {
                    Ok(s) => {
                        self.emit_insn(&insn, offset)?;
                        status = s;
                    }
                    Err(e) => {
                        if insn.class != InsnClass::Unknown {
                            self.emit_insn(&insn, offset)?;
                        }
                        if !self.o.resync_on_error || e.kind == ErrorKind::Eos {
                            break e.kind;
                        }
                        diagnose(self.out, self.dec.offset().0, insn_ip, "error", e.kind)?;
                        self.blocks.open = false;
                        match self.dec.resync() {
                            Ok(s) => {
                                status = s;
                                continue 'inner;
                            }
                            Err(e) => break e.kind,
                        }
                    }
                }
            };
            self.blocks.open = false;
            if err == ErrorKind::Eos {
                break;
            }
            diagnose(self.out, self.dec.offset().0, insn_ip, "error", err)?;
        }
        Ok(())
    }
}

/// Decodes and prints.
pub fn run(o: Options, out: &mut dyn Write) -> anyhow::Result<()> {
    for line in &o.preamble {
        writeln!(out, "{line}")?;
    }
    let style = Style {
        print_offset: o.print_offset,
        print_time: o.print_time,
        print_event_time: o.print_event_time,
        print_event_ip: o.print_event_ip,
    };
    let dec = InsnDecoder::new(&o.trace, o.config, &o.image);
    let mut run = Run {
        o: &o,
        style,
        out,
        dec,
        stats: Stats::default(),
        blocks: Blocks::default(),
        time: 0,
    };
    run.decode()?;
    if o.print_stats {
        if o.stat_insn {
            writeln!(run.out, "insn: {}.", run.stats.insn)?;
        }
        if o.stat_blocks {
            writeln!(run.out, "blocks:\t{}.", run.stats.blocks)?;
        }
    }
    Ok(())
}
