//! PSB+ status events passed over for callers that only count events.
//!
//! An IP-filtered trace has runs of PSB+ between a TIP.PGD and the next
//! TIP.PGE, five status events each, and nothing for the instruction
//! decoder to do with them but note the CR3, the VMCS base and the
//! transaction state; a PSB+ written while tracing is on reports, six
//! events long, where the decoder already is. [`InsnDecoder::pass_status_events`]
//! takes them as [`InsnDecoder::event`] does, without handing each out,
//! and lets the query layer sum up those that follow the first two
//! (the rest of a PSB+'s, already queued) and read the plain PSB+ written
//! while tracing is off straight from the bytes
//! ([`QueryDecoder::set_passing`](crate::event::QueryDecoder)).

use super::InsnDecoder;
use crate::error::Error;
use crate::event::{PassState, Status, StatusPass, passes_over};
use hwtrace_types::ReadMemory;

impl<M: ReadMemory> InsnDecoder<'_, M> {
    /// Whether the pending event is one
    /// [`pass_status_events`](Self::pass_status_events) takes: a status
    /// update the decoder takes without a question where it stands
    /// ([`passes_over`]).
    #[inline]
    pub(in crate::insn) fn status_passable(&self) -> bool {
        self.process_event
            && !self.resyncing
            && self.postponed.is_none()
            && passes_over(&self.event, &self.pass_state())
    }

    /// Where the decoder stands, for [`passes_over`].
    fn pass_state(&self) -> PassState {
        PassState {
            enabled: self.enabled,
            ip: self.ip,
            mode: self.mode,
        }
    }

    /// Takes the pending events while they are PSB+ status updates the
    /// decoder takes without a question
    /// ([`status_passable`](Self::status_passable)), as
    /// [`event`](Self::event) would one after the other, and those the
    /// query layer sums up after them, without handing them out. Returns how
    /// many events a caller of `event` would have been handed and the
    /// status after the last; or, where `event` would have failed, how
    /// many it handed out before and the error (the event whose look-ahead
    /// failed is not handed out, as with `event`).
    pub(in crate::insn) fn pass_status_events(&mut self) -> Result<(u64, Status), (u64, Error)> {
        let mut passed = 0;
        let mut status = self.status;
        while self.status_passable() {
            self.query.set_passing(Some(self.pass_state()));
            let taken = self.event();
            self.query.set_passing(None);
            // The PSB+ passed over before the event just fetched (or the
            // error met instead) come after the one just taken.
            let before = self.query.take_passed();
            if let Some(p) = before {
                self.apply_passed(&p);
            }
            let between = before.map_or(0, |p| p.events);
            match taken {
                Ok((_, s)) => {
                    passed += 1 + between;
                    status = s;
                }
                // `event` hands out what came before the error, but not
                // the event whose look-ahead met it.
                Err(e) => return Err((passed + between, e)),
            }
            if !self.process_event {
                // Nothing was fetched after them (the end of the trace):
                // those passed over after the event just taken are over.
                if let Some(p) = self.query.take_ahead() {
                    self.apply_passed(&p);
                    passed += p.events;
                }
            }
        }
        Ok((passed, status))
    }

    /// What [`event`](Self::event) would have done taking the events of
    /// `p` one after the other (each one the decoder passes over where it
    /// stands: nothing but what `p` sums up changes).
    fn apply_passed(&mut self, p: &StatusPass) {
        if let Some(s) = p.speculative {
            self.speculative = s;
        }
        if let Some(cr3) = p.cr3 {
            self.set_cr3(cr3);
        }
        if let Some(base) = p.vmcs {
            self.set_vmcs(base);
        }
        if let Some(mode) = p.mode {
            self.reported_mode = Some(mode);
            self.mode = Some(mode);
        }
        if p.restarts_count {
            self.icount = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::insn::Insn;
    use hwtrace_packet::{ModeExec, ModeTsx, Packet, Pip, Tma, TraceBuilder};
    use hwtrace_types::{BytesAt, Cr3, Ip};

    const CODE_AT: u64 = 0x1000;
    /// `ret`: the decode needs a TIP there, and the traces end instead.
    const CODE: [u8; 1] = [0xc3];

    /// The status packets of a PSB+ written with tracing off.
    fn status(intx: bool, cr3: u64, cbr: u8) -> Vec<Packet> {
        vec![
            Packet::ModeTsx(ModeTsx { intx, abrt: false }),
            Packet::Pip(Pip {
                cr3: Cr3(cr3),
                nr: true,
            }),
            Packet::Vmcs(0x3_52e9_9000),
            Packet::Cbr(cbr),
        ]
    }

    fn psb(t: &mut TraceBuilder, packets: &[Packet]) {
        t.push(Packet::Psb).unwrap();
        for p in packets {
            t.push(*p).unwrap();
        }
        t.push(Packet::Psbend).unwrap();
    }

    fn enable(t: &mut TraceBuilder) {
        t.push(Packet::ModeExec(ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        }))
        .unwrap();
        t.ip(Packet::TipPge, CODE_AT).unwrap();
    }

    /// Runs of PSB+ written with tracing off, and what may come among or
    /// after them; PSB+ written with tracing on.
    fn traces() -> Vec<(&'static str, Vec<u8>)> {
        let mut out = Vec::new();
        let mut plain = TraceBuilder::new();
        for i in 0..4 {
            psb(&mut plain, &status(false, 0x1ee7_3000, 0x28));
            for _ in 0..i {
                plain.push(Packet::Pad).unwrap();
            }
        }
        enable(&mut plain);
        out.push(("plain, then an enable", plain.finish()));

        let mut timed = TraceBuilder::new();
        for i in 0..5u64 {
            let mut p = vec![
                Packet::Tsc(0x1000 * (i + 1)),
                Packet::Tma(Tma {
                    ctc: (i * 3) as u16,
                    fc: 7,
                }),
            ];
            p.extend(status(i % 2 == 1, 0x1000 * (i + 1), 0x20 + i as u8));
            psb(&mut timed, &p);
        }
        enable(&mut timed);
        out.push(("timed, CR3 and TSX changing", timed.finish()));

        // The same PSB+ again and again (passed over at once after the
        // first), but with the clock moved between some of them: a TSC
        // outside PSB+, then a CBR of another ratio inside one.
        let mut twins = TraceBuilder::new();
        for i in 0..6u64 {
            psb(&mut twins, &status(false, 0x1ee7_3000, 0x28));
            if i == 2 {
                twins.push(Packet::Tsc(0x5000)).unwrap();
            }
            if i == 4 {
                psb(&mut twins, &status(false, 0x1ee7_3000, 0x2a));
            }
        }
        enable(&mut twins);
        out.push(("twins, the clock moved between", twins.finish()));

        let mut ends = TraceBuilder::new();
        for _ in 0..3 {
            psb(&mut ends, &status(true, 0x2000, 0x28));
        }
        out.push(("the trace ends after them", ends.finish()));

        // What the bytes are not read for: each in the third PSB+ of four.
        let odd: [(&'static str, &[Packet]); 5] = [
            ("an MNT", &[Packet::Mnt(0x1234)]),
            (
                "a FUP",
                &[Packet::Fup(hwtrace_packet::IpPayload::full(CODE_AT))],
            ),
            ("a CBR of 0", &[Packet::Cbr(0)]),
            ("an OVF", &[Packet::Ovf]),
            (
                "MODE.Exec",
                &[Packet::ModeExec(ModeExec {
                    csl: true,
                    csd: false,
                    iflag: false,
                })],
            ),
        ];
        for (name, extra) in odd {
            let mut t = TraceBuilder::new();
            for i in 0..4 {
                let mut p = status(false, 0x3000, 0x28);
                if i == 2 {
                    p.extend_from_slice(extra);
                }
                psb(&mut t, &p);
            }
            enable(&mut t);
            out.push((name, t.finish()));
        }

        let mut tip = TraceBuilder::new();
        psb(&mut tip, &status(false, 0x3000, 0x28));
        psb(&mut tip, &status(false, 0x3000, 0x28));
        tip.ip(Packet::Tip, CODE_AT).unwrap();
        out.push(("a TIP with tracing off", tip.finish()));

        // Tracing on: PSB+ at the IP the decoder is at (nothing runs
        // between them), in its mode, in another, at another IP.
        let on = |t: &mut TraceBuilder, at: u64, csl: bool, intx: bool| {
            let mut p = vec![Packet::ModeExec(ModeExec {
                csl,
                csd: !csl,
                iflag: false,
            })];
            p.extend(status(intx, 0x4000, 0x28));
            p.push(Packet::Fup(hwtrace_packet::IpPayload::full(at)));
            psb(t, &p);
        };
        let mut here = TraceBuilder::new();
        for i in 0..4 {
            on(&mut here, CODE_AT, true, i % 2 == 1);
        }
        out.push(("tracing on, where the decoder is", here.finish()));
        let mut mode = TraceBuilder::new();
        on(&mut mode, CODE_AT, true, false);
        on(&mut mode, CODE_AT, true, false);
        on(&mut mode, CODE_AT, false, false);
        out.push(("tracing on, the mode changing", mode.finish()));
        let mut elsewhere = TraceBuilder::new();
        on(&mut elsewhere, CODE_AT, true, false);
        on(&mut elsewhere, CODE_AT + 0x10, true, false);
        out.push(("tracing on, another IP", elsewhere.finish()));

        let mut cut = TraceBuilder::new();
        psb(&mut cut, &status(false, 0x3000, 0x28));
        psb(&mut cut, &status(false, 0x3000, 0x28));
        let mut data = cut.finish();
        // The last PSB+ without its PSBEND and CBR.
        data.truncate(data.len() - 6);
        out.push(("the last one cut short", data));
        out
    }

    /// `dec`'s whole state, as `Debug` shows it, but for the last event
    /// taken and its offset once it is done with (the decoder passing over events never
    /// makes those it passes over; only a tick looks at the last event's
    /// time, and only before an instruction, where both took the same).
    fn state<M: ReadMemory + core::fmt::Debug>(dec: &InsnDecoder<'_, M>) -> String {
        let s = format!("{dec:?}");
        let done = "process_event: false, event: ";
        let cut = |s: String, from: &str, to: &str| {
            let Some(a) = s.find(from) else { return s };
            match s[a..].find(to) {
                Some(b) => format!("{}{}", &s[..a], &s[a + b..]),
                None => s,
            }
        };
        if !s.contains(done) {
            return s;
        }
        let s = cut(s, done, ", speculative: ");
        cut(s, "event_offset: ", "resyncing: ")
    }

    /// Decodes `data` twice, one decoder passing over status events
    /// where it can, the other taking them one by one with `event`: the
    /// two must be in the same state (their whole `Debug`: query layer,
    /// clock and packet decoder included) after every step, and the
    /// events passed over as many as the other took. Returns how many
    /// were passed over.
    fn same_state(name: &str, data: &[u8], config: Config) -> u64 {
        let mem = BytesAt::new(Ip(CODE_AT), &CODE);
        let mut a = InsnDecoder::new(data, config, mem);
        let mut b = InsnDecoder::new(data, config, mem);
        let first = a.sync_forward();
        assert_eq!(first, b.sync_forward(), "{name}: sync");
        let Ok(mut status) = first else { return 0 };
        let mut passed = 0;
        for step in 0..200 {
            assert_eq!(state(&a), state(&b), "{name}: step {step}");
            // As the fast decoder asks: with an event pending.
            if status.event_pending && a.status_passable() {
                match a.pass_status_events() {
                    Ok((n, s)) => {
                        assert!(n > 0, "{name}: nothing passed over");
                        let mut last = None;
                        for _ in 0..n {
                            last = Some(b.event().expect("an event passed over").1);
                        }
                        assert_eq!(last, Some(s), "{name}: status after {n} events");
                        passed += n;
                        status = s;
                    }
                    Err((n, e)) => {
                        for _ in 0..n {
                            b.event().expect("an event passed over");
                        }
                        assert_eq!(b.event().map(|_| ()), Err(e), "{name}: after {n} events");
                        return passed + n;
                    }
                }
                continue;
            }
            let (ra, rb) = if status.event_pending {
                (a.event().map(|r| r.1), b.event().map(|r| r.1))
            } else if status.eos {
                return passed;
            } else {
                let (mut ia, mut ib) = (Insn::empty(0, None, false), Insn::empty(0, None, false));
                let r = (a.next_insn(&mut ia), b.next_insn(&mut ib));
                assert_eq!(ia, ib, "{name}: step {step}");
                r
            };
            assert_eq!(ra, rb, "{name}: step {step}");
            match ra {
                Ok(s) => status = s,
                Err(_) => return passed,
            }
        }
        panic!("{name}: no end");
    }

    #[test]
    fn status_events_passed_over_leave_the_decoder_as_taking_them_does() {
        for (name, data) in traces() {
            for (lenient_status, skl168) in [(false, false), (true, false), (false, true)] {
                let mut config = Config {
                    lenient_status,
                    ..Config::default()
                };
                // Each PSB arms SKL168's check of the next MTC.
                config.time.skl168 = skl168;
                let passed = same_state(name, &data, config);
                // Every run but the one cut short passes something over.
                assert!(passed > 0, "{name}: nothing passed over");
            }
        }
    }

    #[test]
    fn plain_psbs_after_the_first_are_read_from_the_bytes() {
        // With tracing off, the instruction decoder takes the first
        // PSB+'s disabled status and its MODE.TSX (fetched before), the
        // query layer reads the rest itself: the first PSB+'s other three
        // status events and five for each PSB+ after it (timing packets
        // are no events). With tracing on, each PSB+'s five status updates
        // after its enable (the enable is taken, and its look-ahead finds
        // the rest queued); only two of the first one's, after its
        // MODE.TSX: the MODE.Exec before gives the decoder its mode.
        let traces = traces();
        let named = |want: &str| traces.iter().find(|(name, _)| *name == want).unwrap();
        for (name, want) in [
            ("plain, then an enable", vec![(2, 18)]),
            ("timed, CR3 and TSX changing", vec![(2, 23)]),
            (
                "tracing on, where the decoder is",
                vec![(2, 2), (1, 5), (1, 5), (1, 5)],
            ),
        ] {
            let (_, data) = named(name);
            let mem = BytesAt::new(Ip(CODE_AT), &CODE);
            let mut dec = InsnDecoder::new(data, Config::default(), mem);
            dec.sync_forward().unwrap();
            // How many events were taken one by one before each batch
            // passed over, and how many it held.
            let mut passed = Vec::new();
            let mut taken = 0;
            while dec.process_event {
                if !dec.status_passable() {
                    dec.event().unwrap();
                    taken = 0;
                    continue;
                }
                dec.query.set_passing(Some(dec.pass_state()));
                dec.event().unwrap();
                dec.query.set_passing(None);
                taken += 1;
                let mut batch = dec.query.take_passed();
                if !dec.process_event {
                    batch = batch.or(dec.query.take_ahead());
                }
                if let Some(p) = batch {
                    passed.push((taken, p.events));
                    taken = 0;
                }
            }
            assert_eq!(passed, want, "{name}: events passed over");
        }
    }
}
