//! The dump loop: synchronise, decode, print, and resynchronise after
//! errors, with the last-IP and timing columns.

use std::io::{self, Write};

use hwtrace_flow::{Fcr, Time, TimeCal, TimeConfig, TimeError};
use hwtrace_packet::{
    DecodeErrorKind, DecodedPacket, LastIp, LastIpError, Packet, PacketDecoder, find_psb_forward,
};
use hwtrace_types::{TraceOffset, Tsc};

use super::cpu::Errata;
use super::format;
use super::line::Line;
use super::options::Options;
use super::quirks::{self, Quirk};

/// Where sideband records go: printed interleaved with the packets, up to
/// the time the trace has reached.
pub trait SidebandSink {
    /// Prints every record at or before `tsc`.
    fn dump_until(&mut self, tsc: Tsc, out: &mut dyn Write) -> io::Result<()>;
}

/// What the printer needs besides the trace.
#[derive(Debug, Clone)]
pub struct DumpConfig<'a> {
    pub options: &'a Options,
    pub errata: Errata,
    pub time: TimeConfig,
}

/// The decoder-side state ptdump keeps between packets.
#[derive(Debug, Default)]
struct Tracking {
    last_ip: LastIp,
    tcal: TimeCal,
    time: Time,
    /// The last printed TSC and ratio, for `--time-delta`.
    last_tsc: u64,
    last_fcr: u64,
    /// Between PSB and PSBEND.
    in_header: bool,
}

/// Prints a trace the way ptdump does.
pub struct Dumper<'a, 'o> {
    config: DumpConfig<'a>,
    out: &'o mut dyn Write,
    sideband: Option<&'o mut dyn SidebandSink>,
    tracking: Tracking,
}

/// ptdump's name for a packet-decoding failure (libipt's error strings).
/// `None` when the trace simply ended inside a packet.
fn decode_error_text(kind: &DecodeErrorKind) -> Option<&'static str> {
    match kind {
        DecodeErrorKind::UnknownOpcode { .. }
        | DecodeErrorKind::UnknownExtOpcode { .. }
        | DecodeErrorKind::UnknownExt2Opcode { .. } => Some("unknown opcode"),
        DecodeErrorKind::Reserved { .. }
        | DecodeErrorKind::BadPsb
        | DecodeErrorKind::CycTooLong => Some("unknown packet"),
        DecodeErrorKind::Truncated { .. } => None,
        _ => Some("internal error"),
    }
}

/// `len` bytes of `data` from `offset`, as far as they exist.
fn slice(data: &[u8], offset: u64, len: u64) -> &[u8] {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(data.len());
    let end = usize::try_from(offset.saturating_add(len))
        .unwrap_or(usize::MAX)
        .min(data.len());
    &data[start..end]
}

/// Where decoding resumes after an error at `error_at`, having been
/// synchronised at `last_sync`: the first PSB found from a little before
/// the error (a PSB may hide in the bytes of the broken packet), but never
/// the PSB at the last sync point again. This is libipt's rule, so both
/// resume at the same packet.
fn resync_point(data: &[u8], error_at: u64, last_sync: Option<u64>) -> Option<u64> {
    let psb_len = hwtrace_packet::PSB.len() as u64;
    let mut pos = error_at;
    if Some(pos) == last_sync {
        pos = pos.saturating_add(psb_len);
    }
    let start = pos - pos.min(psb_len - 1);
    let start = usize::try_from(start).ok()?;
    find_psb_forward(data, start).map(|at| at as u64)
}

impl<'a, 'o> Dumper<'a, 'o> {
    pub fn new(
        config: DumpConfig<'a>,
        out: &'o mut dyn Write,
        sideband: Option<&'o mut dyn SidebandSink>,
    ) -> Self {
        Self {
            config,
            out,
            sideband,
            tracking: Tracking::default(),
        }
    }

