//! The instruction decoder driven over one AUX run, with the code image
//! switched to the process the sideband says runs at each point of the
//! stream: per-CPU queues interleave processes, and two processes may map
//! different code at one address.
//!
//! It yields the [`Item`]s [`crate::flow::Items`] yields, in the same way
//! (synchronise at the first PSB, after an error report it and go on at the
//! next PSB, give up on an endless untraced loop at [`MAX_STALL`]). It
//! differs in one point: [`Items`](crate::flow::Items) owns its decoder
//! and cannot replace the decoder's memory, which the switch needs
//! ([`InsnDecoder::set_memory`], which also forgets the decoded
//! instructions of the previous process). Each timed event (one that
//! carries a TSC: PSB+, TSC packets at enables) is passed to a
//! [`Switcher`] before the next instruction is decoded.

use hwtrace_flow::ErrorKind;
use hwtrace_flow::event::{Event, Status};
use hwtrace_flow::insn::{Insn, InsnClass, InsnDecoder};
use hwtrace_mem::image::Image;

use crate::flow::Item;

/// Instructions in a row without the trace offset moving before the
/// decoder is taken to loop forever (as `crate::flow::Items` does).
const MAX_STALL: u64 = 1 << 24;

/// Decides the image at each timed event.
pub trait Switcher {
    /// A timed event with this TSC was decoded: returns the index of the
    /// image to decode on with, if it changes.
    fn at_tsc(&mut self, tsc: u64) -> Option<usize>;
}

#[derive(Clone, Copy, Debug)]
enum State {
    Sync { after_error: Option<u64> },
    Run(Status),
    Done,
}

/// The decoder, its images and the switcher, as an iterator of items.
pub struct Driver<'a, 'i, S> {
    dec: InsnDecoder<'a, &'i Image>,
    images: &'i [&'i Image],
    switcher: S,
    state: State,
    queued: Option<Item>,
    last_sync: Option<u64>,
    stall_offset: u64,
    stall: u64,
}

impl<'a, 'i, S: Switcher> Driver<'a, 'i, S> {
    /// Decodes `dec`'s trace from its first PSB; `switcher` picks among
    /// `images` at timed events.
    pub fn new(dec: InsnDecoder<'a, &'i Image>, images: &'i [&'i Image], switcher: S) -> Self {
        Self {
            dec,
            images,
            switcher,
            state: State::Sync { after_error: None },
            queued: None,
            last_sync: None,
            stall_offset: u64::MAX,
            stall: 0,
        }
    }

    fn timed(&mut self, event: &Event) {
        if !event.has_tsc {
            return;
        }
        if let Some(i) = self.switcher.at_tsc(event.tsc)
            && let Some(image) = self.images.get(i)
        {
            self.dec.set_memory(image);
        }
    }

    fn stalled(&mut self, offset: u64, ip: u64) -> Option<Item> {
        if offset != self.stall_offset {
            self.stall_offset = offset;
            self.stall = 0;
        }
        self.stall += 1;
        if self.stall < MAX_STALL {
            return None;
        }
        let insns = std::mem::take(&mut self.stall);
        self.stall_offset = u64::MAX;
        self.state = State::Sync {
            after_error: Some(offset),
        };
        Some(Item::Stuck { offset, ip, insns })
    }

    fn fail(&mut self, e: hwtrace_flow::Error) -> Item {
        self.state = State::Sync {
            after_error: Some(e.offset.0),
        };
        Item::Error(e)
    }

    fn sync(&mut self, after_error: Option<u64>) -> Option<Item> {
        match self.dec.sync_forward() {
            Ok(status) => {
                let to = self.dec.sync_offset().map(|o| o.0);
                if to.is_some() && to <= self.last_sync {
                    self.state = State::Done;
                    return after_error.map(|from| Item::Resync { from, to: None });
                }
                self.last_sync = to;
                self.state = State::Run(status);
                after_error.map(|from| Item::Resync { from, to })
            }
            Err(e) if e.kind == ErrorKind::Eos => {
                self.state = State::Done;
                after_error.map(|from| Item::Resync { from, to: None })
            }
            Err(e) => {
                let at = Some(e.offset.0);
                if at <= self.last_sync {
                    self.state = State::Done;
                } else {
                    self.last_sync = at;
                    self.state = State::Sync {
                        after_error: after_error.or(at),
                    };
                }
                Some(Item::Error(e))
            }
        }
    }
}

