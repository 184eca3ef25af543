//! The answer commands decode a raw PT trace on several threads (`--jobs`)
//! and answer exactly as on one: `report`, `calls --json`, `coverage`'s
//! JSON and `timeline`'s Chrome trace are byte for byte the same on the
//! three real hardware traces of `../shared/corpus/real/`, with the
//! trace split at every PSB (`--unit-bytes 1`), in units of 700 bytes,
//! and in the default units.

mod common;

use common::{hwtrace, shared};
use std::path::PathBuf;

/// A scratch folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "hwtrace-answers-parallel-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one command gives: stdout, stderr, exit code and the files it
/// wrote.
type Answer = (String, String, Option<i32>, Vec<Vec<u8>>);

/// Runs `command` over `case`'s trace and page cache with `split`;
/// `files` are output options (`--json`, `-o`) given a scratch path each.
fn answer(case: &str, command: &[&str], files: &[&str], split: &[&str]) -> Answer {
    let dir = shared().join("real").join(case);
    let trace = dir.join("trace.pt").display().to_string();
    let pages = dir.display().to_string();
    // The same paths whatever the split: a command may print them.
    let scratch = Scratch::new(&format!("{case}-{}", command[0]));
    let outputs: Vec<String> = files
        .iter()
        .enumerate()
        .map(|(i, _)| scratch.0.join(format!("out{i}")).display().to_string())
        .collect();
    let mut args: Vec<&str> = command.to_vec();
    args.extend([trace.as_str(), "--pages", pages.as_str()]);
    for (flag, path) in files.iter().zip(&outputs) {
        args.extend([*flag, path.as_str()]);
    }
    args.extend(split);
    let out = hwtrace(&args);
    let written = outputs
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_default())
        .collect();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
        written,
    )
}

#[test]
fn answers_on_several_threads_are_the_answers_on_one() {
    let commands: [(&[&str], &[&str]); 4] = [
        (&["report"], &[]),
        (&["calls", "--json"], &[]),
        (&["coverage"], &["--json"]),
        (&["timeline"], &["-o"]),
    ];
    for case in ["foo", "Unzip", "icelake_tip"] {
        for (command, files) in commands {
            let one = answer(case, command, files, &["--jobs", "1"]);
            assert!(
                !one.0.is_empty() || one.3.iter().any(|f| !f.is_empty()),
                "{case} {command:?}: no answer at all: {one:?}"
            );
            for split in [
                &["--jobs", "2", "--unit-bytes", "1"][..],
                &["--jobs", "2", "--unit-bytes", "700"],
                &["--jobs", "2"],
            ] {
                let two = answer(case, command, files, split);
                assert!(
                    one == two,
                    "{case} {command:?} {split:?} differs from one thread:\n{two:?}\nvs\n{one:?}"
                );
            }
        }
    }
}
