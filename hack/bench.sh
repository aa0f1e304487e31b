#!/usr/bin/env bash
# The benchmarks behind `make bench`: the part table is torbed/bench/__main__.py
# (`python -m torbed.bench --help` lists the parts; name some to run only those). Each part
# prints its figures and writes JSON results under runs/bench/ (BENCH_OUT); BENCH_QUICK=1:
# each part's shorter settings. One failing part fails the whole (after the others ran).
# `python -m torbed.bench.table --record PART ...` then puts their figures in docs/performance.md.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "bench: needs root (network namespaces)" >&2
  exit 1
fi
exec .venv/bin/python -m torbed.bench --out "${BENCH_OUT:-runs/bench}" ${BENCH_QUICK:+--quick} "$@"
