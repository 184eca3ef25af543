//! Issue 6, "a trace that switches CR3 (PIP) between two processes in a
//! dump decodes each part in its own address space", over a real dump: the
//! Debian kernel and busybox processes `scripts/guest-dump.sh` boots under
//! QEMU and dumps (the test runs the script itself when the dump is
//! missing; `scripts/test.sh` runs it first, so that the guest boots once).
//!
//! `mem cr3s` finds the processes' page tables in the dump; hwtrace-sim's
//! walker makes up an execution over their real code (each process in its
//! own address space, switching every few hundred instructions, as a
//! scheduler would); its PT (PtEncoder, PIP at each switch, PSBs
//! periodically, with and without return compression) is decoded by
//! `hwtrace flow --dump`, which must give back exactly the walked
//! instructions, each in the address space it was walked in.
//!
//! The processes are busybox (a static executable at the same address in
//! every process) but each has faulted in different pages of it, and its
//! own vDSO: the walk starts in code that only its own process maps there,
//! and the test checks that decoding the same trace with every switch
//! naming one CR3 fails.

use hwtrace_mem::paging::{
    DEFAULT_MAX_TABLES, DEFAULT_MAX_TABLES_FOUND, PageTables, PagingConfig, Range, TopTableKind,
    find_top_tables, region_pages, summarize_user,
};
use hwtrace_mem::phys::Dump;
use hwtrace_mem::virt::DumpMemory;
use hwtrace_sim::PtConfig;
use hwtrace_sim::walk::{Stretch, WalkConfig, encode_switches, walk_spaces};
use hwtrace_types::{AddressSpace, Cr3, Ip, ReadMemory};
use iced_x86::{Decoder, DecoderOptions, FlowControl};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One boot at a time (tests of this file run in parallel).
static BOOT: Mutex<()> = Mutex::new(());

/// The dump of the guest booted with `level`-level paging, booting it (with
/// few gva2gpa samples: the full check is `scripts/test.sh`'s) if missing.
fn guest_dump(level: u8) -> PathBuf {
    let dir = repo().join("target/guest");
    let dump = dir.join(format!("la{level}/guest.elf"));
    let _one = BOOT.lock().unwrap_or_else(|e| e.into_inner());
    if !dump.exists() {
        let status = Command::new("bash")
            .arg(repo().join("scripts/guest-dump.sh"))
            .arg(&dir)
            .env("HWTRACE", env!("CARGO_BIN_EXE_hwtrace"))
            .env("LEVELS", level.to_string())
            .env("SAMPLES", "300")
            .status()
            .expect("bash runs");
        assert!(
            status.success() && dump.exists(),
            "scripts/guest-dump.sh failed to make {}: it needs qemu-system-x86 and apt access to Debian's linux-image-amd64 and busybox-static (see scripts/setup.sh)",
            dump.display()
        );
    }
    dump
}

/// A process chosen for the walk.
struct Space {
    cr3: Cr3,
    exec: Vec<Range>,
}

/// Up to `n` processes with different executable layouts (busybox pages
/// faulted in, the vDSO's address), not starting with vCPU 0's own.
fn processes(dump: &Dump, config: &PagingConfig, n: usize) -> Vec<Space> {
    let vcpu = dump.cpus()[0].cr3();
    let scan = find_top_tables(
        dump,
        region_pages(dump.regions()),
        config,
        vcpu,
        DEFAULT_MAX_TABLES_FOUND,
    )
    .expect("scan");
    let mut out: Vec<Space> = Vec::new();
    for t in scan
        .tables
        .iter()
        .filter(|t| t.kind == TopTableKind::Process)
    {
        let summary = summarize_user(&PageTables::new(dump, t.cr3, *config), DEFAULT_MAX_TABLES);
        let layout = |s: &Space| s.exec.iter().map(|r| (r.start, r.size)).collect::<Vec<_>>();
        let space = Space {
            cr3: t.cr3,
            exec: summary.exec_ranges,
        };
        if !space.exec.is_empty() && out.iter().all(|o| layout(o) != layout(&space)) {
            out.push(space);
        }
    }
    // The first stretch must take its CR3 from the trace, not from the
    // dump's vCPU.
    out.sort_by_key(|s| s.cr3.0 == config.root_table(vcpu).0);
    out.truncate(n);
    out
}

