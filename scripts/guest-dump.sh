#!/usr/bin/env bash
# Boots a real Debian kernel under QEMU (TCG) with a busybox initramfs, dumps
# guest memory over QMP (dump-guest-memory, ELF), asks QEMU's monitor to
# translate thousands of addresses (gva2gpa) and for `info mem`, then checks
# `hwtrace mem translate` and `hwtrace mem maps --qemu` against those answers.
#
#   scripts/guest-dump.sh [OUT_DIR]        (default: target/guest)
#
# Env: HWTRACE=path to the hwtrace binary (default: built with cargo),
#      LEVELS="4 5" paging modes to try (5 = -cpu qemu64,+la57),
#      SAMPLES=addresses per run (default 4000), MEM=guest RAM (default 256M).
# Needs root for apt-get (qemu-system-x86 is installed, the kernel and
# busybox-static packages are only downloaded and unpacked). Nothing large is
# written to the repository: the dumps stay in OUT_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(realpath -m "${1:-$ROOT/target/guest}")
LEVELS=${LEVELS:-"4 5"}
SAMPLES=${SAMPLES:-4000}
MEM=${MEM:-256M}
mkdir -p "$OUT"

log() { echo "guest-dump: $*" >&2; }

# --- tools and packages -------------------------------------------------------
if ! command -v qemu-system-x86_64 >/dev/null; then
    log "installing qemu-system-x86"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
