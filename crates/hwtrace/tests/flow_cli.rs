//! `hwtrace flow` on the real hardware trace `real/foo` (a kAFL/Nyx fuzzing
//! run) over its page cache: instructions, disassembly, JSON, blocks,
//! branches, and what a corrupt byte does.
//!
//! The reference is libipt's ptxed output in `reference/ptxed-insn.txt`
//! (117,967 instructions); the corpus is read from `../shared/corpus/`
//! beside the checkout.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FOO_INSNS: usize = 117_967;

fn foo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/real/foo")
}

fn hwtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(args)
        .output()
        .expect("hwtrace runs")
}

/// `hwtrace flow TRACE --pages PAGES EXTRA...`.
fn flow_over(pages: &Path, trace: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "flow",
        trace.to_str().expect("utf-8 path"),
        "--pages",
        pages.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    hwtrace(&args)
}

/// `hwtrace flow TRACE --pages foo EXTRA...`: exit code and stdout lines.
fn flow(trace: &Path, extra: &[&str]) -> (Option<i32>, Vec<String>) {
    let out = flow_over(&foo(), trace, extra);
    let stdout = String::from_utf8(out.stdout).expect("utf-8 output");
    (
        out.status.code(),
        stdout.lines().map(str::to_owned).collect(),
    )
}

