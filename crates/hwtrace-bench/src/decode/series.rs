//! The runs of one row, taken one at a time, so that two rows can take
//! theirs in turn.
//!
//! These machines' speed drifts: a 2-core VM's single-thread decode of the
//! same trace took 14 s, 16 s and 14 s in three runs a minute apart, where
//! a quiet minute earlier it took 11 s. Rows measured one after the other
//! then compare a fast minute with a slow one, and a ratio between them
//! (`--jobs 2` over `--jobs 1`) moves by more than the change it measures.
//! Taking the two rows' runs in turn (one, the other, one, ...) puts each
//! pair of runs in the same minute.

use super::child::Counts;
use super::proc::{self, Run};
use super::{Input, Row};
use anyhow::{Context, Result, ensure};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// A row's runs so far.
pub struct Series {
    name: String,
    runs: Vec<Run>,
    counts: Option<Counts>,
    spent: Duration,
}

impl Series {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            runs: Vec::new(),
            counts: None,
            spent: Duration::ZERO,
        }
    }

    /// Whether it wants another run: fewer than `want`, and (past the
    /// first) its runs took less than `budget` so far.
    pub fn wants(&self, want: usize, budget: Duration) -> bool {
        self.runs.len() < want.max(1) && (self.runs.is_empty() || self.spent < budget)
    }

    /// One more run of `cmds` (one command, or several at once: the run
    /// lasts until the last one exits, its peak RSS is the highest, and
    /// its counts are all of theirs, each command counting the same);
    /// `parse` reads their output lines. Every run must count what the
    /// first counted.
    pub fn take(
        &mut self,
        cmds: &[Command],
        ok_codes: &[i32],
        parse: fn(&[u8], &mut Counts),
    ) -> Result<()> {
        let (run, counts) = match cmds {
            [cmd] => {
                let mut counts = Counts::default();
                let run = proc::run(cmd, ok_codes, |l| parse(l, &mut counts))
                    .with_context(|| self.name.clone())?;
                (run, counts)
            }
            _ => self.take_together(cmds, ok_codes, parse)?,
        };
        if let Some(prev) = &self.counts {
            ensure!(
                (prev.insns, prev.packets, prev.errors)
                    == (counts.insns, counts.packets, counts.errors),
                "{}: two runs on the same trace counted differently: {} and {}",
                self.name,
                prev.to_line(),
                counts.to_line()
            );
        }
        self.spent += run.wall;
        self.runs.push(run);
        self.counts = Some(counts);
        Ok(())
    }

    /// A run of several commands at once ([`take`](Self::take)).
    fn take_together(
        &self,
        cmds: &[Command],
        ok_codes: &[i32],
        parse: fn(&[u8], &mut Counts),
    ) -> Result<(Run, Counts)> {
        let each: Vec<Mutex<Counts>> = cmds.iter().map(|_| Mutex::default()).collect();
        let (wall, runs) = proc::run_together(cmds, ok_codes, |i, l| {
            if let Some(Ok(mut c)) = each.get(i).map(Mutex::lock) {
                parse(l, &mut c);
            }
        })
        .with_context(|| self.name.clone())?;
        let each: Vec<Counts> = each
            .into_iter()
            .map(|c| c.into_inner().unwrap_or_default())
            .collect();
        let first = each.first().context("no command to run")?;
        for c in &each {
            ensure!(
                (c.insns, c.errors) == (first.insns, first.errors) && c.insns.is_some(),
                "{}: the decodes counted differently: {} and {}",
                self.name,
                first.to_line(),
                c.to_line()
            );
        }
        let n = each.len() as u64;
        let run = Run {
            wall,
            max_rss_kib: runs.iter().map(|r| r.max_rss_kib).max().unwrap_or(0),
        };
        let counts = Counts {
            insns: first.insns.map(|i| i * n),
            errors: first.errors * n,
            ..Counts::default()
        };
        Ok((run, counts))
    }

    /// The measured row on `input` (`bytes` long): the median run's wall
    /// time, the highest peak RSS of all runs, every wall time (sorted)
    /// and what the runs counted.
    pub fn into_row(self, input: Input, bytes: u64) -> Row {
        let mut runs = self.runs;
        let max_rss_kib = runs.iter().map(|r| r.max_rss_kib).max().unwrap_or(0);
        runs.sort_by_key(|r| r.wall);
        let wall = runs.get(runs.len() / 2).map_or(Duration::ZERO, |r| r.wall);
        Row {
            name: self.name,
            input,
            bytes,
            wall,
            max_rss_kib,
            walls: runs.iter().map(|r| r.wall).collect(),
            counts: self.counts.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    fn count_x(l: &[u8], c: &mut Counts) {
        if l == b"x" {
            *c.insns.get_or_insert(0) += 1;
        }
    }

    #[test]
    fn commands_run_at_once_count_for_all_of_them_and_must_agree() {
        let mut s = Series::new("two at once");
        s.take(&[sh("echo x; echo x"), sh("echo x; echo x")], &[0], count_x)
            .unwrap();
        let row = s.into_row(Input::Rss, 2);
        assert_eq!(row.counts.insns, Some(4));
        assert_eq!(row.walls.len(), 1);
        let mut s = Series::new("disagreeing");
        let e = s
            .take(&[sh("echo x"), sh("echo x; echo x")], &[0], count_x)
            .unwrap_err();
        assert!(format!("{e:#}").contains("counted differently"), "{e:#}");
    }

    #[test]
    fn a_series_wants_its_runs_then_stops_at_its_budget() {
        let mut s = Series::new("x");
        assert!(s.wants(3, Duration::from_secs(1)));
        s.runs.push(Run {
            wall: Duration::from_millis(600),
            max_rss_kib: 5,
        });
        s.spent += Duration::from_millis(600);
        assert!(s.wants(3, Duration::from_secs(1)));
        s.runs.push(Run {
            wall: Duration::from_millis(500),
            max_rss_kib: 9,
        });
        s.spent += Duration::from_millis(500);
        // Over the budget after two of three runs.
        assert!(!s.wants(3, Duration::from_secs(1)));
        assert!(s.wants(3, Duration::from_secs(10)));
        let row = s.into_row(Input::Full, 1);
        assert_eq!(row.name, "x");
        // Of two runs, the slower is the median (index len / 2).
        assert_eq!(row.wall, Duration::from_millis(600));
        assert_eq!(row.max_rss_kib, 9);
        assert_eq!(
            row.walls,
            vec![Duration::from_millis(500), Duration::from_millis(600)]
        );
    }
}
