//! OVF: finding where tracing resumed after lost packets, with the
//! errata workarounds libipt applies (SKD010, APL11, APL12).

use super::{Binding, Clock, EventDecoder, Res, Step};
use crate::error::ErrorKind;
use crate::event::{Event, EventKind};
use hwtrace_packet::{DecodedPacket, IpPayload, Packet, PacketDecoder};
use hwtrace_types::TraceOffset;

impl<'a> EventDecoder<'a> {
    pub(super) fn decode_ovf(&mut self) -> Res {
        // OVF ends a PSB+ like PSBEND: publish pending status first.
        if self.decode_psbend()? == Step::Event {
            return Ok(Step::Event);
        }
        // Power events still waiting for a FUP or an EXSTOP are reported
        // before the overflow, without IP.
        let mut flushed = core::mem::take(&mut self.after_fup);
        while let Some(ev) = self.evq.pop(Binding::Fup) {
            flushed.push_back(ev);
        }
        while let Some(ev) = self.evq.pop(Binding::Exstop) {
            flushed.push_back(ev);
        }
        if !flushed.is_empty() {
            for mut ev in flushed {
                if matches!(
                    ev.kind,
                    EventKind::Mwait { .. } | EventKind::Exstop { .. } | EventKind::Pwre { .. }
                ) {
                    ev.set_ip(0);
                    ev.ip_suppressed = true;
                    self.deferred.push_back(ev);
                }
            }
            if let Some(mut ev) = self.deferred.pop_front() {
                self.clock.stamp(&mut ev);
                self.event = Some(ev);
                return Ok(Step::Event);
            }
        }
        let clock = self.clock.after_overflow(&self.config);
        self.reset();
        self.status = Ok(());
        self.packet = None;
        self.clock = clock;
        let found = self.find_ovf_fup();
        let offset = match found {
            Ok(Some(n)) => n,
            Ok(None) | Err(_) => {
                if self.config.errata.skd010
                    && let Some(step) = self.handle_skd010()?
                {
                    return Ok(step);
                }
                if self.config.errata.apl11
                    && found == Err(ErrorKind::BadContext)
                    && let Some(step) = self.handle_apl11()?
                {
                    return Ok(step);
                }
                if let Err(e) = found
                    && e != ErrorKind::Eos
                {
                    return Err(e);
                }
                self.standalone(EventKind::Overflow { ip: 0 }).ip_suppressed = true;
                self.fetch_packet();
                return Ok(Step::Event);
            }
        };
        if self.config.errata.apl12
            && let Some(step) = self.handle_apl12(offset)?
        {
            return Ok(step);
        }
        let mut ev = Event::new(EventKind::Overflow { ip: 0 });
        self.clock.stamp(&mut ev);
        self.enqueue(Binding::Fup, ev)?;
        Ok(Step::More)
    }

    /// Looks for the FUP an OVF binds to: the number of bytes to just
    /// after it, `None` if a packet shows tracing resumed disabled.
    fn find_ovf_fup(&self) -> Result<Option<u64>, ErrorKind> {
        let mut pkt = self.pkt.clone();
        let start = pkt.offset().0;
        loop {
            let p = match crate::event::quirks::next_packet(&mut pkt, &self.config.errata) {
                Ok(Some(p)) => p,
                Ok(None) => return Err(ErrorKind::Eos),
                Err(e) => return Err(e.kind.into()),
            };
            match p.packet {
                Packet::Fup(_) => return Ok(Some(pkt.offset().0 - start)),
                Packet::Pad
                | Packet::Mnt(_)
                | Packet::Cbr(_)
                | Packet::Tsc(_)
                | Packet::Tma(_)
                | Packet::Mtc(_)
                | Packet::Cyc(_)
                | Packet::Bbp(_)
                | Packet::Bip { .. }
                | Packet::Bep { .. }
                | Packet::Cfe(_)
                | Packet::Evd(_)
                | Packet::Trig(_) => {}
                Packet::Psb
                | Packet::TipPge(_)
                | Packet::ModeExec(_)
                | Packet::ModeTsx(_)
                | Packet::Pip(_)
                | Packet::Vmcs(_)
                | Packet::Stop
                | Packet::Ovf
                | Packet::Exstop { .. }
                | Packet::Mwait(_)
                | Packet::Pwre(_)
                | Packet::Pwrx(_)
                | Packet::Ptw(_) => return Ok(None),
                Packet::Psbend | Packet::Tip(_) | Packet::TipPgd(_) | Packet::Tnt(_) => {
                    return Err(ErrorKind::BadContext);
                }
            }
        }
    }

