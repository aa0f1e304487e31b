"""The measurement driver's Prometheus exporter (prometheus-client).

What the driver measures, as live series: transfers started / finished / failed (by the
same typed ``error.cause`` as transfers.jsonl), TTFB and TTLB histograms, circuits built
and failed and their build time. Every series carries the client's ``group`` and
``variant`` (and ``client``, ``workload``), so a dashboard splits by them without relying
on scrape labels. transfers.jsonl stays the record of truth; these are for watching a run.

Public API:

- ``DriverMetrics(cfg, registry=None)``: ``.serve(address, port)``, ``.transfer_started()``,
  ``.transfer_done(record)``, ``.circuit_built(seconds)``, ``.circuit_failed()``
- ``NullMetrics``: the same methods doing nothing (exporter switched off)
- ``TIME_BUCKETS``: histogram bucket bounds in seconds
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, start_http_server

# Seconds: from sub-second web fetches to multi-minute bulk transfers on slow links.
TIME_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600)


class DriverMetrics:
    def __init__(self, cfg: dict, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        # process_cpu_seconds_total & co.: what the driver (exporter included) costs.
        ProcessCollector(registry=self.registry)
        names = ["group", "variant", "client", "workload"]
        self.values = [cfg["group"], cfg["variant"], cfg["client"], cfg["workload"]["kind"]]
        r = self.registry
        self.started = Counter("torbed_transfers_started", "Transfers started", names, registry=r)
        self.finished = Counter("torbed_transfers_finished", "Transfers that delivered the whole file", names,
                                registry=r)
        self.failed = Counter("torbed_transfers_failed", "Transfers that failed, by error cause (as in "
                              "transfers.jsonl error.cause)", names + ["cause"], registry=r)
        self.ttfb = Histogram("torbed_transfer_ttfb_seconds", "Time to first byte from the request being sent",
                              names, buckets=TIME_BUCKETS, registry=r)
        self.ttlb = Histogram("torbed_transfer_ttlb_seconds", "Time to last byte from the request being sent "
                              "(completed transfers)", names, buckets=TIME_BUCKETS, registry=r)
        self.circ_built = Counter("torbed_circuits_built", "Circuits built along the configured path", names,
                                  registry=r)
        self.circ_failed = Counter("torbed_circuits_failed", "Circuits that failed to build", names, registry=r)
        self.circ_time = Histogram("torbed_circuit_build_seconds", "Circuit build time", names,
                                   buckets=TIME_BUCKETS, registry=r)
        # Series exist (at 0) from the first scrape, so rates and "no failures" are visible.
        for m in (self.started, self.finished, self.circ_built, self.circ_failed):
            m.labels(*self.values)

    def serve(self, address: str, port: int) -> None:
        start_http_server(port, addr=address, registry=self.registry)

    def transfer_started(self) -> None:
        self.started.labels(*self.values).inc()

    def transfer_done(self, rec: dict) -> None:
        """Count a finished transfer record (driver.transfer's or a replayed flow's)."""
        if rec.get("status") == "ok":
            self.finished.labels(*self.values).inc()
        elif rec.get("status") != "cancelled":   # the run ended under it: not a failure
            cause = (rec.get("error") or {}).get("cause") or rec.get("status") or "unknown"
            self.failed.labels(*self.values, cause).inc()
        if rec.get("ttfb_s") is not None:
            self.ttfb.labels(*self.values).observe(rec["ttfb_s"])
        if rec.get("ttlb_s") is not None:
            self.ttlb.labels(*self.values).observe(rec["ttlb_s"])

    def circuit_built(self, seconds: float) -> None:
        self.circ_built.labels(*self.values).inc()
        self.circ_time.labels(*self.values).observe(seconds)

    def circuit_failed(self) -> None:
        self.circ_failed.labels(*self.values).inc()


class NullMetrics:
    def serve(self, address: str, port: int) -> None: ...
    def transfer_started(self) -> None: ...
    def transfer_done(self, rec: dict) -> None: ...
    def circuit_built(self, seconds: float) -> None: ...
    def circuit_failed(self) -> None: ...
