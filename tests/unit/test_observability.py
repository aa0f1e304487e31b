"""Prometheus configuration, the driver's and the collectors' exporters, the dashboards'
structure, and the report's MetricsPort / resources figures (no network needed; the real
Prometheus is exercised in tests/integration/test_prometheus.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from torbed.backends.k8s import chart, dashboards
from torbed import collectors, constants, scenario as scenario_mod
from torbed.backends.local import prometheus
from torbed.client.metrics import DriverMetrics
from torbed.collectors import Exporter
from torbed.network import plan as make_plan

REPO = Path(__file__).resolve().parents[2]


def _quickstart(**measure) -> scenario_mod.Scenario:
    data = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    data.setdefault("measure", {}).update(measure)
    return scenario_mod.Scenario.model_validate(data)


def test_scrape_config_has_every_exporter_and_only_planned_addresses():
    s = _quickstart()
    p = make_plan(s, "vanilla")
    conf = prometheus.scrape_config(p, release="quickstart-X", variant="vanilla", rep=0, interval_s=5,
                                    driver_port=constants.DRIVER_METRICS_PORT,
                                    collector_port=constants.COLLECTOR_METRICS_PORT)
    jobs = {j["job_name"]: j for j in conf["scrape_configs"]}
    assert set(jobs) == {"prometheus", "tor", "driver", "collector"}
    tor = [sc["targets"][0] for sc in jobs["tor"]["static_configs"]]
    assert tor == [f"{r.address}:{constants.METRICS_PORT}" for r in p.by_role("relay")]
    drivers = jobs["driver"]["static_configs"]
    assert [d["labels"]["node"] for d in drivers] == [c.name for c in p.by_role("client")]
    assert {d["labels"]["group"] for d in drivers} == {"bulk", "web"}
    assert all(sc["labels"]["release"] == "quickstart-X" and sc["labels"]["variant"] == "vanilla"
               for j in jobs.values() for sc in j["static_configs"])
    assert conf["global"]["scrape_interval"] == "5s"


def test_scrape_interval_must_be_whole_seconds():
    with pytest.raises(Exception) as e:
        _quickstart(prometheus={"scrape_interval": "500ms"})
    assert "scrape_interval" in str(e.value)
    assert _quickstart(prometheus={"enabled": False}).measure.prometheus.enabled is False


def _driver_cfg():
    return {"group": "web", "variant": "kist", "client": "web0", "workload": {"kind": "fetch"}}


def test_driver_metrics_count_like_transfers_jsonl():
    reg = CollectorRegistry()
    m = DriverMetrics(_driver_cfg(), registry=reg)
    for _ in range(3):
        m.transfer_started()
    m.transfer_done({"status": "ok", "ttfb_s": 0.2, "ttlb_s": 1.2})
    m.transfer_done({"status": "error", "error": {"cause": "circuit_failed"}, "ttfb_s": None, "ttlb_s": None})
    m.transfer_done({"status": "cancelled", "error": {"cause": "run_ended"}, "ttfb_s": 0.3, "ttlb_s": None})
    m.circuit_built(0.4)
    m.circuit_failed()
    labels = {"group": "web", "variant": "kist", "client": "web0", "workload": "fetch"}
    get = reg.get_sample_value
    assert get("torbed_transfers_started_total", labels) == 3
    assert get("torbed_transfers_finished_total", labels) == 1
    assert get("torbed_transfers_failed_total", {**labels, "cause": "circuit_failed"}) == 1
    # Cancelled by the run's end: not a failure.
    assert get("torbed_transfers_failed_total", {**labels, "cause": "run_ended"}) is None
    assert get("torbed_transfer_ttlb_seconds_count", labels) == 1
    assert get("torbed_transfer_ttfb_seconds_count", labels) == 2
    assert get("torbed_transfer_ttlb_seconds_bucket", {**labels, "le": "1.5"}) == 1
    assert get("torbed_transfer_ttlb_seconds_bucket", {**labels, "le": "1.0"}) == 0
    assert get("torbed_circuits_built_total", labels) == 1 and get("torbed_circuits_failed_total", labels) == 1
    # Its own cost, for the emulator dashboard's CPU panel and make bench.
    assert get("process_cpu_seconds_total") is not None


def test_collector_exporter_sums_cellstats_per_relay_and_direction():
    ex = Exporter()
    side = {"queue": 1, "conn": 2, "added": {"relay": 10}, "removed": {"relay": 8, "destroy": 2},
            "time_ms": {"relay": 40, "destroy": 10}}
    for _ in range(2):
        ex.observe_cellstats({"relay": "middle0", "group": "middle", "inbound": side, "outbound": None})
    reg = CollectorRegistry()
    reg.register(ex)
    k = {"relay": "middle0", "group": "middle", "direction": "inbound"}
    assert reg.get_sample_value("torbed_relay_cells_total", k) == 20
    assert reg.get_sample_value("torbed_relay_cell_queue_wait_seconds_total", k) == pytest.approx(0.1)
    assert reg.get_sample_value("torbed_relay_cellstats_events_total", {"relay": "middle0", "group": "middle"}) == 2
    assert reg.get_sample_value("torbed_relay_cells_total", {**k, "direction": "outbound"}) is None
    assert b"torbed_linkemu" not in generate_latest(reg)   # no linkemu socket configured


def _linkemu_stats(pairs: int) -> dict:
    links = [{"src": f"n{i}", "dst": f"m{i}", "frames_in": 2, "bytes_in": 100 + i, "lost": 0, "queue_drops": 1,
              "frames_out": 2, "bytes_out": 100, "max_backlog_bytes": i} for i in range(pairs)]
    return {"ports": [{"dev": "s0", "node": "guard0", "tx_bytes": 5}], "links": links, "scheduled": 3}


def _registry(families) -> CollectorRegistry:
    class Fixed:
        def collect(self):
            yield from families
    reg = CollectorRegistry()
    reg.register(Fixed())
    return reg


def test_linkemu_series_per_link_in_small_networks_and_summed_in_large_ones():
    small = _registry(collectors.linkemu_families(_linkemu_stats(3), link_series_max=3))
    assert small.get_sample_value("torbed_linkemu_link_bytes_in_total", {"src": "n2", "dst": "m2"}) == 102
    assert small.get_sample_value("torbed_linkemu_links") == 3
    assert small.get_sample_value("torbed_linkemu_port_tx_bytes_total", {"node": "guard0"}) == 5
    large = _registry(collectors.linkemu_families(_linkemu_stats(4), link_series_max=3))
    assert large.get_sample_value("torbed_linkemu_link_bytes_in_total", {"src": "n2", "dst": "m2"}) is None
    assert large.get_sample_value("torbed_linkemu_links_bytes_in_total") == 100 + 101 + 102 + 103
    assert large.get_sample_value("torbed_linkemu_links_queue_drops_total") == 4
    assert large.get_sample_value("torbed_linkemu_links_max_backlog_bytes") == 3
    assert large.get_sample_value("torbed_linkemu_port_tx_bytes_total", {"node": "guard0"}) == 5
    assert large.get_sample_value("torbed_linkemu_scheduled_frames") == 3


def test_dashboards_have_the_template_variables_and_filter_by_them():
    models = dashboards.dashboards()
    assert set(models) == {"torbed-network.json", "torbed-clients.json", "torbed-emulator.json"}
    for name, m in models.items():
        assert [v["name"] for v in m["templating"]["list"]] == ["datasource", "release", "variant", "group"]
        queries = dashboards.panel_queries(m)
        assert len(queries) >= 5, name
        for title, expr in queries:
            assert '$release' in expr and '$variant' in expr, (name, title)
        titles = [p["title"] for p in m["panels"]]
        assert len(set(titles)) == len(titles), name
    clients = dashboards.panel_queries(models["torbed-clients.json"])
    assert all('$group' in e for _, e in clients)
    assert any(p["type"] == "heatmap" for p in models["torbed-clients.json"]["panels"])


def test_dashboard_files_in_the_chart_are_the_generated_ones():
    # The same check as `torbed chart-files --check` (CI), for the dashboards.
    for rel, text in dashboards.generated_files().items():
        assert (chart.CHART_DIR / rel).read_text() == text, f"{rel}: run `make schema`"
    assert json.loads((chart.CHART_DIR / "files/grafana/dashboards/torbed-network.json").read_text())["uid"] == \
        "torbed-network"


def test_graph_url_covers_the_window():
    url = prometheus.graph_url("http://x", "up", 1_700_000_000.0, 1_700_000_130.0)
    assert url.startswith("http://x/graph?g0.expr=up")
    # 22:15:30 UTC: the classic page takes whole minutes, so the window ends at 22:16.
    assert "g0.range_input=161s" in url and "g0.end_input=2023-11-14+22%3A16" in url
