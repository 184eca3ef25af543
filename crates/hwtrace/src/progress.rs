//! A progress bar for commands that read a whole trace: bytes of trace
//! consumed out of the total, with the rate and the time left, drawn on
//! stderr only when stderr is a terminal (a pipe or a file gets nothing,
//! so logs and test output stay clean) and never with `--quiet`.
//!
//! Callers report where they are as often as they like: [`Progress::at`]
//! is a couple of comparisons, and the bar redraws at most a few times a
//! second.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// How many updates pass between two looks at the bar (keeps the cost
/// per decoded record to a counter increment).
const EVERY: u32 = 1 << 14;

/// A progress bar over bytes of trace, or nothing.
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
    position: u64,
    total: u64,
    items: u64,
    countdown: u32,
}

impl Progress {
    /// A bar over `total` bytes labelled `what` (the file), shown when
    /// stderr is a terminal and not `quiet`.
    pub fn bytes(total: u64, what: &str, quiet: bool) -> Self {
        let show = !quiet && total > 0 && std::io::stderr().is_terminal();
        Self::with_bar(total, what, show)
    }

    fn with_bar(total: u64, what: &str, show: bool) -> Self {
        let bar = show.then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left) {msg}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(what.to_owned());
            bar
        });
        Self {
            bar,
            position: 0,
            total,
            items: 0,
            countdown: EVERY,
        }
    }

    /// One more item decoded, at trace offset `offset` if the caller
    /// knows it (positions only move forward; beyond the total they stop
    /// at the total).
    #[inline]
    pub fn at(&mut self, offset: Option<u64>) {
        self.items += 1;
        if let Some(offset) = offset {
            self.position = self.position.max(offset.min(self.total));
        }
        self.countdown -= 1;
        if self.countdown == 0 {
            self.countdown = EVERY;
            self.draw();
        }
    }

    fn draw(&self) {
        if let Some(bar) = &self.bar {
            bar.set_position(self.position);
            bar.set_message(format!("{} records", self.items));
        }
    }

    /// Removes the bar (the whole trace was read, or the command failed).
    pub fn finish(&mut self) {
        self.position = self.total;
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_or_empty_shows_nothing() {
        assert!(Progress::bytes(1000, "t", true).bar.is_none());
        assert!(Progress::bytes(0, "t", false).bar.is_none());
    }

    #[test]
    fn positions_only_move_forward_and_stop_at_the_total() {
        let mut p = Progress::with_bar(100, "t", false);
        p.at(Some(40));
        p.at(None);
        p.at(Some(10));
        assert_eq!(p.position, 40);
        p.at(Some(400));
        assert_eq!(p.position, 100);
        for _ in 0..2 * EVERY {
            p.at(None);
        }
        assert_eq!(p.items, 2 * u64::from(EVERY) + 4);
        p.finish();
        assert_eq!(p.position, 100);
    }

    #[test]
    fn a_drawn_bar_follows_the_position() {
        // Drawn to a hidden target: the bar's state is what would show.
        let mut p = Progress::with_bar(1 << 20, "t", true);
        if let Some(bar) = &p.bar {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        for k in 0..u64::from(EVERY) {
            p.at(Some(k * 8));
        }
        let bar = p.bar.as_ref().map(ProgressBar::position);
        assert_eq!(bar, Some(u64::from(EVERY - 1) * 8));
        p.finish();
        assert!(p.bar.is_none());
    }
}
