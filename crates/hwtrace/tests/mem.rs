//! `hwtrace mem translate|maps|selfmap` over dumps generated here: raw
//! files (whole, or at a physical base) and QEMU-style ELF cores.

use hwtrace_mem::paging::entry::{G, RW, US, XD};
use hwtrace_mem::paging::{PageSize, PageTableBuilder, PagingMode};
use hwtrace_mem::phys::{QemuCpuState, SparseMemory, write_qemu_core};
use hwtrace_types::{Ip, PhysAddr, PhysMemory};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hwtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-mem-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Writes `mem` as one flat raw file from physical `base` (holes as zeros).
fn write_raw(mem: &SparseMemory, base: u64, path: &Path) {
    let end = mem.pages().map(|(pa, _)| pa.0 + 4096).max().unwrap();
    let mut bytes = vec![0u8; (end - base) as usize];
    for (pa, page) in mem.pages() {
        let at = (pa.0 - base) as usize;
        bytes[at..at + 4096].copy_from_slice(page);
    }
    std::fs::write(path, bytes).unwrap();
}

/// A small guest: user code, a kernel 2 MiB page, a 1 GiB direct map, and
/// the self-map at seed 004's index 0x1f6.
fn guest(mode: PagingMode, first_frame: u64) -> PageTableBuilder {
    let mut b = PageTableBuilder::new(mode, PhysAddr(first_frame));
    let code = b.alloc_frame();
    let data = b.alloc_frame();
    b.map(Ip(0x40_0000), code, PageSize::Size4K, US).unwrap();
    b.map(Ip(0x40_1000), data, PageSize::Size4K, US | XD)
        .unwrap();
    b.map(
        Ip(0xffff_ffff_8100_0000),
        PhysAddr(0x20_0000),
        PageSize::Size2M,
        G,
    )
    .unwrap();
    b.map(
        Ip(0xffff_8880_0000_0000),
        PhysAddr(0),
        PageSize::Size1G,
        RW | XD,
    )
    .unwrap();
    b.self_map(0x1f6, RW | XD);
    b
}

#[test]
fn translate_prints_the_walk_path() {
    let b = guest(PagingMode::Level4, 0x1000);
    let path = temp("flat.raw");
    write_raw(b.memory(), 0, &path);
    let cr3 = format!("{:#x}", b.cr3().0);
    let o = hwtrace(&[
        "mem",
        "translate",
        "--dump",
        path.to_str().unwrap(),
        "--cr3",
        &cr3,
        "0x400010",
        "ffffffff`81012345",
    ]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let text = stdout(&o);
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines[0], "0x0000000000400010 -> 0x2010 (4K page, ur-x)");
    assert_eq!(lines[1], "  PML4 0x0 PDPT 0x0 PD 0x2 PT 0x0 offset 0x10");
    assert!(
        lines[2].starts_with("  PML4E[0x000] at 0x1000 = 0x"),
        "{text}"
    );
    assert!(lines[5].starts_with("  PTE[0x000] at "), "{text}");
    assert!(lines[5].ends_with("P US PK=0"), "{text}");
    assert_eq!(lines[6], "0xffffffff81012345 -> 0x212345 (2M page, -r-x)");
    assert!(
        lines[10].starts_with("  PDE[0x008] at ") && lines[10].ends_with("P PS G PK=0"),
        "{text}"
    );
    assert_eq!(lines.len(), 11);
}

