"""Grafana dashboards as code (grafana-foundation-sdk, pinned to Grafana 11.6's types).

Three dashboards over the series a run's Prometheus holds (``torbed.backends.local.prometheus``; on
Kubernetes the cluster's Prometheus scraping the chart's targets):

- ``torbed-network``: relay throughput, open OR connections, circuits opened, queue wait
  per relay (CELL_STATS), relay targets up;
- ``torbed-clients``: TTFB / TTLB heatmaps and quantiles per group and variant, transfers
  finished, errors by cause, circuits built / failed and build time;
- ``torbed-emulator``: linkemu's per-node throughput, losses and queue drops, largest link
  backlog, relays up or down (faults), CPU of the observability processes themselves.

Each has ``datasource``, ``release``, ``variant`` and ``group`` template variables. The JSON
is written by ``torbed chart-files`` (``charts/torbed/files/grafana/``; the chart ships them
as ConfigMaps for Grafana's dashboard sidecar) and never edited by hand; ``chart-files
--check`` fails when it differs from what this module generates.

Public API:

- ``dashboards() -> dict[str, dict]`` file name -> dashboard JSON model
- ``panel_queries(model) -> [(panel title, expr)]``
- ``expand(expr, release, variant=".*", group=".*", interval="10s") -> str`` the PromQL a
  Grafana would send (template variables substituted), for testing queries
- ``generated_files() -> {relative path: text}`` (dashboards and provisioning files)
- ``GRAFANA_VERSION``: the Grafana the SDK's types (and the docs) are for
"""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

GRAFANA_VERSION = "11.6"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'release=~"$release", variant=~"$variant"'
CLIENT_SEL = SEL + ', group=~"$group"'
RATE = "$__rate_interval"


def _q(expr: str, legend: str, ref: str = "A", heat: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)
    if heat:
        q = q.format(pm.PromQueryFormat.HEATMAP)
    return q.range()


def _ts(title: str, desc: str, unit: str, *queries, w: int = 12) -> timeseries.Panel:
    p = timeseries.Panel().title(title).description(desc).unit(unit).datasource(DS).height(8).span(w)
    for q in queries:
        p = p.with_target(q)
    return p


def _heat(title: str, desc: str, expr: str) -> heatmap.Panel:
    return (heatmap.Panel().title(title).description(desc).datasource(DS).height(8).span(12).calculate(False)
            .with_target(_q(expr, "{{le}}", heat=True)))


def _variables(d: db.Dashboard) -> db.Dashboard:
    d = d.with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    for name, query, label in (
            ("release", "label_values(up, release)", "Release / run"),
            ("variant", 'label_values(up{release=~"$release"}, variant)', "Variant"),
            ("group", 'label_values(torbed_transfers_started_total{release=~"$release"}, group)', "Client group")):
        d = d.with_variable(db.QueryVariable(name).label(label).datasource(DS).query(query)
                            .multi(True).include_all(True).all_value(".*")
                            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC))
    return d


def _dashboard(uid: str, title: str, desc: str) -> db.Dashboard:
    return _variables(db.Dashboard(title).uid(uid).description(desc).tags(["torbed"]).time("now-30m", "now")
                      .refresh("10s").timezone("utc").editable())


