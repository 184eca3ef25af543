#!/usr/bin/env bash
# The benchmark command: builds in release mode and times hwtrace's decoders
# against their peers (libipt 2.0.5 from Debian's libipt-dev) on the same
# bytes in the same run. Prints medians and ratios; BENCHMARKS.md records the
# latest figures. Options are passed on, e.g.:
#   bash scripts/bench.sh packets --size-mib 256 --runs 7
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked -p hwtrace-bench
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
exec "${CARGO_TARGET_DIR:-target}/release/hwtrace-bench" "${@:-all}"
