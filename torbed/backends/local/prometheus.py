"""A real Prometheus (Debian's package) beside a local run, and serving a finished run's TSDB.

While a repetition runs, Prometheus runs in the run's switch namespace (the control plane:
it holds the control address on the private network and has no route anywhere else), so it
reaches every node's exporters and nothing outside the testbed. It scrapes

- ``tor``: every relay's MetricsPort (``tor_relay_*``),
- ``driver``: every client's measurement driver (``torbed_transfer*``, ``torbed_circuit*``,
  ``torbed.client.metrics``),
- ``collector``: the collectors' exporter in the switch namespace (CELL_STATS cells and
  queue wait per relay, linkemu's per-port and per-link counters when linkemu runs),
- ``locust``: the Locust master's exporter when the scenario has ``load:``
  (``torbed_load_*``, ``torbed.load.metrics``; up only from load.start to load.stop),
- ``prometheus``: itself (its own CPU and memory cost),

with target labels ``node``, ``role``, ``group``, ``variant``, ``release`` (the run
directory's name) and ``rep``. Its TSDB is ``<variant>/rep-<k>/prometheus/`` in the run
directory, kept after the run; scrape settings go to meta.json (``prometheus``). The
Supervisor stops it at teardown (SIGTERM: it closes its TSDB cleanly).

torbed's own process stays outside the run's namespaces, so it forwards a loopback port to
Prometheus (``Forwarder``): the live URL printed at bring-up. ``torbed prometheus RUN_DIR``
serves a finished repetition read-only: Prometheus on a copy of its TSDB (Prometheus writes
to the TSDB directory it opens), which is removed again when it stops.

Public API:

- ``binary() -> str``; ``version(binary) -> str``; raises ``RunFailed`` when missing
- ``scrape_config(plan, ...) -> dict`` the prometheus.yml of one repetition
- ``start(rep, console) -> Forwarder | None`` (local backend), or its halves ``launch(rep) ->
  handle`` and ``ready(rep, console, handle) -> Forwarder | None``; ``meta_entry`` is recorded
- ``Forwarder(ns, address, port)``: ``.url``, ``.close()``; ``pump(src, dst)``: one direction of a TCP relay
- ``serve(tsdb, port=0) -> Served`` (context manager: ``.url``); ``graph_url(base, expr, t0, t1)``
- ``repetitions_with_tsdb(run_dir) -> [Path]``
- ``RELAY_THROUGHPUT``: the PromQL of relay throughput (bytes written per second per relay)
"""

from __future__ import annotations

import datetime as dt
import http.client
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import yaml

from ... import constants
from . import netns
from ...errors import RunFailed

PORT = 9090                    # inside the switch namespace (its own loopback)
READY_TIMEOUT = 30.0
# Keep everything: a run's TSDB is a record, not a rolling window (the default is 15 days).
RETENTION = "100y"
RELAY_THROUGHPUT = 'sum by (node) (rate(tor_relay_traffic_bytes{direction="written"}[30s]))'


def binary() -> str:
    found = shutil.which("prometheus")
    if not found:
        raise RunFailed("'prometheus' not found: apt-get install --no-install-recommends prometheus "
                        "(`make setup` does), or set measure.prometheus.enabled: false")
    return found


def version(path: str) -> str:
    p = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    first = (p.stdout or p.stderr).splitlines()
    return first[0].split("version", 1)[-1].split()[0] if first else "unknown"


