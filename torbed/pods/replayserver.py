"""A server group's replay container: the replay server (torbed.replay.server) for the
scenario's replay workloads that name this group, its upstream cells streamed to the
results service (cells.jsonl, beside the clients' downstream cells), and the clock
exchanges of the replay clients answered on the UDP port of the same number.

Traces are looked up as the scenario names them, by file name in TORBED_TRACE_DIRS (the
client image ships the project's traces; the chart mounts a release's own first).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from ..errors import EXIT_OK
from ..replay.server import ReplayServer
from ..workloads import trace_name
from . import Shipper, env, load_scenario, log


def traces_for(s, group: str) -> dict[str, Path]:
    """{trace name: path} of the replay workloads served by ``group``."""
    out = {}
    for cg in s.clients.values():
        wl = cg.workload
        if wl.kind == "replay" and (wl.server or next(iter(s.servers))) == group:
            path = s.trace_path(wl.trace)
            out[trace_name(path)] = path
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="torbed replay server pod container")
    ap.add_argument("--scenario", type=Path, required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--port", type=int, default=8000, help="TCP replay port; UDP for clock exchanges")
    ap.add_argument("--results", type=Path, default=Path("/tmp/results"))
    args = ap.parse_args(argv)
    s = load_scenario(args.scenario)
    traces = traces_for(s, args.group)
    args.results.mkdir(parents=True, exist_ok=True)
    shipper = Shipper(args.results, env("TORBED_RESULTS_URL")).start()
    srv = ReplayServer(traces, "0.0.0.0", args.port, args.results / "cells.jsonl", sys.stderr)
    srv.log(f"replay server {args.group}: {', '.join(f'{n} ({p})' for n, p in traces.items())} "
            f"on :{args.port} (TCP replay, UDP clock)")
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown, daemon=True).start())
    try:
        srv.serve_forever()
    finally:
        srv.writer.close()
        if not shipper.stop():
            log(f"replay server {args.group}: some records could not be delivered to the results service")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
