#!/usr/bin/env bash
# `make demo`: run scenarios/quickstart.yaml (two variants) on this machine and report it.
# The first run builds tor for each variant (cached afterwards under ~/.cache/torbed).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
scenario=${SCENARIO:-scenarios/quickstart.yaml}
out=${OUT:-runs}
if [ "$(id -u)" -ne 0 ]; then
  echo "demo: running unprivileged; torbed will use a user namespace (needs unprivileged user namespaces)" >&2
fi
"$bin/torbed" validate "$scenario"
"$bin/torbed" plan "$scenario"
# `torbed run` prints the run directory on stdout (its progress goes to stderr).
run_dir=$("$bin/torbed" run "$scenario" --out "$out")
"$bin/torbed" report "$run_dir"
echo
echo "demo: the report is at $run_dir/report/report.html (also report.md, summary.json, figures/)"
