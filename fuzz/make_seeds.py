#!/usr/bin/env python3
"""Seed corpora for the fuzz targets (written to fuzz/corpus/, which git ignores).

packet_decode: every trace of ../shared/corpus (libipt scenarios and real traces).
page_walk:     16 bytes of parameters (va, flags, cr3 page, MAXPHYADDR) followed by
               physical memory holding small but valid 4- and 5-level page tables,
               so the fuzzer starts from walks that reach every level.
cr3_scan:      8 bytes of parameters (flags, MAXPHYADDR, reference page, pages to copy the
               kernel half into, region split, hole, table limit, PCID bits) followed by
               pages holding a top-level table whose kernel half points into the dump,
               so the fuzzer starts from scans that find tables and walk their user halves.
parallel_decode: fast_decode's seeds (pass corpus/fast_decode as a second directory) and
               pair-loop's rounds timed: a PSB+ (TSC, TMA, CBR) every few rounds, CYC
               packets before each TNT-8 and disable and MTC packets between, so units'
               clocks are warmed over calibrating packets and compared at every seam.
fast_decode:   the libipt corpus's traces under 8 KiB, and traces over the targets' code image
               (fuzz_targets/branchy_code.rs) that reach the block-cached decoder's bursts:
               TNT-8 packets round the backward loop at 0x1010, and that loop calling out of
               the traced range through `call rax` round and round (a TIP.PGD/TIP.PGE pair
               after a TNT packet each time, the pair the counting chains remember).
perf_data:     the perf.data fixtures of testdata/perf (Debian perf's file and pipe
               format, hwtrace's Intel PT file) and, where `perf` can record here,
               fresh `perf record` files: cpu-clock samples, --switch-events, pipe
               format, zstd-compressed (-z) in file and pipe format, LBR-free
               samples with callchains (-g); and what hwtrace's writer makes:
               `hwtrace record --portable --pt|--bts|--lbr -- /bin/true` (Intel PT
               AUX data, BTS AUX data, LBR samples with branch stacks), with the
               binary named by $HWTRACE (default: target/debug/hwtrace, if built).
regs_dumps:    a kind byte, then: a DS management area (32- and 64-bit layouts) with a
               BTS buffer holding records, linear and wrapped; raw 32- and 64-bit BTS
               records; LBR MSR text dumps (16 and 32 entries, with LBR_INFO, TOS,
               IA32_PERF_CAPABILITIES); `NAME VALUE` register lines for `hwtrace msr`.
object_files:  a kind byte, then: a small static ELF built here with `gcc -g` (two functions,
               DWARF lines and an inlined call) as an image (kind 0) and for the symboliser
               (kind 2); a minimal PE32+ image with one .text section (kind 1); image option
               strings (`FILE@ADDR`, `FILE:OFF-SIZE@ADDR`, `FILE@BIAS`, ptxed's forms; kind 3);
               a QEMU ELF core (kind 4): a "QEMU" note whose CR3 points at 4-level page
               tables in its one PT_LOAD segment, mapping its RIP; the same core's headers
               as a kcore's (kind 5); the PDB clang and lld-link write for a small program
               (kind 6); /proc/kallsyms text with text, weak, data and module symbols (kind 7).
coverage_parts: a cut count (1-7) and the cut places, then records of three bytes (kind,
               block, shape): runs and instructions over 16 blocks under three CR3s, gaps of
               every kind and times; written to testdata/fuzz/coverage_parts/ too (seed-*),
               where the regression test requires them to give records.

Run from the repository root:  python3 fuzz/make_seeds.py
"""
import glob
import os
import shutil
import struct
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "..", "shared", "corpus")
OUT = os.path.join(ROOT, "fuzz", "corpus")

P, RW, US, PS, NX = 1, 2, 4, 0x80, 1 << 63


def packet_seeds():
    out = os.path.join(OUT, "packet_decode")
    os.makedirs(out, exist_ok=True)
    for path in glob.glob(os.path.join(CORPUS, "libipt", "*", "*.pt")) + glob.glob(
        os.path.join(CORPUS, "real", "*", "trace.pt")
    ):
        name = os.path.basename(os.path.dirname(path)) + "-" + os.path.basename(path)
        shutil.copy(path, os.path.join(out, name))


