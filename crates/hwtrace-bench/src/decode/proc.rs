//! Runs one decoder as a child process and measures it: wall time from
//! spawn to exit, and the decoder's peak resident set as GNU time reports
//! it (`/usr/bin/time -f %M`, its `ru_maxrss` from `wait4`). Its standard
//! output is handed to the caller line by line while it runs.
//!
//! Why through `time` rather than our own `wait4`: Linux keeps a process's
//! RSS high-water mark across `execve`, so a child spawned straight from
//! this (larger) process would report at least this process's RSS. `time`
//! is small, and the decoder it starts inherits only `time`'s ~2 MiB.

use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The marker of the line `time` writes to standard error.
const MARK: &str = "hwtrace-bench-maxrss-kib=";

/// One run of a child.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub wall: Duration,
    /// Peak resident set size, KiB.
    pub max_rss_kib: u64,
}

/// Runs `cmd` under `/usr/bin/time`, feeds each line of its standard output
/// to `line`, and returns the measurements. Standard error is kept and
/// shown when the exit code is not in `ok_codes`.
pub fn run(cmd: &Command, ok_codes: &[i32], mut line: impl FnMut(&[u8])) -> Result<Run> {
    let what = format!("{cmd:?}");
    let mut timed = Command::new("/usr/bin/time");
    timed
        .arg("-f")
        .arg(format!("{MARK}%M"))
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => timed.env(k, v),
            None => timed.env_remove(k),
        };
    }
    let start = Instant::now();
    let mut child = timed
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!("starting {what} under /usr/bin/time (Debian package `time`, scripts/setup.sh)")
        })?;
    let mut stderr = child.stderr.take().context("no stderr pipe")?;
    let errors = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    if let Some(out) = child.stdout.take() {
        let mut out = BufReader::with_capacity(1 << 20, out);
        let mut buf = Vec::with_capacity(256);
        loop {
            buf.clear();
            if out.read_until(b'\n', &mut buf)? == 0 {
                break;
            }
            line(buf.strip_suffix(b"\n").unwrap_or(&buf));
        }
    }
    let status = child.wait()?;
    let wall = start.elapsed();
    let err = String::from_utf8_lossy(&errors.join().unwrap_or_default()).into_owned();
    let max_rss_kib = err
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(MARK))
        .and_then(|v| v.trim().parse().ok());
    let code = status.code();
    if !code.is_some_and(|c| ok_codes.contains(&c)) {
        bail!(
            "{what} failed ({}): {}",
            code.map_or("killed by a signal".to_owned(), |c| format!(
                "exit code {c}"
            )),
            err.trim()
        );
    }
    Ok(Run {
        wall,
        max_rss_kib: max_rss_kib
            .with_context(|| format!("/usr/bin/time printed no peak RSS for {what}"))?,
    })
}

/// Runs every command of `cmds` at the same time (each as [`run`] does)
/// and returns the wall time until the last one exited, with each one's
/// run. `line` gets each command's output lines with its index.
pub fn run_together(
    cmds: &[Command],
    ok_codes: &[i32],
    line: impl Fn(usize, &[u8]) + Sync,
) -> Result<(Duration, Vec<Run>)> {
    let start = Instant::now();
    let runs: Vec<Result<Run>> = std::thread::scope(|scope| {
        let line = &line;
        let handles: Vec<_> = cmds
            .iter()
            .enumerate()
            .map(|(i, cmd)| scope.spawn(move || run(cmd, ok_codes, |l| line(i, l))))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a timing thread panicked"))
            })
            .collect()
    });
    let wall = start.elapsed();
    Ok((wall, runs.into_iter().collect::<Result<_>>()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_timed_and_its_output_read() {
        let mut lines = Vec::new();
        let mut sh = Command::new("sh");
        sh.args(["-c", "echo one; echo two"]);
        let r = run(&sh, &[0], |l| {
            lines.push(String::from_utf8_lossy(l).into_owned())
        })
        .unwrap();
        assert_eq!(lines, ["one", "two"]);
        assert!(r.max_rss_kib > 0);
        let mut bad = Command::new("sh");
        bad.args(["-c", "echo bad >&2; exit 3"]);
        let e = run(&bad, &[0], |_| {}).unwrap_err().to_string();
        assert!(e.contains("exit code 3") && e.contains("bad"), "{e}");
    }

    #[test]
    fn peak_rss_is_the_childs_not_ours() {
        // dd reads into a 64 MiB buffer: that shows; `true` stays small
        // whatever this test process holds.
        let _ballast = std::hint::black_box(vec![1u8; 48 << 20]);
        let mut dd = Command::new("dd");
        dd.args([
            "if=/dev/zero",
            "of=/dev/null",
            "bs=64M",
            "count=1",
            "status=none",
        ]);
        let big = run(&dd, &[0], |_| {}).unwrap();
        assert!(big.max_rss_kib >= 60 * 1024, "{big:?}");
        let small = run(&Command::new("true"), &[0], |_| {}).unwrap();
        assert!(small.max_rss_kib < 16 * 1024, "{small:?}");
    }

    #[test]
    fn commands_run_together_run_at_the_same_time() {
        // Each waits (up to 20 s) for the other's file: only commands that
        // really run at once both get past it.
        let dir =
            std::env::temp_dir().join(format!("hwtrace-bench-together-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let meet = |me: usize| {
            let other = dir.join((1 - me).to_string());
            let mut sh = Command::new("sh");
            sh.arg("-c").arg(format!(
                "touch {}; for i in $(seq 2000); do [ -e {} ] && echo met && exit 0; sleep 0.01; done; exit 1",
                dir.join(me.to_string()).display(),
                other.display()
            ));
            sh
        };
        let seen = std::sync::Mutex::new(Vec::new());
        let (wall, runs) = run_together(&[meet(0), meet(1)], &[0], |i, l| {
            seen.lock()
                .unwrap()
                .push((i, String::from_utf8_lossy(l).into_owned()));
        })
        .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(runs.len(), 2);
        assert!(runs.iter().all(|r| r.wall <= wall));
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, [(0, "met".to_owned()), (1, "met".to_owned())]);
        let mut bad = Command::new("sh");
        bad.args(["-c", "exit 4"]);
        assert!(run_together(&[Command::new("true"), bad], &[0], |_, _| {}).is_err());
    }
}