def network() -> db.Dashboard:
    by = "release, variant, node"
    wait = (f"sum by (release, variant, relay, direction) (rate(torbed_relay_cell_queue_wait_seconds_total{{{SEL}}}[{RATE}]))"
            f" / sum by (release, variant, relay, direction) (rate(torbed_relay_cells_total{{{SEL}}}[{RATE}]))")
    return (_dashboard("torbed-network", "torbed / network overview", "Relays of torbed runs (MetricsPort, CELL_STATS)")
            .with_row(db.Row("Relays"))
            .with_panel(_ts("Relay throughput", "Bytes written per second per relay (MetricsPort "
                            "tor_relay_traffic_bytes)", "Bps",
                            _q(f'sum by ({by}) (rate(tor_relay_traffic_bytes{{direction="written", {SEL}}}[{RATE}]))',
                               "{{variant}} {{node}}")))
            .with_panel(_ts("Open OR connections", "OR connections open per relay", "short",
                            _q(f'sum by ({by}) (tor_relay_connections{{type="OR", state="opened", {SEL}}})',
                               "{{variant}} {{node}}")))
            .with_panel(_ts("Circuits opened", "Circuits opened per second per relay", "ops",
                            _q(f'sum by ({by}) (rate(tor_relay_circuits_total{{state="opened", {SEL}}}[{RATE}]))',
                               "{{variant}} {{node}}")))
            .with_panel(_ts("Circuit queue wait per cell", "Mean time a cell waited in a relay's circuit queue "
                            "(CELL_STATS; circuit queues only, not outbufs or the kernel)", "s",
                            _q(wait, "{{variant}} {{relay}} {{direction}}")))
            .with_panel(_ts("Relay targets up", "1 while Prometheus can scrape a relay's MetricsPort", "short",
                            _q(f'up{{job="tor", {SEL}}}', "{{variant}} {{node}}"), w=24)))


def clients() -> db.Dashboard:
    def quantiles(metric: str) -> list[prometheus.Dataquery]:
        return [_q(f"histogram_quantile({q}, sum by (le, group, variant) "
                   f"(rate({metric}_bucket{{{CLIENT_SEL}}}[{RATE}])))", f"p{int(q * 100)} {{{{group}}}} {{{{variant}}}}",
                   ref=chr(65 + i)) for i, q in enumerate((0.5, 0.9, 0.99))]
    by = "group, variant"
    return (_dashboard("torbed-clients", "torbed / client experience", "Measurement drivers of torbed runs")
            .with_row(db.Row("Transfer times"))
            .with_panel(_heat("TTFB", "Time to first byte from the request being sent",
                              f"sum by (le) (increase(torbed_transfer_ttfb_seconds_bucket{{{CLIENT_SEL}}}[{RATE}]))"))
            .with_panel(_heat("TTLB", "Time to last byte from the request being sent (completed transfers)",
                              f"sum by (le) (increase(torbed_transfer_ttlb_seconds_bucket{{{CLIENT_SEL}}}[{RATE}]))"))
            .with_panel(_ts("TTFB quantiles", "Per group and variant", "s", *quantiles("torbed_transfer_ttfb_seconds")))
            .with_panel(_ts("TTLB quantiles", "Per group and variant", "s", *quantiles("torbed_transfer_ttlb_seconds")))
            .with_row(db.Row("Outcomes"))
            .with_panel(_ts("Transfers finished", "Completed transfers per second", "ops",
                            _q(f"sum by ({by}) (rate(torbed_transfers_finished_total{{{CLIENT_SEL}}}[{RATE}]))",
                               "{{group}} {{variant}}")))
            .with_panel(_ts("Errors by cause", "Failed transfers per interval by error.cause (as in "
                            "transfers.jsonl)", "short",
                            _q(f"sum by (cause, {by}) (increase(torbed_transfers_failed_total{{{CLIENT_SEL}}}[{RATE}]))",
                               "{{cause}} {{group}} {{variant}}")))
            .with_panel(_ts("Circuits built and failed", "Per second", "ops",
                            _q(f"sum by ({by}) (rate(torbed_circuits_built_total{{{CLIENT_SEL}}}[{RATE}]))",
                               "built {{group}} {{variant}}"),
                            _q(f"sum by ({by}) (rate(torbed_circuits_failed_total{{{CLIENT_SEL}}}[{RATE}]))",
                               "failed {{group}} {{variant}}", ref="B")))
            .with_panel(_ts("Circuit build time (median)", "Per group and variant", "s",
                            _q(f"histogram_quantile(0.5, sum by (le, {by}) "
                               f"(rate(torbed_circuit_build_seconds_bucket{{{CLIENT_SEL}}}[{RATE}])))",
                               "{{group}} {{variant}}"))))


