//! Blocks, edges and the output formats on hand-made flows.

use super::*;
use crate::exec::{ExecInsn, Mapping};
use crate::symbols::Symbolizer;
use hwtrace_types::{AddressSpace, TraceOffset};

fn insn(ip: u64, size: u8, class: InsnClass) -> Exec {
    Exec::Insn(ExecInsn {
        space: AddressSpace::UNKNOWN,
        ip: Ip(ip),
        size,
        class,
    })
}

fn gap(why: GapKind) -> Exec {
    Exec::Gap {
        offset: TraceOffset(0),
        why,
    }
}

/// 1000: nop; 1001: jz 1000 (taken twice, then not); 1003: ret
fn loop_flow() -> Vec<Exec> {
    let mut v = Vec::new();
    for _ in 0..3 {
        v.push(insn(0x1000, 1, InsnClass::Other));
        v.push(insn(0x1001, 2, InsnClass::CondJump));
    }
    v.push(insn(0x1003, 1, InsnClass::Return));
    v
}

#[test]
fn runs_cover_as_their_instructions_do() {
    // Loops, a disable, lost data, two threads, code at odd addresses
    // and blocks longer than a run.
    let mut flow = loop_flow();
    flow.push(gap(GapKind::Disabled));
    flow.extend(loop_flow());
    flow.push(gap(GapKind::Lost));
    for tid in [1, 2, 1] {
        flow.push(Exec::Thread {
            pid: Some(7),
            tid: Some(tid),
            cpu: None,
        });
        for k in 0..9u64 {
            flow.push(insn(0x2000 + 3 * k, 3, InsnClass::Other));
        }
        flow.push(insn(0x201b, 5, InsnClass::Call));
        flow.extend(loop_flow());
    }
    let want = Coverage::from_execs(&flow);
    assert!(want.edges.len() > 3, "{want:?}");
    for max in [1, 2, 4, 7, u32::MAX] {
        let runs = crate::exec::as_runs(&flow, max);
        assert!(
            runs.iter()
                .any(|e| matches!(e, Exec::Run(r) if r.insns > 1))
                || max == 1
        );
        assert_eq!(Coverage::from_execs(&runs), want, "runs of at most {max}");
    }
}

fn block(cov: &Coverage, start: u64) -> (usize, &Block) {
    cov.blocks
        .iter()
        .enumerate()
        .find(|(_, b)| b.start == Ip(start))
        .unwrap_or_else(|| panic!("no block at {start:#x}: {cov:?}"))
}

#[test]
fn blocks_end_at_control_transfers_and_edges_count_each_transfer() {
    let cov = Coverage::from_execs(&loop_flow());
    assert_eq!(cov.insns, 7);
    assert_eq!(cov.blocks.len(), 2);
    let (a, body) = block(&cov, 0x1000);
    assert_eq!(
        (body.end, body.last, body.insns, body.hits),
        (Ip(0x1003), Ip(0x1001), 2, 3)
    );
    let (r, ret) = block(&cov, 0x1003);
    assert_eq!((ret.end, ret.insns, ret.hits), (Ip(0x1004), 1, 1));
    let edges: Vec<(usize, usize, u64)> = cov
        .edges
        .iter()
        .map(|e| (e.from as usize, e.to as usize, e.hits))
        .collect();
    // Taken back twice, then falling through once.
    assert_eq!(edges, [(a, a, 2), (a, r, 1)]);
}

#[test]
fn a_disable_keeps_the_flow_and_lost_data_breaks_it() {
    let mut flow = loop_flow();
    flow.insert(2, gap(GapKind::Disabled));
    let cov = Coverage::from_execs(&flow);
    assert_eq!(cov.edges.iter().map(|e| e.hits).sum::<u64>(), 3);
    let mut flow = loop_flow();
    flow.insert(2, gap(GapKind::Overflow));
    let cov = Coverage::from_execs(&flow);
    assert_eq!(cov.edges.iter().map(|e| e.hits).sum::<u64>(), 2);
    // A gap inside a block cuts it: a shorter block at the same start.
    let flow = [
        insn(0x1000, 1, InsnClass::Other),
        gap(GapKind::DecodeError),
        insn(0x1000, 1, InsnClass::Other),
        insn(0x1001, 2, InsnClass::CondJump),
    ];
    let cov = Coverage::from_execs(&flow);
    let ends: Vec<u64> = cov.blocks.iter().map(|b| b.end.0).collect();
    assert_eq!(ends, [0x1001, 0x1003]);
    assert!(cov.edges.is_empty());
}

