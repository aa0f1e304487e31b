#!/usr/bin/env bash
# `make demo`: run scenarios/quickstart.yaml (two variants) on this machine and report it.
# The design concludes in minutes: 3 short blocks per variant (repetition k of both variants
# back to back, so the report pairs them) and one comparison declared here, before the run,
# as the primary one (report --primary: tested alone at alpha 0.05; the rest stay under Holm).
# The first run builds tor for each variant (cached afterwards under ~/.cache/torbed).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
scenario=${SCENARIO:-scenarios/quickstart.yaml}
out=${OUT:-runs}
repetitions=${REPETITIONS:-3}
warmup=${WARMUP:-5s}
duration=${DURATION:-20s}
primary=${PRIMARY:-ttlb_s/web:small}
start=$SECONDS
if [ "$(id -u)" -ne 0 ]; then
  echo "demo: running unprivileged; torbed will use a user namespace (needs unprivileged user namespaces)" >&2
fi
"$bin/torbed" validate "$scenario"
"$bin/torbed" plan "$scenario"
echo "demo: $repetitions blocks per variant (warm-up $warmup, duration $duration each, overriding the" \
     "scenario's repetitions and measure); primary comparison: $primary" >&2
# `torbed run` prints the run directory on stdout (its progress goes to stderr); it exits 1
# when a repetition failed, and the report still says what the others measured.
run_dir=$("$bin/torbed" run "$scenario" --out "$out" --repetitions "$repetitions" --warmup "$warmup" \
          --duration "$duration") || [ -n "${run_dir:-}" ]
"$bin/torbed" report "$run_dir" --primary "$primary"
echo
echo "demo: done in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s; the report is at" \
     "$run_dir/report/report.html (also report.md, summary.json, figures/)"