/// Whether the page of `va` translates, in every space of `others`, to
/// something other than it does in `cr3` (or not at all): code there can
/// only be read in its own space.
fn own_page<M: hwtrace_types::PhysMemory>(
    mem: &DumpMemory<M>,
    cr3: Cr3,
    others: &[Cr3],
    va: Ip,
) -> bool {
    let pa = |c: Cr3| {
        mem.translate(AddressSpace::with_cr3(c), va)
            .and_then(Result::ok)
            .map(|t| t.pa.0 & !0xfff)
    };
    let mine = pa(cr3);
    mine.is_some() && others.iter().all(|&o| pa(o) != mine)
}

/// Start points: direct-call targets found by decoding the space's
/// executable ranges (at most 1 MiB) in pages only this space maps there
/// (none when it shares all its code with `others`: a forked process that
/// faulted in nothing of its own).
fn starts<M: hwtrace_types::PhysMemory>(
    mem: &DumpMemory<M>,
    space: &Space,
    others: &[Cr3],
) -> Vec<Ip> {
    let aspace = AddressSpace::with_cr3(space.cr3);
    let mut targets = Vec::new();
    let mut budget: u64 = 1 << 20;
    for r in &space.exec {
        let len = r.size.min(budget);
        budget -= len;
        let mut bytes = vec![0u8; len as usize];
        let n = mem
            .read_memory(aspace, r.start, &mut bytes)
            .expect("executable range reads");
        let mut d = Decoder::with_ip(64, &bytes[..n], r.start.0, DecoderOptions::NONE);
        while d.can_decode() {
            let insn = d.decode();
            let t = insn.near_branch_target();
            if insn.flow_control() == FlowControl::Call && t >= r.start.0 && t - r.start.0 < r.size
            {
                targets.push(Ip(t));
            }
        }
    }
    targets.sort_by_key(|t| t.0);
    targets.dedup();
    targets.retain(|&t| own_page(mem, space.cr3, others, t));
    // Spread the picks over the code.
    let step = (targets.len() / 32).max(1);
    targets.into_iter().step_by(step).take(32).collect()
}

/// `(cr3, ip)` of every instruction `hwtrace flow --json` prints, the CR3
/// starting as `first` and following the paging events; errors are
/// returned as the second value.
fn decode(trace: &Path, dump: &Path, first: Cr3) -> (Vec<(u64, u64)>, Vec<String>, Option<i32>) {
    let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(["flow", "--json", "--no-disasm", "--dump"])
        .arg(dump)
        .arg(trace)
        .output()
        .expect("hwtrace runs");
    let hex = |v: &serde_json::Value| {
        u64::from_str_radix(v.as_str().expect("hex string").trim_start_matches("0x"), 16)
            .expect("hex")
    };
    let mut cr3 = first.0;
    let mut insns = Vec::new();
    let mut errors = Vec::new();
    for line in String::from_utf8(out.stdout).expect("utf-8").lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        match v["type"].as_str() {
            Some("insn") => insns.push((cr3, hex(&v["ip"]))),
            Some("event") if !v["cr3"].is_null() => cr3 = hex(&v["cr3"]),
            Some("error") | Some("resync") => errors.push(line.to_owned()),
            _ => {}
        }
    }
    (insns, errors, out.status.code())
}

fn walked(stretches: &[Stretch]) -> Vec<(u64, u64)> {
    stretches
        .iter()
        .flat_map(|s| s.execution.insns().iter().map(|i| (s.cr3.0, i.0)))
        .collect()
}

fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-pip-guest-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).expect("scratch file");
    path
}

