//! Running the built `hwtrace` binary, shared by the CLI test files.
#![allow(dead_code)] // each test binary uses a different subset

use std::process::{Command, Output};

pub mod qemu;

/// Runs `hwtrace ARGS…`.
pub fn hwtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(args)
        .output()
        .expect("the hwtrace binary runs")
}

/// Runs `hwtrace ARGS…`, which must succeed, and returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = hwtrace(args);
    assert!(
        out.status.success(),
        "hwtrace {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Runs `hwtrace ARGS…`, which must fail, and returns its stderr.
pub fn fails(args: &[&str]) -> String {
    let out = hwtrace(args);
    assert!(!out.status.success(), "hwtrace {args:?} should fail");
    String::from_utf8(out.stderr).expect("UTF-8 output")
}
