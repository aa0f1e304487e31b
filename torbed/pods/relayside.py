"""The collector sidecar of a relay pod: the local backend's collectors (CELL_STATS,
throughput every bw_interval, MetricsPort every metrics_interval) on this pod's tor,
writing the same JSON lines, streamed to the results service as they are written."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

from .. import collectors, constants
from ..errors import EXIT_FAILED, EXIT_OK
from . import (Shipper, bringup, cpusample, env, fingerprints, load_scenario, log, node_name, plan, repetition, service_host,
               variant, write_hardware, TOR_MACHINE_FILE)
from .bringup import connect_control


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
        # The collectors' exporter for the cluster's Prometheus (PodMonitor / in-chart).
        "metrics_listen": [env("POD_IP"), constants.COLLECTOR_METRICS_PORT],
    }
    shipper = Shipper(out, env("TORBED_RESULTS_URL")).start()
    # The CPU gate's samples of this pod (tor, the shaper, this collector): the chart shares
    # the relay pod's process namespace, so their /proc entries are visible here.
    mech = s.measure.mechanism
    cpu = cpusample.start(out, node, group, "relay", threads=mech.kind == "cpu-bound" and mech.target == group)
    # With the architecture the tor container runs as, once it has said (it starts beside us;
    # under qemu-user that can take minutes, and a guess would record the wrong hardware).
    threading.Thread(target=write_hardware, args=(out, node, group, TOR_MACHINE_FILE), daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log(f"collector {node}: collecting {', '.join(cfg['collect']) or 'nothing'}")
    # Bring-up help (torbed.pods.bringup): SIGHUP once the consensus exists; a guard reports
    # when it can serve the clients.
    bringup.start_relay_nudge(
        plan(s), fingerprints(), node, env("TORBED_RESULTS_URL"), env("POD_NAME"),
        [f"http://{service_host(f'auth-{i}')}:{constants.DIR_PORT}" for i in range(s.network.authorities)],
        lambda: connect_control(time.time() + s.measure.ready_timeout.seconds), s.measure.ready_timeout.seconds, stop)
    try:
        errors = collectors.run(cfg, stop)
    finally:
        # Stopped by SIGTERM: the pod is being deleted. Mid-run (a kill fault) the results
        # service takes the last records at the first attempt; at uninstall it is being
        # deleted too (the backend fetched everything before), and retrying (30 s by
        # default) only held the pod for its whole grace period.
        errors_cpu = cpu.stop()
        shipped = shipper.stop(attempts=3)
    for e in errors + [f"cpu samples: {x}" for x in errors_cpu]:
        log(f"collector: {e}")
    if not shipped:
        log("collector: some records could not be delivered to the results service")
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
