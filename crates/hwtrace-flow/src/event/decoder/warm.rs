//! Warming a clock for a decode that starts at a PSB: what a decode from
//! further back would know of the time there.
//!
//! A PSB+ restates the time (TSC, TMA) but not the CYC calibration, which
//! is measured over the MTC periods before: a parallel decode's unit,
//! started at its PSB with a fresh clock, turns its first CYC packets into
//! no time where the decode from the start turns them into ticks, and so
//! is never spliced on (its timing state differs at every seam). Here the
//! packets of a stretch before the PSB, from an earlier PSB on, go through
//! a clock as the event decoder would apply them: PSB+ headers, TSC, TMA,
//! MTC, CYC, CBR and overflows. The calibration is the last one measured,
//! so a stretch that holds it gives the same clock as the decode from the
//! start (taken as that of a decode that saw MTC packets before the
//! stretch where the stretch holds any: such a decode no longer
//! calibrates from PSB+ TSCs). Where it does not (or where that decode
//! resynchronised in between, which a timing scan cannot see), the seam
//! compares unequal and the unit is decoded on from the start as before:
//! the warm-up decides speed, never the items.

use super::{Clock, quirks};
use crate::config::Config;
use crate::error::ErrorKind;
use hwtrace_packet::{Packet, PacketDecoder};
use hwtrace_types::TraceOffset;

impl Clock {
    /// The clock after the packets of `data` from the PSB at `from` up to
    /// `to`; a fresh one where they cannot be read.
    pub(super) fn warmed(
        data: &[u8],
        from: TraceOffset,
        to: TraceOffset,
        config: &Config,
    ) -> Clock {
        let end = usize::try_from(to.0).unwrap_or(usize::MAX).min(data.len());
        let mut pkt = PacketDecoder::new(data.get(..end).unwrap_or_default());
        if pkt.sync_at(from).is_err() {
            return Clock::default();
        }
        // Two clocks: `fresh` as a decode starting at `from` has it, and
        // `seasoned` as one that saw MTC packets before `from`. Once a
        // decode has seen an MTC it calibrates CYC from MTC periods only,
        // never again from the cycles between two PSB+ TSCs; where the
        // stretch holds MTCs, a decode from further back had almost
        // surely seen one before it too (unless the stretch starts the
        // trace), and `seasoned` is its clock. Without a CTC ratio MTCs
        // calibrate nothing, and the two differ from the second PSB+ on.
        let mut fresh = Clock::default();
        let mut seasoned = Clock::default();
        // `seasoned` still assumes an MTC before the stretch: none since,
        // and no overflow or error that would have reset it.
        let mut assumed = true;
        let mut mtc_seen = false;
        // Inside a PSB+ header (its TSC and CBR calibrate differently).
        let mut header = false;
        // After a packet the decoder would stop at: it would resynchronise
        // at the next PSB with a fresh clock, so nothing counts until then.
        let mut lost = false;
        loop {
            let packet = match quirks::next_packet(&mut pkt, &config.errata) {
                Ok(Some(p)) => p.packet,
                Ok(None) => break,
                Err(_) => return Clock::default(),
            };
            if lost && !matches!(packet, Packet::Psb) {
                continue;
            }
            match packet {
                Packet::Psb => {
                    lost = false;
                    header = true;
                }
                Packet::Psbend => header = false,
                Packet::Ovf => {
                    header = false;
                    assumed &= config.keep_tcal_on_ovf;
                }
                Packet::Mtc(_) => {
                    mtc_seen = true;
                    assumed = false;
                }
                _ => {}
            }
            let fresh_ok = fresh.warm_with(&packet, header, config).is_ok();
            // A decode that saw an MTC takes a PSB+ TSC as a plain one.
            let seasoned_header = header && !(assumed && matches!(packet, Packet::Tsc(_)));
            let seasoned_ok = seasoned.warm_with(&packet, seasoned_header, config).is_ok();
            if !(fresh_ok && seasoned_ok) {
                fresh = Clock::default();
                seasoned = Clock::default();
                assumed = false;
                lost = true;
            }
        }
        if mtc_seen && from.0 > 0 {
            seasoned
        } else {
            fresh
        }
    }

