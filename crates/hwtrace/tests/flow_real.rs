//! The flow decoder on traces from real hardware (kAFL/Nyx fuzzing runs,
//! `../shared/corpus/real/`), each decoded over its page cache, must give
//! libipt ptxed's instruction addresses, events and errors line for line
//! (`reference/ptxed-insn.txt`; on `foo`, 117,967 instructions).

use hwtrace_flow::event::EventKind;
use hwtrace_flow::insn::{Insn, InsnDecoder};
use hwtrace_flow::{Config, ErrorKind};
use hwtrace_mem::image::Image;
use hwtrace_mem::pagecache::PageCache;
use std::path::{Path, PathBuf};

fn case_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/real/foo")
}

fn event_text(kind: &EventKind, resumed_ok: bool) -> Option<String> {
    Some(match kind {
        EventKind::Enabled { resumed, .. } => if *resumed && resumed_ok {
            "[resumed]"
        } else {
            "[enabled]"
        }
        .to_string(),
        EventKind::Disabled { .. } | EventKind::AsyncDisabled { .. } => "[disabled]".to_string(),
        EventKind::ExecMode { .. } => "[exec mode: 64-bit]".to_string(),
        EventKind::Overflow { .. } => "[overflow]".to_string(),
        _ => return None,
    })
}

/// Decodes the whole trace the way ptxed's loop does and returns its
/// lines: instruction addresses and the events ptxed prints.
fn decode(trace: &[u8], image: &Image) -> (Vec<String>, usize) {
    let mut dec = InsnDecoder::new(trace, Config::default(), image);
    let mut lines = Vec::new();
    let mut insns = 0;
    'sync: loop {
        let mut status = match dec.sync_forward() {
            Ok(s) => s,
            Err(e) if e.kind == ErrorKind::Eos => break,
            Err(e) => {
                lines.push(format!("[{:x}, 0: sync error: {}]", e.offset.0, e.kind));
                continue;
            }
        };
        // ptxed names the IP decoding had reached (0 before the first
        // instruction) for errors found between instructions.
        let mut decoded = false;
        loop {
            while status.event_pending {
                match dec.event() {
                    Ok((ev, s)) => {
                        status = s;
                        if !ev.status_update
                            && let Some(t) = event_text(&ev.kind, true)
                        {
                            lines.push(t);
                        }
                    }
                    Err(e) => {
                        let ip = if decoded { dec.ip() } else { 0 };
                        lines.push(format!(
                            "[{:x}, {:x}: error: {}]",
                            dec.offset().0,
                            ip,
                            e.kind
                        ));
                        continue 'sync;
                    }
                }
            }
            if status.eos {
                break 'sync;
            }
            let mut insn = Insn::empty(0, None, false);
            match dec.next_insn(&mut insn) {
                Ok(s) => {
                    insns += 1;
                    lines.push(format!("{:016x}", insn.ip));
                    decoded = true;
                    status = s;
                }
                Err(e) => {
                    if insn.class != hwtrace_flow::insn::InsnClass::Unknown {
                        insns += 1;
                        lines.push(format!("{:016x}", insn.ip));
                    }
                    if e.kind == ErrorKind::Eos {
                        break 'sync;
                    }
                    lines.push(format!(
                        "[{:x}, {:x}: error: {}]",
                        dec.offset().0,
                        insn.ip,
                        e.kind
                    ));
                    continue 'sync;
                }
            }
        }
    }
    (lines, insns)
}

/// Decodes a real case; returns our lines and libipt ptxed's.
fn run_case(name: &str) -> (Vec<String>, Vec<String>, usize) {
    let dir = case_dir().join("..").join(name);
    let cache = PageCache::open_files(&dir.join("pages.addr"), &dir.join("pages.dump"))
        .expect("page cache loads");
    let mut image = Image::new();
    image.add_page_cache(None, cache, name);
    let trace = std::fs::read(dir.join("trace.pt")).expect("trace reads");
    let reference =
        std::fs::read_to_string(dir.join("reference/ptxed-insn.txt")).expect("reference reads");
    let want = reference
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let (got, insns) = decode(&trace, &image);
    (got, want, insns)
}

/// `Unzip` and `icelake_tip` have trace errors (a status update that
/// contradicts the decoded state; PSB+ with tracing on followed by
/// TIP.PGE, which libipt rejects and perf accepts): hwtrace reports the
/// same errors at the same offsets and IPs, and the same instructions.
#[test]
fn real_traces_with_errors_match_libipt() {
    for name in ["Unzip", "icelake_tip"] {
        let (got, want, _) = run_case(name);
        let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        assert!(
            got == want,
            "{name}: first {same} of {} reference lines equal; next: expected {:?}, got {:?}",
            want.len(),
            want.get(same),
            got.get(same)
        );
    }
}

#[test]
fn real_foo_matches_libipt() {
    let dir = case_dir();
    let cache = PageCache::open_files(&dir.join("pages.addr"), &dir.join("pages.dump"))
        .expect("page cache loads");
    let mut image = Image::new();
    image.add_page_cache(None, cache, "foo");
    let trace = std::fs::read(dir.join("trace.pt")).expect("trace reads");
    let reference =
        std::fs::read_to_string(dir.join("reference/ptxed-insn.txt")).expect("reference reads");
    let want: Vec<&str> = reference.lines().filter(|l| !l.is_empty()).collect();

    let (got, insns) = decode(&trace, &image);
    let want_insns = want.iter().filter(|l| !l.starts_with('[')).count();
    if let Some(i) = (0..want.len().max(got.len()))
        .find(|&i| want.get(i).copied() != got.get(i).map(String::as_str))
    {
        let from = i.saturating_sub(3);
        panic!(
            "first difference at line {}: expected {:?}, got {:?}\ncontext expected {:?}\ncontext got {:?}",
            i + 1,
            want.get(i),
            got.get(i),
            &want[from..(i + 3).min(want.len())],
            &got[from..(i + 3).min(got.len())]
        );
    }
    assert_eq!(insns, want_insns);
    assert_eq!(insns, 117_967);
}
