//! ptxed's decode loop: synchronise, drain events, print instructions,
//! report errors and resynchronise, as ptxed does.

use super::options::{DecoderKind, Options};
use super::print::{InsnText, Style, event_line, insn_line};
use crate::flow::{Disassembler, Syntax};
use hwtrace_flow::ErrorKind;
use hwtrace_flow::event::{Event, EventKind, Status};
use hwtrace_flow::insn::{Insn, InsnClass, InsnDecoder, ends_block};
use hwtrace_mem::image::{Image, RawSpec};
use hwtrace_perf::pevent::{ContextId, LocationHint, Session, TraceEvent};
use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory, Tsc};
use std::io::{self, Write};
use std::path::PathBuf;
use std::rc::Rc;

/// The image the decoder reads: the command line's, or a sideband
/// context's after a switch.
#[derive(Debug, Clone)]
struct Mem(Rc<Image>);

impl ReadMemory for Mem {
    fn read_memory(
        &self,
        space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        self.0.read_memory(space, addr, buf)
    }
}

/// What libipt's sideband decoders learn about the location from an
/// event.
fn location_hint(ev: &Event) -> LocationHint {
    let ip = |ip: u64| {
        if ev.ip_suppressed {
            LocationHint::None
        } else {
            LocationHint::Ip(Ip(ip))
        }
    };
    match ev.kind {
        EventKind::Enabled { ip: at, .. } => LocationHint::Ip(Ip(at)),
        EventKind::Disabled { ip: at } => {
            if ev.ip_suppressed {
                LocationHint::DisabledSuppressed
            } else {
                LocationHint::Ip(Ip(at))
            }
        }
        EventKind::AsyncDisabled { at, ip: to } => {
            if ev.ip_suppressed {
                LocationHint::AsyncDisabledSuppressed { from: Ip(at) }
            } else {
                LocationHint::Ip(Ip(to))
            }
        }
        EventKind::AsyncBranch { to, .. } => ip(to),
        EventKind::Paging { .. } | EventKind::AsyncPaging { .. } => LocationHint::Paging,
        EventKind::Overflow { ip: at }
        | EventKind::ExecMode { ip: at, .. }
        | EventKind::Tsx { ip: at, .. }
        | EventKind::Exstop { ip: at }
        | EventKind::Mwait { ip: at, .. }
        | EventKind::Ptwrite { ip: at, .. }
        | EventKind::Iflags { ip: at, .. }
        | EventKind::Tick { ip: at } => ip(at),
        _ => LocationHint::None,
    }
}

/// Counters for `--stat`.
#[derive(Debug, Default)]
struct Stats {
    insn: u64,
    blocks: u64,
}