#[test]
fn a_stretch_carries_no_blocks_and_breaks_the_flow_as_lost_data_does() {
    // Joined runs (what a source hands out for the call structure only)
    // say nothing about the blocks inside: no block, no edge across it.
    let stretch = Exec::Stretch(ExecRun {
        space: AddressSpace::UNKNOWN,
        ip: Ip(0x1000),
        insns: 4,
        last_ip: Ip(0x1001),
        last_size: 2,
        last_class: InsnClass::CondJump,
    });
    let mut flow = loop_flow();
    flow.insert(2, stretch);
    let with = Coverage::from_execs(&flow);
    let mut flow = loop_flow();
    flow.insert(2, gap(GapKind::Overflow));
    let lost = Coverage::from_execs(&flow);
    assert_eq!(format!("{:?}", with.blocks), format!("{:?}", lost.blocks));
    assert_eq!(format!("{:?}", with.edges), format!("{:?}", lost.edges));
}

#[test]
fn threads_have_their_own_flows() {
    let thread = |tid| Exec::Thread {
        pid: Some(7),
        tid: Some(tid),
        cpu: None,
    };
    let flow = [
        thread(1),
        insn(0x1000, 1, InsnClass::Other),
        thread(2),
        insn(0x2000, 1, InsnClass::Jump),
        thread(1),
        insn(0x1001, 2, InsnClass::CondJump),
        insn(0x1003, 1, InsnClass::Return),
    ];
    let cov = Coverage::from_execs(&flow);
    // Thread 1's block was cut by the switch; it resumed at 0x1001.
    let starts: Vec<u64> = cov.blocks.iter().map(|b| b.start.0).collect();
    assert_eq!(starts, [0x1000, 0x1001, 0x1003, 0x2000]);
    assert!(cov.blocks.iter().all(|b| b.space.pid == Some(7)));
    let (b1000, _) = block(&cov, 0x1000);
    let (b1001, _) = block(&cov, 0x1001);
    let (b1003, _) = block(&cov, 0x1003);
    let edges: Vec<(usize, usize)> = cov
        .edges
        .iter()
        .map(|e| (e.from as usize, e.to as usize))
        .collect();
    assert_eq!(edges, [(b1000, b1001), (b1001, b1003)]);
}

#[test]
fn branch_records_bound_blocks_from_target_to_next_source() {
    let br = |from: u64, to: u64| Exec::Branch {
        from: Ip(from),
        to: Ip(to),
        class: InsnClass::Unknown,
    };
    let flow = [
        br(0x500, 0x1000),
        br(0x1010, 0x2000),
        br(0x2004, 0x1000),
        br(0x1010, 0x2000),
        // Too far from its target: records were lost.
        br(0x9000_0000, 0x3000),
    ];
    let cov = Coverage::from_execs(&flow);
    let blocks: Vec<(u64, u64, u64)> = cov
        .blocks
        .iter()
        .map(|b| (b.start.0, b.end.0, b.hits))
        .collect();
    assert_eq!(blocks, [(0x1000, 0x1011, 2), (0x2000, 0x2005, 1)]);
    let edges: Vec<(u32, u32, u64)> = cov.edges.iter().map(|e| (e.from, e.to, e.hits)).collect();
    assert_eq!(edges, [(0, 1, 1), (1, 0, 1)]);
}