/// The whole check on the dump of `level`-level paging.
fn switches_decode_in_their_own_spaces(level: u8, seed: u64) {
    let path = guest_dump(level);
    let dump = Dump::open(&path, None).expect("dump opens");
    let cpu = dump.cpus()[0];
    let config = PagingConfig::with_mode(cpu.paging_mode());
    let candidates = processes(&dump, &config, 8);
    let kernel_entry = (cpu.rip >> 63 == 1).then_some(Ip(cpu.rip));
    let mem = DumpMemory::new(dump, None, config);
    // Up to three processes, each with code of its own to start in (which
    // processes have some depends on what the guest did before the dump).
    let all: Vec<Cr3> = candidates.iter().map(|s| s.cr3).collect();
    let (spaces, starts): (Vec<Space>, Vec<(Cr3, Vec<Ip>)>) = candidates
        .into_iter()
        .filter_map(|s| {
            let others: Vec<Cr3> = all.iter().copied().filter(|&c| c != s.cr3).collect();
            let st = starts(&mem, &s, &others);
            let cr3 = s.cr3;
            (!st.is_empty()).then_some((s, (cr3, st)))
        })
        .take(3)
        .unzip();
    assert!(
        spaces.len() >= 2,
        "{}: fewer than two processes with code of their own found",
        path.display()
    );
    let cr3s: Vec<Cr3> = spaces.iter().map(|s| s.cr3).collect();
    let walk = WalkConfig {
        seed,
        slice_len: 400,
        slices: 4 * spaces.len(),
        max_restarts: 64,
    };
    let stretches = walk_spaces(&mem, &starts, &walk).expect("walk");
    let expected = walked(&stretches);
    assert!(
        expected.len() > 1000,
        "{} instructions walked",
        expected.len()
    );

    // Each space ran code the others cannot read there.
    for s in &spaces {
        let others: Vec<Cr3> = cr3s.iter().copied().filter(|&c| c != s.cr3).collect();
        let own = expected
            .iter()
            .filter(|(c, ip)| *c == s.cr3.0 && own_page(&mem, s.cr3, &others, Ip(*ip)))
            .count();
        assert!(
            own > 0,
            "{:#x}: every walked instruction is shared",
            s.cr3.0
        );
    }

    for compression in [true, false] {
        let pt = PtConfig {
            return_compression: compression,
            // A PSB+ with its PIP, MODE.Exec and FUP takes about 35 bytes,
            // and each stretch is encoded on its own (its opening PSB+
            // replaced by the switch's PIP). Without return compression,
            // 40 puts PSBs inside stretches of a few dozen instructions
            // too, which the processes of some dumps keep restarting in;
            // with it, 48 leaves returns room to find their calls after
            // the last PSB (the hardware's smallest period, 2 KiB, is
            // longer than this whole trace).
            psb_period: if compression { 48 } else { 40 },
            ..PtConfig::default()
        };
        let trace = encode_switches(&stretches, pt, kernel_entry).expect("encode");
        assert_eq!(trace.switch_pips, walk.slices - 1);
        if compression {
            assert!(trace.compressed_returns > 0, "no compressed return");
        } else {
            assert!(trace.psbs.len() >= 8, "{} PSBs", trace.psbs.len());
            assert_eq!(trace.compressed_returns, 0);
        }
        let file = scratch(&format!("la{level}-{compression}.pt"), &trace.bytes);
        let (decoded, errors, code) = decode(&file, &path, stretches[0].cr3);
        eprintln!(
            "{level}-level, return compression {compression}: {} processes, {} instructions in {} stretches, {} switches, {} PSBs, {} compressed returns, {} trace bytes; {} decoded",
            spaces.len(),
            expected.len(),
            stretches.len(),
            trace.switch_pips,
            trace.psbs.len(),
            trace.compressed_returns,
            trace.bytes.len(),
            decoded.len()
        );
        assert_eq!(
            errors,
            Vec::<String>::new(),
            "return compression {compression}"
        );
        assert_eq!(code, Some(0));
        assert_eq!(
            decoded.len(),
            expected.len(),
            "return compression {compression}"
        );
        let first_diff = decoded.iter().zip(&expected).position(|(a, b)| a != b);
        assert_eq!(first_diff, None, "return compression {compression}");
        let _ = std::fs::remove_file(file);

        // From a PSB in the second half, in a space other than the vCPU's:
        // the decoder takes the CR3 from the PIP in that PSB+.
        let vcpu = config.root_table(cpu.cr3()).0;
        let mark = trace.psbs[trace.psbs.len() / 2..]
            .iter()
            .find(|m| expected[m.insn_index].0 != vcpu)
            .expect("a PSB in another space");
        let from = &trace.bytes[mark.offset.0 as usize..];
        let file = scratch(&format!("la{level}-{compression}-from.pt"), from);
        let (decoded, errors, code) = decode(&file, &path, Cr3(expected[mark.insn_index].0));
        assert_eq!(
            errors,
            Vec::<String>::new(),
            "from PSB at {}",
            mark.offset.0
        );
        assert_eq!(code, Some(0));
        assert!(
            decoded == expected[mark.insn_index..],
            "from PSB at {}: {} instructions decoded, {} expected",
            mark.offset.0,
            decoded.len(),
            expected.len() - mark.insn_index
        );
        let _ = std::fs::remove_file(file);
    }

    // The same trace with every PIP naming the first space: the other
    // spaces' code is read in the wrong address space, and the decode fails.
    let wrong: Vec<Stretch> = stretches
        .iter()
        .map(|s| Stretch {
            cr3: stretches[0].cr3,
            execution: s.execution.clone(),
        })
        .collect();
    let trace = encode_switches(&wrong, PtConfig::default(), kernel_entry).expect("encode");
    let file = scratch(&format!("la{level}-wrong.pt"), &trace.bytes);
    let (decoded, errors, code) = decode(&file, &path, stretches[0].cr3);
    let flat: Vec<u64> = decoded.iter().map(|d| d.1).collect();
    let want: Vec<u64> = expected.iter().map(|e| e.1).collect();
    assert!(
        flat != want && !errors.is_empty() && code == Some(2),
        "decoding in one address space should fail"
    );
    let _ = std::fs::remove_file(file);
}

