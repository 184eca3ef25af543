//! The flow decoder on a trace from real hardware: `real/foo`, a kAFL/Nyx
//! fuzzing run, decoded over its page cache, must give libipt ptxed's
//! instruction addresses and enable/disable events line for line
//! (`reference/ptxed-insn.txt`, 117,967 instructions).

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
                lines.push(format!("[sync error: {}]", e.kind));
                continue;
            }
        };
        loop {
            while status.event_pending {
                match dec.event() {
                    Ok((ev, s)) => {
                        status = s;
                        if !ev.status_update {
                            if let Some(t) = event_text(&ev.kind, true) {
                                lines.push(t);
                            }
                        }
                    }
                    Err(e) => {
                        lines.push(format!("[error: {}]", e.kind));
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
                    status = s;
                }
                Err(e) => {
                    if e.kind == ErrorKind::Eos {
                        break 'sync;
                    }
                    lines.push(format!("[error: {}]", e.kind));
                    continue 'sync;
                }
            }
        }
    }
    (lines, insns)
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
