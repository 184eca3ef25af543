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
//!
//! Then two real processes (echo and ls recorded with qemu-user) are put
//! into one dump, each in its own page tables, and their traces decoded
//! one after the other, switched by the PIP in each one's PSB+.

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
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-flow-dump-{}-{name}", std::process::id()));
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

/// Maps `execution`'s code into a new address space whose tables start at
/// `first_frame`: each 4 KiB page any code segment touches gets a frame
/// after the tables'.
fn space_of(execution: &hwtrace_sim::Execution, first_frame: u64) -> PageTableBuilder {
    let mut b = PageTableBuilder::new(PagingMode::Level4, PhysAddr(first_frame));
    let mut frames: std::collections::BTreeMap<u64, PhysAddr> = std::collections::BTreeMap::new();
    for seg in execution.memory().segments() {
        let mut va = seg.addr.0;
        let mut rest: &[u8] = &seg.bytes;
        while !rest.is_empty() {
            let page = va & !0xfff;
            let frame = match frames.get(&page) {
                Some(f) => *f,
                None => {
                    let f = b.alloc_frame();
                    b.map(Ip(page), f, PageSize::Size4K, 0)
                        .expect("map code page");
                    frames.insert(page, f);
                    f
                }
            };
            let n = rest
                .len()
                .min(usize::try_from(0x1000 - (va & 0xfff)).expect("small"));
            b.write(PhysAddr(frame.0 + (va & 0xfff)), &rest[..n]);
            rest = &rest[n..];
            va += n as u64;
        }
    }
    b
}

/// `trace` with a PIP naming `cr3` put into its first PSB+.
fn with_pip(trace: &[u8], cr3: Cr3) -> Vec<u8> {
    let mut pip = TraceBuilder::new();
    pip.push(Packet::Pip(Pip { cr3, nr: false })).expect("pip");
    let psb = 16;
    assert!(hwtrace_packet::find_psb_forward(trace, 0) == Some(0));
    let mut out = trace[..psb].to_vec();
    out.extend_from_slice(pip.as_bytes());
    out.extend_from_slice(&trace[psb..]);
    out
}

/// Two real processes (echo, then ls, recorded with qemu-user: both load
/// at the same addresses, with different code there) in one physical
/// memory, each in its own page tables; their PT (hwtrace-sim) one after
/// the other, each starting with a PSB+ whose PIP names its CR3. Decoded
/// from a QEMU-style ELF core with no CPU state, the instructions are
/// echo's and then ls's, exactly.
#[test]
fn two_recorded_processes_decode_from_one_dump() {
    use hwtrace_sim::{Execution, Limits, PtConfig, PtEncoder};
    assert!(
        std::path::Path::new("/usr/bin/qemu-x86_64").exists(),
        "qemu-x86_64 missing: run scripts/setup.sh"
    );
    let limits = Limits {
        max_instructions: Some(2_000_000),
        timeout: Some(std::time::Duration::from_secs(60)),
    };
    let echo = Execution::record_qemu("/bin/echo", &["dump"], limits).expect("echo records");
    let ls = Execution::record_qemu("/bin/ls", &["-d", "/"], limits).expect("ls records");
    let (echo, ls) = (echo.execution, ls.execution);

    let a = space_of(&echo, 0x10_0000);
    let b = space_of(&ls, 0x80_0000);
    let (cr3_a, cr3_b) = (a.cr3(), b.cr3());
    let mut mem = a.memory().clone();
    for (base, page) in b.memory().pages() {
        mem.write(base, page);
    }
    let runs = mem.runs();
    let runs: Vec<(PhysAddr, &[u8])> = runs.iter().map(|(p, b)| (*p, b.as_slice())).collect();
    let core = scratch("two.elf", &write_qemu_core(&runs, &[]));

    let encoder = PtEncoder::new(PtConfig::default());
    let mut trace = with_pip(&encoder.encode(&echo).expect("encode echo").bytes, cr3_a);
    trace.extend(with_pip(
        &encoder.encode(&ls).expect("encode ls").bytes,
        cr3_b,
    ));
    let pt = scratch("two.pt", &trace);

    let (code, lines, err) = flow(&[
        pt.to_str().expect("utf-8"),
        "--dump",
        core.to_str().expect("utf-8"),
        "--no-disasm",
    ]);
    let _ = std::fs::remove_file(&core);
    let _ = std::fs::remove_file(&pt);
    assert_eq!(code, Some(0), "{err}");
    let got: Vec<u64> = lines
        .iter()
        .filter(|l| !l.starts_with('['))
        .map(|l| u64::from_str_radix(l, 16).expect("hex"))
        .collect();
    let want: Vec<u64> = echo
        .insns()
        .iter()
        .chain(ls.insns())
        .map(|ip| ip.0)
        .collect();
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "the instructions differ from the executed ones"
    );
    // The two programs' code differs at addresses both ran: decoding either
    // in the other's space would have gone wrong.
    let echo_code = echo.memory();
    let differs = ls.insns().iter().any(|ip| {
        matches!((echo_code.bytes_at(*ip), ls.memory().bytes_at(*ip)),
            (Some(x), Some(y)) if x.first() != y.first())
    });
    assert!(
        differs,
        "echo and ls share all their code; the test proves nothing"
    );
}