def emulator() -> db.Dashboard:
    link = "release, variant, src, dst"
    return (_dashboard("torbed-emulator", "torbed / emulator and faults",
                       "linkemu's counters, relays going down, and what observing costs")
            .with_row(db.Row("linkemu"))
            .with_panel(_ts("Node throughput through linkemu", "Bytes per second linkemu delivered to each node",
                            "Bps", _q(f"sum by (release, variant, node) "
                                      f"(rate(torbed_linkemu_port_tx_bytes_total{{{SEL}}}[{RATE}]))",
                                      "{{variant}} {{node}}")))
            .with_panel(_ts("Frames lost and dropped", "Per link: random loss (lost) and drop-tail queue drops",
                            "pps", _q(f"sum by ({link}) (rate(torbed_linkemu_link_lost_total{{{SEL}}}[{RATE}]))",
                                      "lost {{src}}->{{dst}}"),
                            _q(f"sum by ({link}) (rate(torbed_linkemu_link_queue_drops_total{{{SEL}}}[{RATE}]))",
                               "dropped {{src}}->{{dst}}", ref="B")))
            .with_panel(_ts("Largest link backlog", "Largest queue backlog seen per link", "bytes",
                            _q(f"max by ({link}) (torbed_linkemu_link_max_backlog_bytes{{{SEL}}})",
                               "{{src}}->{{dst}}")))
            .with_row(db.Row("Faults and cost"))
            .with_panel(_ts("Relays up", "1 while a relay's MetricsPort answers: a killed relay drops to 0", "short",
                            _q(f'up{{job="tor", {SEL}}}', "{{variant}} {{node}}")))
            .with_panel(_ts("CPU of Prometheus and the exporters", "CPU seconds per second of Prometheus, the "
                            "measurement drivers and the collectors", "percentunit",
                            _q(f'sum by (release, variant, job) (rate(process_cpu_seconds_total{{job=~"prometheus|'
                               f'driver|collector", {SEL}}}[{RATE}]))', "{{variant}} {{job}}"), w=24)))


def _encode(builder) -> dict:
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(builder.build()))


def dashboards() -> dict[str, dict]:
    return {f"{name}.json": _encode(b()) for name, b in
            (("torbed-network", network), ("torbed-clients", clients), ("torbed-emulator", emulator))}


def panel_queries(model: dict) -> list[tuple[str, str]]:
    out = []
    for p in model.get("panels", []):
        for t in p.get("targets") or []:
            if t.get("expr"):
                out.append((p.get("title", "?"), t["expr"]))
    return out


def expand(expr: str, release: str, variant: str = ".*", group: str = ".*", interval: str = "10s") -> str:
    return (expr.replace("$release", release).replace("$variant", variant).replace("$group", group)
            .replace("$__rate_interval", interval).replace("$__interval", interval))


PROVIDER = """\
# Grafana provisioning for torbed's dashboards (copy to /etc/grafana/provisioning/dashboards/
# and set `path` to this directory's dashboards/). Generated by `torbed chart-files`.
apiVersion: 1
providers:
  - name: torbed
    folder: torbed
    type: file
    allowUiUpdates: false
    options:
      path: /var/lib/grafana/dashboards/torbed
"""

DATASOURCE = """\
# A Prometheus data source for a local run served by `torbed prometheus RUN_DIR --port 9090`
# (copy to /etc/grafana/provisioning/datasources/). Generated by `torbed chart-files`.
apiVersion: 1
datasources:
  - name: torbed
    type: prometheus
    access: proxy
    url: http://127.0.0.1:9090
"""


def generated_files() -> dict[str, str]:
    out = {f"files/grafana/dashboards/{name}": json.dumps(model, indent=2, sort_keys=True) + "\n"
           for name, model in dashboards().items()}
    out["files/grafana/provisioning/dashboards.yaml"] = PROVIDER
    out["files/grafana/provisioning/datasources.yaml"] = DATASOURCE
    return out
