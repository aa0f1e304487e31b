"""Relay-side collectors: CELL_STATS, bytes read/written every 500 ms, MetricsPort scrapes.

``python -m torbed.collectors CONFIG.json`` watches one or more relays until SIGTERM
(locally one process in the switch namespace watches every relay; on Kubernetes it is a
sidecar of each relay pod). Records (docs/records.md) go to cellstats.jsonl, relay_bw.jsonl
and metrics.jsonl in the config's output directory, one line each, flushed as written.

tor keeps per-cell statistics for CELL_STATS only until the event is emitted; with no
subscriber its memory grows. So a collector always subscribes when the relay has
TestingEnableCellStatsEvent set, and when ``cellstats`` is not collected it switches the
option off on the relay instead.

Public API:

- ``cellstats_record(event, base) -> dict``  (event: stem CellStatsEvent)
- ``parse_metrics(text) -> dict[str, float]`` Prometheus text format -> {"name{labels}": value}
- ``RelayCollector(relay_cfg, cfg, writers)``: ``.start()``, ``.stop()``
- ``Exporter(linkemu_socket=None)``: the collectors' Prometheus exporter (config
  ``metrics_listen: [address, port]``): cells and queue wait per relay and direction from
  CELL_STATS (``torbed_relay_cells_total``, ``torbed_relay_cell_queue_wait_seconds_total``)
  and, when linkemu runs (config ``linkemu_socket``), its counters read from its control
  socket at each scrape (``torbed_linkemu_*``)
- ``run(cfg, stop_event)``, ``main(argv)``
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import stem
import stem.control
from stem.control import EventType

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .records import RecordWriter


def _side(queue, conn, added, removed, times) -> dict | None:
    if queue is None and not added and not removed:
        return None
    return {"queue": queue, "conn": conn, "added": dict(added or {}),
            "removed": dict(removed or {}), "time_ms": dict(times or {})}


def cellstats_record(event, base: dict) -> dict:
    """One CELL_STATS event as a record. Inbound = cells toward the client."""
    # Origin circuits have an ID; at a relay a circuit is named by its inbound connection
    # and the circuit id on it (stable for the circuit's life).
    circuit = event.id or f"{event.inbound_connection}:{event.inbound_queue}"
    return {**base, "type": "cellstats", "t": time.time(), "circuit": circuit,
            "inbound": _side(event.inbound_queue, event.inbound_connection, event.inbound_added,
                             event.inbound_removed, event.inbound_time),
            "outbound": _side(event.outbound_queue, event.outbound_connection, event.outbound_added,
                              event.outbound_removed, event.outbound_time)}


def parse_metrics(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            samples[name] = float(value)
        except ValueError:
            continue
    return samples


class Exporter:
    """A prometheus-client collector over what the relay collectors see (and linkemu)."""

    def __init__(self, linkemu_socket: str | None = None):
        self.lock = threading.Lock()
        self.cells: dict[tuple, float] = {}    # (relay, group, direction) -> cells removed
        self.wait: dict[tuple, float] = {}     # ... -> seconds those cells waited in the queue
        self.events: dict[tuple, float] = {}   # (relay, group) -> CELL_STATS events
        self.linkemu_socket = linkemu_socket
        self._linkemu_stats: dict | None = None    # the last stats answer, and when it came
        self._linkemu_at = 0.0

    def observe_cellstats(self, rec: dict) -> None:
        with self.lock:
            key = (rec["relay"], rec["group"])
            self.events[key] = self.events.get(key, 0) + 1
            for direction in ("inbound", "outbound"):
                side = rec.get(direction)
                if not side:
                    continue
                k = (*key, direction)
                self.cells[k] = self.cells.get(k, 0) + sum(side["removed"].values())
                self.wait[k] = self.wait.get(k, 0) + sum(side["time_ms"].values()) / 1000.0

    def collect(self):
        with self.lock:
            cells = CounterMetricFamily("torbed_relay_cells", "Cells leaving relays' circuit queues (CELL_STATS "
                                        "removed)", labels=["relay", "group", "direction"])
            wait = CounterMetricFamily("torbed_relay_cell_queue_wait_seconds", "Total time those cells waited "
                                       "in circuit queues (CELL_STATS time)", labels=["relay", "group", "direction"])
            events = CounterMetricFamily("torbed_relay_cellstats_events", "CELL_STATS events received",
                                         labels=["relay", "group"])
            for k, v in self.cells.items():
                cells.add_metric(list(k), v)
                wait.add_metric(list(k), self.wait[k])
            for k, v in self.events.items():
                events.add_metric(list(k), v)
        yield from (cells, wait, events)
        if self.linkemu_socket:
            yield from self._linkemu()

    def _linkemu(self):
        from .linkemu_control import EmulatorError, request
        now = time.monotonic()
        if self._linkemu_stats is None or now - self._linkemu_at >= LINKEMU_STATS_MIN_S:
            try:
                self._linkemu_stats = request(self.linkemu_socket, {"op": "stats"}, timeout=2.0)["stats"]
                self._linkemu_at = now
            except (EmulatorError, OSError):
                return   # linkemu gone (teardown): no series rather than a failed scrape
        yield from linkemu_families(self._linkemu_stats)


# linkemu answers on its forwarding thread, and a 750-tor network's answer (15,000 links) is
# ~2.5 MB: asked at every 5 s scrape, it cost forwarding time each time. Scrapes closer
# together than this reuse the last answer.
LINKEMU_STATS_MIN_S = 10.0
# Past this many links, per-link series (7 per link: ~107,000 at 750 tors) give way to their
# sums over every link (torbed_linkemu_links_*); ports keep their own series.
LINKEMU_LINK_SERIES_MAX = 2500


def linkemu_families(stats: dict, link_series_max: int = LINKEMU_LINK_SERIES_MAX) -> list:
    """Prometheus metric families of one linkemu stats answer (docs/observability.md)."""
    port = {k: CounterMetricFamily(f"torbed_linkemu_port_{k}", f"linkemu port counter {k}", labels=["node"])
            for k in ("rx_frames", "rx_bytes", "tx_frames", "tx_bytes", "tx_errors", "oversize")}
    for p in stats.get("ports", []):
        for k, m in port.items():
            m.add_metric([p.get("node") or p["dev"]], p.get(k, 0))
    links = stats.get("links", [])
    kinds = ("frames_in", "bytes_in", "lost", "queue_drops", "frames_out", "bytes_out")
    count = GaugeMetricFamily("torbed_linkemu_links", "Node pairs linkemu has carried IPv4 between")
    count.add_metric([], len(links))
    if len(links) <= link_series_max:
        link = {k: CounterMetricFamily(f"torbed_linkemu_link_{k}", f"linkemu link counter {k}", labels=["src", "dst"])
                for k in kinds}
        backlog = GaugeMetricFamily("torbed_linkemu_link_max_backlog_bytes", "Largest queue backlog of a link",
                                    labels=["src", "dst"])
        for entry in links:
            for k, m in link.items():
                m.add_metric([entry["src"], entry["dst"]], entry.get(k, 0))
            backlog.add_metric([entry["src"], entry["dst"]], entry.get("max_backlog_bytes", 0))
        per_link = [*link.values(), backlog]
    else:
        per_link = []
        for k in kinds:
            m = CounterMetricFamily(f"torbed_linkemu_links_{k}", f"linkemu link counter {k}, summed over every link")
            m.add_metric([], sum(entry.get(k, 0) for entry in links))
            per_link.append(m)
        backlog = GaugeMetricFamily("torbed_linkemu_links_max_backlog_bytes", "Largest queue backlog of any link")
        backlog.add_metric([], max((entry.get("max_backlog_bytes", 0) for entry in links), default=0))
        per_link.append(backlog)
    scheduled = GaugeMetricFamily("torbed_linkemu_scheduled_frames", "Frames waiting in linkemu's timeline")
    scheduled.add_metric([], stats.get("scheduled", 0))
    return [*port.values(), count, *per_link, scheduled]


class RelayCollector:
    def __init__(self, relay: dict, cfg: dict, writers: dict[str, RecordWriter], exporter: Exporter | None = None):
        self.exporter = exporter
        self.relay = relay
        self.cfg = cfg
        self.writers = writers
        self.base = {"variant": cfg["variant"], "rep": cfg["rep"], "relay": relay["name"], "group": relay["group"]}
        self.stop_ev = threading.Event()
        self.threads: list[threading.Thread] = []
        self.controller: stem.control.Controller | None = None
        self.errors: list[str] = []

    def _open(self) -> stem.control.Controller:
        c = self.relay["control"]
        if c.get("socket"):
            ctl = stem.control.Controller.from_socket_file(c["socket"])
        else:
            ctl = stem.control.Controller.from_port(c.get("address", "127.0.0.1"), c["port"])
        ctl.authenticate()
        return ctl

    def _connect(self) -> stem.control.Controller:
        deadline = time.time() + self.cfg.get("connect_timeout", 60)
        while True:
            try:
                return self._open()
            except (stem.SocketError, stem.connection.AuthenticationFailure):
                if time.time() > deadline:
                    raise
                time.sleep(0.2)

    def start(self) -> None:
        self.controller = self._connect()
        self._listen()
        collect = self.cfg["collect"]
        if "relay_bw" in collect:
            self.threads.append(threading.Thread(target=self._poll_bw, daemon=True))
        if "metrics" in collect and self.relay.get("metrics_url"):
            self.threads.append(threading.Thread(target=self._poll_metrics, daemon=True))
        for t in self.threads:
            t.start()

    def _reconnect(self) -> bool:
        """After the relay's tor went away (a restart fault): connect to the new one and
        listen again; False once stopping. Its counters start again from zero."""
        if self.controller is not None:
            self.controller.close()
        while not self.stop_ev.is_set():
            try:
                ctl = self._open()
            except (stem.SocketError, stem.connection.AuthenticationFailure):
                self.stop_ev.wait(0.5)
                continue
            self.controller = ctl
            self._listen()
            return True
        return False

    def _listen(self) -> None:
        collect = self.cfg["collect"]
        # Which tor the records come from: a restarted tor numbers its channels from 1 again,
        # so channel ids (cellstats conn) are only unique within one session (analysis/circuits.py).
        self.base["session"] = round(time.time(), 3)
        if "cellstats" in collect:
            w = self.writers["cellstats"]

            def on_cellstats(ev) -> None:
                rec = cellstats_record(ev, self.base)
                w.write(rec)
                if self.exporter is not None:
                    self.exporter.observe_cellstats(rec)
            self.controller.add_event_listener(on_cellstats, EventType.CELL_STATS)
        elif self.controller.get_conf("TestingEnableCellStatsEvent", "0") == "1":
            self.controller.set_conf("TestingEnableCellStatsEvent", "0")

    def _poll_bw(self) -> None:
        interval = self.cfg["bw_interval_s"]
        w = self.writers["relay_bw"]
        prev = None
        next_t = time.time()
        while not self.stop_ev.is_set():
            try:
                r, wr = self.controller.get_info(["traffic/read", "traffic/written"]).values()
            except (stem.ControllerError, stem.SocketClosed) as e:
                # The relay's tor stopped: a restart fault brings a new one on the same socket.
                self.errors.append(f"relay_bw: {e}")
                if not self._reconnect():
                    return
                prev, next_t = None, time.time()
                continue
            now = time.time()
            cur = (now, int(r), int(wr))
            if prev is not None:
                w.write({**self.base, "type": "relay_bw", "t": now, "interval_s": round(now - prev[0], 6),
                         "read": cur[1] - prev[1], "written": cur[2] - prev[2]})
            prev = cur
            next_t += interval
            self.stop_ev.wait(max(0.0, next_t - time.time()))

    def _poll_metrics(self) -> None:
        w = self.writers["metrics"]
        while not self.stop_ev.is_set():
            try:
                with urllib.request.urlopen(self.relay["metrics_url"], timeout=5) as resp:
                    samples = parse_metrics(resp.read().decode())
                w.write({**self.base, "type": "metrics", "t": time.time(), "samples": samples})
            except OSError as e:
                self.errors.append(f"metrics: {e}")
            self.stop_ev.wait(self.cfg["metrics_interval_s"])

    def stop(self) -> None:
        self.stop_ev.set()
        for t in self.threads:
            t.join(5)
        if self.controller is not None:
            self.controller.close()


ATTACH_AT_ONCE = 8     # relays the collector connects to at once


def run(cfg: dict, stop: threading.Event) -> list[str]:
    out = Path(cfg["output"])
    writers = {k: RecordWriter(out / f"{k}.jsonl") for k in ("cellstats", "relay_bw", "metrics") if k in cfg["collect"]}
    exporter = None
    if cfg.get("metrics_listen"):
        exporter = Exporter(cfg.get("linkemu_socket"))
        registry = CollectorRegistry()
        registry.register(exporter)
        ProcessCollector(registry=registry)   # the collector process's own CPU and memory
        start_http_server(cfg["metrics_listen"][1], addr=cfg["metrics_listen"][0], registry=registry)
    collectors = [RelayCollector(r, cfg, writers, exporter) for r in cfg["relays"]]
    errors: list[str] = []
    try:
        # Several at once: one after another, a 597-relay network's collector had attached to
        # 34 relays after 4 minutes (stem's connect and authentication on a starved machine).
        with ThreadPoolExecutor(max_workers=ATTACH_AT_ONCE, thread_name_prefix="attach") as pool:
            for f in [pool.submit(c.start) for c in collectors]:
                f.result()      # a relay that never answered stops the collector, as before
        stop.wait()
    finally:
        for c in collectors:
            c.stop()
            errors += [f"{c.relay['name']}: {e}" for e in c.errors]
        for w in writers.values():
            w.close()
    return errors


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m torbed.collectors CONFIG.json", file=sys.stderr)
        return 2
    cfg = json.loads(Path(argv[0]).read_text())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    errors = run(cfg, stop)
    for e in errors:
        print(f"collector: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
