"""The collector sidecar of a relay pod: the local backend's collectors (CELL_STATS,
throughput every bw_interval, MetricsPort every metrics_interval) on this pod's tor,
writing the same JSON lines, streamed to the results service as they are written."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from .. import collectors, constants
from . import Shipper, env, load_scenario, log, node_name, repetition, variant, write_hardware


def main(argv: list[str] | None = None) -> int:
    s = load_scenario()
    group = env("TORBED_GROUP")
    node = node_name(group)
    out = Path("/tmp/results")
    out.mkdir(parents=True, exist_ok=True)
    cfg = {
        "variant": variant(), "rep": repetition(), "output": str(out),
        "collect": [c for c in s.measure.collect if c != "transfers"],
        "bw_interval_s": s.measure.bw_interval.seconds,
        "metrics_interval_s": s.measure.metrics_interval.seconds,
        # tor takes a while to open its control port; the collector waits for it.
        "connect_timeout": s.measure.ready_timeout.seconds,
        "relays": [{"name": node, "group": group,
                    "control": {"address": "127.0.0.1", "port": constants.CONTROL_PORT},
                    "metrics_url": f"http://{env('POD_IP')}:{constants.METRICS_PORT}/metrics"}],
    }
    write_hardware(out, node, group)
    shipper = Shipper(out, env("TORBED_RESULTS_URL")).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log(f"collector {node}: collecting {', '.join(cfg['collect']) or 'nothing'}")
    try:
        errors = collectors.run(cfg, stop)
    finally:
        shipped = shipper.stop()
    for e in errors:
        log(f"collector: {e}")
    if not shipped:
        log("collector: some records could not be delivered to the results service")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
