#!/usr/bin/env bash
# Regenerates the project's own traces in replay/traces/ (see replay/traces/README.md):
# an HTTP browsing session (headless Chromium), an interactive SSH session (sshd + ssh on a
# pty) and a relay cell-timing log from our own testbed under load. Needs root (namespaces,
# tcpdump) and the capture packages: hack/install-deps.sh --capture. Takes about 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh --capture
py=.venv/bin/python
out=replay/traces
mkdir -p "$out"
$py replay/capture/http_session.py "$out/http-browsing.trace.jsonl.gz"
$py replay/capture/ssh_session.py "$out/ssh-session.trace.jsonl.gz"
runs=$(mktemp -d /tmp/torbed-capture-runs.XXXXXX)
trap 'rm -rf "$runs"' EXIT
.venv/bin/torbed run replay/capture/relay-load.yaml --out "$runs" --system-tor
run=$(find "$runs" -mindepth 1 -maxdepth 1 -type d | head -1)
$py replay/capture/relay_cells.py "$run" "$out/relay-cells.log.csv.gz" "$out/relay-cells.trace.jsonl.gz"
ls -l "$out"