    /// Applies one packet of a warm-up as the event decoder would (`header`:
    /// inside a PSB+).
    fn warm_with(
        &mut self,
        packet: &Packet,
        header: bool,
        config: &Config,
    ) -> Result<(), ErrorKind> {
        match *packet {
            Packet::Psb => {
                self.tcal.update_psb(&config.time);
                Ok(())
            }
            Packet::Ovf => {
                *self = self.after_overflow(config);
                Ok(())
            }
            Packet::Tsc(t) => self.tsc(t, header, config),
            Packet::Cbr(r) => self.cbr(r, header, config),
            Packet::Tma(t) => self.tma(t.ctc, t.fc, config),
            Packet::Mtc(m) => self.mtc(m, config),
            Packet::Cyc(c) => self.cyc(c, config),
            _ => Ok(()),
        }
    }

    /// What an overflow leaves of the clock: the time, and the calibration
    /// when the configuration keeps it.
    pub(super) fn after_overflow(&self, config: &Config) -> Clock {
        let mut clock = Clock {
            time: self.time,
            ..Clock::default()
        };
        if config.keep_tcal_on_ovf {
            clock.tcal = self.tcal;
            clock.tcal.update_ovf();
        }
        clock
    }
}

#[cfg(test)]
mod tests {
    use super::super::EventDecoder;
    use crate::config::Config;
    use crate::event::EventKind;
    use crate::time::TimeConfig;
    use hwtrace_packet::{ModeExec, Packet, Tma, TraceBuilder};
    use hwtrace_types::TraceOffset;