    fn opts(&self) -> &'a Options {
        self.config.options
    }

    /// `[offset: what: error]`, ptdump's diagnostic line.
    fn diag(
        &mut self,
        offset: u64,
        what: &str,
        error: Option<&dyn std::fmt::Display>,
    ) -> io::Result<()> {
        match error {
            Some(e) => writeln!(self.out, "[{offset:x}: {what}: {e}]"),
            None => writeln!(self.out, "[{offset:x}: {what}]"),
        }
    }

    /// Dumps the whole trace, then any sideband records left.
    pub fn run(mut self, trace: &[u8]) -> io::Result<()> {
        let mut decoder = PacketDecoder::new(trace);
        let mut sync = if self.opts().no_sync {
            decoder.set_offset(TraceOffset(0)).ok().map(|()| 0)
        } else {
            resync_point(trace, 0, None).filter(|&at| decoder.sync_at(TraceOffset(at)).is_ok())
        };
        while let Some(at) = sync {
            let Some(error_at) = self.dump_packets(&mut decoder)? else {
                break;
            };
            sync = resync_point(trace, error_at, Some(at))
                .filter(|&next| decoder.sync_at(TraceOffset(next)).is_ok());
            self.tracking = Tracking::default();
        }
        if let Some(sb) = self.sideband.as_deref_mut() {
            sb.dump_until(Tsc(u64::MAX), self.out)?;
        }
        self.out.flush()
    }

    /// Dumps packets until the end of the trace (`None`) or a decode error
    /// (its offset, after printing it).
    fn dump_packets(&mut self, decoder: &mut PacketDecoder<'_>) -> io::Result<Option<u64>> {
        let data = decoder.data();
        loop {
            let decoded = match decoder.next_packet() {
                Ok(None) => return Ok(None),
                Ok(Some(decoded)) => decoded,
                Err(err) => {
                    let Some(text) = decode_error_text(&err.kind) else {
                        return Ok(None);
                    };
                    self.diag(err.offset.0, "error decoding packet", Some(&text))?;
                    return Ok(Some(err.offset.0));
                }
            };
            let offset = decoded.offset.0;
            let bytes = decoder.bytes(&decoded);
            match quirks::check(&decoded, bytes, data, &self.config.errata) {
                Quirk::None => self.dump_packet(&decoded, bytes)?,
                Quirk::Reserved => {
                    self.diag(offset, "error decoding packet", Some(&"unknown packet"))?;
                    return Ok(Some(offset));
                }
                Quirk::Invalid { size, resume } => {
                    let mut line = self.new_line(offset, slice(data, offset, u64::from(size)));
                    line.set_opcode("<invalid>");
                    self.print(&line)?;
                    if decoder.set_offset(TraceOffset(resume)).is_err() {
                        return Ok(None);
                    }
                }
                Quirk::Replace {
                    packet,
                    size,
                    resume,
                } => {
                    let replaced = DecodedPacket {
                        offset: decoded.offset,
                        size,
                        packet,
                    };
                    let raw = slice(data, offset, u64::from(size));
                    self.dump_packet(&replaced, raw)?;
                    if decoder.set_offset(TraceOffset(resume)).is_err() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    fn new_line(&self, offset: u64, bytes: &[u8]) -> Line {
        let mut line = Line::new(self.opts().show_offset.then_some(offset));
        if self.opts().show_raw {
            line.set_raw(bytes);
        }
        line
    }

    fn print(&mut self, line: &Line) -> io::Result<()> {
        if self.opts().quiet {
            return Ok(());
        }
        line.write(self.out)
    }

    fn dump_packet(&mut self, decoded: &DecodedPacket, bytes: &[u8]) -> io::Result<()> {
        let offset = decoded.offset.0;
        let opts = self.opts();
        let mut line = self.new_line(offset, bytes);
        match &decoded.packet {
            Packet::Pad => {
                line.set_opcode("pad");
                line.skip = opts.no_pad;
            }
            Packet::Psb => {
                line.set_opcode("psb");
                if opts.track_time {
                    self.tracking.tcal.update_psb(&self.config.time);
                }
                self.tracking.in_header = true;
            }
            Packet::Psbend => {
                line.set_opcode("psbend");
                self.tracking.in_header = false;
            }
            Packet::Ovf => {
                line.set_opcode("ovf");
                if opts.track_time {
                    if opts.keep_tcal_on_ovf {
                        self.tracking.tcal.update_ovf();
                    } else {
                        self.tracking.tcal.reset();
                    }
                }
            }
            Packet::Stop => line.set_opcode("stop"),
            Packet::Fup(ip) | Packet::Tip(ip) | Packet::TipPge(ip) | Packet::TipPgd(ip) => {
                line.set_opcode(match decoded.packet {
                    Packet::Fup(_) => "fup",
                    Packet::Tip(_) => "tip",
                    Packet::TipPge(_) => "tip.pge",
                    _ => "tip.pgd",
                });
                line.set_payload(format::ip_payload(ip));
                if opts.show_last_ip {
                    self.tracking.last_ip.update(*ip);
                    match self.tracking.last_ip.ip() {
                        Ok(ip) => line.set_tracking("ip", format!("{ip:016x}")),
                        Err(LastIpError::Suppressed) => {
                            line.set_tracking("ip", "<suppressed>".into())
                        }
                        Err(LastIpError::NoIp) => {
                            line.set_tracking("ip", "<unavailable>".into());
                            self.diag(offset, "error tracking last-ip", Some(&"no ip"))?;
                        }
                    }
                }
            }
            Packet::Pip(pip) => {
                line.set_opcode("pip");
                line.set_payload(format::pip(pip));
                line.set_tracking("cr3", format!("{:016x}", pip.cr3.0));
            }
            Packet::Vmcs(base) => {
                line.set_opcode("vmcs");
                line.set_payload(format!("{base:x}"));
                line.set_tracking("vmcs", format!("{base:016x}"));
            }
            Packet::Tnt(tnt) => {
                line.set_opcode(if tnt.long { "tnt.64" } else { "tnt.8" });
                line.set_tnt_payload(format::tnt(tnt));
            }
            Packet::ModeExec(mode) => {
                line.set_opcode("mode.exec");
                line.set_payload(format::mode_exec(mode));
                if opts.show_exec_mode {
                    line.set_tracking("em", format::exec_mode(mode).into());
                }
            }
            Packet::ModeTsx(mode) => {
                line.set_opcode("mode.tsx");
                line.set_payload(format::mode_tsx(mode));
            }
            Packet::Tsc(tsc) => {
                line.set_opcode("tsc");
                line.set_payload(format!("{tsc:x}"));
                if opts.track_time {
                    self.track_tsc(&mut line, offset, *tsc)?;
                }
                line.skip = opts.no_timing;
            }
            Packet::Cbr(ratio) => {
                line.set_opcode("cbr");
                line.set_payload(format!("{ratio:x}"));
                if opts.track_time {
                    self.track_cbr(&mut line, offset, *ratio)?;
                }
                line.skip = opts.no_timing;
            }
            Packet::Tma(tma) => {
                line.set_opcode("tma");
                line.set_payload(format!("{:x}, {:x}", tma.ctc, tma.fc));
                if opts.track_time {
                    self.track_tma(&mut line, offset, tma.ctc, tma.fc)?;
                }
                line.skip = opts.no_timing;
            }
            Packet::Mtc(ctc) => {
                line.set_opcode("mtc");
                line.set_payload(format!("{ctc:x}"));
                if opts.track_time {
                    self.track_mtc(&mut line, offset, *ctc)?;
                }
                line.skip = opts.no_timing;
            }
            Packet::Cyc(cycles) => {
                line.set_opcode("cyc");
                line.set_payload(format!("{cycles:x}"));
                if opts.track_time && !opts.no_cyc {
                    self.track_cyc(&mut line, offset, *cycles)?;
                }
                line.skip = opts.no_timing || opts.no_cyc;
            }
            Packet::Mnt(payload) => {
                line.set_opcode("mnt");
                line.set_payload(format!("{payload:x}"));
            }
            Packet::Ptw(ptw) => {
                line.set_opcode("ptw");
                line.set_payload(format::ptw(ptw));
            }
            Packet::Exstop { ip } => {
                line.set_opcode("exstop");
                line.set_payload(if *ip { "ip".into() } else { String::new() });
            }
            Packet::Mwait(mwait) => {
                line.set_opcode("mwait");
                line.set_payload(format!("{:08x}, {:08x}", mwait.hints, mwait.ext));
            }
            Packet::Pwre(pwre) => {
                line.set_opcode("pwre");
                line.set_payload(format::pwre(pwre, quirks::pwre_hw(bytes)));
            }
            Packet::Pwrx(pwrx) => {
                line.set_opcode("pwrx");
                line.set_payload(format::pwrx(pwrx));
            }
            Packet::Cfe(cfe) => {
                line.set_opcode("cfe");
                line.set_payload(format::cfe(cfe));
                line.set_tracking("type", format::cfe_type(cfe).into());
            }
            Packet::Evd(evd) => {
                line.set_opcode("evd");
                line.set_payload(format::evd(evd));
                line.set_tracking("type", format::evd_type(evd).into());
            }
            Packet::Trig(trig) => {
                line.set_opcode("trig");
                line.set_payload(format::trig(trig));
            }
            // PEBS-via-PT blocks; libipt's ptdump has no text for them, so
            // this is hwtrace's own.
            Packet::Bbp(bbp) => {
                line.set_opcode("bbp");
                line.set_payload(format!(
                    "sz: {}, type: {:x}",
                    if bbp.four_bytes { 4 } else { 8 },
                    bbp.ty
                ));
            }
            Packet::Bip { id, value, .. } => {
                line.set_opcode("bip");
                line.set_payload(format!("{id:x}: {value:x}"));
            }
            Packet::Bep { ip } => {
                line.set_opcode("bep");
                line.set_payload(if *ip { "ip".into() } else { String::new() });
            }
        }
        self.print(&line)
    }

    // --- timing -----------------------------------------------------------

    fn track_tsc(&mut self, line: &mut Line, offset: u64, tsc: u64) -> io::Result<()> {
        if !self.opts().no_tcal {
            let result = if self.tracking.in_header {
                self.tracking.tcal.header_tsc(tsc)
            } else {
                self.tracking.tcal.update_tsc(tsc);
                Ok(())
            };
            self.report(offset, "error calibrating time", result)?;
        }
        self.tracking.time.update_tsc(Tsc(tsc));
        self.track_time(line, offset)
    }

    fn track_cbr(&mut self, line: &mut Line, offset: u64, ratio: u8) -> io::Result<()> {
        let config = self.config.time;
        if !self.opts().no_tcal {
            let result = if self.tracking.in_header {
                self.tracking.tcal.header_cbr(ratio, &config)
            } else {
                self.tracking.tcal.update_cbr(ratio, &config)
            };
            self.report(offset, "error calibrating time", result)?;
        }
        let result = self.tracking.time.update_cbr(ratio);
        self.report(offset, "error updating time", result)?;
        // A CBR does not move time.
        line.skip_time = true;
        self.track_time(line, offset)
    }

    fn track_tma(&mut self, line: &mut Line, offset: u64, ctc: u16, fc: u16) -> io::Result<()> {
        let config = self.config.time;
        let result = self.tracking.time.update_tma(ctc, fc, &config);
        self.report(offset, "error updating time", result)?;
        // A TMA does not change the calibration.
        line.skip_tcal = true;
        self.track_time(line, offset)
    }

    fn track_mtc(&mut self, line: &mut Line, offset: u64, ctc: u8) -> io::Result<()> {
        let config = self.config.time;
        if !self.opts().no_tcal {
            let result = self.tracking.tcal.update_mtc(ctc, &config);
            self.report(offset, "error calibrating time", result)?;
        }
        let result = self.tracking.time.update_mtc(ctc, &config);
        self.report(offset, "error updating time", result)?;
        self.track_time(line, offset)
    }

    fn track_cyc(&mut self, line: &mut Line, offset: u64, cycles: u64) -> io::Result<()> {
        let config = self.config.time;
        let mut fcr = None;
        if !self.opts().no_tcal {
            match self.tracking.tcal.fcr() {
                Ok(f) => fcr = Some(f),
                Err(e) => self.diag(offset, "calibration error", Some(&e))?,
            }
            self.tracking.tcal.update_cyc(cycles);
        }
        let result = self.tracking.time.update_cyc(cycles, &config, fcr);
        self.report(offset, "error updating time", result)?;
        // A CYC does not change the calibration.
        line.skip_tcal = true;
        self.track_time(line, offset)
    }

    fn report(&mut self, offset: u64, what: &str, result: Result<(), TimeError>) -> io::Result<()> {
        match result {
            Ok(()) => Ok(()),
            Err(e) => self.diag(offset, what, Some(&e)),
        }
    }

    /// The time and calibration columns, then sideband up to this time.
    fn track_time(&mut self, line: &mut Line, offset: u64) -> io::Result<()> {
        let opts = self.opts();
        if opts.show_tcal && !line.skip_tcal {
            self.print_tcal(line, offset)?;
        }
        if opts.show_time && !line.skip_time {
            self.print_time(line, offset)?;
        }
        if let Some(sb) = self.sideband.as_deref_mut() {
            let now = self.tracking.time.estimate().tsc;
            sb.dump_until(now, self.out)?;
        }
        Ok(())
    }

    fn print_time(&mut self, line: &mut Line, offset: u64) -> io::Result<()> {
        let tsc = match self.tracking.time.query_tsc() {
            Ok(estimate) => estimate.tsc.0,
            Err(TimeError::NoTime) if self.opts().no_wall_clock => {
                self.tracking.time.estimate().tsc.0
            }
            Err(e) => {
                self.diag(offset, "error printing time", Some(&e))?;
                line.set_tracking("tsc", "<unavailable>".into());
                return Ok(());
            }
        };
        let text = if self.opts().time_delta {
            let old = std::mem::replace(&mut self.tracking.last_tsc, tsc);
            if old <= tsc {
                format!("+{:x}", tsc - old)
            } else {
                format!("-{:x}", old - tsc)
            }
        } else {
            format!("{tsc:016x}")
        };
        line.set_tracking("tsc", text);
        Ok(())
    }

    fn print_tcal(&mut self, line: &mut Line, offset: u64) -> io::Result<()> {
        let fcr = match self.tracking.tcal.fcr() {
            Ok(fcr) => fcr,
            Err(e) => {
                line.set_tracking("fcr", "<unavailable>".into());
                return self.diag(offset, "error printing time", Some(&e));
            }
        };
        let text = if self.opts().time_delta {
            let old = std::mem::replace(&mut self.tracking.last_fcr, fcr.0);
            format!("{:+.3}", fcr.as_f64() - Fcr(old).as_f64())
        } else {
            format!("{:.3}", fcr.as_f64())
        };
        line.set_tracking("fcr", text);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptdump::options::{Invocation, parse};

    fn options(list: &[&str]) -> Options {
        let args: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        match parse(&args) {
            Ok(Invocation::Dump(o)) => *o,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn render(opts: &Options, errata: Errata, trace: &[u8]) -> String {
        let config = DumpConfig {
            options: opts,
            errata,
            time: TimeConfig {
                mtc_freq: opts.mtc_freq,
                nom_freq: opts.nom_freq,
                cpuid_0x15_eax: opts.cpuid_0x15_eax,
                cpuid_0x15_ebx: opts.cpuid_0x15_ebx,
                skl168: errata.skl168,
            },
        };
        let mut out = Vec::new();
        Dumper::new(config, &mut out, None)
            .run(trace)
            .expect("writing to a Vec");
        String::from_utf8(out).expect("ptdump output is ASCII")
    }

    const PSB: [u8; 16] = hwtrace_packet::PSB;

    #[test]
    fn resync_skips_the_current_psb_but_finds_overlapping_ones() {
        let mut data = vec![0u8; 8];
        data.extend_from_slice(&PSB);
        data.extend_from_slice(&[0xc9]);
        data.extend_from_slice(&PSB);
        // Error at the sync point itself: look after it.
        assert_eq!(resync_point(&data, 8, Some(8)), Some(25));
        // The search starts 15 bytes early: a PSB overlapping the broken
        // packet is found, one that ended before it is not.
        assert_eq!(resync_point(&data, 23, Some(0)), Some(8));
        assert_eq!(resync_point(&data, 24, Some(0)), Some(25));
        assert_eq!(resync_point(&data, 41, Some(25)), None);
        assert_eq!(resync_point(&data, 0, None), Some(8));
    }

    #[test]
    fn decode_error_then_resync() {
        let mut trace = PSB.to_vec();
        trace.push(0xc9);
        trace.extend_from_slice(&PSB);
        trace.extend_from_slice(&[0x02, 0x23]);
        let text = render(&options(&["t"]), Errata::default(), &trace);
        assert_eq!(
            text,
            "0000000000000000  psb\n[10: error decoding packet: unknown opcode]\n\
             0000000000000011  psb\n0000000000000021  psbend\n"
        );
    }

    #[test]
    fn time_columns() {
        // PSB, PSBEND, TSC 0x1000, TMA ctc 2 fc 0, MTC 3.
        let mut trace = PSB.to_vec();
        trace.extend_from_slice(&[0x02, 0x23]);
        trace.extend_from_slice(&[0x19, 0x00, 0x10, 0, 0, 0, 0, 0]);
        trace.extend_from_slice(&[0x02, 0x73, 0x02, 0x00, 0x00, 0x00, 0x00]);
        trace.extend_from_slice(&[0x59, 0x03]);
        let opts = options(&[
            "--time",
            "--time-delta",
            "--cpuid-0x15.eax",
            "1",
            "--cpuid-0x15.ebx",
            "2",
            "t",
        ]);
        let text = render(&opts, Errata::default(), &trace);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[2],
            ["0000000000000012", "tsc", "1000", "tsc", "+1000"]
        );
        assert_eq!(
            lines[3],
            ["000000000000001a", "tma", "2,", "0", "tsc", "+0"]
        );
        // One CTC tick = 2 TSC ticks.
        assert_eq!(lines[4], ["0000000000000021", "mtc", "3", "tsc", "+2"]);
    }

    /// A small deterministic generator (xorshift) for noise.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn any_bytes_give_output_not_panics() {
        let option_sets: [&[&str]; 4] = [
            &["t"],
            &["--no-sync", "--raw", "--lastip", "--exec-mode", "t"],
            &[
                "--no-sync",
                "--time",
                "--no-wall-clock",
                "--mtc-freq",
                "31",
                "--cpuid-0x15.eax",
                "3",
                "--cpuid-0x15.ebx",
                "0xffffffff",
                "--nom-freq",
                "255",
                "t",
            ],
            &[
                "--no-sync",
                "--tcal",
                "--time-delta",
                "--keep-tcal-on-ovf",
                "--mtc-freq",
                "255",
                "t",
            ],
        ];
        let errata = Errata {
            skz84: true,
            skd007: true,
            skl168: true,
            ..Errata::default()
        };
        for seed in 0..64u64 {
            let mut trace = noise(seed, 512);
            // Sprinkle PSBs so resynchronisation is exercised too.
            let at = (seed as usize * 37) % 400;
            trace[at..at + 16].copy_from_slice(&PSB);
            for set in option_sets {
                let text = render(&options(set), errata, &trace);
                assert!(text.lines().all(|l| !l.is_empty()));
            }
        }
    }
}
