//! `hwtrace coverage` on one thread and on several, compared byte for
//! byte (`coverage_parallel.rs`, `coverage_qemu.rs`).

use anyhow::{Context, Result, ensure};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Thread counts and least unit sizes: a unit per PSB, and larger ones.
const SPLITS: [(&str, &str); 4] = [("2", "1"), ("3", "300"), ("2", "4096"), ("4", "700")];

/// Everything one `hwtrace coverage` run writes.
#[derive(Debug, PartialEq, Eq)]
struct Written {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// The output files (`None`: not written, as when the input is
    /// refused).
    files: Vec<Option<Vec<u8>>>,
}

/// `hwtrace coverage ARGS... JOBS` run in `dir`, its output files in
/// `out` (named by `tag`).
fn coverage(dir: &Path, args: &[String], jobs: &[&str], out: &Path, tag: &str) -> Result<Written> {
    let files: Vec<(&str, PathBuf)> = [
        ("--json", "json"),
        ("--drcov", "drcov"),
        ("--afl-map", "afl"),
    ]
    .into_iter()
    .map(|(flag, ext)| (flag, out.join(format!("{tag}.{ext}"))))
    .collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hwtrace"));
    cmd.current_dir(dir).arg("coverage").args(args).args(jobs);
    for (flag, path) in &files {
        let _ = std::fs::remove_file(path);
        cmd.arg(flag).arg(path);
    }
    let run = cmd.output().context("hwtrace coverage")?;
    Ok(Written {
        code: run.status.code(),
        stdout: String::from_utf8(run.stdout)?,
        stderr: String::from_utf8(run.stderr)?,
        files: files.iter().map(|(_, p)| std::fs::read(p).ok()).collect(),
    })
}

/// Coverage of `args` (run in `dir`) on one thread and with every split
/// of [`SPLITS`] (and with all edges in the AFL map): the same bytes
/// everywhere. Returns the one-thread run's summary line.
pub fn same(name: &str, dir: &Path, args: &[String]) -> Result<String> {
    let out = std::env::temp_dir().join(format!(
        "hwtrace-coverage-parallel-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&out)?;
    let mut summary = String::new();
    for edges in ["conditional", "all"] {
        let mut args = args.to_vec();
        args.extend(["--afl-edges".into(), edges.into()]);
        let want = coverage(dir, &args, &["--jobs", "1"], &out, "one")?;
        ensure!(
            (want.code == Some(0) || want.code == Some(2)) && want.stdout.contains(" blocks, ")
                || want.code == Some(1) && want.stderr.contains("error: "),
            "{name}: {want:?}"
        );
        for (threads, unit) in SPLITS {
            let got = coverage(
                dir,
                &args,
                &["--jobs", threads, "--unit-bytes", unit],
                &out,
                "many",
            )?;
            if got != want {
                let file = got.files.iter().zip(&want.files).position(|(g, w)| g != w);
                anyhow::bail!(
                    "{name} ({edges} edges): {threads} threads, units of {unit} B differ from one thread: \
                     exit {:?}/{:?}, output file {file:?} differs, stdout:\n{}\nagainst\n{}\nstderr:\n{}\nagainst\n{}",
                    got.code,
                    want.code,
                    got.stdout,
                    want.stdout,
                    got.stderr.lines().take(5).collect::<Vec<_>>().join("\n"),
                    want.stderr.lines().take(5).collect::<Vec<_>>().join("\n"),
                );
            }
        }
        summary = want.stdout.lines().next().unwrap_or_default().to_owned();
    }
    std::fs::remove_dir_all(&out)?;
    Ok(summary)
}