fn reference() -> Vec<String> {
    std::fs::read_to_string(foo().join("reference/ptxed-insn.txt"))
        .expect("reference reads")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn is_insn(line: &str) -> bool {
    !line.starts_with('[')
}

/// The address at the start of an instruction line.
fn ip_of(line: &str) -> u64 {
    let hex = line.split_whitespace().next().expect("an address");
    u64::from_str_radix(hex, 16).expect("hex address")
}

#[test]
fn foo_addresses_and_events_are_ptxeds() {
    let (code, got) = flow(&foo().join("trace.pt"), &["--no-disasm"]);
    assert_eq!(code, Some(0));
    let want = reference();
    assert_eq!(want.iter().filter(|l| is_insn(l)).count(), FOO_INSNS);
    if let Some(i) = (0..want.len().max(got.len())).find(|&i| want.get(i) != got.get(i)) {
        panic!(
            "line {}: expected {:?}, got {:?}",
            i + 1,
            want.get(i),
            got.get(i)
        );
    }
    let insns: Vec<&String> = got.iter().filter(|l| is_insn(l)).collect();
    assert_eq!(insns.len(), FOO_INSNS);
    assert_eq!(insns.first().map(|l| l.as_str()), Some("00007ffff78508e0"));
    assert_eq!(
        insns.last().map(|l| ip_of(l)),
        want.iter().rev().find(|l| is_insn(l)).map(|l| ip_of(l))
    );
}

#[test]
fn foo_disassembly_agrees_with_the_flow() {
    let (code, lines) = flow(&foo().join("trace.pt"), &["--stats"]);
    assert_eq!(code, Some(0));
    let stats = lines.last().expect("a stats line");
    assert!(
        stats.starts_with(&format!("[stats: {FOO_INSNS} instructions,")),
        "{stats}"
    );
    assert!(stats.contains(" 0 errors, 0 bytes skipped]"), "{stats}");
    let insns: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .filter(|l| is_insn(l))
        .collect();
    assert_eq!(insns.len(), FOO_INSNS);
    let mut direct = 0;
    for (line, next) in insns.iter().zip(insns.iter().skip(1)) {
        let (_, text) = line.split_once("  ").expect("ip  disassembly");
        assert!(!text.is_empty() && !text.contains("(bad)"), "{line}");
        // A direct call or jump goes where its disassembly says (tracing
        // stays on in between for these: no event line between them).
        let target = text
            .strip_prefix("call 0x")
            .or_else(|| text.strip_prefix("jmp 0x"))
            .or_else(|| text.strip_prefix("jmp short 0x"));
        if let Some(hex) = target {
            let target = u64::from_str_radix(hex, 16).expect("hex target");
            let at = lines.iter().position(|l| l == line).unwrap_or(0);
            if lines.get(at + 1).is_some_and(|l| is_insn(l)) {
                assert_eq!(ip_of(next), target, "{line} then {next}");
                direct += 1;
            }
        }
        if direct > 200 {
            break;
        }
    }
    assert!(direct > 100, "only {direct} direct branches checked");
}

#[test]
fn foo_json_lines_carry_the_same_instructions() {
    let (code, lines) = flow(&foo().join("trace.pt"), &["--json"]);
    assert_eq!(code, Some(0));
    let values: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let ips: Vec<u64> = values
        .iter()
        .filter(|v| v["type"] == "insn")
        .map(|v| {
            let ip = v["ip"].as_str().expect("ip string");
            u64::from_str_radix(ip.trim_start_matches("0x"), 16).expect("hex ip")
        })
        .collect();
    let want: Vec<u64> = reference()
        .iter()
        .filter(|l| is_insn(l))
        .map(|l| ip_of(l))
        .collect();
    assert_eq!(ips, want);
    let events = values.iter().filter(|v| v["type"] == "event").count();
    assert_eq!(events, reference().iter().filter(|l| !is_insn(l)).count());
    assert!(
        values
            .iter()
            .filter(|v| v["type"] == "insn")
            .all(|v| v["disasm"].as_str().is_some_and(|d| !d.is_empty())
                && v["size"].as_u64().is_some_and(|s| (1..=15).contains(&s)))
    );
}

/// `hwtrace ptxed --block-decoder --stat:blocks` on foo, its page cache
/// (one run of pages) given as ptxed's `--raw`.
fn ptxed_blocks() -> u64 {
    let addrs = std::fs::read(foo().join("pages.addr")).expect("pages.addr reads");
    let pages: Vec<u64> = addrs
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    assert!(
        pages.windows(2).all(|w| w[1] == w[0] + 0x1000),
        "the pages are one run"
    );
    let raw = format!("{}:{:#x}", foo().join("pages.dump").display(), pages[0]);
    let trace = foo().join("trace.pt");
    let out = hwtrace(&[
        "ptxed",
        "--raw",
        &raw,
        "--pt",
        trace.to_str().expect("utf-8"),
        "--block-decoder",
        "--stat",
        "--stat:blocks",
        "--quiet",
    ]);
    let text = String::from_utf8(out.stdout).expect("utf-8");
    text.lines()
        .find_map(|l| l.strip_prefix("blocks:\t"))
        .and_then(|n| n.trim_end_matches('.').parse().ok())
        .unwrap_or_else(|| panic!("no block count in {text:?}"))
}

/// Blocks hold every instruction once, in order; branches are exactly the
/// transfers the instruction stream shows (a next IP other than the
/// fall-through, or an unconditional branch), plus one begin per enable and
/// one end per disable.
#[test]
fn foo_blocks_and_branches_account_for_every_instruction() {
    let trace = foo().join("trace.pt");
    let (_, json) = flow(&trace, &["--json", "--no-disasm"]);
    let items: Vec<Value> = json
        .iter()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let num = |v: &Value| {
        u64::from_str_radix(v.as_str().unwrap_or("x").trim_start_matches("0x"), 16).expect("hex")
    };

    let (code, blocks) = flow(&trace, &["--blocks", "--json", "--no-disasm", "--stats"]);
    assert_eq!(code, Some(0));
    let blocks: Vec<Value> = blocks
        .iter()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let in_blocks: u64 = blocks
        .iter()
        .filter(|v| v["type"] == "block")
        .map(|v| v["insns"].as_u64().expect("count"))
        .sum();
    assert_eq!(in_blocks, FOO_INSNS as u64);
    let stats = blocks.last().expect("stats");
    assert_eq!(stats["insns"], FOO_INSNS as u64);
    // As many blocks as ptxed's block decoder draws (hwtrace ptxed, checked
    // against libipt's corpus; libipt 2.0.5's pt_blk_next agrees on foo):
    // PSB+ in the middle of a block ends it there too.
    assert_eq!(stats["blocks"], ptxed_blocks());
    // Each block starts where an instruction starts and ends at the first
    // instruction that needs the trace to know what follows.
    let insns: Vec<&Value> = items.iter().filter(|v| v["type"] == "insn").collect();
    let mut at = 0usize;
    for b in blocks.iter().filter(|v| v["type"] == "block") {
        let n = usize::try_from(b["insns"].as_u64().expect("count")).expect("small");
        assert_eq!(num(&b["ip"]), num(&insns[at]["ip"]));
        assert_eq!(num(&b["end_ip"]), num(&insns[at + n - 1]["ip"]));
        at += n;
    }

    // Taken branches, from the instruction stream itself: whether the
    // branch `p` went to `to`.
    let taken = |p: &Value, to: u64| {
        let fall = num(&p["ip"]) + p["size"].as_u64().expect("size");
        match p["class"].as_str().expect("class") {
            "other" | "ptwrite" => false,
            "cond jump" => to != fall,
            _ => true,
        }
    };
    let mut expected = 0u64;
    let (mut begins, mut ends) = (0u64, 0u64);
    let mut prev: Option<&Value> = None;
    for v in &items {
        if v["type"] == "event" {
            match v["event"].as_str() {
                Some("enabled" | "resumed") => {
                    begins += 1;
                    prev = None;
                }
                Some("disabled") => {
                    ends += 1;
                    // Disabled asynchronously (an interrupt into the
                    // kernel): the branch before went where it hit.
                    if let (Some(p), Some(at)) = (prev, v.get("at")) {
                        expected += u64::from(taken(p, num(at)));
                    }
                    prev = None;
                }
                _ => {}
            }
            continue;
        }
        if let Some(p) = prev {
            expected += u64::from(taken(p, num(&v["ip"])));
        }
        prev = Some(v);
    }
    let (code, branches) = flow(&trace, &["--branches"]);
    assert_eq!(code, Some(0));
    let count = |needle: &str| branches.iter().filter(|l| l.contains(needle)).count() as u64;
    let strt = count("  tr strt");
    let end = count("  tr end") + count(" (tr end)");
    assert_eq!((strt, end), (begins, ends));
    let plain = branches
        .iter()
        .filter(|l| l.contains(" => ") && !l.contains("tr strt") && !l.contains("tr end"))
        .count() as u64;
    assert_eq!(plain, expected);
    assert!(expected > 10_000, "{expected}");
}

/// Overwrites the first TIP past the middle of the trace with an unknown
/// opcode: the error names that offset, decoding resumes at the next PSB
/// with the gap reported, and what follows is the clean decode's tail.
#[test]
fn a_broken_byte_gives_an_error_and_a_resync() {
    let trace = foo().join("trace.pt");
    let mut bytes = std::fs::read(&trace).expect("trace reads");
    let out = hwtrace(&["dump", "--json", trace.to_str().expect("utf-8")]);
    let packets: Vec<Value> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let offset = |p: &Value| p["offset"].as_u64().expect("offset");
    let half = bytes.len() as u64 / 2;
    let tip = packets
        .iter()
        .find(|p| p["kind"] == "tip" && offset(p) > half)
        .map(offset)
        .expect("a TIP past the middle");
    let psb = packets
        .iter()
        .find(|p| p["kind"] == "psb" && offset(p) > tip)
        .map(offset)
        .expect("a PSB after it");
    let at = usize::try_from(tip).expect("small");
    bytes[at] = 0x02;
    bytes[at + 1] = 0xff;
    let broken = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-flow-cli-{}.pt", std::process::id()));
    std::fs::write(&broken, &bytes).expect("write");
    let (code, lines) = flow(&broken, &["--no-disasm", "--stats"]);
    let _ = std::fs::remove_file(&broken);
    assert_eq!(code, Some(2), "errors give exit code 2");

    let errors: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains(": error: "))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "{:?}",
        errors.iter().map(|&i| &lines[i]).collect::<Vec<_>>()
    );
    let e = errors[0];
    let prefix = format!("[{tip:x}, ");
    assert!(lines[e].starts_with(&prefix), "{}", lines[e]);
    assert!(
        lines[e].ends_with(": error: unknown opcode]"),
        "{}",
        lines[e]
    );
    assert_eq!(
        lines[e + 1],
        format!(
            "[resync at {psb:x}: {} bytes from {tip:x} skipped]",
            psb - tip
        )
    );
    let stats = lines.last().expect("stats");
    assert!(stats.contains(" 1 errors, "), "{stats}");
    assert!(
        stats.contains(&format!(" {} bytes skipped]", psb - tip)),
        "{stats}"
    );

    // Before the error: the reference's beginning; after the resync: its end.
    let want: Vec<u64> = reference()
        .iter()
        .filter(|l| is_insn(l))
        .map(|l| ip_of(l))
        .collect();
    let before: Vec<u64> = lines[..e]
        .iter()
        .filter(|l| is_insn(l))
        .map(|l| ip_of(l))
        .collect();
    let after: Vec<u64> = lines[e + 2..lines.len() - 1]
        .iter()
        .filter(|l| is_insn(l))
        .map(|l| ip_of(l))
        .collect();
    assert!(!before.is_empty() && !after.is_empty());
    assert_eq!(&want[..before.len()], &before[..]);
    assert_eq!(&want[want.len() - after.len()..], &after[..]);
    assert!(before.len() + after.len() < want.len());
}