    /// Resumes after the OVF at `pkt` (just after `packet`) with tracing
    /// enabled at `ip`.
    fn recover_ovf_at_ip(
        &mut self,
        pkt: PacketDecoder<'a>,
        packet: DecodedPacket,
        ip: IpPayload,
        clock: Clock,
    ) -> Result<(), ErrorKind> {
        self.update_ip(ip);
        let mut ev = Event::new(EventKind::Overflow { ip: 0 });
        self.clock.stamp(&mut ev);
        self.pkt = pkt;
        self.packet = Some(packet);
        self.clock = clock;
        self.enabled = true;
        Self::event_ip(&self.ip, &mut ev);
        self.event = Some(ev);
        Ok(())
    }

    fn recover_ovf_disabled(
        &mut self,
        pkt: PacketDecoder<'a>,
        packet: DecodedPacket,
        clock: Clock,
    ) {
        let mut ev = Event::new(EventKind::Overflow { ip: 0 });
        ev.ip_suppressed = true;
        self.clock.stamp(&mut ev);
        self.event = Some(ev);
        self.pkt = pkt;
        self.packet = Some(packet);
        self.clock = clock;
    }

    /// SKD010: the FUP after an OVF may be missing while tracing is on.
    fn handle_skd010(&mut self) -> Result<Option<Step>, ErrorKind> {
        let mut pkt = self.pkt.clone();
        let mut clock = self.clock;
        let cfg = self.config;
        let mut tsx: Option<(bool, bool)> = None;
        loop {
            let p = match crate::event::quirks::next_packet(&mut pkt, &self.config.errata) {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(None),
                Err(e) => {
                    let k = ErrorKind::from(e.kind);
                    return if k == ErrorKind::Eos {
                        Ok(None)
                    } else {
                        Err(k)
                    };
                }
            };
            match p.packet {
                Packet::TipPge(_) | Packet::Tnt(_) | Packet::Ovf | Packet::Stop => return Ok(None),
                Packet::TipPgd(_) => {
                    self.recover_ovf_disabled(pkt, p, clock);
                    self.fetch_packet();
                    return Ok(Some(Step::Event));
                }
                Packet::Pip(_) | Packet::Vmcs(_) | Packet::ModeExec(_) => {}
                Packet::ModeTsx(t) => {
                    if tsx.is_some() {
                        return Ok(None);
                    }
                    tsx = Some((t.intx, t.abrt));
                }
                Packet::Fup(ip) => {
                    if let Some((intx, abrt)) = tsx {
                        let ev = Event::new(EventKind::Tsx {
                            speculative: intx,
                            aborted: abrt,
                            ip: 0,
                        });
                        self.enqueue(Binding::Fup, ev)?;
                    }
                    // Resume at this FUP: it is processed again next.
                    let at = PacketDecoder::clone(&pkt);
                    self.recover_ovf_at_ip(at, p, ip, clock)?;
                    return Ok(Some(Step::Event));
                }
                Packet::Tip(ip) => {
                    self.recover_ovf_at_ip(pkt, p, ip, clock)?;
                    self.fetch_packet();
                    return Ok(Some(Step::Event));
                }
                Packet::Psb => match find_header_fup(&pkt, &self.config.errata) {
                    Ok(Some(ip)) => {
                        self.recover_ovf_at_ip(pkt, p, ip, clock)?;
                        return Ok(Some(Step::Event));
                    }
                    Ok(None) | Err(ErrorKind::Eos) => return Ok(None),
                    Err(e) => return Err(e),
                },
                Packet::Psbend => return Err(ErrorKind::BadContext),
                Packet::Pad | Packet::Mnt(_) | Packet::Pwre(_) | Packet::Pwrx(_) => {}
                Packet::Exstop { ip } => {
                    if ip {
                        return Ok(None);
                    }
                }
                Packet::Mwait(_) => return Ok(None),
                Packet::Ptw(ptw) => {
                    if ptw.ip {
                        return Ok(None);
                    }
                }
                ref other => {
                    if !clock.apply(other, &cfg)? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// APL11: an OVF may be followed by a spurious TIP.PGD.
    fn handle_apl11(&mut self) -> Result<Option<Step>, ErrorKind> {
        let mut pkt = self.pkt.clone();
        let mut clock = self.clock;
        let cfg = self.config;
        loop {
            let p = match crate::event::quirks::next_packet(&mut pkt, &self.config.errata) {
                Ok(Some(p)) => p,
                Ok(None) => return Err(ErrorKind::Eos),
                Err(e) => return Err(e.kind.into()),
            };
            match p.packet {
                Packet::TipPgd(_) => {
                    self.recover_ovf_disabled(pkt, p, clock);
                    self.fetch_packet();
                    return Ok(Some(Step::Event));
                }
                Packet::Pad | Packet::Mnt(_) => {}
                ref other => {
                    if !clock.apply(other, &cfg)? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// APL12: a FUP may follow an OVF that resolved with tracing off.
    fn handle_apl12(&mut self, offset: u64) -> Result<Option<Step>, ErrorKind> {
        let mut pkt = self.pkt.clone();
        let target = TraceOffset(pkt.offset().0 + offset);
        pkt.set_offset(target).map_err(|_| ErrorKind::Internal)?;
        loop {
            let p = match crate::event::quirks::next_packet(&mut pkt, &self.config.errata) {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(None),
                Err(e) => {
                    let k = ErrorKind::from(e.kind);
                    return if k == ErrorKind::Eos {
                        Ok(None)
                    } else {
                        Err(k)
                    };
                }
            };
            match p.packet {
                Packet::Tnt(_) | Packet::Tip(_) | Packet::TipPgd(_) => return Ok(None),
                Packet::Psb => match find_header_fup(&pkt, &self.config.errata) {
                    Ok(None) => return self.recover_ovf_at_offset(offset).map(Some),
                    Ok(Some(_)) | Err(ErrorKind::Eos) => return Ok(None),
                    Err(e) => return Err(e),
                },
                Packet::Stop | Packet::TipPge(_) => {
                    return self.recover_ovf_at_offset(offset).map(Some);
                }
                Packet::Psbend | Packet::Ovf => return Ok(None),
                _ => {}
            }
        }
    }

    /// Skips `offset` bytes (up to and including the FUP), keeping time,
    /// and reports an overflow with tracing disabled.
    fn recover_ovf_at_offset(&mut self, offset: u64) -> Result<Step, ErrorKind> {
        let cfg = self.config;
        let end = self.pkt.offset().0 + offset;
        loop {
            let p = match crate::event::quirks::next_packet(&mut self.pkt, &self.config.errata) {
                Ok(Some(p)) => p,
                Ok(None) => return Err(ErrorKind::Eos),
                Err(e) => return Err(e.kind.into()),
            };
            let after = p.offset.0 + u64::from(p.size);
            if after >= end {
                if after > end {
                    return Err(ErrorKind::Internal);
                }
                break;
            }
            match p.packet {
                Packet::ModeExec(_) | Packet::ModeTsx(_) | Packet::Pip(_) | Packet::Vmcs(_) => {
                    return Err(ErrorKind::Internal);
                }
                ref other => {
                    self.clock.apply(other, &cfg)?;
                }
            }
        }
        self.standalone(EventKind::Overflow { ip: 0 }).ip_suppressed = true;
        self.fetch_packet();
        Ok(Step::Event)
    }
}

/// The FUP of the PSB+ that `pkt` is inside of (just after the PSB).
fn find_header_fup(
    pkt: &PacketDecoder<'_>,
    errata: &crate::errata::Errata,
) -> Result<Option<IpPayload>, ErrorKind> {
    let mut pkt = pkt.clone();
    loop {
        let p = match crate::event::quirks::next_packet(&mut pkt, errata) {
            Ok(Some(p)) => p,
            Ok(None) => return Err(ErrorKind::Eos),
            Err(e) => return Err(e.kind.into()),
        };
        match p.packet {
            Packet::Fup(ip) => return Ok(Some(ip)),
            Packet::ModeExec(_)
            | Packet::ModeTsx(_)
            | Packet::Pip(_)
            | Packet::Vmcs(_)
            | Packet::Mnt(_)
            | Packet::Tsc(_)
            | Packet::Cbr(_)
            | Packet::Tma(_)
            | Packet::Mtc(_)
            | Packet::Cyc(_)
            | Packet::Pad => {}
            Packet::Psbend | Packet::Ovf => return Ok(None),
            _ => return Err(ErrorKind::BadContext),
        }
    }
}