def page_walk_seed(name, va, flags, pages, cr3_page=0, maxphys=40):
    params = struct.pack("<Q", va) + bytes([flags, cr3_page, maxphys]) + bytes(5)
    mem = bytearray(4096 * len(pages))
    for i, entries in enumerate(pages):
        for idx, val in entries.items():
            struct.pack_into("<Q", mem, i * 4096 + idx * 8, val)
    with open(os.path.join(OUT, "page_walk", name), "wb") as f:
        f.write(params + bytes(mem))


def page_walk_seeds():
    os.makedirs(os.path.join(OUT, "page_walk"), exist_ok=True)
    # flags bit 0: 5-level paging, bit 1: NXE.
    page_walk_seed("l4-4k", 0x401000, 2, [{0: 0x1000 | P | RW | US}, {0: 0x2000 | P | RW | US},
                                           {2: 0x3000 | P | RW | US},
                                           {1: 0x4000 | P | US, 2: 0x5000 | P | RW | US | NX}, {}, {}])
    page_walk_seed("l4-2m-1g", 0x40201234, 0, [{0: 0x1000 | P | RW},
                                                {1: 0x2000 | P | RW, 2: 0x40000000 | P | PS},
                                                {1: 0x200000 | P | RW | PS}])
    page_walk_seed("selfmap", 0xFFFFF6FB7DBED000, 2, [{0x1ED: P | RW, 0x1FF: 0x1000 | P | RW},
                                                       {0x1FE: 0x2000 | P | RW}, {0: 0x3000 | P | RW | PS}, {}])
    page_walk_seed("l5-4k", 0x401000, 3, [{0: 0x1000 | P | RW | US}, {0: 0x2000 | P | RW | US},
                                           {0: 0x3000 | P | RW | US}, {2: 0x4000 | P | RW | US},
                                           {1: 0x5000 | P | US}, {}])


def cr3_scan_seeds():
    out = os.path.join(OUT, "cr3_scan")
    os.makedirs(out, exist_ok=True)
    # flags bit 0: 5-level, bit 1: NXE, bit 2: copy the reference's kernel
    # half into the pages params[3] selects, bit 3: two regions.
    tables = [
        {**{i: 0x1000 | P | RW for i in range(256, 512, 3)}, 0: 0x2000 | P | RW | US, 1: 0x3000 | P | US | 0x60},
        {0: 0x2000 | P | RW, 5: NX | 0x3000 | P | RW},
        {0: 0x3000 | P | US, 1: 0x4000 | P | RW | US, 511: 0x1000 | P | RW | PS},
        {i: 0x1000 * (i % 4) | P | US for i in range(0, 512, 7)},
    ]
    mem = bytearray(4096 * len(tables))
    for i, entries in enumerate(tables):
        for idx, val in entries.items():
            struct.pack_into("<Q", mem, i * 4096 + idx * 8, val)
    for n, (flags, select) in enumerate([(4, 0b1110), (4 | 8, 0b0110), (1 | 4, 0b1010), (4 | 2, 0b0011)]):
        params = bytes([flags, 40, 0, select, 2, 3, 7, 0])
        with open(os.path.join(out, "seed%d" % n), "wb") as f:
            f.write(params + bytes(mem))


PSB = bytes([0x02, 0x82] * 8)
PSBEND = bytes([0x02, 0x23])
MODE_EXEC_64 = bytes([0x99, 0x01])


def ip_packet(kind, ip):
    """An IP packet (TIP 0x0d, TIP.PGE 0x11, TIP.PGD 0x01, FUP 0x1d) with a full 8-byte IP."""
    return bytes([(6 << 5) | kind]) + struct.pack("<Q", ip)


def tnt8(bits):
    """A TNT-8 packet of `bits` ('1' taken, '0' not; oldest first)."""
    return bytes([(1 << (len(bits) + 1)) | (int(bits, 2) << 1)])