#[test]
fn without_code_it_says_what_to_give() {
    let trace = foo().join("trace.pt");
    let out = hwtrace(&["flow", trace.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("give --image, --elf, --pe, --pages or --dump"),
        "{err}"
    );
    let out = hwtrace(&["flow", "/nonexistent/trace.pt", "--pages", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/trace.pt"));
}

/// `real/Unzip` and `real/icelake_tip` have errors (libipt reports them
/// too): the instructions are ptxed's, and so are the errors' offsets and
/// kinds. hwtrace adds a resync line after each and names the IP decoding
/// was at where ptxed prints 0.
#[test]
fn unzip_and_icelake_errors_are_ptxeds() {
    let real = foo().join("..");
    for (case, want_insns) in [("Unzip", 121_052), ("icelake_tip", 0)] {
        let dir = real.join(case);
        let out = flow_over(&dir, &dir.join("trace.pt"), &["--no-disasm"]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{case}: errors give exit code 2"
        );
        // Unzip's errors are PSB+ status updates: the user is told of
        // --lenient.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.contains("--lenient"),
            case == "Unzip",
            "{case}: {stderr}"
        );
        let got = String::from_utf8(out.stdout).expect("utf-8");
        let want =
            std::fs::read_to_string(dir.join("reference/ptxed-insn.txt")).expect("reference reads");
        let insns = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| !l.is_empty() && is_insn(l))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(insns(&got).len(), want_insns, "{case}");
        assert!(insns(&got) == insns(&want), "{case}: instructions differ");
        // `[offset, ip: error: what]` without the IP.
        let errors = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.contains(": error: "))
                .map(|l| {
                    let (offset, rest) = l.split_once(", ").expect("offset, ip");
                    let (_, what) = rest.split_once(": ").expect("ip: what");
                    format!("{offset} {what}")
                })
                .collect()
        };
        let e = errors(&got);
        assert!(!e.is_empty(), "{case}");
        assert_eq!(e, errors(&want), "{case}");
        let resyncs = got
            .lines()
            .filter(|l| l.starts_with("[resync at ") || l.starts_with("[no PSB after "))
            .count();
        assert_eq!(resyncs, e.len(), "{case}: one resync per error");
    }
}

