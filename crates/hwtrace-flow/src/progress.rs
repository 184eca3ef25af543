//! [`SyncProgress`]: when a loop that synchronises again after errors
//! must stop.

use hwtrace_types::TraceOffset;

/// For a caller driving a decoder itself that synchronises at the next PSB
/// whenever one fails (a bad PSB+): a decoder whose position after a failed
/// synchronisation is not past the last failed one would fail there again
/// and again, so the loop stops instead. ([`crate::parallel::Flow`] keeps
/// the same rule for its own callers.)
///
/// ```
/// use hwtrace_flow::SyncProgress;
/// use hwtrace_types::TraceOffset;
///
/// let mut progress = SyncProgress::new();
/// assert!(progress.moved(TraceOffset(16)));
/// assert!(progress.moved(TraceOffset(32)));
/// assert!(!progress.moved(TraceOffset(32)));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncProgress {
    last: Option<TraceOffset>,
}

impl SyncProgress {
    /// No synchronisation failed yet.
    pub const fn new() -> Self {
        Self { last: None }
    }

    /// A synchronisation failed with the decoder now at `at`: whether that
    /// is past the last failure (try the next PSB) or not (stop).
    pub fn moved(&mut self, at: TraceOffset) -> bool {
        if self.last.is_some_and(|l| at <= l) {
            return false;
        }
        self.last = Some(at);
        true
    }
}
