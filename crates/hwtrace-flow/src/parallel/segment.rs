//! Finding the PSBs of a trace and grouping the stretches between them
//! into work units.
//!
//! A PSB is `02 82` eight times; `memchr`'s substring search finds each
//! run of the pattern, and the PSB is the one that *ends* the run (the
//! rule of [`hwtrace_packet::find_psb_forward`], which is libipt's), so a run that is
//! longer than a PSB resolves to the same sync point the decoder would
//! choose.

use hwtrace_packet::{PSB, is_psb_at};
use hwtrace_types::TraceOffset;

/// The offsets of every PSB in `trace`, in order.
pub fn psb_offsets(trace: &[u8]) -> Vec<TraceOffset> {
    let finder = memchr::memmem::Finder::new(&PSB);
    let mut found = Vec::new();
    let mut pos = 0;
    while let Some(hit) = trace.get(pos..).and_then(|rest| finder.find(rest)) {
        // Walk to the end of the run of `02 82`, then back one PSB.
        let mut end = pos + hit + PSB.len();
        while trace.get(end..end + 2) == Some(&[0x02, 0x82][..]) {
            end += 2;
        }
        let at = end - PSB.len();
        if is_psb_at(trace, at) {
            found.push(TraceOffset(at as u64));
        }
        pos = end;
    }
    found
}

/// A stretch of trace decoded by one worker: from the PSB at `start` (the
/// first unit starts at the trace's beginning, as a sequential decode
/// does) to `end`, the next unit's `start` or the end of the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Where decoding starts.
    pub start: TraceOffset,
    /// Where the next unit starts.
    pub end: TraceOffset,
}

/// The first PSB at or after `from`.
fn psb_from(trace: &[u8], from: usize) -> Option<usize> {
    let finder = memchr::memmem::Finder::new(&PSB);
    let mut pos = from;
    while let Some(hit) = trace.get(pos..).and_then(|rest| finder.find(rest)) {
        let mut end = pos + hit + PSB.len();
        while trace.get(end..end + 2) == Some(&[0x02, 0x82][..]) {
            end += 2;
        }
        let at = end - PSB.len();
        if is_psb_at(trace, at) {
            return Some(at);
        }
        pos = end;
    }
    None
}

/// Splits a trace at its PSBs into units of at least `min_bytes` each
/// (the last may be smaller), scanning only as far as the units asked
/// for: a scan of the whole trace up front would read (and keep
/// resident) every page of it before decoding began. PSB segments are
/// often a few KiB, too small to be worth a task, so consecutive ones are
/// grouped.
#[derive(Debug)]
pub struct Splitter<'a> {
    trace: &'a [u8],
    min_bytes: u64,
    found: Vec<Unit>,
    done: bool,
}

impl<'a> Splitter<'a> {
    /// Splits `trace`; nothing is scanned yet.
    pub fn new(trace: &'a [u8], min_bytes: u64) -> Self {
        Self {
            trace,
            min_bytes: min_bytes.max(1),
            found: Vec::new(),
            done: false,
        }
    }

    /// Unit `i`, or `None` past the last.
    pub fn get(&mut self, i: usize) -> Option<Unit> {
        while self.found.len() <= i && !self.done {
            let start = self.found.last().map_or(0, |u| u.end.0);
            let len = self.trace.len() as u64;
            let from = usize::try_from(start.saturating_add(self.min_bytes)).unwrap_or(usize::MAX);
            let end = match psb_from(self.trace, from) {
                Some(psb) => TraceOffset(psb as u64),
                None => {
                    self.done = true;
                    TraceOffset(len)
                }
            };
            self.found.push(Unit {
                start: TraceOffset(start),
                end,
            });
        }
        self.found.get(i).copied()
    }

    /// How many units were found so far.
    pub fn found(&self) -> usize {
        self.found.len()
    }
}

/// Every unit of `trace` ([`Splitter`]).
pub fn units(trace: &[u8], min_bytes: u64) -> Vec<Unit> {
    let mut split = Splitter::new(trace, min_bytes);
    let mut i = 0;
    while split.get(i).is_some() {
        i += 1;
    }
    split.found
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_packet::find_psb_forward;

    fn reference(trace: &[u8]) -> Vec<TraceOffset> {
        let mut out = Vec::new();
        let mut pos = 0;
        while let Some(at) = find_psb_forward(trace, pos) {
            out.push(TraceOffset(at as u64));
            pos = at + PSB.len();
        }
        out
    }

    #[test]
    fn finds_the_psbs_sync_finds() {
        let mut trace = vec![0u8; 5];
        trace.extend_from_slice(&PSB);
        trace.extend_from_slice(&[0x99, 0x01]);
        // A run longer than one PSB: the PSB is the run's last 16 bytes.
        trace.extend_from_slice(&[0x02, 0x82, 0x02, 0x82]);
        trace.extend_from_slice(&PSB);
        trace.extend_from_slice(&[0x00; 7]);
        trace.extend_from_slice(&PSB);
        let got = psb_offsets(&trace);
        assert_eq!(got, [TraceOffset(5), TraceOffset(27), TraceOffset(50)]);
        // The aligned-word search agrees where it sees the PSB at all.
        for at in reference(&trace) {
            assert!(got.contains(&at), "{at:?}");
        }
    }

    #[test]
    fn units_cover_the_trace_and_start_at_psbs() {
        let mut trace = Vec::new();
        for _ in 0..10 {
            trace.extend_from_slice(&PSB);
            trace.extend_from_slice(&[0u8; 100]);
        }
        let u = units(&trace, 250);
        assert_eq!(u.first().map(|u| u.start), Some(TraceOffset(0)));
        assert_eq!(
            u.last().map(|u| u.end),
            Some(TraceOffset(trace.len() as u64))
        );
        for w in u.windows(2) {
            assert_eq!(w[0].end, w[1].start);
            assert!(is_psb_at(&trace, w[1].start.0 as usize));
            assert!(w[0].end.0 - w[0].start.0 >= 250);
        }
        assert_eq!(u.len(), 4);
        assert_eq!(
            units(&[], 1),
            [Unit {
                start: TraceOffset(0),
                end: TraceOffset(0)
            }]
        );
    }
}
