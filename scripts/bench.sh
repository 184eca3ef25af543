#!/usr/bin/env bash
# The benchmark command: builds in release mode and times hwtrace's decoders
# against their peers on the same bytes in the same run. Prints medians and
# ratios; BENCHMARKS.md records the latest figures. Benchmarks:
#   packets  hwtrace-packet vs libipt's packet decoder (real traces)
#   flow     hwtrace's instruction decoders vs libipt's (in-process)
#   decode   issue 8: every decoder as a child process over one corpus
#            repeated to 1 GiB (hwtrace flow --jobs 1 and --jobs N, libipt's
#            packet/instruction/block decoders, perf script, iptr, ptcov):
#            MB/s, instructions/s, peak RSS, checked instruction counts;
#            and hwtrace against libipt's block decoder on a trace decoded
#            once (sort under qemu-user), which no memo of repeated bytes
#            reaches
#   answers  report, calls, coverage and timeline against the decode they
#            stand on (hwtrace flow --jobs 1), on the decode corpus's
#            32 MiB prefixes (mixed and real traces)
#   all      the four (the default)
# Options are passed on, e.g.:
#   bash scripts/bench.sh packets --size-mib 256 --runs 7
#   bash scripts/bench.sh decode --size-mib 1024 --runs 3
# The decode corpus is built once under the target folder
# ($CARGO_TARGET_DIR or target/, bench-corpus/) and reused.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked -p hwtrace-bench -p hwtrace
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
"${CARGO_TARGET_DIR:-target}/release/hwtrace-bench" "${@:-all}"
echo "load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
