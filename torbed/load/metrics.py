"""The Locust master's Prometheus exporter (prometheus-client): background load as live series.

Read from Locust's own statistics at scrape time (a custom collector), so the exporter adds
no work per request and shows exactly what load.jsonl records: on a master those are the
workers' statistics merged. Series (all carry ``variant``; per request kind also ``name``
and ``method``; the scrape adds node/role/group/rep):

- ``torbed_load_users``: users running now
- ``torbed_load_requests_total`` / ``torbed_load_failures_total`` / ``torbed_load_received_bytes_total``
- ``torbed_load_requests_per_second`` / ``torbed_load_failures_per_second``: Locust's current
  rates (over its last 10 s)
- ``torbed_load_response_time_seconds``: histogram of every response time so far (Locust's
  rounded milliseconds, into the given buckets: ``torbed.client.metrics.TIME_BUCKETS``), so
  ``histogram_quantile`` over ``rate(...)`` gives percentiles over any window
- ``torbed_load_response_time_window_seconds{quantile}``: Locust's own percentiles over its
  current window, the values of load.jsonl's ``p50_ms`` ...

This module imports no Locust (the locustfile hands it the runner), so it can be used and
tested without Locust's gevent patching, and nothing of torbed but prometheus-client: the
locustfile loads it by its path, since Locust's own venv (the locust image's /opt/locust)
has no torbed.

Public API: ``LoadCollector(runner, variant, buckets)``; ``serve(runner, variant, address, port,
buckets) -> port`` (the port bound: ``port`` or, when 0, the one chosen); ``buckets``: upper
bounds in seconds
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

QUANTILES = (0.5, 0.9, 0.95, 0.99)


class LoadCollector:
    """``runner``: a Locust runner (``.stats``, ``.user_count``)."""

    def __init__(self, runner, variant: str, buckets):
        self.runner, self.variant, self.buckets = runner, variant, tuple(buckets)

    def collect(self):
        v = self.variant
        users = GaugeMetricFamily("torbed_load_users", "Locust users running now", labels=["variant"])
        users.add_metric([v], self.runner.user_count)
        yield users
        names = ["variant", "name", "method"]
        fams = {
            "requests": CounterMetricFamily("torbed_load_requests", "Locust requests completed", labels=names),
            "failures": CounterMetricFamily("torbed_load_failures", "Locust requests that failed", labels=names),
            "bytes": CounterMetricFamily("torbed_load_received_bytes", "Response body bytes Locust received",
                                         labels=names),
            "rps": GaugeMetricFamily("torbed_load_requests_per_second", "Locust's current requests/s (last 10 s)",
                                     labels=names),
            "fps": GaugeMetricFamily("torbed_load_failures_per_second", "Locust's current failures/s (last 10 s)",
                                     labels=names),
            "hist": HistogramMetricFamily("torbed_load_response_time_seconds", "Locust response times (rounded "
                                          "as Locust keeps them)", labels=names),
            "window": GaugeMetricFamily("torbed_load_response_time_window_seconds", "Locust's response-time "
                                        "percentiles over its current window (10 s)", labels=names + ["quantile"]),
        }
        # Snapshot: the master merges worker reports into these dicts between scrapes.
        for (name, method), e in sorted(list(self.runner.stats.entries.items())):
            lv = [v, name, method]
            fams["requests"].add_metric(lv, e.num_requests)
            fams["failures"].add_metric(lv, e.num_failures)
            fams["bytes"].add_metric(lv, e.total_content_length)
            fams["rps"].add_metric(lv, e.current_rps)
            fams["fps"].add_metric(lv, e.current_fail_per_sec)
            times = sorted(dict(e.response_times).items())
            buckets, i, below = [], 0, 0
            for bound in self.buckets:
                while i < len(times) and times[i][0] <= bound * 1000:
                    below += times[i][1]
                    i += 1
                buckets.append((repr(float(bound)), below))
            count = sum(n for _, n in times)
            buckets.append(("+Inf", count))
            fams["hist"].add_metric(lv, buckets, sum_value=e.total_response_time / 1000)
            if e.num_requests:
                for q in QUANTILES:
                    try:
                        ms = e.get_current_response_time_percentile(q)
                    except ValueError:   # statistics kept without Locust's window cache
                        ms = None
                    if ms is not None:
                        fams["window"].add_metric(lv + [str(q)], ms / 1000)
        yield from fams.values()


def serve(runner, variant: str, address: str, port: int, buckets) -> int:
    registry = CollectorRegistry()
    registry.register(LoadCollector(runner, variant, buckets))
    server, _ = start_http_server(port, addr=address, registry=registry)
    return server.server_port
