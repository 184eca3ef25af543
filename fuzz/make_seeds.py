#!/usr/bin/env python3
"""Seed corpora for the fuzz targets (written to fuzz/corpus/, which git ignores).

packet_decode: every trace of ../shared/corpus (libipt scenarios and real traces).
page_walk:     16 bytes of parameters (va, flags, cr3 page, MAXPHYADDR) followed by
               physical memory holding small but valid 4- and 5-level page tables,
               so the fuzzer starts from walks that reach every level.

Run from the repository root:  python3 fuzz/make_seeds.py
"""
import glob
import os
import shutil
import struct

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


if __name__ == "__main__":
    packet_seeds()
    page_walk_seeds()
