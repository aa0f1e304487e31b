"""The Locust master's Prometheus exporter (torbed.load.metrics): real Locust statistics
(locust.stats.RequestStats) served by prometheus-client and scraped over loopback HTTP, and
the locust job in the local Prometheus' scrape configuration.

Locust monkey-patches the standard library when imported, so its side runs in a child
Python; the test process only scrapes and parses."""

import subprocess
import sys
import textwrap
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_load import loaded
from torbed import constants, load, network
from torbed.backends.local import prometheus
from torbed.client.metrics import TIME_BUCKETS

CHILD = textwrap.dedent("""
    import select, sys, time
    from locust.stats import RequestStats
    from torbed.client.metrics import TIME_BUCKETS
    from torbed.load import metrics

    class Runner:   # what the exporter reads of a runner: its statistics and its user count
        user_count = 6

    r = Runner()
    r.stats = RequestStats()
    # web: 30 requests of 120 ms (one of them failed); bulk: 2 of 4.5 s, 1 MiB each.
    for _ in range(29):
        r.stats.log_request("GET", "web", 120, 51200)
    r.stats.log_request("GET", "web", 120, 0)
    r.stats.log_error("GET", "web", "HTTP 503")
    for _ in range(2):
        r.stats.log_request("GET", "bulk", 4500, 1048576)
    print(metrics.serve(r, "kist", "127.0.0.1", 0, TIME_BUCKETS), flush=True)
    # Commands on stdin, one a line: "log NAME N MS BYTES" logs N more requests into the same
    # statistics object the exporter reads, then answers "logged". select() (patched by
    # gevent, like time.sleep) lets the exporter serve while this waits.
    deadline = time.time() + 60
    while time.time() < deadline:
        if not select.select([sys.stdin], [], [], 0.2)[0]:
            continue
        line = sys.stdin.readline()
        if not line:
            break
        _, name, n, ms, size = line.split()
        for _ in range(int(n)):
            r.stats.log_request("GET", name, int(ms), int(size))
        print("logged", flush=True)
""")


class Exporter:
    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url = proc, url

    def log(self, name: str, n: int, ms: int, size: int) -> None:
        """Log ``n`` requests into the running exporter's Locust statistics."""
        self.proc.stdin.write(f"log {name} {n} {ms} {size}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "logged"


@pytest.fixture()
def exporter():
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        yield Exporter(p, f"http://127.0.0.1:{port}/metrics")
    finally:
        p.kill()
        p.wait()


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: dict, metric: str, **labels) -> float:
    return samples[(metric, tuple(sorted({"variant": "kist", **labels}.items())))]


def test_exporter_serves_locust_statistics(exporter):
    s = scrape(exporter.url)
    web, bulk = {"name": "web", "method": "GET"}, {"name": "bulk", "method": "GET"}
    assert value(s, "torbed_load_users") == 6
    assert value(s, "torbed_load_requests_total", **web) == 30
    assert value(s, "torbed_load_requests_total", **bulk) == 2
    assert value(s, "torbed_load_failures_total", **web) == 1
    assert value(s, "torbed_load_failures_total", **bulk) == 0
    assert value(s, "torbed_load_received_bytes_total", **bulk) == 2 * 1048576
    assert value(s, "torbed_load_received_bytes_total", **web) == 29 * 51200
    # Histogram: 120 ms lies in (0.1, 0.25], 4.5 s in (3, 5].
    assert value(s, "torbed_load_response_time_seconds_bucket", le="0.1", **web) == 0
    assert value(s, "torbed_load_response_time_seconds_bucket", le="0.25", **web) == 30
    assert value(s, "torbed_load_response_time_seconds_bucket", le="3.0", **bulk) == 0
    assert value(s, "torbed_load_response_time_seconds_bucket", le="5.0", **bulk) == 2
    assert value(s, "torbed_load_response_time_seconds_bucket", le="+Inf", **bulk) == 2
    assert value(s, "torbed_load_response_time_seconds_count", **web) == 30
    assert value(s, "torbed_load_response_time_seconds_sum", **bulk) == pytest.approx(9.0)
    assert ("torbed_load_requests_per_second", tuple(sorted({"variant": "kist", **web}.items()))) in s
    # Locust's "Aggregated" total is not a series: sum() in PromQL is.
    assert not any(dict(labels).get("name") == "Aggregated" for _, labels in s)


def test_exporter_reads_the_statistics_at_every_scrape(exporter):
    # The counters are the live statistics, not a copy taken at start: requests logged
    # between two scrapes show in the second, including a request name first seen then.
    web = {"name": "web", "method": "GET"}
    a = scrape(exporter.url)
    assert value(a, "torbed_load_requests_total", **web) == 30
    exporter.log("web", 7, 2000, 1000)
    exporter.log("late", 3, 50, 10)
    b = scrape(exporter.url)
    assert value(b, "torbed_load_requests_total", **web) == 37
    assert value(b, "torbed_load_received_bytes_total", **web) == 29 * 51200 + 7 * 1000
    assert value(b, "torbed_load_response_time_seconds_bucket", le="0.25", **web) == 30
    assert value(b, "torbed_load_response_time_seconds_bucket", le="+Inf", **web) == 37   # 2 s: above 0.25
    assert value(b, "torbed_load_requests_total", name="late", method="GET") == 3
    assert ("torbed_load_requests_total", tuple(sorted({"variant": "kist", "name": "late", "method": "GET"}.items()))) \
        not in a


def test_locust_master_is_a_scrape_target_on_its_private_address():
    s = loaded()
    plan = network.plan(s, "kist")
    conf = prometheus.scrape_config(plan, release="r", variant="kist", rep=0, interval_s=5,
                                    driver_port=constants.DRIVER_METRICS_PORT,
                                    collector_port=constants.COLLECTOR_METRICS_PORT)
    jobs = {j["job_name"]: j for j in conf["scrape_configs"]}
    master = plan.node("locust0")
    (sc,) = jobs["locust"]["static_configs"]
    assert sc["targets"] == [f"{master.address}:{constants.LOCUST_METRICS_PORT}"]
    assert sc["labels"]["role"] == "loadmaster" and sc["labels"]["group"] == "locust"
    assert load.metrics_target(plan) == (master.address, constants.LOCUST_METRICS_PORT)
    cfg = load.locust_config(s, plan, {"load-web": {"size": 1}, "load-bulk": {"size": 2}}, variant="kist",
                             rep=0, output="x", metrics=True)
    assert cfg["metrics"] == {"address": master.address, "port": constants.LOCUST_METRICS_PORT,
                              "buckets": list(TIME_BUCKETS)}
    k8s = load.locust_config(s, plan, {"load-web": {"size": 1}, "load-bulk": {"size": 2}}, variant="kist",
                             rep=0, output="x", metrics=True, metrics_address="0.0.0.0")
    assert k8s["metrics"]["address"] == "0.0.0.0" and k8s["metrics"]["port"] == constants.LOCUST_METRICS_PORT
    # Without load: no locust job.
    from tests.unit.test_scenario import patched
    from torbed import scenario
    plain = network.plan(scenario.parse(patched({}), "s.yaml"), "kist")
    conf = prometheus.scrape_config(plain, release="r", variant="kist", rep=0, interval_s=5,
                                    driver_port=None, collector_port=None)
    assert "locust" not in {j["job_name"] for j in conf["scrape_configs"]}