#[test]
fn drcov_lays_blocks_out_per_module_and_unknown_code_gets_a_region() {
    let mut flow = loop_flow();
    flow.push(insn(0x7000_1234, 1, InsnClass::Return));
    let cov = Coverage::from_execs(&flow);
    let symbols = Symbolizer::from_mappings(&[Mapping {
        path: "/nonexistent/code.bin".into(),
        cr3: None,
        pid: None,
        start: Ip(0x1000),
        len: 0x100,
        file_offset: 0x400,
    }]);
    let t = drcov::table(&cov, &symbols);
    assert_eq!(t.modules.len(), 2);
    assert_eq!(t.modules[0].path, "/nonexistent/code.bin");
    // A file not read: its base is where file offset 0 would be.
    assert_eq!(t.modules[0].base, Ip(0xc00));
    assert_eq!(t.modules[1].path, "[unknown]");
    assert_eq!(t.modules[1].base, Ip(0x7000_1000));
    let rows: Vec<(u32, u16, u16)> = t
        .blocks
        .iter()
        .map(|b| (b.offset, b.size, b.module))
        .collect();
    assert_eq!(rows, [(0x400, 3, 0), (0x403, 1, 0), (0x234, 1, 1)]);
    assert_eq!(t.module_of, [Some(0), Some(0), Some(1)]);
    let mut out = Vec::new();
    drcov::write(&t, &mut out).unwrap();
    let text_end = out.len() - 3 * 8;
    let text = std::str::from_utf8(&out[..text_end]).unwrap();
    assert!(text.starts_with("DRCOV VERSION: 2\nDRCOV FLAVOR: drcov-hwtrace\nModule Table: version 2, count 2\nColumns: id, base, end, entry, path\n"), "{text}");
    assert!(text.ends_with("BB Table: 3 bbs\n"), "{text}");
    assert_eq!(&out[text_end..text_end + 8], &[0, 4, 0, 0, 3, 0, 0, 0]);
}

#[test]
fn the_afl_map_counts_each_edge_at_libxdcs_index() {
    let cov = Coverage::from_execs(&loop_flow());
    for which in [afl::AflEdges::Conditional, afl::AflEdges::All] {
        let map = afl::bitmap(&cov, which, afl::MAP_SIZE);
        assert_eq!(map.len(), afl::MAP_SIZE);
        let back = afl::edge_index(Ip(0x1001), Ip(0x1000));
        let out = afl::edge_index(Ip(0x1001), Ip(0x1003));
        assert_ne!(back, out);
        assert_eq!((map[back], map[out]), (2, 1));
        assert_eq!(map.iter().map(|&c| u64::from(c)).sum::<u64>(), 3);
    }
    // The mixer and index, worked by hand for one pair.
    assert_eq!(afl::mix(1), 0x7fb5_d329_728e_a185);
    assert_eq!(afl::edge_index(Ip(0), Ip(1)), 0xa185);
    assert_eq!(
        afl::edge_index(Ip(1), Ip(0)),
        (0x7fb5_d329_728e_a185u64 >> 1) as usize & 0xffff
    );
}