/// `--lenient` reads tracing's status as perf does: on Unzip, where
/// libipt stops at a PSB+ that says tracing is on after an asynchronous
/// disable (and at the TIP.PGE after it), it decodes on without an error to
/// exactly Linux perf's instructions (`reference/perf-insn.txt`, 149,576 of
/// them), on foo it changes nothing, and on one or two threads alike.
/// icelake_tip, where libipt decodes nothing, gives the edges libxdc saw.
#[test]
fn lenient_status_decodes_as_perf_does() {
    let real = foo().join("..");
    let run = |dir: &Path, extra: &[&str]| {
        let mut args = vec!["--no-disasm", "--lenient"];
        args.extend_from_slice(extra);
        let out = flow_over(dir, &dir.join("trace.pt"), &args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{}: {stderr}", dir.display());
        let text = String::from_utf8(out.stdout).expect("utf-8");
        assert!(!text.contains(": error: "), "{}", dir.display());
        let ips: Vec<u64> = text
            .lines()
            .filter(|l| !l.is_empty() && is_insn(l))
            .map(ip_of)
            .collect();
        ips
    };
    for (case, want_insns) in [("Unzip", 149_576), ("foo", FOO_INSNS)] {
        let dir = real.join(case);
        let perf: Vec<u64> = std::fs::read_to_string(dir.join("reference/perf-insn.txt"))
            .expect("reference reads")
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| u64::from_str_radix(l.trim(), 16).expect("hex"))
            .collect();
        assert_eq!(perf.len(), want_insns, "{case}");
        let one = run(&dir, &["--jobs", "1"]);
        assert!(
            one == perf,
            "{case}: not perf's instructions ({} of {})",
            one.len(),
            perf.len()
        );
        assert!(
            run(&dir, &["--jobs", "2", "--unit-bytes", "512"]) == perf,
            "{case}: --jobs 2"
        );
    }
    // icelake_tip: tracing enabled after PSB+ at 0xffffffffc038103c; the
    // edges libxdc reports between there and the last FUP.
    let ips = run(&real.join("icelake_tip"), &["--jobs", "1"]);
    assert_eq!(ips.first(), Some(&0xffff_ffff_c038_103c), "{ips:x?}");
    for (from, to) in [
        (0xffff_ffff_c038_1050u64, 0xffff_ffff_c038_1052u64),
        (0xffff_ffff_c038_1055, 0xffff_ffff_c038_106c),
        (0xffff_ffff_c038_106f, 0xffff_ffff_c038_1073),
        (0xffff_ffff_c038_1081, 0xffff_ffff_c038_108a),
    ] {
        assert!(
            ips.windows(2).any(|w| w == [from, to]),
            "edge {from:#x}->{to:#x} in {ips:x?}"
        );
    }
}

