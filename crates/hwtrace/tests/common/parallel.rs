//! An answer command (coverage, report, calls, timeline) on one thread
//! and on several, compared byte for byte: exit code, stdout, stderr and
//! every output file (`answers_parallel.rs`, `coverage_qemu.rs`).

use anyhow::{Context, Result, ensure};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Thread counts and least unit sizes: a unit per PSB, and larger ones.
pub const SPLITS: [(&str, &str); 4] = [("2", "1"), ("3", "300"), ("2", "4096"), ("4", "700")];

/// Everything one answer command's run writes.
#[derive(Debug, PartialEq, Eq)]
struct Written {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// The output files (`None`: not written, as when the input is
    /// refused).
    files: Vec<Option<Vec<u8>>>,
}

/// `hwtrace COMMAND ARGS... JOBS` run in `dir`, each output option of
/// `outputs` (flag, file extension) writing into `out` (named by `tag`).
fn answer(
    dir: &Path,
    command: &[String],
    outputs: &[(&str, &str)],
    jobs: &[&str],
    out: &Path,
    tag: &str,
) -> Result<Written> {
    let files: Vec<(&str, PathBuf)> = outputs
        .iter()
        .map(|&(flag, ext)| (flag, out.join(format!("{tag}.{ext}"))))
        .collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hwtrace"));
    cmd.current_dir(dir).args(command).args(jobs);
    for (flag, path) in &files {
        let _ = std::fs::remove_file(path);
        cmd.arg(flag).arg(path);
    }
    let run = cmd.output().context("hwtrace")?;
    Ok(Written {
        code: run.status.code(),
        stdout: String::from_utf8(run.stdout)?,
        stderr: String::from_utf8(run.stderr)?,
        files: files.iter().map(|(_, p)| std::fs::read(p).ok()).collect(),
    })
}

/// `hwtrace COMMAND...` (run in `dir`, with `outputs` written) on one
/// thread and with every split of [`SPLITS`]: the same bytes everywhere.
/// Returns the one-thread run's stdout.
pub fn same_answer(
    name: &str,
    dir: &Path,
    command: &[String],
    outputs: &[(&str, &str)],
) -> Result<String> {
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "hwtrace-answer-parallel-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&out)?;
    let want = answer(dir, command, outputs, &["--jobs", "1"], &out, "out")?;
    ensure!(
        want.code == Some(0)
            || want.code == Some(2)
            || want.code == Some(1) && want.stderr.contains("error: "),
        "{name}: {command:?}: {want:?}"
    );
    for (threads, unit) in SPLITS {
        let got = answer(
            dir,
            command,
            outputs,
            &["--jobs", threads, "--unit-bytes", unit],
            &out,
            "out",
        )?;
        if got != want {
            let file = got
                .files
                .iter()
                .zip(&want.files)
                .position(|(g, w)| g != w)
                .map(|i| outputs[i].0);
            anyhow::bail!(
                "{name}: {command:?}: {threads} threads, units of {unit} B differ from one thread: \
                 exit {:?}/{:?}, output {file:?} differs, stdout:\n{}\nagainst\n{}\nstderr:\n{}\nagainst\n{}",
                got.code,
                want.code,
                got.stdout,
                want.stdout,
                got.stderr.lines().take(5).collect::<Vec<_>>().join("\n"),
                want.stderr.lines().take(5).collect::<Vec<_>>().join("\n"),
            );
        }
    }
    std::fs::remove_dir_all(&out)?;
    Ok(want.stdout)
}

/// `hwtrace coverage ARGS...` (run in `dir`) with its drcov, JSON and AFL
/// map (conditional edges, then all) on one thread and with every split
/// of [`SPLITS`]: the same bytes everywhere. Returns the summary line.
pub fn same(name: &str, dir: &Path, args: &[String]) -> Result<String> {
    let mut summary = String::new();
    for edges in ["conditional", "all"] {
        let mut command = vec!["coverage".to_owned()];
        command.extend(args.iter().cloned());
        command.extend(["--afl-edges".into(), edges.into()]);
        let stdout = same_answer(
            &format!("{name}-{edges}"),
            dir,
            &command,
            &[
                ("--json", "json"),
                ("--drcov", "drcov"),
                ("--afl-map", "afl"),
            ],
        )?;
        ensure!(
            stdout.contains(" blocks, ") || stdout.is_empty(),
            "{name}: {stdout}"
        );
        summary = stdout.lines().next().unwrap_or_default().to_owned();
    }
    Ok(summary)
}

/// foo, Unzip, icelake_tip and foo again, each cut by its last byte (its
/// last packet broken: the next piece starts with a decode error and a
/// resynchronisation, and the CR3 the piece before left is not its own),
/// written to `dir/all.pt`: the arguments that decode it there (the trace
/// and the three traces' page caches).
pub fn concatenated_real_traces(dir: &Path) -> Result<Vec<String>> {
    let real = super::shared().join("real");
    let mut trace = Vec::new();
    for name in ["foo", "Unzip", "icelake_tip", "foo"] {
        let bytes = std::fs::read(real.join(name).join("trace.pt"))?;
        trace.extend_from_slice(&bytes[..bytes.len() - 1]);
    }
    std::fs::write(dir.join("all.pt"), &trace)?;
    let mut args = vec!["all.pt".to_owned()];
    for name in ["foo", "Unzip", "icelake_tip"] {
        args.extend(["--pages".to_owned(), real.join(name).display().to_string()]);
    }
    Ok(args)
}
