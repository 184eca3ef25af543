#!/usr/bin/env bash
# Install the system packages that hwtrace's tests and benchmarks need on a
# Debian machine (run as root). None of them is needed to *run* hwtrace:
#   libipt-dev, libipt2  Intel's reference decoder (libipt 2.0.5), cross-checked
#                        by crates/hwtrace-libipt and used in benchmarks
#   linux-perf           `perf`, for `perf script --itrace` comparisons
#   qemu-user            `qemu-x86_64`, an independent recorder of real executions
#   binutils             objdump/readelf for fixtures
#   time                 /usr/bin/time, to measure peak memory in tests
#   chromium             headless Chromium renders flame graphs and timeline pages
#                        (crates/hwtrace/tests/calls_render.rs)
#   lcov, gcc            `genhtml` renders `hwtrace coverage --lcov` output of a
#                        program gcc builds with DWARF (tests/coverage_qemu.rs)
#   clang, lld, llvm     build a PE + PDB at test time (clang -gcodeview, lld-link)
#                        and cross-check it with llvm-pdbutil (hwtrace-report/tests/pdb_symbols.rs)
#   lz4, zstd, xz-utils, bzip2
#                        compress traces as kAFL and users save them
#                        (crates/hwtrace/tests/compressed_traces.rs)
# Idempotent and fast when everything is present: `dpkg -s` is checked before
# any `apt-get update`.
set -euo pipefail

packages=(libipt-dev libipt2 linux-perf qemu-user binutils time chromium lcov gcc clang lld llvm lz4 zstd xz-utils bzip2)

missing=()
for pkg in "${packages[@]}"; do
    if ! dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install ok installed$'; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup.sh: missing packages (${missing[*]}) and apt-get is not available" >&2
    exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo=(sudo)
    else
        echo "setup.sh: missing packages (${missing[*]}); run as root to install them" >&2
        exit 1
    fi
fi

echo "setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >/dev/null
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
