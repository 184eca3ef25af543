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
