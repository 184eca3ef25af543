//! `hwtrace coverage` of a raw trace on every core gives byte for byte
//! what it gives on one: each work unit's coverage is built by the thread
//! that decoded it and the parts are merged in trace order, so every seam
//! (a block cut in two, the edge across it, a conditional branch whose
//! target left the IP filter just before it, the address space at its
//! start) must be stitched exactly. Compared: the JSON (every block and
//! edge with hits), the drcov file, the AFL maps (libxdc's conditional
//! edges and all edges), the summary on stdout, the problems on stderr and
//! the exit code, with tiny work units that put seams at nearly every PSB.
//!
//! Inputs: the three real hardware traces (strict and `--lenient`: errors,
//! resynchronisations, PIPs, filter exits), every 7th libipt corpus case
//! with an image, and the three concatenated with errors between them
//! (each piece's CR3 must not leak into the next after the
//! resynchronisation). Real executions are checked the same way in
//! `coverage_qemu.rs`, against their recorded truth.

mod common;

use anyhow::{Result, ensure};
use common::parallel::same;
use common::{libipt_flow_cases, shared};

#[test]
fn the_real_traces_cover_the_same_on_every_core() -> Result<()> {
    let real = shared().join("real");
    for name in ["foo", "Unzip", "icelake_tip"] {
        let dir = real.join(name);
        for lenient in [false, true] {
            let mut args: Vec<String> = vec!["trace.pt".into(), "--pages".into(), ".".into()];
            if lenient {
                args.push("--lenient".into());
            }
            let summary = same(name, &dir, &args)?;
            eprintln!("{name} (lenient: {lenient}): {summary}");
        }
    }
    Ok(())
}

#[test]
fn libipt_corpus_cases_cover_the_same_on_every_core() -> Result<()> {
    let cases = libipt_flow_cases(7)?;
    ensure!(cases.len() > 40, "only {} cases", cases.len());
    for case in &cases {
        same(&case.name, &case.dir, &case.args)?;
    }
    Ok(())
}

/// foo, Unzip and icelake_tip one after the other, over their pages
/// together: each piece's first bytes fail to decode (the last packet of
/// the piece before is cut), the decoder resynchronises, and the CR3 the
/// piece before left is not the next one's.
#[test]
fn concatenated_traces_cover_the_same_on_every_core() -> Result<()> {
    let real = shared().join("real");
    let out = std::env::temp_dir().join(format!(
        "hwtrace-coverage-parallel-{}-concatenated",
        std::process::id()
    ));
    std::fs::create_dir_all(&out)?;
    let mut trace = Vec::new();
    let mut args = vec!["all.pt".to_owned()];
    for name in ["foo", "Unzip", "icelake_tip", "foo"] {
        let bytes = std::fs::read(real.join(name).join("trace.pt"))?;
        // Cut the piece's last byte: its last packet is broken.
        trace.extend_from_slice(&bytes[..bytes.len() - 1]);
    }
    for name in ["foo", "Unzip", "icelake_tip"] {
        args.extend(["--pages".to_owned(), real.join(name).display().to_string()]);
    }
    std::fs::write(out.join("all.pt"), &trace)?;
    let summary = same("concat", &out, &args)?;
    ensure!(summary.contains(" errors"), "{summary}");
    eprintln!("concatenated: {summary}");
    std::fs::remove_dir_all(&out)?;
    Ok(())
}