def scrape_config(plan, *, release: str, variant: str, rep: int, interval_s: float,
                  driver_port: int | None, collector_port: int | None) -> dict:
    """prometheus.yml for one repetition: static targets only (nothing is discovered, so
    nothing outside the plan is ever contacted)."""
    base = {"variant": variant, "release": release, "rep": str(rep)}

    def target(addr: str, port: int, n, **extra) -> dict:
        labels = {**base, **extra}
        if n is not None:
            labels.update(node=n.name, role=n.role, group=n.group)
        return {"targets": [f"{addr}:{port}"], "labels": labels}

    jobs = [{"job_name": "prometheus",
             "static_configs": [target("127.0.0.1", PORT, None, node="prometheus", role="control")]},
            {"job_name": "tor", "static_configs": [target(r.address, r.ports["metrics"], r)
                                                   for r in plan.by_role("relay") if "metrics" in r.ports]}]
    if driver_port:
        # The driver's own group/variant labels are the same values; honour them.
        jobs.append({"job_name": "driver", "honor_labels": True,
                     "static_configs": [target(c.address, driver_port, c) for c in plan.by_role("client")]})
    for m in plan.by_role("loadmaster"):
        # Its series carry the same variant; honour them like the driver's.
        jobs.append({"job_name": "locust", "honor_labels": True,
                     "static_configs": [target(m.address, m.ports["metrics"], m)]})
    if collector_port:
        jobs.append({"job_name": "collector", "honor_labels": True,
                     "static_configs": [target("127.0.0.1", collector_port, None, node="collector",
                                               role="control")]})
    interval = f"{max(1, round(interval_s))}s"
    return {"global": {"scrape_interval": interval, "scrape_timeout": interval,
                       "evaluation_interval": interval},
            "scrape_configs": jobs}