/// Single corrupted bytes anywhere in real/foo (a fixed pseudo-random set):
/// hwtrace flow always ends, within a minute, with exit code 0 (the byte
/// did not matter) or 2 (errors reported), never a panic or a hang.
#[test]
fn corrupted_bytes_never_hang_or_panic() {
    let trace = foo().join("trace.pt");
    let clean = std::fs::read(&trace).expect("trace reads");
    let pages = foo();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let (mut clean_runs, mut error_runs) = (0, 0);
    for n in 0..48 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let at = usize::try_from((x >> 33) % clean.len() as u64).expect("small");
        let mut bytes = clean.clone();
        bytes[at] ^= ((x >> 8) as u8) | 1;
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "hwtrace-flow-corrupt-{}-{n}.pt",
            std::process::id()
        ));
        std::fs::write(&path, &bytes).expect("write");
        let mut child = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
            .args([
                "flow",
                path.to_str().expect("utf-8"),
                "--pages",
                pages.to_str().expect("utf-8"),
                "--quiet",
                "--stats",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("hwtrace starts");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("byte {at:#x} corrupted: hwtrace flow did not end within a minute");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let _ = std::fs::remove_file(&path);
        match status.code() {
            Some(0) => clean_runs += 1,
            Some(2) => error_runs += 1,
            other => panic!("byte {at:#x} corrupted: exit {other:?}"),
        }
    }
    eprintln!("{error_runs} runs with errors, {clean_runs} without");
    assert!(
        error_runs > 0,
        "no corruption was noticed ({clean_runs} clean runs)"
    );
}