def fast_decode_seeds():
    out = os.path.join(OUT, "fast_decode")
    os.makedirs(out, exist_ok=True)
    for path in glob.glob(os.path.join(CORPUS, "libipt", "*", "*.pt")):
        if os.path.getsize(path) < 8192:
            name = os.path.basename(os.path.dirname(path)) + "-" + os.path.basename(path)
            shutil.copy(path, os.path.join(out, name))
    start = PSB + MODE_EXEC_64 + ip_packet(0x1D, 0x1010) + PSBEND
    # The loop at 0x1010 (add; jne 0x1010): TNT-8 packets one after the other.
    for n, bits in ((40, "111111"), (40, "11111"), (200, "111111")):
        with open(os.path.join(out, "tnt8-loop-%s-x%d.pt" % (bits, n)), "wb") as f:
            f.write(start + tnt8(bits) * n + tnt8("0"))
    # The loop leaves at 0x1015 (call rax) for 0x5000, outside the traced range, and comes
    # back at 0x1017 (ret, to 0x1007: jmp rax, back to 0x1010).
    pair = ip_packet(0x01, 0x5000) + ip_packet(0x11, 0x1017)
    back = ip_packet(0x0D, 0x1007) + ip_packet(0x0D, 0x1010)
    for n, pads in ((3, 0), (50, 0), (50, 3)):
        rounds = (tnt8("110") + pair + bytes(pads) + back) * n
        with open(os.path.join(out, "pair-loop-x%d-pads%d.pt" % (n, pads)), "wb") as f:
            f.write(start + rounds)
    # The same loop with PSB+ written while out of the range (tracing off: no FUP), as
    # IP-filtered traces have them: MODE.TSX, PIP, VMCS, CBR; the enable after them has
    # its full IP (PSB forgets the last IP).
    off = (PSB + bytes([0x99, 0x20]) + bytes([0x02, 0x43, 0x01, 0x30, 0xe7, 0x1e, 0, 0])
           + bytes([0x02, 0xc8, 0x99, 0x2e, 0x35, 0, 0]) + bytes([0x02, 0x03, 0x28, 0]) + PSBEND)
    for n, psbs in ((3, 1), (20, 3)):
        away = ip_packet(0x01, 0x5000) + off * psbs + MODE_EXEC_64 + ip_packet(0x11, 0x1017)
        rounds = (tnt8("110") + away + back) * n
        with open(os.path.join(out, "psb-off-loop-x%d-psbs%d.pt" % (n, psbs)), "wb") as f:
            f.write(start + rounds)


def timed_loop(rounds, psb_every, cycles):
    """pair-loop's rounds (TNT-8, out of the range through `call rax` and back) with TSC,
    TMA and CBR in every PSB+ (one every `psb_every` rounds), a CYC of `cycles` before the
    TNT-8 and before the disable of each, and an MTC after every other round: the disables
    are stamped with CYC-timed TSC estimates."""
    def psb_plus(tsc, ctc):
        return (PSB + bytes([0x19]) + struct.pack("<Q", tsc)[:7]
                + bytes([0x02, 0x73]) + struct.pack("<H", ctc) + bytes([0, 0, 0])
                + bytes([0x02, 0x03, 20, 0]) + MODE_EXEC_64 + ip_packet(0x1D, 0x1010) + PSBEND)
    cyc = bytes([(cycles << 3) | 3])
    pair = ip_packet(0x01, 0x5000) + ip_packet(0x11, 0x1017)
    back = ip_packet(0x0D, 0x1007) + ip_packet(0x0D, 0x1010)
    out = psb_plus(0x100000, 0)
    ctc = 0
    for i in range(1, rounds + 1):
        out += cyc + tnt8("110") + cyc + pair + back
        if i % 2 == 0:
            ctc += 8
            out += bytes([0x59, (ctc >> 3) & 0xFF])
        if i % psb_every == 0:
            out += psb_plus(0x100000 + ctc * 62, ctc)
    return out


def parallel_decode_seeds():
    out = os.path.join(OUT, "parallel_decode")
    os.makedirs(out, exist_ok=True)
    for rounds, psb_every, cycles in ((40, 4, 20), (150, 16, 7), (60, 3, 31)):
        name = "timed-loop-x%d-psb%d-cyc%d.pt" % (rounds, psb_every, cycles)
        with open(os.path.join(out, name), "wb") as f:
            f.write(timed_loop(rounds, psb_every, cycles))


