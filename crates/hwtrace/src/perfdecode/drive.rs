//! The instruction decoder driven over one AUX run, with the code image
//! switched to the process the sideband says runs at each point of the
//! stream: per-CPU queues interleave processes, and two processes may map
//! different code at one address.
//!
//! The decode itself is hwtrace-flow's [`Flow`] over the block-cached
//! decoder, as for [`crate::flow::Items`] (synchronise at the first PSB,
//! after an error report it and go on at the next PSB, give up on an
//! endless untraced loop): every instruction as an item, or runs of plain
//! code handed out whole ([`Driver::runs`]). Each timed event it
//! yields (one that carries a TSC: PSB+, TSC packets at enables) is passed
//! to a [`Switcher`] before the next instruction is decoded; when the
//! switcher names another image, the decoder's memory is replaced
//! ([`ImageSource::switch_image`], which also forgets the decoded code of
//! the previous process). Printing every instruction, the instruction
//! decoder is the faster ([`Driver::new`]).

use hwtrace_flow::event::Event;
use hwtrace_flow::insn::{FastDecoder, InsnDecoder};
use hwtrace_flow::parallel::{FastSource, Flow, FlowItem, MAX_STALL, PassedRun, StepSource};
use hwtrace_mem::image::Image;
use hwtrace_types::TraceOffset;

use super::image::ProcessImage;
use crate::flow::{Item, RunFlow};

/// Decides the image at each timed event.
pub trait Switcher {
    /// A timed event with this TSC was decoded: returns the index of the
    /// image to decode on with, if it changes.
    fn at_tsc(&mut self, tsc: u64) -> Option<usize>;
}

/// A decoder whose code image can be switched between items.
pub trait ImageSource<'i>: StepSource {
    /// Decodes on over `image` (decoded code forgotten).
    fn switch_image(&mut self, image: &'i Image);
}

impl<'i> ImageSource<'i> for InsnDecoder<'_, &'i Image> {
    fn switch_image(&mut self, image: &'i Image) {
        self.set_memory(image);
    }
}

impl<'i> ImageSource<'i> for FastSource<'_, &'i Image> {
    fn switch_image(&mut self, image: &'i Image) {
        self.set_memory(image);
    }
}

/// The decoder, its images and the switcher, as an iterator of items.
pub struct Driver<'i, D, S> {
    flow: Flow<D>,
    images: &'i [ProcessImage],
    switcher: S,
}

impl<'a, 'i, S: Switcher> Driver<'i, FastSource<'a, &'i Image>, S> {
    /// Decodes `dec`'s trace from its first PSB, runs of plain code to be
    /// handed out whole ([`Self::visit_runs`], [`Self::skip_runs`]);
    /// `switcher` picks among `images` at timed events.
    pub fn runs(dec: FastDecoder<'a, &'i Image>, images: &'i [ProcessImage], switcher: S) -> Self {
        Self::new(FastSource::runs(dec, MAX_STALL), images, switcher)
    }
}

impl<'i, D: ImageSource<'i>, S: Switcher> Driver<'i, D, S> {
    /// Decodes `dec`'s trace from its first PSB; `switcher` picks among
    /// `images` at timed events.
    pub fn new(dec: D, images: &'i [ProcessImage], switcher: S) -> Self {
        Self {
            flow: Flow::new(dec),
            images,
            switcher,
        }
    }

    /// Passes over the runs of plain code that can be handed out whole,
    /// only counting them ([`Flow::skip_runs`]): how many instructions.
    pub fn skip_runs(&mut self) -> u64 {
        let skipped = self.flow.skip_runs(TraceOffset(u64::MAX));
        // Only a counting source passes over events; this one hands them
        // out (they switch images).
        debug_assert_eq!(skipped.events, 0);
        skipped.insns
    }

    /// Passes over the runs of plain code that can be handed out whole
    /// ([`Flow::visit_runs`]), handing each to `visit`; the items that
    /// follow are those [`Iterator::next`] would have made after them (no
    /// timed event falls among the runs: events are items).
    pub fn visit_runs(&mut self, visit: &mut dyn FnMut(&PassedRun)) -> u64 {
        self.flow.visit_runs(TraceOffset(u64::MAX), visit)
    }

    fn timed(&mut self, event: &Event) {
        if !event.has_tsc {
            return;
        }
        if let Some(i) = self.switcher.at_tsc(event.tsc)
            && let Some(p) = self.images.get(i)
        {
            self.flow.source_mut().switch_image(&p.image);
        }
    }
}