def _http_get(sock_factory, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    s = sock_factory()
    s.settimeout(timeout)
    conn = http.client.HTTPConnection("prometheus", timeout=timeout)
    conn.sock = s
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _wait_ready(sock_factory, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.time() + READY_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise RunFailed(f"prometheus exited with status {proc.returncode} (log: {log})")
        try:
            status, _ = _http_get(sock_factory, "/-/ready", timeout=2.0)
            if status == 200:
                return
        except OSError:
            pass
        if time.time() > deadline:
            raise RunFailed(f"prometheus not ready within {READY_TIMEOUT:.0f} s (log: {log})")
        time.sleep(0.2)


def _argv(path: str, config: Path, tsdb: Path, listen: str) -> list[str]:
    return [path, f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
            f"--storage.tsdb.retention.time={RETENTION}", f"--web.listen-address={listen}",
            # No admin API, no lifecycle endpoints, no remote-write receiver (all off by
            # default; said here so nobody turns them on by accident).
            "--log.level=warn"]


def start(rep, console) -> "Forwarder | None":
    """Start Prometheus for a local repetition (``rep``: engine.Repetition with the local
    backend's state) unless the scenario switched it off; returns the live forwarder."""
    return ready(rep, console, launch(rep))


def launch(rep) -> dict | None:
    """The first half of ``start``: the Prometheus process, not waited for (the local backend
    launches the tors meanwhile). Returns what ``ready`` needs, or None when switched off."""
    s = rep.scenario
    cfg = s.measure.prometheus
    if not cfg.enabled:
        rep.meta["prometheus"] = {"enabled": False}
        return None
    st = rep.state
    path = binary()
    interval = cfg.scrape_interval.seconds
    conf = scrape_config(st.plan, release=rep.run.run_dir.name, variant=rep.variant, rep=rep.index,
                         interval_s=interval, driver_port=constants.DRIVER_METRICS_PORT,
                         collector_port=constants.COLLECTOR_METRICS_PORT)
    cfg_dir = rep.dir / "config"
    cfg_dir.mkdir(exist_ok=True)
    config = cfg_dir / "prometheus.yml"
    config.write_text(yaml.safe_dump(conf, sort_keys=False))
    tsdb = rep.dir / "prometheus"
    tsdb.mkdir(exist_ok=True)
    log = rep.logs / "prometheus.log"
    t_start = time.time()
    ns = st.topo.switch
    proc = st.sup.start("prometheus", netns.exec_prefix(ns) + _argv(path, config, tsdb, f"127.0.0.1:{PORT}"), log)
    return {"proc": proc, "log": log, "ns": ns, "t_start": t_start, "path": path, "interval": interval, "conf": conf}


def ready(rep, console, launched: dict | None) -> "Forwarder | None":
    """The second half of ``start``: wait until Prometheus answers, then forward a loopback
    port to it and record it in meta.json."""
    if launched is None:
        return None
    ns, interval, conf = launched["ns"], launched["interval"], launched["conf"]

    def factory() -> socket.socket:
        sk = netns.socket_in(ns)
        sk.settimeout(2.0)
        sk.connect(("127.0.0.1", PORT))
        return sk

    _wait_ready(factory, launched["proc"], launched["log"])
    fwd = Forwarder(ns, "127.0.0.1", PORT)
    rep.meta["prometheus"] = {
        "enabled": True, "version": version(launched["path"]), "start_s": round(time.time() - launched["t_start"], 3),
        "scrape_interval_s": float(round(interval) or 1),
        "scrape_timeout_s": float(round(interval) or 1), "tsdb": "prometheus",
        "config": "config/prometheus.yml", "namespace": ns, "listen": f"127.0.0.1:{PORT}",
        "jobs": {j["job_name"]: [t for sc in j["static_configs"] for t in sc["targets"]] for j in conf["scrape_configs"]},
        "live_url": fwd.url}
    rep.write_meta()
    console.log(f"prometheus scraping {sum(len(v) for v in rep.meta['prometheus']['jobs'].values())} targets "
                f"every {rep.meta['prometheus']['scrape_interval_s']:.0f} s; live: {fwd.url}")
    return fwd


class Forwarder:
    """Loopback port in torbed's namespace -> ``address:port`` inside namespace ``ns``
    (threads copy bytes both ways; ``close`` stops accepting)."""

    def __init__(self, ns: str, address: str, port: int, listen_port: int = 0):
        self.ns, self.target = ns, (address, port)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", listen_port))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name="prometheus-forwarder").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pair, args=(client,), daemon=True).start()

    def _pair(self, client: socket.socket) -> None:
        try:
            upstream = netns.socket_in(self.ns)
            upstream.connect(self.target)
        except OSError:
            client.close()
            return
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy src to dst until either side closes, then shut both down (one direction of a relay)."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------
# Serving a finished run

def repetitions_with_tsdb(run_dir: Path) -> list[Path]:
    """Repetition directories of a run that have a Prometheus TSDB, in run order."""
    return sorted(p.parent for p in Path(run_dir).glob("*/rep-*/prometheus") if p.is_dir())


class Served:
    """Prometheus serving a copy of a TSDB on 127.0.0.1 (``with serve(tsdb) as s: s.url``)."""

    def __init__(self, tsdb: Path, port: int = 0, log: Path | None = None):
        self.tsdb, self.port, self.log_path = Path(tsdb), port, log
        self.proc: subprocess.Popen | None = None
        self.tmp: Path | None = None

    def __enter__(self) -> "Served":
        if not self.tsdb.is_dir():
            raise RunFailed(f"{self.tsdb}: no Prometheus TSDB (was measure.prometheus.enabled false?)")
        path = binary()
        self.tmp = Path(tempfile.mkdtemp(prefix="torbed-prometheus-"))
        try:
            shutil.copytree(self.tsdb, self.tmp / "data", ignore=shutil.ignore_patterns("lock"))
            (self.tmp / "prometheus.yml").write_text("scrape_configs: []\n")
            port = self.port or _free_port()
            self.url = f"http://127.0.0.1:{port}"
            log = self.log_path or self.tmp / "prometheus.log"
            with open(log, "ab") as f:
                self.proc = subprocess.Popen(_argv(path, self.tmp / "prometheus.yml", self.tmp / "data",
                                                   f"127.0.0.1:{port}"), stdout=f, stderr=subprocess.STDOUT,
                                             start_new_session=True)

            def factory() -> socket.socket:
                return socket.create_connection(("127.0.0.1", port), timeout=2.0)

            _wait_ready(factory, self.proc, log)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def serve(tsdb: Path, port: int = 0, log: Path | None = None) -> Served:
    return Served(tsdb, port, log)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graph_url(base: str, expr: str, t0: float, t1: float) -> str:
    """Prometheus' own graph page showing ``expr`` from t0 to t1 (UNIX seconds). The classic
    page reads its end time to the minute, so the window ends at the next whole minute."""
    end = (int(t1) // 60 + 1) * 60
    q = {"g0.expr": expr, "g0.tab": "0", "g0.range_input": f"{max(60, int(end - t0) + 1)}s",
         "g0.end_input": dt.datetime.fromtimestamp(end, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")}
    return f"{base}/graph?{urllib.parse.urlencode(q)}"