#[test]
fn libxdcs_map_counts_conditional_branches_alone() {
    // A call, a loop's jcc taken twice and not taken once, a return, a
    // jump: the conditional map holds the jcc's two edges, all of them
    // the call's, the return's and the jump's too; the jcc's edge across
    // an interrupt counts, one across lost data does not (no edge at all;
    // across a disable by the jcc itself: the test below).
    let mut flow = vec![insn(0x500, 5, InsnClass::Call)];
    flow.extend(loop_flow());
    flow.push(insn(0x505, 2, InsnClass::Jump));
    flow.push(insn(0x1000, 1, InsnClass::Other));
    flow.push(insn(0x1001, 2, InsnClass::CondJump));
    flow.push(gap(GapKind::Interrupted));
    flow.push(insn(0x1000, 1, InsnClass::Other));
    flow.push(insn(0x1001, 2, InsnClass::CondJump));
    flow.push(gap(GapKind::Lost));
    flow.push(insn(0x1003, 1, InsnClass::Return));
    let cov = Coverage::from_execs(&flow);
    let cond = afl::bitmap(&cov, afl::AflEdges::Conditional, afl::MAP_SIZE);
    let all = afl::bitmap(&cov, afl::AflEdges::All, afl::MAP_SIZE);
    let back = afl::edge_index(Ip(0x1001), Ip(0x1000));
    let out = afl::edge_index(Ip(0x1001), Ip(0x1003));
    let call = afl::edge_index(Ip(0x500), Ip(0x1000));
    let ret = afl::edge_index(Ip(0x1003), Ip(0x505));
    let jump = afl::edge_index(Ip(0x505), Ip(0x1000));
    assert_eq!((cond[back], cond[out]), (3, 1));
    assert_eq!(cond.iter().map(|&c| u64::from(c)).sum::<u64>(), 4);
    assert_eq!(
        (all[back], all[out], all[call], all[ret], all[jump]),
        (3, 1, 1, 1, 1)
    );
    assert_eq!(all.iter().map(|&c| u64::from(c)).sum::<u64>(), 7);
    // A larger map: the same counts at the index's wider bits (the low
    // sixteen the same).
    let big = afl::bitmap(&cov, afl::AflEdges::Conditional, 1 << 20);
    let wide = afl::edge_slot(Ip(0x1001), Ip(0x1000), 1 << 20);
    assert_eq!((big.len(), big[wide], wide & 0xffff), (1 << 20, 3, back));
    assert_eq!(big.iter().map(|&c| u64::from(c)).sum::<u64>(), 4);
    let block = cov.blocks.iter().find(|b| b.start == Ip(0x1000)).unwrap();
    assert_eq!(
        (block.last, block.last_class),
        (Ip(0x1001), InsnClass::CondJump)
    );
}

/// SMHasher's check of a hash function: keys of 0 to 255 bytes
/// (`0, 1, 2, ...`), each hashed with seed 256 - length; the digests
/// one after the other hashed with seed 0; the first four bytes of that.
/// Every tail length and seed goes through it.
#[test]
fn murmur3_passes_smhashers_verification() {
    let key: Vec<u8> = (0..=255u8).collect();
    let mut digests = Vec::new();
    for len in 0..256usize {
        let (h1, h2) = afl::murmur3_x64_128(&key[..len], 256 - len as u32);
        digests.extend_from_slice(&h1.to_le_bytes());
        digests.extend_from_slice(&h2.to_le_bytes());
    }
    let (h1, _) = afl::murmur3_x64_128(&digests, 0);
    // SMHasher's table: MurmurHash3_x64_128 ("Murmur3F"), 0x6384BA69.
    assert_eq!(h1 as u32, 0x6384_ba69);
    // An empty input with seed 0 hashes to zero (the finaliser of 0 is 0).
    assert_eq!(afl::murmur3_x64_128(&[], 0), (0, 0));
    assert_ne!(afl::libxdc_hash(&[0; afl::MAP_SIZE]), 0);
}

#[test]
fn json_names_every_block_and_edge() {
    let cov = Coverage::from_execs(&loop_flow());
    let symbols = Symbolizer::new();
    let t = drcov::table(&cov, &symbols);
    let mut out = Vec::new();
    json::write(&cov, &t, &symbols, &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["summary"]["blocks"], 2);
    assert_eq!(v["blocks"][0]["start"], "0x1000");
    assert_eq!(v["blocks"][0]["hits"], 3);
    assert_eq!(v["blocks"][0]["module"], 0);
    assert_eq!(v["modules"][0]["path"], "[unknown]");
    assert_eq!(v["edges"].as_array().map(Vec::len), Some(2));
}

