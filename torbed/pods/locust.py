"""The background-load pods (scenario ``load:``, charts/torbed templates/load/), in the locust image.

``python -m torbed.pods.locust worker``: beside the pod's tor (torbed-node, role loadworker),
wait until that tor is ready as a client's is (torbed.readiness; its path relays known), set
the load's path (load.path) over the control port, report ready to the results service (the
load nodes are part of the start barrier, as on the local backend), then exec the Locust
worker, connected to the master's Service.

``python -m torbed.pods.locust master``: run the Locust master (web UI on WEB_PORT, for
``kubectl port-forward``) from pod start; when the start barrier opens (t_workload), wait for
load.start, then for every worker, and start the users through the master's own web API
(/swarm, with load.stop as run time: Locust stops them itself). Its statistics (load.jsonl,
written by the locustfile while users run) are streamed to the results service, and served
to Prometheus on port 9038 (torbed.load.metrics; the chart's Service port ``metrics``). The master
then stays up, idle, so its web UI shows the finished test until the release is removed.

The Locust program is ``$TORBED_LOCUST`` (the image's /opt/locust venv); the locustfile is
torbed/load/locustfile.py, which imports nothing of torbed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .. import constants, load
from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from . import Shipper, env, fingerprints, load_scenario, log, plan, repetition, service_host, variant, write_hardware
from .bringup import connect_control, wait_network, wait_start

MASTER_PORT = 5557
WEB_PORT = 8089
CONFIG = Path("/tmp/locust.json")
RESULTS = Path("/tmp/results")
WORKERS_WAIT_S = 60.0


def node() -> str:
    """What torbed-node names this load node's tor: load<the pod name's random suffix>."""
    return "load" + env("POD_NAME").rsplit("-", 1)[-1]


def locust_argv() -> list[str]:
    return [os.environ.get("TORBED_LOCUST", "locust"), "-f", str(load.LOCUSTFILE), "--loglevel", "INFO"]


def write_config(s, output: Path) -> None:
    """The locustfile's JSON, as the local backend writes it, with the load's server group
    addressed by its Service (as the foreground clients address theirs here)."""
    group = s.load_server()
    server_ip = socket.gethostbyname(service_host(group))
    manifest = {f"load-{name}": {"size": r.size.bytes} for name, r in s.load.mix.items()}
    # The master's exporter listens on the pod's address (the chart's Service port metrics).
    cfg = load.locust_config(s, plan(s), manifest, variant=variant(), rep=repetition(), output=output,
                             servers=[f"http://{server_ip}:{s.servers[group].port}"], socks_port=constants.SOCKS_PORT,
                             metrics=True, metrics_address="0.0.0.0")
    CONFIG.write_text(json.dumps(cfg, indent=1))


def worker() -> int:
    s = load_scenario()
    me = node()
    p = plan(s)
    deadline = time.time() + s.measure.ready_timeout.seconds
    ctl = connect_control(deadline)
    fprs = fingerprints()
    path_nodes = [r.name for g in (s.load.path or []) for r in p.group_nodes(g)]
    why = wait_network(ctl, p, fprs, path_nodes, deadline)
    if why is not None:
        log(f"load node {me}: network not ready after {s.measure.ready_timeout}: {why}")
        return EXIT_FAILED
    opts = load.path_options(s, p, fprs)
    if opts:
        ctl.set_options(list(opts.items()))
        log(f"load node {me}: circuits only through {', '.join(s.load.path)}")
    ctl.close()
    write_config(s, RESULTS / "load.jsonl")   # a worker writes no statistics
    t_work = wait_start(env("TORBED_RESULTS_URL"), node=me, deadline=deadline)
    if t_work is None:
        log(f"load node {me}: not every client was ready within {s.measure.ready_timeout}")
        return EXIT_FAILED
    log(f"load node {me}: ready; Locust worker connecting to the master")
    argv = locust_argv() + ["--worker", "--master-host", service_host("locust"), "--master-port", str(MASTER_PORT)]
    os.execvpe(argv[0], argv, {**os.environ, "TORBED_LOAD_CONFIG": str(CONFIG), "TORBED_LOAD_NODE": me})
    return EXIT_FAILED   # not reached


def _web(path: str, form: dict | None = None, timeout: float = 10) -> dict:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    with urllib.request.urlopen(f"http://127.0.0.1:{WEB_PORT}{path}", data=data, timeout=timeout) as r:
        return json.loads(r.read())


def _workers() -> int:
    try:
        return sum(1 for w in _web("/stats/requests").get("workers", []) if w.get("state") != "missing")
    except (urllib.error.URLError, OSError, ValueError):
        return 0


def master() -> int:
    s = load_scenario()
    ld = s.load
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_config(s, RESULTS / "load.jsonl")
    write_hardware(RESULTS, "locust0", "locust")
    url = env("TORBED_RESULTS_URL")
    shipper = Shipper(RESULTS, url).start()
    csv_dir = Path("/tmp/locust")
    csv_dir.mkdir(exist_ok=True)
    argv = locust_argv() + [
        "--master", "--master-bind-port", str(MASTER_PORT), "--web-host", "0.0.0.0", "--web-port", str(WEB_PORT),
        "--csv", str(csv_dir / "stats"), "--csv-full-history", "--exit-code-on-error", "0"]
    proc = subprocess.Popen(argv, env={**os.environ, "TORBED_LOAD_CONFIG": str(CONFIG), "TORBED_LOAD_NODE": "locust0"})
    stopping = []
    # Pod deletion: Locust writes its last statistics on SIGTERM; ship them, then leave.
    signal.signal(signal.SIGTERM, lambda *_: (stopping.append(1), proc.terminate()))
    rc = EXIT_OK
    try:
        t_work = wait_start(url, alive=lambda: proc.poll() is None, interval=0.5)
        if t_work is not None:
            t_start, t_stop = t_work + ld.start.seconds, t_work + (ld.stop or s.measure.duration).seconds
            while proc.poll() is None and time.time() < t_start:
                time.sleep(0.2)
            deadline = time.time() + WORKERS_WAIT_S
            while proc.poll() is None and _workers() < ld.workers and time.time() < deadline:
                time.sleep(0.5)
            if proc.poll() is None and time.time() < t_stop - 1:   # (a restarted master past load.stop: no load)
                got = _workers()
                if got < ld.workers:
                    log(f"locust master: {got} of {ld.workers} workers connected after {WORKERS_WAIT_S:.0f} s")
                run_time = max(1, round(t_stop - time.time()))
                answer = _web("/swarm", {"user_count": ld.users, "spawn_rate": ld.spawn_rate,
                                         "run_time": f"{run_time}s"})
                log(f"locust master: {ld.users} users on {got} worker(s) for {run_time} s: {answer.get('message')}")
        rc = proc.wait()
        if not stopping:
            log(f"locust master: Locust exited ({rc})")
            rc = rc or EXIT_FAILED
        else:
            rc = EXIT_OK
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
        if not shipper.stop():
            log("locust master: some statistics could not be delivered to the results service")
            rc = EXIT_FAILED
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["worker"]:
        return worker()
    if argv == ["master"]:
        return master()
    print("usage: python -m torbed.pods.locust master|worker", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