fi
PKGS="$OUT/pkgs"
mkdir -p "$PKGS"
if [ ! -e "$PKGS/vmlinuz" ]; then
    # linux-image-amd64 is a metapackage: its Depends names the real image.
    IMAGE=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    [ -n "$IMAGE" ] || { apt-get update -qq; IMAGE=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'); }
    log "downloading $IMAGE and busybox-static"
    (cd "$PKGS" && apt-get download -qq "$IMAGE" busybox-static)
    for deb in "$PKGS"/*.deb; do dpkg-deb -x "$deb" "$PKGS/root"; done
    cp "$PKGS"/root/boot/vmlinuz-* "$PKGS/vmlinuz"
fi

# --- initramfs: busybox as /init, a few processes, then a ready marker ---------
# The file name changes with the init script below, so that an older cached
# initramfs is not booted instead.
INITRD="$OUT/initrd-2.gz"
if [ ! -e "$INITRD" ]; then
    python3 - "$PKGS/root/bin/busybox" "$INITRD" <<'PY'
import gzip, os, sys
busybox, out = sys.argv[1], sys.argv[2]
init = b"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev 2>/dev/null
/bin/busybox --install -s /bin
# Three subshells, each waiting for a `sleep` that outlives the test: the
# processes are all there whenever the guest is stopped.
for i in 1 2 3; do (sleep 100000; echo never) & done
dd if=/dev/zero of=/tmp/fill bs=1M count=8 2>/dev/null
echo GUEST-READY
exec sleep 100000
"""
entries = []
def add(name, mode, data=b""):
    entries.append((name, mode, data))
for d in ("bin", "proc", "sys", "dev", "tmp"):
    add(d, 0o040755)
add("bin/busybox", 0o100755, open(busybox, "rb").read())
add("init", 0o100755, init)
buf = bytearray()
def pad4():
    while len(buf) % 4:
        buf.append(0)
for ino, (name, mode, data) in enumerate(entries + [("TRAILER!!!", 0, b"")], 1):
    nb = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0]
    buf += b"070701" + b"".join(b"%08X" % f for f in fields)
    buf += nb
    pad4()
    buf += data
    pad4()
with gzip.open(out, "wb") as f:
    f.write(bytes(buf))
PY
fi

# --- hwtrace ------------------------------------------------------------------
if [ -z "${HWTRACE:-}" ]; then
    (cd "$ROOT" && cargo build -q -p hwtrace)
    HWTRACE="${CARGO_TARGET_DIR:-$ROOT/target}/debug/hwtrace"
fi

# --- one boot per paging mode -------------------------------------------------
status=0
for level in $LEVELS; do
    RUN="$OUT/la$level"
    rm -rf "$RUN"; mkdir -p "$RUN"
    cpu=qemu64; [ "$level" = 5 ] && cpu=qemu64,+la57
    log "booting ($level-level paging, -cpu $cpu)"
    qemu-system-x86_64 -machine q35 -accel tcg -cpu "$cpu" -smp 1 -m "$MEM" \
        -kernel "$PKGS/vmlinuz" -initrd "$INITRD" \
        -append "console=ttyS0 panic=-1 quiet" \
        -display none -serial "file:$RUN/console.log" -no-reboot \
        -qmp "unix:$RUN/qmp.sock,server=on,wait=off" &
    QEMU_PID=$!
    python3 - "$RUN" "$SAMPLES" "$HWTRACE" <<'PY' || status=1
import json, os, random, socket, subprocess, sys, time
run, samples, hwtrace = sys.argv[1], int(sys.argv[2]), sys.argv[3]
deadline = time.time() + 600
while b"GUEST-READY" not in (open(f"{run}/console.log", "rb").read() if os.path.exists(f"{run}/console.log") else b""):
    if time.time() > deadline:
        sys.exit("guest did not become ready in 600 s")
    time.sleep(2)
time.sleep(3)
s = socket.socket(socket.AF_UNIX)
s.connect(f"{run}/qmp.sock")
f = s.makefile("rw")
def cmd(name, **args):
    f.write(json.dumps({"execute": name, "arguments": args}) + "\n"); f.flush()
    while True:
        r = json.loads(f.readline())
        if "return" in r: return r["return"]
        if "error" in r: raise SystemExit(f"{name}: {r['error']}")
def hmp(line):
    return cmd("human-monitor-command", **{"command-line": line})
json.loads(f.readline())
cmd("qmp_capabilities")
cmd("stop")
open(f"{run}/info-mem.txt", "w").write(hmp("info mem"))
open(f"{run}/info-registers.txt", "w").write(hmp("info registers"))
cmd("dump-guest-memory", paging=False, protocol=f"file:{run}/guest.elf")
# QEMU 7.2 prints nothing for `info mem` under LA57: then take the ranges to
# sample from hwtrace (the gva2gpa answers stay QEMU's own).
lines = open(f"{run}/info-mem.txt").read().splitlines()
if not lines:
    lines = subprocess.run([hwtrace, "mem", "maps", "--qemu", "--dump", f"{run}/guest.elf"],
                           capture_output=True, text=True).stdout.splitlines()
ranges = []
for line in lines:
    a, rest = line.split("-", 1)
    b = rest.split()[0]
    ranges.append((int(a, 16), int(b, 16)))
rng = random.Random(6)
addrs = set()
# Both ends of (a sample of) the mapped ranges and the first byte after each,
# where off-by-one mistakes live; then random addresses inside ranges and
# anywhere in the address space. SAMPLES bounds the total: each answer is
# one monitor round trip.
for a, b in rng.sample(ranges, min(len(ranges), samples // 6)):
    addrs.update({a, b - 1, b})
while len(addrs) < samples and ranges:
    a, b = rng.choice(ranges)
    addrs.add(rng.randrange(a, b))
    addrs.add(rng.getrandbits(64) & rng.choice([0x7fff_ffff_ffff, 0xffff_ffff_ffff_ffff]))
with open(f"{run}/gva2gpa.txt", "w") as out:
    for va in sorted(addrs):
        r = hmp(f"gva2gpa {va:#x}").strip()
        out.write(f"{va:#018x} {r.split()[-1] if r.startswith('gpa:') else '-'}\n")
cmd("quit")
PY
    wait "$QEMU_PID" || true
    [ -e "$RUN/guest.elf" ] || { log "no dump for $level-level"; status=1; continue; }

    # --- compare ---------------------------------------------------------------
    cut -d' ' -f1 "$RUN/gva2gpa.txt" | xargs "$HWTRACE" mem translate --short --dump "$RUN/guest.elf" \
        > "$RUN/hwtrace-translate.txt" || true
    "$HWTRACE" mem maps --qemu --dump "$RUN/guest.elf" > "$RUN/hwtrace-maps.txt" 2> "$RUN/hwtrace-maps.err" || true
    python3 - "$RUN" "$level" <<'PY' || status=1
import sys
run, level = sys.argv[1], sys.argv[2]
def norm(v):
    return v if v == "-" else int(v, 16)
qemu = {int(l.split()[0], 16): norm(l.split()[1]) for l in open(f"{run}/gva2gpa.txt")}
ours = {int(l.split()[0], 16): norm(l.split()[1]) for l in open(f"{run}/hwtrace-translate.txt")}
bad = [va for va in qemu if ours.get(va) != qemu[va]]
mapped = sum(1 for v in qemu.values() if v != "-")
print(f"{level}-level: translate: {len(qemu) - len(bad)} agree, {len(bad)} differ ({mapped} mapped, {len(qemu) - mapped} unmapped)")
for va in bad[:10]:
    print(f"  {va:#x}: qemu {qemu[va]} hwtrace {ours.get(va)}")
qm = open(f"{run}/info-mem.txt").read().split("\n")
hm = open(f"{run}/hwtrace-maps.txt").read().split("\n")
same = qm == hm
if qm == [""]:
    same = True
    print(f"{level}-level: maps: QEMU printed no info mem (LA57 in QEMU 7.2); not compared")
else:
    print(f"{level}-level: maps: {len([l for l in qm if l])} ranges from qemu, {len([l for l in hm if l])} from hwtrace, {'identical' if same else 'DIFFERENT'}")
sys.exit(0 if not bad and same else 1)
PY
done
exit $status