    /// A PSB+ with tracing on at 0x4000, its TSC placed at CTC `ctc`.
    fn psb_plus(t: &mut TraceBuilder, tsc: u64, ctc: u16) {
        t.push(Packet::Psb).unwrap();
        t.push(Packet::Tsc(tsc)).unwrap();
        t.push(Packet::Tma(Tma { ctc, fc: 0 })).unwrap();
        t.push(Packet::ModeExec(ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        }))
        .unwrap();
        t.ip(Packet::Fup, 0x4000).unwrap();
        t.push(Packet::Psbend).unwrap();
    }

    /// Eight MTC periods of 100 cycles each (one CTC tick, four TSC
    /// ticks: 0.04 ticks a cycle), then a second PSB+, 40 cycles and a
    /// disable. Returns the trace and the second PSB's offset.
    fn trace() -> (Vec<u8>, TraceOffset) {
        let mut t = TraceBuilder::new();
        psb_plus(&mut t, 0x10_0000, 0);
        for ctc in 1..=8u8 {
            t.push(Packet::Cyc(100)).unwrap();
            t.push(Packet::Mtc(ctc)).unwrap();
        }
        let second = TraceOffset(t.as_bytes().len() as u64);
        psb_plus(&mut t, 0x10_0000 + 8 * 4, 8);
        t.push(Packet::Cyc(250)).unwrap();
        t.ip(Packet::TipPgd, 0x4010).unwrap();
        (t.finish(), second)
    }

    fn config() -> Config {
        Config {
            time: TimeConfig {
                mtc_freq: 0,
                cpuid_0x15_eax: 1,
                cpuid_0x15_ebx: 4,
                ..TimeConfig::default()
            },
            ..Config::default()
        }
    }

    /// The disable's time and lost CYC count.
    fn disable(dec: &mut EventDecoder<'_>) -> (u64, u32) {
        loop {
            let ev = dec.next_event().unwrap();
            if let EventKind::Disabled { .. } = ev.kind {
                return (ev.tsc, ev.lost_cyc);
            }
        }
    }

    #[test]
    fn a_warmed_clock_stamps_as_the_decode_from_the_start() {
        let (data, second) = trace();
        let mut whole = EventDecoder::new(&data, config());
        whole.sync_forward().unwrap();
        let want = disable(&mut whole);
        // 250 cycles at 0.04 ticks a cycle (in fixed point, 10/256) after
        // the second TSC.
        assert_eq!(want, (0x10_0000 + 8 * 4 + 9, 0));

        let mut warm = EventDecoder::new(&data, config());
        warm.warm_clock(1 << 10);
        warm.sync_set(second).unwrap();
        assert_eq!(disable(&mut warm), want);
        assert_eq!(
            warm.calibration().map(|c| c.settled()),
            whole.calibration().map(|c| c.settled())
        );

        // Cold, the CYC packet is lost; a window holding no earlier PSB
        // leaves the clock cold.
        let mut cold = EventDecoder::new(&data, config());
        cold.sync_set(second).unwrap();
        assert_eq!(disable(&mut cold), (0x10_0000 + 8 * 4, 1));
        let mut short = EventDecoder::new(&data, config());
        short.warm_clock(4);
        short.sync_set(second).unwrap();
        assert_eq!(disable(&mut short), (0x10_0000 + 8 * 4, 1));
    }

    #[test]
    fn a_stretch_with_mtcs_warms_a_clock_that_saw_mtcs_before() {
        // Without a CTC ratio MTCs calibrate nothing, and a decode that saw
        // one never calibrates from two PSB+ TSCs either: the decode from
        // the start has no calibration at the last CYC. A stretch from the
        // second PSB holds two PSB+ TSCs before its MTC; a clock fresh
        // there would calibrate from them.
        let mut t = TraceBuilder::new();
        psb_plus(&mut t, 0x10_0000, 0);
        for ctc in 1..=2u8 {
            t.push(Packet::Cyc(100)).unwrap();
            t.push(Packet::Mtc(ctc)).unwrap();
        }
        let second = t.as_bytes().len() as u64;
        psb_plus(&mut t, 0x10_0010, 2);
        t.push(Packet::Cyc(100)).unwrap();
        psb_plus(&mut t, 0x10_0020, 2);
        t.push(Packet::Cyc(50)).unwrap();
        t.push(Packet::Mtc(3)).unwrap();
        let last = TraceOffset(t.as_bytes().len() as u64);
        psb_plus(&mut t, 0x10_0030, 3);
        t.push(Packet::Cyc(250)).unwrap();
        t.ip(Packet::TipPgd, 0x4010).unwrap();
        let data = t.finish();
        let config = Config::default();

        let mut whole = EventDecoder::new(&data, config);
        whole.sync_forward().unwrap();
        let want = disable(&mut whole);
        assert_eq!(want, (0x10_0030, 1), "no calibration from the start");

        let mut warm = EventDecoder::new(&data, config);
        warm.warm_clock(last.0 - second);
        warm.sync_set(last).unwrap();
        assert_eq!(disable(&mut warm), want);
        assert_eq!(
            warm.calibration().map(|c| c.settled()),
            whole.calibration().map(|c| c.settled())
        );
        // The fresh clock's calibration is what it would have learned.
        let fresh = super::Clock::warmed(
            &data[usize::try_from(second).unwrap()..],
            TraceOffset(0),
            TraceOffset(last.0 - second),
            &config,
        );
        assert!(fresh.tcal.fcr().is_ok());
    }

    #[test]
    fn packets_the_decoder_stops_at_leave_the_clock_cold_until_a_psb() {
        // A second TMA for one TSC is an error the decoder stops at: what
        // came before it is forgotten.
        let (data, psb) = trace();
        let at = psb.0 as usize;
        let mut broken = data[..at].to_vec();
        broken.extend_from_slice(&[0x02, 0x73, 0, 0, 0, 0, 0]);
        broken.extend_from_slice(&data[at..]);
        let second = TraceOffset(psb.0 + 7);
        let mut warm = EventDecoder::new(&broken, config());
        warm.warm_clock(1 << 10);
        warm.sync_set(second).unwrap();
        assert_eq!(disable(&mut warm).1, 1);
    }
}