/// lcov over DWARF: a program gcc builds with `-g`; a block covering one
/// function gives its lines that block's count, the other function's
/// lines 0.
#[test]
fn lcov_counts_lines_of_the_blocks_that_ran() {
    use crate::symbols::{ObjectInfo, Placement, Space};
    use std::process::Command;
    let dir = std::env::temp_dir().join(format!("hwtrace-lcov-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("l.c");
    std::fs::write(
        &src,
        "int twice(int v) {\n    return v * 2;\n}\n\nint main(int argc, char **argv) {\n    return twice(argc);\n}\n",
    )
    .unwrap();
    let exe = dir.join("l");
    let status = Command::new("gcc")
        .args(["-g", "-O0", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("gcc runs (Debian package gcc)");
    assert!(status.success());
    let info = ObjectInfo::load(&exe).unwrap();
    let twice = info.funcs().iter().find(|f| &*f.name == "twice").unwrap();
    let bias = 0x10_0000_0000u64;
    let mut symbols = Symbolizer::new();
    symbols
        .add_file(&exe, Placement::Bias(bias), Space::ANY)
        .unwrap();
    let start = twice.addr + bias;
    let cov = Coverage {
        blocks: vec![Block {
            space: Space::ANY,
            start: Ip(start),
            end: Ip(start + twice.size),
            last: Ip(start + twice.size - 1),
            last_class: InsnClass::Return,
            insns: 0,
            hits: 5,
        }],
        edges: Vec::new(),
        insns: 0,
    };
    let counts = lcov::line_counts(&cov, &symbols);
    let file = src.display().to_string();
    let lines = counts.get(&file).unwrap_or_else(|| panic!("{counts:?}"));
    assert_eq!(lines.get(&1), Some(&5), "{lines:?}");
    assert_eq!(lines.get(&2), Some(&5), "{lines:?}");
    assert_eq!(lines.get(&3), Some(&5), "{lines:?}");
    assert_eq!(lines.get(&6), Some(&0), "{lines:?}");
    let mut out = Vec::new();
    lcov::write(&counts, "unit test", &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("TN:unit_test\n"), "{text}");
    assert!(
        text.contains(&format!("SF:{file}\nDA:1,5\nDA:2,5\nDA:3,5\n")),
        "{text}"
    );
    assert!(text.contains("LH:3\nend_of_record\n"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A pseudo-random flow over a small program: blocks of one to four
/// instructions ending in every kind of control transfer (or running on
/// into the next block), walked by two threads of two processes, under
/// two CR3s, with disables, lost data and overflows in between; then cut
/// into runs of at most `max` instructions.
fn random_flow(seed: u64, len: usize, max: u32) -> Vec<Exec> {
    random_flow_of(seed, len, max, true)
}

/// [`random_flow`], with thread records or without (one thread, as a raw
/// trace's records), and then with a disable every ten blocks or so.
fn random_flow_of(seed: u64, len: usize, max: u32, threads: bool) -> Vec<Exec> {
    let mut x = seed | 1;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    const BLOCKS: u64 = 40;
    let classes = [
        InsnClass::CondJump,
        InsnClass::Jump,
        InsnClass::Call,
        InsnClass::Return,
        InsnClass::Other,
    ];
    // Block k: at 0x1000 + 0x20 k, `1 + k % 4` instructions of 2 bytes.
    let class_of = |k: u64| classes[(k.wrapping_mul(7) % 5) as usize];
    let mut flow = Vec::new();
    let mut k = 0u64;
    let mut space = AddressSpace::UNKNOWN;
    for _ in 0..len {
        match next(100) {
            0 => flow.push(gap(GapKind::Disabled)),
            4..=12 if !threads => flow.push(gap(GapKind::Disabled)),
            2 if !threads => flow.push(Exec::Time(seed)),
            1 => flow.push(gap([GapKind::Lost, GapKind::Overflow][next(2) as usize])),
            2 => {
                let tid = next(2) as u32;
                flow.push(Exec::Thread {
                    pid: Some(7 + tid % 2),
                    tid: Some(tid),
                    cpu: None,
                });
            }
            3 => space.cr3 = [None, Some(Cr3(0x5000))][next(2) as usize],
            _ => {}
        }
        let n = 1 + k % 4;
        let base = 0x1000 + 0x20 * k;
        for i in 0..n {
            let class = if i + 1 == n {
                class_of(k)
            } else {
                InsnClass::Other
            };
            flow.push(Exec::Insn(ExecInsn {
                space,
                ip: Ip(base + 2 * i),
                size: 2,
                class,
            }));
        }
        // Mostly the next few blocks (loops), sometimes anywhere.
        k = match (class_of(k), next(4)) {
            (InsnClass::Other, _) => k + 1,
            (_, 0) => next(BLOCKS),
            _ => (k + 1 + next(3)) % BLOCKS,
        } % BLOCKS;
    }
    crate::exec::as_runs(&flow, max)
}

#[test]
fn the_memo_of_transfers_counts_as_the_general_way() {
    for seed in 1..40u64 {
        for max in [1, 3, u32::MAX] {
            let flow = random_flow(seed, 3000, max);
            let mut with = CoverageBuilder::new();
            let mut without = CoverageBuilder::new();
            without.memo = false;
            for e in &flow {
                with.push(e);
                without.push(e);
            }
            let used = with.seen.iter().filter(|s| s.from != u32::MAX).count();
            assert!(used > 10, "seed {seed}: the memo was not filled ({used})");
            assert!(without.seen.is_empty());
            let (with, without) = (with.finish(), without.finish());
            assert!(with.edges.len() > 20, "seed {seed}: {with:?}");
            assert_eq!(with, without, "seed {seed}, runs of at most {max}");
        }
    }
}

/// A conditional branch followed by tracing switched off by a branch
/// left the IP filter: the edge to where tracing came back is kept, and
/// marked, and libxdc's map leaves it out; after an interrupt (tracing
/// off between two instructions) or after another kind of branch it
/// counts. The memo (a transfer seen before) marks it the same way.
#[test]
fn a_conditional_branch_out_of_the_filter_is_no_libxdc_outcome() {
    // 1000: jz 2000 (out of the filter); tracing back at 1002.
    let flow = |why: GapKind, class: InsnClass, times: usize| {
        let mut v = Vec::new();
        for _ in 0..times {
            v.push(insn(0x1000, 2, class));
            v.push(gap(why));
            v.push(insn(0x1002, 1, InsnClass::Return));
        }
        v
    };
    let edge = |cov: &Coverage| {
        let from = cov
            .blocks
            .iter()
            .position(|b| b.start == Ip(0x1000))
            .unwrap();
        let to = cov
            .blocks
            .iter()
            .position(|b| b.start == Ip(0x1002))
            .unwrap();
        *cov.edges
            .iter()
            .find(|e| (e.from as usize, e.to as usize) == (from, to))
            .unwrap()
    };
    let slot = afl::edge_slot(Ip(0x1000), Ip(0x1002), afl::MAP_SIZE);
    for times in [1, 3] {
        let cov = Coverage::from_execs(&flow(GapKind::Disabled, InsnClass::CondJump, times));
        let e = edge(&cov);
        assert_eq!((e.hits, e.left_filter), (times as u64, times as u64));
        let map = afl::bitmap(&cov, afl::AflEdges::Conditional, afl::MAP_SIZE);
        assert!(map.iter().all(|&c| c == 0), "counted");
        let all = afl::bitmap(&cov, afl::AflEdges::All, afl::MAP_SIZE);
        assert_eq!(all[slot], times as u8, "every transfer counts in `all`");

        let cov = Coverage::from_execs(&flow(GapKind::Interrupted, InsnClass::CondJump, times));
        assert_eq!(edge(&cov).left_filter, 0);
        let map = afl::bitmap(&cov, afl::AflEdges::Conditional, afl::MAP_SIZE);
        assert_eq!(map[slot], times as u8);

        let cov = Coverage::from_execs(&flow(GapKind::Disabled, InsnClass::Jump, times));
        assert_eq!(edge(&cov).left_filter, 0);
    }
}

/// A flow cut into parts at `cuts` (record indices), each built apart and
/// merged in order.
fn merged(flow: &[Exec], cuts: &[usize]) -> Coverage {
    let mut whole = CoverageBuilder::new();
    let mut from = 0;
    for &to in cuts.iter().chain([&flow.len()]) {
        let mut part = CoveragePart::new();
        for e in &flow[from..to] {
            part.push(e);
        }
        whole.merge(part);
        from = to;
    }
    whole.finish()
}

/// Where two coverages differ, in a few lines.
fn differences(got: &Coverage, want: &Coverage) -> String {
    let mut out = Vec::new();
    if got.insns != want.insns {
        out.push(format!("insns {} against {}", got.insns, want.insns));
    }
    if got.blocks != want.blocks {
        let diff: Vec<_> = got
            .blocks
            .iter()
            .zip(&want.blocks)
            .filter(|(g, w)| g != w)
            .take(3)
            .collect();
        out.push(format!(
            "{} blocks against {}: {diff:?}",
            got.blocks.len(),
            want.blocks.len()
        ));
    }
    let edges = |c: &Coverage| -> Vec<(Ip, Ip, u64, u64)> {
        c.edges
            .iter()
            .map(|e| {
                let (f, t) = (&c.blocks[e.from as usize], &c.blocks[e.to as usize]);
                (f.start, t.start, e.hits, e.left_filter)
            })
            .collect()
    };
    let (g, w) = (edges(got), edges(want));
    let extra: Vec<_> = g.iter().filter(|e| !w.contains(e)).take(4).collect();
    let missing: Vec<_> = w.iter().filter(|e| !g.contains(e)).take(4).collect();
    if !extra.is_empty() || !missing.is_empty() {
        out.push(format!("edges got {extra:x?}, want {missing:x?}"));
    }
    out.join("; ")
}

/// Cutting a stream anywhere (inside blocks, between a conditional branch
/// and the disable after it, parts with no block or nothing at all),
/// building the parts apart and merging them in order gives the coverage
/// of the stream in one piece: blocks, edges, hits, the left-filter marks.
#[test]
fn parts_merged_in_order_cover_as_the_whole_stream() {
    let mut marked = 0;
    for seed in 1..60u64 {
        for max in [1, 3, u32::MAX] {
            let flow = random_flow_of(seed, 1500, max, false);
            let want = Coverage::from_execs(&flow);
            marked += want.edges.iter().filter(|e| e.left_filter > 0).count();
            let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move |n: usize| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % n as u64) as usize
            };
            for parts in [2, 5, 40, 300] {
                let mut cuts: Vec<usize> = (1..parts).map(|_| next(flow.len() + 1)).collect();
                cuts.sort_unstable();
                let got = merged(&flow, &cuts);
                assert!(
                    got == want,
                    "seed {seed}, runs of at most {max}, {parts} parts: {}",
                    differences(&got, &want)
                );
            }
            // Every record a part of its own.
            if seed > 20 {
                continue;
            }
            let each: Vec<usize> = (1..flow.len()).collect();
            let got = merged(&flow, &each);
            assert!(
                got == want,
                "seed {seed}, runs of at most {max}, one record a part: {}",
                differences(&got, &want)
            );
        }
    }
    assert!(marked > 50, "too few left-filter marks to test: {marked}");
}

/// A part with nothing, or with a head only, hands the open block on.
#[test]
fn parts_without_a_block_end_hand_the_open_block_on() {
    let flow = [
        insn(0x1000, 1, InsnClass::Other),
        insn(0x1001, 1, InsnClass::Other),
        Exec::Time(5),
        insn(0x1002, 2, InsnClass::Jump),
        insn(0x1000, 1, InsnClass::Other),
        insn(0x1001, 1, InsnClass::Other),
        insn(0x1002, 2, InsnClass::Jump),
    ];
    let want = Coverage::from_execs(&flow);
    assert_eq!(want.blocks.len(), 1);
    assert_eq!(want.blocks[0].hits, 2);
    for cuts in [&[0, 0, 1, 1, 2][..], &[1, 2, 3], &[4, 5, 6, 7], &[7, 7]] {
        assert_eq!(merged(&flow, cuts), want, "{cuts:?}");
    }
}