#[test]
fn translate_failures_name_the_entry_and_exit_2() {
    let b = guest(PagingMode::Level4, 0x1000);
    let path = temp("fail.raw");
    write_raw(b.memory(), 0, &path);
    let cr3 = format!("{:#x}", b.cr3().0);
    let o = hwtrace(&[
        "mem",
        "translate",
        "--dump",
        path.to_str().unwrap(),
        "--cr3",
        &cr3,
        "0x402000",
        "0x800000000000",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let text = stdout(&o);
    assert!(
        text.contains("0x0000000000402000 -> error: PTE[0x002] at 0x"),
        "{text}"
    );
    assert!(text.contains("is not present"), "{text}");
    assert!(
        text.contains("0x0000800000000000 -> error: address is not canonical under 4-level paging"),
        "{text}"
    );

    let short = hwtrace(&[
        "mem",
        "translate",
        "--short",
        "--dump",
        path.to_str().unwrap(),
        "--cr3",
        &cr3,
        "400000",
        "402000",
    ]);
    assert_eq!(
        stdout(&short),
        "0x0000000000400000 0x2000\n0x0000000000402000 -\n"
    );

    // A raw dump carries no CPU state: CR3 must be given.
    let o = hwtrace(&[
        "mem",
        "translate",
        "--dump",
        path.to_str().unwrap(),
        "0x400000",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("give --cr3"));
}

#[test]
fn raw_dump_at_a_physical_base() {
    // Every frame above 16 MiB: the file starts there.
    let b = guest(PagingMode::Level4, 0x100_0000);
    let path = temp("high.raw");
    write_raw(b.memory(), 0x100_0000, &path);
    let cr3 = format!("{:#x}", b.cr3().0);
    let arg = format!("{}@0x1000000", path.display());
    let o = hwtrace(&[
        "mem",
        "translate",
        "--short",
        "--dump",
        &arg,
        "--cr3",
        &cr3,
        "0x401008",
    ]);
    assert_eq!(stdout(&o), "0x0000000000401008 0x1002008\n");
    // Without the base the tables are outside the file.
    let o = hwtrace(&[
        "mem",
        "translate",
        "--dump",
        path.to_str().unwrap(),
        "--cr3",
        &cr3,
        "0x401008",
    ]);
    assert!(stdout(&o).contains("is outside the dump"), "{}", stdout(&o));
}

#[test]
fn maps_lists_merged_ranges_like_info_mem() {
    let b = guest(PagingMode::Level4, 0x1000);
    let path = temp("maps.raw");
    write_raw(b.memory(), 0, &path);
    let cr3 = format!("{:#x}", b.cr3().0);
    let o = hwtrace(&[
        "mem",
        "maps",
        "--dump",
        path.to_str().unwrap(),
        "--cr3",
        &cr3,
    ]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let text = stdout(&o);
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(
        lines[0],
        "0000000000400000-0000000000401000 0000000000001000 ur-x"
    );
    assert_eq!(
        lines[1],
        "0000000000401000-0000000000402000 0000000000001000 ur--"
    );
    assert_eq!(
        lines[2],
        "ffff888000000000-ffff888040000000 0000000040000000 -rw-"
    );
    // The self-map window shows every table, then the kernel text.
    assert!(lines[3].starts_with("fffffb"), "{text}");
    assert_eq!(
        *lines.last().unwrap(),
        "ffffffff81000000-ffffffff81200000 0000000000200000 -r-x"
    );
    let q = hwtrace(&[
        "mem",
        "maps",
        "--qemu",
        "--dump",
        path.to_str().unwrap(),
        "--cr3",
        &cr3,
    ]);
    let qtext = stdout(&q);
    let qlines: Vec<_> = qtext.lines().collect();
    // XD ignored: the two user pages merge.
    assert_eq!(
        qlines[0],
        "0000000000400000-0000000000402000 0000000000002000 ur-"
    );
    assert_eq!(
        *qlines.last().unwrap(),
        "ffffffff81000000-ffffffff81200000 0000000000200000 -r-"
    );
}

#[test]
fn selfmap_reports_seed_004_bases() {
    let b = guest(PagingMode::Level4, 0x1000);
    let path = temp("selfmap.raw");
    write_raw(b.memory(), 0, &path);
    let cr3 = format!("{:#x}", b.cr3().0);
    let o = hwtrace(&[
        "mem",
        "selfmap",
        "--dump",
        path.to_str().unwrap(),
        "--cr3",
        &cr3,
        "--va",
        "0x400000",
    ]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(
        stdout(&o),
        "self-map index 0x1f6 (PML4E[0x1f6] at 0x1fb0 points to its own table)\n\
         PT   base 0xfffffb0000000000\n\
         PD   base 0xfffffb7d80000000\n\
         PDPT base 0xfffffb7dbec00000\n\
         PML4 base 0xfffffb7dbedf6000\n\
         0x0000000000400000:\n  \
         PML4E at 0xfffffb7dbedf6000\n  \
         PDPTE at 0xfffffb7dbec00000\n  \
         PDE   at 0xfffffb7d80000010\n  \
         PTE   at 0xfffffb0000002000\n"
    );
}

#[test]
fn elf_core_supplies_cr3_and_la57() {
    let b = guest(PagingMode::Level5, 0x1000);
    let cpu = QemuCpuState {
        version: 1,
        rip: 0xffff_ffff_8100_0000,
        rsp: 0,
        cr: [0x8005_0033, 0, 0, b.cr3().0, 0x1000 | 0x20],
    };
    let runs = b.memory().runs();
    let runs: Vec<_> = runs
        .iter()
        .map(|(pa, bytes)| (*pa, bytes.as_slice()))
        .collect();
    let path = temp("guest.elf");
    std::fs::write(&path, write_qemu_core(&runs, &[cpu])).unwrap();
    let o = hwtrace(&[
        "mem",
        "translate",
        "--dump",
        path.to_str().unwrap(),
        "0xffffffff81000000",
    ]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let text = stdout(&o);
    assert!(
        text.contains("  PML5 0x1ff PML4 0x1ff PDPT 0x1fe PD 0x8 PT 0x0 offset 0x0"),
        "{text}"
    );
    assert!(text.contains("  PML5E[0x1ff]"), "{text}");
    let o = hwtrace(&["mem", "selfmap", "--dump", path.to_str().unwrap()]);
    // 57-bit canonical form of the same index.
    assert!(
        stdout(&o).contains("PML5 base 0xfff6fb7dbedf6000"),
        "{}",
        stdout(&o)
    );
    // @BASE makes no sense for an ELF core.
    let arg = format!("{}@0x1000", path.display());
    let o = hwtrace(&["mem", "maps", "--dump", &arg]);
    assert_eq!(o.status.code(), Some(1));
}

/// `mem cr3s` over an ELF core whose vCPU runs in one process: the guest's
/// kernel half copied into two more top-level tables (one with user code at
/// another address, one with none) is found, each summarised, the vCPU's
/// marked; `--short` lists just the CR3s.
#[test]
fn cr3s_finds_the_address_spaces_sharing_the_kernel_half() {
    let mode = PagingMode::Level4;
    let b = guest(mode, 0x1000);
    let cr3 = b.cr3().0;
    let mut mem = b.memory().clone();
    let top: Vec<u64> = (0..512)
        .map(|i| mem.read_phys_u64(PhysAddr(cr3 + i * 8)).unwrap())
        .collect();
    // Process two at 0x80000: user code at 0x600000 through its own
    // tables; the kernel half (and the self-map entry in it) copied.
    let mut p = PageTableBuilder::new(mode, PhysAddr(0x8_0000));
    let code = PhysAddr(0x9_0000);
    p.map(Ip(0x60_0000), code, PageSize::Size4K, US).unwrap();
    for (pa, page) in p.memory().pages() {
        mem.write(pa, page);
    }
    mem.write(code, &[0x90; 16]);
    // A kernel-only table at 0x70000.
    mem.add_page(PhysAddr(0x7_0000));
    for i in 256..512u64 {
        mem.write_u64(PhysAddr(0x8_0000 + i * 8), top[i as usize]);
        mem.write_u64(PhysAddr(0x7_0000 + i * 8), top[i as usize]);
    }
    let mut cpu = QemuCpuState {
        version: 1,
        ..QemuCpuState::default()
    };
    cpu.cr[0] = hwtrace_mem::phys::CR0_PG;
    cpu.cr[3] = cr3;
    let runs = mem.runs();
    let runs: Vec<(PhysAddr, &[u8])> = runs.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    let path = temp("cr3s.elf");
    std::fs::write(&path, write_qemu_core(&runs, &[cpu])).unwrap();

    let o = hwtrace(&["mem", "cr3s", "--dump", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "0x0000000000001000  process: 1 user entries, 2 user pages (0x2000 bytes), 1 executable ranges, vCPU 0",
            "    0000000000400000-0000000000401000 0000000000001000 ur-x",
            "0x0000000000070000  kernel only: 0 user entries, 0 user pages (0x0 bytes), 0 executable ranges",
            "0x0000000000080000  process: 1 user entries, 1 user pages (0x1000 bytes), 1 executable ranges",
            "    0000000000600000-0000000000601000 0000000000001000 ur-x",
            &format!(
                "3 top-level tables in {} pages (0 with the kernel half rejected as tables)",
                mem.pages().count()
            ),
        ],
        "{text}"
    );

    let short = hwtrace(&["mem", "cr3s", "--short", "--dump", path.to_str().unwrap()]);
    assert_eq!(stdout(&short), "0x1000\n0x70000\n0x80000\n");

    // A CR3 whose table has no kernel half cannot be the reference.
    let o = hwtrace(&[
        "mem",
        "cr3s",
        "--dump",
        path.to_str().unwrap(),
        "--cr3",
        "0x90000",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("has no kernel half"), "{err}");
}