#[test]
fn pip_switches_decode_in_their_own_spaces_4_level() {
    switches_decode_in_their_own_spaces(4, 6);
}

#[test]
fn pip_switches_decode_in_their_own_spaces_5_level() {
    switches_decode_in_their_own_spaces(5, 7);
}

/// `mem cr3s` on the real guest: the vCPU's CR3 among the tables found,
/// and processes of both kinds the guest runs (the shells and the `sleep`s
/// fault in different pages of busybox).
#[test]
fn cr3s_lists_the_guest_processes() {
    let path = guest_dump(4);
    let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(["mem", "cr3s", "--dump"])
        .arg(&path)
        .output()
        .expect("hwtrace runs");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let dump = Dump::open(&path, None).expect("dump");
    let vcpu = format!("{:#018x} ", dump.cpus()[0].cr3().0 & !0xfff);
    assert!(
        text.lines()
            .any(|l| l.starts_with(&vcpu) && l.ends_with("vCPU 0")),
        "{text}"
    );
    let procs: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("  process: ") && !l.contains(" 0 executable ranges"))
        .collect();
    // init (a `sleep` by now), its three subshells and their `sleep`s,
    // all waiting for as long as the guest runs.
    assert!(procs.len() >= 7, "{text}");
    let config = PagingConfig::with_mode(dump.cpus()[0].paging_mode());
    assert!(processes(&dump, &config, 8).len() >= 2, "{text}");
    assert!(
        text.lines()
            .last()
            .is_some_and(|l| l.contains(" top-level tables in "))
    );
}
