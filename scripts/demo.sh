#!/usr/bin/env bash
# The main job on a real example: record a real program on this machine and
# show what it did. On an Intel machine with PT, `hwtrace record` uses the
# hardware (perf_event_open); anywhere else (AMD, VMs) it says so and records
# the real execution with qemu-user instead, writing the perf.data Intel PT
# would have written. Then `hwtrace report` decodes it: top functions,
# images, threads, trace health, a flame graph and a Perfetto timeline.
#
#   bash scripts/demo.sh [CMD ARGS...]     (default: gzip -9 of the README)
#
# Writes into target/demo/. Needs root for apt-get only when qemu-user is
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v qemu-x86_64 >/dev/null && [ ! -d /sys/bus/event_source/devices/intel_pt ]; then
    echo "demo: installing qemu-user (the portable capture records with it)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user >/dev/null
fi
cargo build --release -q -p hwtrace
hwtrace="${CARGO_TARGET_DIR:-target}/release/hwtrace"
out=target/demo
mkdir -p "$out"

if [ $# -eq 0 ]; then
    set -- gzip -9 -c README.md
fi
echo "demo: hwtrace record -o $out/perf.data -- $*" >&2
"$hwtrace" record -o "$out/perf.data" -- "$@" >"$out/stdout"
echo >&2
"$hwtrace" report "$out/perf.data" --quiet \
    --flame "$out/flame.svg" --timeline "$out/timeline.json" --tree "$out/calls.txt"
echo
echo "Also try: $hwtrace perf decode $out/perf.data | head      (every instruction)"
echo "          $hwtrace coverage $out/perf.data --drcov $out/cov.drcov   (coverage for Lighthouse)"
echo "          open $out/timeline.json in https://ui.perfetto.dev, $out/flame.svg in a browser"