impl<S: Switcher> Iterator for Driver<'_, '_, S> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        if let Some(item) = self.queued.take() {
            return Some(item);
        }
        loop {
            let status = match self.state {
                State::Done => return None,
                State::Sync { after_error } => {
                    if let Some(item) = self.sync(after_error) {
                        return Some(item);
                    }
                    continue;
                }
                State::Run(status) => status,
            };
            if status.event_pending {
                let offset = self.dec.offset().0;
                return Some(match self.dec.event() {
                    Ok((event, status)) => {
                        self.state = State::Run(status);
                        self.timed(&event);
                        Item::Event { offset, event }
                    }
                    Err(e) => self.fail(e),
                });
            }
            if status.eos {
                self.state = State::Done;
                return None;
            }
            let offset = self.dec.offset().0;
            let mut insn = Insn::empty(0, None, false);
            match self.dec.next_insn(&mut insn) {
                Ok(status) => {
                    self.state = State::Run(status);
                    self.queued = self.stalled(offset, insn.ip);
                    return Some(Item::Insn { offset, insn });
                }
                Err(e) => {
                    let error = if e.kind == ErrorKind::Eos {
                        self.state = State::Done;
                        None
                    } else {
                        Some(self.fail(e))
                    };
                    if insn.class != InsnClass::Unknown {
                        self.queued = error;
                        return Some(Item::Insn { offset, insn });
                    }
                    if error.is_some() {
                        return error;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_flow::Config;
    use hwtrace_packet::{ModeExec, Packet, Tnt, TraceBuilder};
    use hwtrace_types::Ip;

    /// Switches to image 1 at the first TSC at or after `at`.
    struct At(u64);

    impl Switcher for At {
        fn at_tsc(&mut self, tsc: u64) -> Option<usize> {
            (tsc >= self.0).then(|| {
                self.0 = u64::MAX;
                1
            })
        }
    }

    /// Two PSB+ (TSC 100, then 200), each with FUP 0x1000 and one taken
    /// TNT bit.
    fn trace() -> Vec<u8> {
        let mut t = TraceBuilder::new();
        for tsc in [100, 200] {
            t.push(Packet::Psb).unwrap();
            t.push(Packet::Tsc(tsc)).unwrap();
            t.push(Packet::ModeExec(ModeExec {
                csl: true,
                csd: false,
                iflag: false,
            }))
            .unwrap();
            t.ip(Packet::Fup, 0x1000).unwrap();
            t.push(Packet::Psbend).unwrap();
            t.push(Packet::Tnt(Tnt {
                bits: 1,
                len: 1,
                long: false,
            }))
            .unwrap();
        }
        t.finish()
    }

    fn image(code: &[u8]) -> Image {
        let mut i = Image::new();
        i.add_bytes(None, Ip(0x1000), code.to_vec(), "code")
            .unwrap();
        i
    }

    fn ips(items: impl Iterator<Item = Item>) -> Vec<u64> {
        items
            .filter_map(|i| match i {
                Item::Insn { insn, .. } => Some(insn.ip),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_image_switches_at_the_timed_event_and_forgets_decoded_code() {
        // A: 1000: je 1002; 1002: jmp 1000. B: 1000: nop; 1001: je 1000.
        let (a, b) = (image(&[0x74, 0x00, 0xeb, 0xfc]), image(&[0x90, 0x74, 0xfd]));
        let images = [&a, &b];
        let trace = trace();
        let run = |switcher: At| {
            let dec = InsnDecoder::new(&trace, Config::default(), images[0]);
            ips(Driver::new(dec, &images, switcher))
        };
        let switched = run(At(200));
        // Before the second PSB+ only A's code ran (1002 is A's jmp); after
        // it only B's (1001 is B's je).
        let first_b = switched.iter().position(|&ip| ip == 0x1001);
        let first_b = first_b.unwrap_or_else(|| panic!("B never ran: {switched:x?}"));
        assert!(switched[..first_b].contains(&0x1002), "{switched:x?}");
        assert!(!switched[first_b..].contains(&0x1002), "{switched:x?}");
        // Never switching: A's code throughout.
        let stayed = run(At(u64::MAX));
        assert!(!stayed.contains(&0x1001), "{stayed:x?}");
    }
}
