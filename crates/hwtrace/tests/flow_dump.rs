//! `hwtrace flow --dump`: code read from physical memory through the page
//! tables of the CR3 the trace reports (issue 6: "a trace that switches CR3
//! (PIP) between two processes in a dump decodes each part in its own
//! address space").
//!
//! The memory is built with hwtrace-mem's page-table builder: two address
//! spaces map *different* code at the *same* kernel virtual address. The
//! code switches CR3 itself (`mov cr3, rax` in A, `mov cr3, rbx` in B), so
//! the flow crosses from one space into the other at the next instruction,
//! and the PT trace carries a PIP bound to each MOV CR3 (SDM vol. 3C,
//! 33.4.2.7). Decoding the bytes after a switch in the wrong space would
//! give other instructions at other addresses.

use hwtrace_mem::paging::{PageSize, PageTableBuilder, PagingMode};
use hwtrace_mem::phys::{SparseMemory, write_qemu_core};
use hwtrace_packet::{ModeExec, Packet, Pip, TraceBuilder};
use hwtrace_types::{Cr3, Ip, PhysAddr};
use std::path::PathBuf;
use std::process::Command;

/// Where both spaces have code.
const VA: u64 = 0xffff_8000_0040_0000;
/// The physical frames of each space's code page.
const CODE_A: u64 = 0x5000;
const CODE_B: u64 = 0x7000;

/// Space A's code page:
/// ```text
///  +0  b8 01 00 00 00   mov eax,1
///  +5  0f 22 d8         mov cr3,rax      -> B
///  +8  0f 0b            ud2              (B runs here, not A)
///  +a  0f 0b            ud2
///  +c  ff c1            inc ecx          (back from B)
///  +e  ff e0            jmp rax          (TIP.PGD to 0x1000: tracing ends)
/// ```
const A: &[u8] = &[
    0xb8, 1, 0, 0, 0, 0x0f, 0x22, 0xd8, 0x0f, 0x0b, 0x0f, 0x0b, 0xff, 0xc1, 0xff, 0xe0,
];

/// Space B's code page (the same addresses, other instructions):
/// ```text
///  +0  0f 0b 0f 0b ...  (A runs here)
///  +8  90               nop
///  +9  0f 22 db         mov cr3,rbx      -> A
///  +c  48 31 c0         xor rax,rax      (A runs here, not B)
/// ```
const B: &[u8] = &[
    0x0f, 0x0b, 0x0f, 0x0b, 0x0f, 0x0b, 0x0f, 0x0b, 0x90, 0x0f, 0x22, 0xdb, 0x48, 0x31, 0xc0, 0x90,
];

/// The executed instructions and their disassembly, in order.
const EXPECTED: [(u64, &str); 6] = [
    (VA, "mov eax,1"),
    (VA + 5, "mov cr3,rax"),
    (VA + 8, "nop"),
    (VA + 9, "mov cr3,rbx"),
    (VA + 0xc, "inc ecx"),
    (VA + 0xe, "jmp rax"),
];

/// Two address spaces in one physical memory: A's tables from 1 MiB, B's
/// from 2 MiB.
fn two_spaces() -> (SparseMemory, Cr3, Cr3) {
    let mut a = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x10_0000));
    a.map(Ip(VA), PhysAddr(CODE_A), PageSize::Size4K, 0)
        .expect("map A");
    a.write(PhysAddr(CODE_A), A);
    let mut b = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x20_0000));
    b.map(Ip(VA), PhysAddr(CODE_B), PageSize::Size4K, 0)
        .expect("map B");
    b.write(PhysAddr(CODE_B), B);
    let mut mem = a.memory().clone();
    for (base, page) in b.memory().pages() {
        mem.write(base, page);
    }
    (mem, a.cr3(), b.cr3())
}

/// PSB+ (optionally naming CR3 A), then the flow: a PIP at each MOV CR3,
/// a TIP.PGD at the final indirect jump.
fn trace(cr3_a: Cr3, cr3_b: Cr3, pip_in_psb: bool) -> Vec<u8> {
    let pip = |cr3| Packet::Pip(Pip { cr3, nr: false });
    let mut t = TraceBuilder::new();
    t.push(Packet::Psb).expect("psb");
    if pip_in_psb {
        t.push(pip(cr3_a)).expect("pip");
    }
    t.push(Packet::ModeExec(ModeExec {
        csl: true,
        csd: false,
        iflag: false,
    }))
    .expect("mode");
    t.ip(Packet::Fup, VA).expect("fup");
    t.push(Packet::Psbend).expect("psbend");
    t.push(pip(cr3_b)).expect("pip b");
    t.push(pip(cr3_a)).expect("pip a");
    // The indirect jump leaves for an address tracing does not cover.
    t.ip(Packet::TipPgd, 0x1000).expect("tip.pgd");
    t.finish()
}

fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let path =
        std::env::temp_dir().join(format!("hwtrace-flow-dump-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).expect("scratch file");
    path
}

/// A raw dump: physical memory from address 0, holes zero.
fn raw_dump(mem: &SparseMemory) -> Vec<u8> {
    let end = mem
        .pages()
        .map(|(base, _)| base.0 + 4096)
        .max()
        .unwrap_or(0);
    let mut bytes = vec![0u8; usize::try_from(end).expect("small")];
    for (base, page) in mem.pages() {
        let at = usize::try_from(base.0).expect("small");
        bytes[at..at + 4096].copy_from_slice(page);
    }
    bytes
}

fn flow(args: &[&str]) -> (Option<i32>, Vec<String>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .arg("flow")
        .args(args)
        .output()
        .expect("hwtrace runs");
    (
        out.status.code(),
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .lines()
            .map(str::to_owned)
            .collect(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn expected_lines(cr3_a: Cr3, cr3_b: Cr3) -> Vec<String> {
    let insn = |i: usize| format!("{:016x}  {}", EXPECTED[i].0, EXPECTED[i].1);
    // Tracing is on from PSB+ (a status, not shown as an event).
    vec![
        insn(0),
        insn(1),
        format!("[paging, cr3: {:016x}]", cr3_b.0),
        insn(2),
        insn(3),
        format!("[paging, cr3: {:016x}]", cr3_a.0),
        insn(4),
        insn(5),
        "[disabled]".to_owned(),
    ]
}

/// CR3 A from PIP in PSB+; the raw dump alone.
#[test]
fn each_part_decodes_in_its_own_address_space() {
    let (mem, cr3_a, cr3_b) = two_spaces();
    let dump = scratch("raw.bin", &raw_dump(&mem));
    let pt = scratch("switch.pt", &trace(cr3_a, cr3_b, true));
    let (code, lines, err) = flow(&[
        pt.to_str().expect("utf-8"),
        "--dump",
        dump.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(lines, expected_lines(cr3_a, cr3_b));

    // The same in JSON: each paging event names its CR3.
    let (_, json, _) = flow(&[
        pt.to_str().expect("utf-8"),
        "--dump",
        dump.to_str().expect("utf-8"),
        "--json",
    ]);
    let cr3s: Vec<String> = json
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
        .filter_map(|v| v["cr3"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(cr3s, [format!("{:#x}", cr3_b.0), format!("{:#x}", cr3_a.0)]);
    let _ = std::fs::remove_file(dump);
    let _ = std::fs::remove_file(pt);
}

/// No PIP before the first switch: the CR3 to start in comes from
/// `--cr3`, or from the CPU state of a QEMU ELF core; without either the
/// code cannot be read and the error names offset and IP.
#[test]
fn the_first_space_comes_from_cr3_or_the_core() {
    let (mem, cr3_a, cr3_b) = two_spaces();
    let pt = scratch("nopip.pt", &trace(cr3_a, cr3_b, false));
    let pt = pt.to_str().expect("utf-8").to_owned();
    let raw = scratch("raw2.bin", &raw_dump(&mem));
    let raw = raw.to_str().expect("utf-8").to_owned();

    let cr3 = format!("{:#x}", cr3_a.0);
    let (code, lines, err) = flow(&[&pt, "--dump", &raw, "--cr3", &cr3]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(lines, expected_lines(cr3_a, cr3_b));

    // B's CR3 to start with: B has no MOV CR3 at VA + 5, and A's first
    // instruction is B's `ud2`.
    let wrong = format!("{:#x}", cr3_b.0);
    let (code, lines, _) = flow(&[&pt, "--dump", &raw, "--cr3", &wrong]);
    assert_ne!(lines, expected_lines(cr3_a, cr3_b));
    assert_eq!(code, Some(2));

    // An ELF core whose vCPU 0 runs in A.
    let mut cpu = hwtrace_mem::phys::QemuCpuState {
        version: 1,
        ..Default::default()
    };
    cpu.cr[0] = hwtrace_mem::phys::CR0_PG;
    cpu.cr[3] = cr3_a.0;
    let runs: Vec<(PhysAddr, Vec<u8>)> = mem.runs();
    let borrowed: Vec<(PhysAddr, &[u8])> = runs.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    let core = scratch("core.elf", &write_qemu_core(&borrowed, &[cpu]));
    let core = core.to_str().expect("utf-8").to_owned();
    let (code, lines, err) = flow(&[&pt, "--dump", &core]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(lines, expected_lines(cr3_a, cr3_b));

    // Neither: nothing can be read before the first PIP.
    let (code, lines, _) = flow(&[&pt, "--dump", &raw, "--no-disasm"]);
    assert_eq!(code, Some(2));
    let error = lines
        .iter()
        .find(|l| l.contains(": error: "))
        .expect("an error line");
    assert!(
        error.ends_with(&format!("{VA:x}: error: no memory mapped at this address]")),
        "{error}"
    );
    for f in [pt, raw, core] {
        let _ = std::fs::remove_file(f);
    }
}
