#!/usr/bin/env bash
# The benchmarks behind `make bench`: each part prints its figures and writes JSON results
# under runs/bench/. Add further parts below; one failing part fails the whole (after the
# others ran).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
out=${BENCH_OUT:-runs/bench}
if [ "$(id -u)" -ne 0 ]; then
  echo "bench: needs root (network namespaces)" >&2
  exit 1
fi
rc=0
part() {
  echo "== bench: $1"
  shift
  "$@" || { echo "bench: part failed: $*" >&2; rc=1; }
}

# linkemu (userspace link emulator): delay/rate/jitter/loss fidelity and forwarding speed.
part linkemu "$bin/python" -m torbed.bench.linkemu --out "$out" ${BENCH_QUICK:+--quick}

# Local backend: seconds to a ready network and per-node RSS/CPU (quickstart, 100 relays).
part backend "$bin/python" -m torbed.bench.backend --out "$out" ${BENCH_QUICK:+--runs 1 --soak 30}

# Torchestra: many circuits crossing the light/heavy thresholds both ways for minutes;
# zero failed (sha256-checked) transfers required, switches reported.
part torchestra "$bin/python" -m torbed.analysis.torchestra --out "$out" ${BENCH_QUICK:+--duration 2m}

# Prometheus: its and the exporters' CPU during quickstart; bring-up time and TTLB with it
# on vs off (same seed, alternating order).
part prometheus "$bin/python" -m torbed.bench.prometheus --out "$out" ${BENCH_QUICK:+--runs 1 --duration 60s}
# Background load (Locust through tor): users carried, CPU per user, at rising user counts.
part load "$bin/python" -m torbed.bench.load --out "$out" ${BENCH_QUICK:+--users 10,100 --duration 30}
# mtrelay (Engler & Goldberg 2021): relay throughput of a middle relay vs connection threads
# (stock, mtrelay-1/2/3), median and range over repetitions, ratio to single-threaded.
part mtrelay "$bin/python" -m torbed.bench.mtrelay --out "$out" ${BENCH_QUICK:+--quick}

# Experiments that used to sit in the test suite (pytest marker `experiment`): effect sizes
# and ratios between arms, each with its expected direction and bound (docs/testing.md).
part experiments make -s experiments

exit $rc