/// A runs-keeping driver gives runs of plain code by their ends
/// ([`crate::flow::RunEndItems`], for reshaping into branches), its timed
/// events still switching the image.
impl<'i, D: ImageSource<'i>, S: Switcher> RunFlow for Driver<'i, D, S> {
    fn offset(&self) -> TraceOffset {
        self.flow.source().offset()
    }

    fn visit_runs_until(&mut self, until: TraceOffset, visit: &mut dyn FnMut(&PassedRun)) {
        self.flow.visit_runs(until, visit);
    }

    fn next_item(&mut self) -> Option<Item> {
        self.next()
    }
}

impl<'i, D: ImageSource<'i>, S: Switcher> Iterator for Driver<'i, D, S> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        let item = self.flow.next()?;
        if let FlowItem::Event { event, .. } = &item {
            self.timed(event);
        }
        Some(Item::from(item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answers::testing::{psb_plus, tnt};
    use crate::flow::{Branches, RunEndItems};
    use hwtrace_flow::Config;
    use hwtrace_packet::TraceBuilder;
    use hwtrace_types::Ip;

    /// Switches to image 1 at the first TSC at or after `at`.
    #[derive(Clone)]
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
            psb_plus(&mut t, Some(tsc), None, 0x1000);
            tnt(&mut t, 1, 1);
        }
        t.finish()
    }

    fn image(code: &[u8]) -> ProcessImage {
        let mut image = Image::new();
        image
            .add_bytes(None, Ip(0x1000), code.to_vec(), "code")
            .unwrap();
        ProcessImage {
            image,
            missing: Vec::new(),
        }
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
    fn run_ends_reshape_into_the_same_branches() {
        // A: 1000: je 1002; 1002: jmp 1000. B: 1000: nop; 1001: je 1000.
        let (a, b) = (image(&[0x74, 0x00, 0xeb, 0xfc]), image(&[0x90, 0x74, 0xfd]));
        let images = [a, b];
        let trace = trace();
        for at in [200, u64::MAX] {
            let dec = InsnDecoder::new(&trace, Config::default(), &images[0].image);
            let want: Vec<Item> = Branches::new(Driver::new(dec, &images, At(at))).collect();
            let dec = FastDecoder::new(&trace, Config::default(), &images[0].image);
            let passed = std::cell::Cell::new(0);
            let ends = RunEndItems::new(Driver::runs(dec, &images, At(at)), &passed);
            let got: Vec<Item> = Branches::new(ends).collect();
            assert!(
                want.iter().any(|i| matches!(i, Item::Branch(_))),
                "{want:?}"
            );
            assert_eq!(got, want, "switch at {at}");
        }
    }

    #[test]
    fn the_image_switches_at_the_timed_event_and_forgets_decoded_code() {
        // A: 1000: je 1002; 1002: jmp 1000. B: 1000: nop; 1001: je 1000.
        let (a, b) = (image(&[0x74, 0x00, 0xeb, 0xfc]), image(&[0x90, 0x74, 0xfd]));
        let images = [a, b];
        let trace = trace();
        let run = |switcher: At| {
            let dec = FastDecoder::new(&trace, Config::default(), &images[0].image);
            let fast = ips(Driver::runs(dec, &images, switcher.clone()));
            let dec = InsnDecoder::new(&trace, Config::default(), &images[0].image);
            assert_eq!(ips(Driver::new(dec, &images, switcher)), fast);
            fast
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