/// Block boundaries as ptxed's block decoder draws them (the rule is
/// `hwtrace_flow::insn::ends_block`, shared with the library's
/// `BlockDecoder`; ptxed groups here so that it prints instructions and
/// errors exactly where the instruction loop finds them).
#[derive(Debug, Default)]
struct Blocks {
    open: bool,
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

struct Run<'o, 'w> {
    o: &'o Options,
    style: Style,
    out: &'w mut dyn Write,
    dec: InsnDecoder<'o, Mem>,
    stats: Stats,
    blocks: Blocks,
    time: u64,
    sideband: Option<Session>,
    /// The sideband context decoded with, and how many mappings its image
    /// was built from.
    context: Option<(ContextId, usize)>,
    /// Instruction texts, and the line being written.
    dis: Disassembler,
    line: String,
}

impl Run<'_, '_> {
    /// Shows an event to the sideband session; switches images when it
    /// switches contexts.
    fn sideband_event(&mut self, ev: &Event) -> io::Result<()> {
        let Some(session) = self.sideband.as_mut() else {
            return Ok(());
        };
        let event = TraceEvent {
            tsc: Tsc(ev.tsc),
            hint: location_hint(ev),
        };
        if let Some(id) = session.apply_event(event, self.out)? {
            self.context = Some((id, usize::MAX));
        }
        // The decoder reads the current context's image, which grows with
        // every MMAP record applied to it.
        if let Some((id, built)) = self.context {
            let now = session.contexts().get(id).map_or(0, |c| c.mappings().len());
            if now != built {
                let image = context_image(session, id, self.o.sideband.kcore.as_deref());
                self.dec.set_memory(Mem(Rc::new(image)));
                self.context = Some((id, now));
            }
        }
        Ok(())
    }

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
            self.sideband_event(&ev).map_err(|_| ErrorKind::Internal)?;
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
            let text = InsnText {
                raw: self.o.print_raw_insn,
                disassembly: !self.o.dont_print_insn,
            };
            let line = &mut self.line;
            insn_line(
                line,
                &mut self.dis,
                insn,
                &self.style,
                offset,
                self.time,
                text,
            );
            line.push('\n');
            self.out.write_all(line.as_bytes())?;
        }
        if ends_block(insn.class, insn.target.is_some(), &self.o.config) {
            self.blocks.open = false;
        }
        Ok(())
    }

    fn decode(&mut self) -> io::Result<()> {
        let mut sync = 0u64;
        let mut resync_failed = false;
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
            let mut decoded = false;
            let err = 'inner: loop {
                status = match self.drain(status) {
                    Ok(s) => s,
                    Err(k) => {
                        // libipt finds these while fetching the next
                        // instruction: it names the IP decoding was at.
                        if decoded {
                            insn_ip = self.dec.ip();
                        }
                        if !self.o.resync_on_error || k == ErrorKind::Eos {
                            break k;
                        }
                        diagnose(self.out, self.dec.offset().0, insn_ip, "error", k)?;
                        match self.dec.resync() {
                            Ok(s) => {
                                status = s;
                                continue 'inner;
                            }
                            Err(e) => {
                                let at = self.dec.offset().0;
                                diagnose(self.out, at, insn_ip, "resync error", e.kind)?;
                                resync_failed = true;
                                break e.kind;
                            }
                        }
                    }
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
                decoded = true;
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
                            Err(e) => {
                                let at = self.dec.offset().0;
                                diagnose(self.out, at, insn_ip, "resync error", e.kind)?;
                                resync_failed = true;
                                break e.kind;
                            }
                        }
                    }
                }
            };
            self.blocks.open = false;
            if err == ErrorKind::Eos {
                break;
            }
            if !std::mem::take(&mut resync_failed) {
                diagnose(self.out, self.dec.offset().0, insn_ip, "error", err)?;
            }
        }
        Ok(())
    }
}

/// The image of a sideband context: its kernel and process mappings
/// (libipt replaces the decoder's image with it). Files that cannot be
/// loaded leave a hole, as in libipt, where decoding then reports no
/// memory mapped.
fn context_image(session: &Session, id: ContextId, kcore: Option<&str>) -> Image {
    let mut image = Image::new();
    // The kernel, from `--pevent:kcore`, is part of every context.
    if let Some(path) = kcore {
        let _ = image.add_elf(None, &hwtrace_mem::image::parse_ptxed_elf(path));
    }
    if let Some(ctx) = session.contexts().get(id) {
        for m in ctx.mappings() {
            let spec = RawSpec {
                path: PathBuf::from(&m.filename),
                offset: m.offset,
                size: Some(m.size),
                addr: m.vaddr,
                truncate: true,
            };
            let _ = image.add_raw(None, &spec);
        }
    }
    image
}

/// Decodes and prints.
pub fn run(mut o: Options, out: &mut dyn Write) -> anyhow::Result<()> {
    let image = Rc::new(std::mem::take(&mut o.image));
    for line in &o.preamble {
        writeln!(out, "{line}")?;
    }
    let style = Style {
        print_offset: o.print_offset,
        print_time: o.print_time,
        print_event_time: o.print_event_time,
        print_event_ip: o.print_event_ip,
    };
    if let Some(kcore) = &o.sideband.kcore {
        // Fail early, as ptxed does, rather than at the first switch.
        Image::new()
            .add_elf(None, &hwtrace_mem::image::parse_ptxed_elf(kcore))
            .map_err(|e| anyhow::anyhow!("--pevent:kcore: {e}"))?;
    }
    let sideband = if o.sideband.files.is_empty() {
        None
    } else {
        let mut session = o.sideband.clone().into_session()?;
        session.start(out)?;
        Some(session)
    };
    let dec = InsnDecoder::new(o.trace.bytes(), o.config, Mem(image));
    let mut run = Run {
        sideband,
        context: None,
        o: &o,
        style,
        out,
        dec,
        stats: Stats::default(),
        blocks: Blocks::default(),
        time: 0,
        dis: Disassembler::new(Syntax::Iced),
        line: String::new(),
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