def perf_seeds():
    out = os.path.join(OUT, "perf_data")
    os.makedirs(out, exist_ok=True)
    for path in glob.glob(os.path.join(ROOT, "testdata", "perf", "*.data")):
        shutil.copy(path, os.path.join(out, os.path.basename(path)))
    for path in glob.glob(os.path.join(ROOT, "testdata", "fuzz", "perf_data", "*")):
        shutil.copy(path, os.path.join(out, "regression-" + os.path.basename(path)))
    work = ["/bin/sh", "-c", "ls /usr >/dev/null"]
    runs = {
        "cpu-clock": ["-e", "cpu-clock", "-c", "100000"],
        "switch": ["-e", "cpu-clock", "-c", "100000", "--switch-events"],
        "callchain": ["-e", "cpu-clock", "-c", "100000", "-g"],
        "zstd": ["-z", "-e", "cpu-clock", "-c", "100000", "--switch-events"],
        "zstd-level9": ["--compression-level=9", "-e", "cpu-clock", "-c", "100000"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in runs.items():
            for pipe in (False, True):
                dest = os.path.join(out, "perf-" + name + ("-pipe" if pipe else "") + ".data")
                target = "-" if pipe else os.path.join(tmp, "f.data")
                try:
                    r = subprocess.run(["perf", "record", "-q", "-o", target] + args + ["--"] + work,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60)
                except (OSError, subprocess.TimeoutExpired) as e:
                    print("perf_data: no `perf record` seeds:", e)
                    return
                if r.returncode != 0:
                    print("perf_data: perf record", name, "failed; seed skipped")
                    continue
                data = r.stdout if pipe else open(target, "rb").read()
                start = data.find(b"PERFILE2")
                if start >= 0:
                    with open(dest, "wb") as f:
                        f.write(data[start:])
        hwtrace = os.environ.get("HWTRACE", os.path.join(ROOT, "target", "debug", "hwtrace"))
        for kind in ("pt", "bts", "lbr"):
            dest = os.path.join(out, "hwtrace-portable-" + kind + ".data")
            try:
                subprocess.run([hwtrace, "record", "--portable", "--" + kind, "-o", dest, "--", "/bin/true"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300, check=True)
            except (OSError, subprocess.SubprocessError) as e:
                print("perf_data: no hwtrace writer seed for", kind + ":", e)


def seed_writer(target):
    """A function writing one seed file of `target`'s corpus."""
    out = os.path.join(OUT, target)
    os.makedirs(out, exist_ok=True)

    def write(name, data):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

    return write


def regs_seeds():
    write = seed_writer("regs_dumps")

    for word, fmt in ((4, "<I"), (8, "<Q")):
        area_size = 0x28 if word == 4 else 0x48  # DsFormat::area_size
        rec = 3 * word
        base, cap = 0x8100_0000, 8
        records = b"".join(
            struct.pack(fmt, 0x8000_1000 + 16 * i) + struct.pack(fmt, 0x8000_2000 + 16 * i)
            + struct.pack(fmt, 0x10 if i % 2 else 0)
            for i in range(cap)
        )
        for n, name in ((5, "linear"), (3, "wrapped")):
            ptrs = [base, base + n * rec, base + cap * rec, base + cap * rec + 1, 0, 0, 0, 0]
            area = b"".join(struct.pack(fmt, p) for p in ptrs)
            area += b"\0" * (area_size - len(area))
            write("ds-%d-%s" % (8 * word, name), b"\0" + area + records)
        write("raw-%d" % (8 * word), b"\1" + records)
    for depth, info in ((16, False), (32, True)):
        lines = ["MSR_LASTBRANCH_TOS %d" % (depth // 3), "IA32_PERF_CAPABILITIES %#x" % (5 if info else 4)]
        for i in range(depth):
            lines.append("MSR_LASTBRANCH_%d_FROM_IP %#x" % (i, 0x401000 + 0x10 * i | (1 << 63) * (i % 2)))
            lines.append("MSR_LASTBRANCH_%d_TO_IP %#x" % (i, 0x402000 + 0x10 * i))
            if info:
                lines.append("MSR_LBR_INFO_%d %#x" % (i, 0x20 + i))
        write("lbr-%d" % depth, b"\2" + "\n".join(lines).encode() + b"\n")
    for i, line in enumerate(("IA32_RTIT_CTL 0x2609", "0x1d9 0x801", "MSR_LBR_SELECT 0x1c4",
                              "IA32_RTIT_STATUS 0x10", "0x680 0x8000000000401000")):
        write("msr-%d" % i, b"\3" + line.encode())


def minimal_pe():
    """A PE32+ image: headers, one .text section of eight bytes of code."""
    dos = b"MZ" + b"\0" * 0x3A + struct.pack("<I", 0x40)
    coff = struct.pack("<HHIIIHH", 0x8664, 1, 0, 0, 0, 0xF0, 0x22)
    opt = struct.pack("<HBBIIIII", 0x20B, 0, 0, 0x200, 0, 0, 0x1000, 0x1000)
    opt += struct.pack("<QII", 0x1_4000_0000, 0x1000, 0x200)
    opt += struct.pack("<HHHHHHI", 6, 0, 0, 0, 6, 0, 0)
    opt += struct.pack("<IIIHH", 0x2000, 0x200, 0, 3, 0)
    opt += struct.pack("<QQQQII", 0x100000, 0x1000, 0x100000, 0x1000, 0, 16)
    opt += b"\0" * (16 * 8)
    section = b".text\0\0\0" + struct.pack("<IIIIIIHHI", 8, 0x1000, 0x200, 0x200, 0, 0, 0, 0, 0x60000020)
    headers = dos + b"PE\0\0" + coff + opt + section
    code = bytes([0x55, 0x48, 0x89, 0xE5, 0x31, 0xC0, 0x5D, 0xC3])
    return headers.ljust(0x200, b"\0") + code.ljust(0x200, b"\0")


def object_seeds():
    write = seed_writer("object_files")

    src = (
        "static inline int twice(int x) { return 2 * x; }\n"
        "int work(int n) { int s = 0; for (int i = 0; i < n; i++) s += twice(i); return s; }\n"
        "void _start(void) { volatile int r = work(10); (void)r; for (;;) {} }\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        c, elf = os.path.join(tmp, "tiny.c"), os.path.join(tmp, "tiny")
        with open(c, "w") as f:
            f.write(src)
        try:
            subprocess.run(["gcc", "-g", "-O1", "-static", "-nostdlib", "-fno-asynchronous-unwind-tables",
                            "-Wl,--build-id=none", "-o", elf, c], check=True, timeout=60)
            data = open(elf, "rb").read()
            write("elf-image", b"\0" + data)
            write("elf-symbols", b"\2" + data)
        except (OSError, subprocess.SubprocessError) as e:
            print("object_files: no ELF seed:", e)
    pe = minimal_pe()
    write("pe-image", b"\1" + pe)
    write("pe-symbols", b"\2" + pe)
    args = ["code.bin@401000", "code.bin:10-20@0x401000", "/bin/true@5555000", "lib.so",
            "app.exe@140000000", "code.bin:0x401000", "code.bin:0x10-0x20:0x401000"]
    write("image-args", b"\3" + "\n".join(args).encode())
    write("qemu-core", b"\4" + qemu_core())
    write("kcore", b"\5" + qemu_core())
    pdb = small_pdb()
    if pdb:
        write("pdb", b"\6" + pdb)
    write("kallsyms", b"\7" + KALLSYMS.encode())


# /proc/kallsyms text: text, weak and data symbols, the text's bounds, a module's.
KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81000100 t secondary_startup_64
ffffffff81000200 D some_data
ffffffff81001000 W weak_fn
ffffffff81001000 T alias_of_weak_fn
ffffffff82000000 T _etext
ffffffffc0000000 t e1000_probe\t[e1000]
ffffffffc0000400 t e1000_remove\t[e1000]
"""


def small_pdb():
    """The PDB clang (-gcodeview) and lld-link write for a three-function
    program, as tests/pdb_symbols.rs builds it; None without them."""
    src = ("static int helper(int x) { int s = 0; for (int i = 0; i < x; i++) s += i; return s; }\n"
           "__declspec(dllexport) int entry(int x) { return helper(x) + 1; }\n"
           "int main(void) { return entry(5); }\n")
    with tempfile.TemporaryDirectory() as tmp:
        c, obj = os.path.join(tmp, "x.c"), os.path.join(tmp, "x.obj")
        exe, pdb = os.path.join(tmp, "x.exe"), os.path.join(tmp, "x.pdb")
        with open(c, "w") as f:
            f.write(src)
        try:
            subprocess.run(["clang", "--target=x86_64-pc-windows-msvc", "-g", "-gcodeview", "-O0", "-c", c,
                            "-o", obj], check=True, timeout=60)
            subprocess.run(["lld-link", "/debug", "/entry:main", "/subsystem:console", "/nodefaultlib",
                            "/pdb:" + pdb, "/out:" + exe, obj], check=True, timeout=60)
            return open(pdb, "rb").read()
        except (OSError, subprocess.SubprocessError) as e:
            print("object_files: no PDB seed:", e)
            return None


def qemu_core():
    """A dump-guest-memory ELF core: one vCPU (CR0.PG, CR3 = 0) whose 4-level
    tables at physical 0 map its RIP 0x401000 to physical 0x4000."""
    pages = [{0: 0x1000 | P | RW}, {0: 0x2000 | P | RW}, {2: 0x3000 | P | RW}, {1: 0x4000 | P}, {}]
    mem = bytearray(4096 * len(pages))
    for i, entries in enumerate(pages):
        for idx, val in entries.items():
            struct.pack_into("<Q", mem, i * 4096 + idx * 8, val)
    cr_offset = 8 + 18 * 8 + 10 * 24
    state = bytearray(cr_offset + 5 * 8 + 8)
    struct.pack_into("<II", state, 0, 1, len(state))
    struct.pack_into("<Q", state, 8 + 16 * 8, 0x401000)  # rip
    struct.pack_into("<QQQQQ", state, cr_offset, 1 << 31, 0, 0, 0, 0)  # cr0..cr4
    note = struct.pack("<III", 5, len(state), 0) + b"QEMU\0\0\0\0" + bytes(state)
    phoff, phnum = 64, 2
    note_off = phoff + 56 * phnum
    mem_off = (note_off + len(note) + 4095) // 4096 * 4096
    ehdr = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    ehdr += struct.pack("<HHIQQQIHHHHHH", 4, 62, 1, 0, phoff, 0, 0, 64, 56, phnum, 0, 0, 0)
    ph_note = struct.pack("<IIQQQQQQ", 4, 0, note_off, 0, 0, len(note), len(note), 1)
    ph_load = struct.pack("<IIQQQQQQ", 1, 7, mem_off, 0, 0, len(mem), len(mem), 4096)
    head = ehdr + ph_note + ph_load + note
    return head.ljust(mem_off, b"\0") + bytes(mem)


def coverage_seeds():
    """Streams of 400 records cut in 1 to 7 places, loops mostly: a
    record's kind is mostly a run, its block the next few."""
    write = seed_writer("coverage_parts")
    keep = os.path.join(ROOT, "testdata", "fuzz", "coverage_parts")
    os.makedirs(keep, exist_ok=True)
    for seed in range(1, 7):
        x = seed * 0x9E3779B9 & 0xFFFFFFFF
        def nxt(n):
            nonlocal x
            x ^= (x << 13) & 0xFFFFFFFF
            x ^= x >> 17
            x ^= (x << 5) & 0xFFFFFFFF
            return x % n
        cuts = 1 + seed % 7
        data = bytearray([cuts])
        for _ in range(cuts):
            data += struct.pack("<H", nxt(401))
        block = 0
        for _ in range(400):
            kind = [0, 1, 2, 3, 0, 1, 4, 5, 6, 7][nxt(10)] if nxt(4) == 0 else 0
            block = (block + 1 + nxt(3)) % 16 if nxt(5) else nxt(256)
            data += bytes([kind, block, nxt(256)])
        name = "seed-%d" % seed
        write(name, bytes(data))
        with open(os.path.join(keep, name), "wb") as f:
            f.write(bytes(data))


if __name__ == "__main__":
    coverage_seeds()
    packet_seeds()
    page_walk_seeds()
    cr3_scan_seeds()
    fast_decode_seeds()
    parallel_decode_seeds()
    perf_seeds()
    regs_seeds()
    object_seeds()
