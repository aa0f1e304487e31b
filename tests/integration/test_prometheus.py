"""Prometheus beside a real local run (torbed.backends.local.prometheus): what it scraped, serving the TSDB
afterwards, what a person sees in its graph page (headless Chromium), and the generated
dashboards' queries against it.

One short run (linkemu as the shaper, so its counters are scraped; a kill fault, so failures
and a relay going down are in the data) serves every test of this module: watched live
through the URL torbed prints, then its kept TSDB served by `torbed prometheus`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.integration.helpers import REPO, TORBED, env, run_torbed, small_scenario, start_torbed, write_scenario

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run, watched while it measures: 15 s into the workload (before the fault) the
    live URL torbed printed is asked for its targets and opened in headless Chromium."""
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    for tool in ("prometheus", "chromium"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is not installed: `make setup` installs it (hack/install-deps.sh)")
    from torbed.backends.local import prometheus
    tmp = tmp_path_factory.mktemp("prom")
    s = small_scenario("prom-it", **{
        "links.emulator": "linkemu",
        "clients.web.workload": {"kind": "fetch", "file": "small", "repeat": 1000, "pause": "0s"},
        "clients.bulk": {"path": ["guard", "middle", "exit"], "workload": {"kind": "bulk", "file": "bulk"}},
        "measure.duration": "40s",
        "measure.prometheus": {"scrape_interval": "2s"},
        # The middle dies 30 s in: failures by cause and a relay target going down are in the data.
        "faults": [{"at": "30s", "kind": "kill", "target": "middle"}],
    })
    out = tmp / "runs"
    proc = start_torbed(["run", str(write_scenario(tmp, s)), "--out", str(out)], tmp / "torbed.log")
    live: dict = {}
    try:
        deadline = time.time() + 300
        while proc.poll() is None and time.time() < deadline and not live:
            for path in out.glob("prom-it-*/kist/rep-0/meta.json"):
                m = json.loads(path.read_text())
                url = (m.get("prometheus") or {}).get("live_url")
                if url and m.get("t_workload_start") and time.time() > m["t_workload_start"] + 15:
                    with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=30) as r:
                        live["targets"] = json.load(r)["data"]["activeTargets"]
                    live["data_pixels"] = _screenshot_pixels(
                        prometheus.graph_url(url, prometheus.RELAY_THROUGHPUT, m["t_start"], time.time()),
                        tmp / "live.png")
                    live["empty_pixels"] = _screenshot_pixels(
                        prometheus.graph_url(url, 'tor_relay_traffic_bytes{node="none"}', m["t_start"], time.time()),
                        tmp / "live-empty.png")
            time.sleep(1)
        rc = proc.wait(600)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp / "torbed.log").read_text()
    assert rc == 0, log[-3000:]
    run_dir = Path(next(line for line in log.splitlines() if line.startswith(str(out))).strip())
    rep = run_dir / "kist" / "rep-0"
    return {"dir": run_dir, "rep": rep, "meta": json.loads((rep / "meta.json").read_text()), "live": live}


@pytest.fixture(scope="module")
def served(run):
    from torbed.backends.local import prometheus
    with prometheus.serve(run["rep"] / "prometheus") as s:
        yield s.url


def query(url: str, expr: str, t: float) -> list[dict]:
    u = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{t:.3f}"})
    with urllib.request.urlopen(u, timeout=30) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_every_target_was_up_and_the_settings_are_recorded(run, served):
    meta = run["meta"]
    prom = meta["prometheus"]
    assert prom["enabled"] and prom["scrape_interval_s"] == 2.0 and prom["version"].startswith("2.")
    span = int(meta["t_end"] - meta["t_start"]) + 5
    up = query(served, f"max_over_time(up[{span}s])", meta["t_end"])
    seen = {(r["metric"]["job"], r["metric"]["instance"]): r["value"][1] for r in up}
    expected = {(job, t) for job, targets in prom["jobs"].items() for t in targets}
    assert set(seen) == expected
    assert {k for k, v in seen.items() if v != "1"} == set(), "targets never up"
    assert {"tor", "driver", "collector", "prometheus"} <= set(prom["jobs"])
    # Two clients, three relays: every one a target.
    assert len(prom["jobs"]["driver"]) == 2 and len(prom["jobs"]["tor"]) == 3


def test_the_killed_relay_went_down(run, served):
    meta = run["meta"]
    down = query(served, 'min_over_time(up{job="tor"}[15s])', meta["t_end"])
    state = {r["metric"]["node"]: r["value"][1] for r in down}
    assert state["middle0"] == "0" and state["guard0"] == "1", state


def test_series_of_every_exporter(run, served):
    t = run["meta"]["t_end"]
    span = int(t - run["meta"]["t_start"]) + 5
    relays = query(served, f'max_over_time(tor_relay_traffic_bytes{{direction="written"}}[{span}s])', t)
    assert {r["metric"]["node"] for r in relays} == {"guard0", "middle0", "exit0"}
    assert all(float(r["value"][1]) > 100_000 for r in relays if r["metric"]["node"] != "middle0")
    # Drivers stop before t_end (their series go stale then): look back over the run.
    done = query(served, f"sum by (group, variant) (max_over_time(torbed_transfers_finished_total[{span}s]))", t)
    assert "web" in {r["metric"]["group"] for r in done if float(r["value"][1]) > 0}
    assert {r["metric"]["variant"] for r in done} == {"kist"}
    # transfers.jsonl and the exporter count the same transfers.
    records = [json.loads(line) for line in (run["rep"] / "transfers.jsonl").read_text().splitlines()]
    ok_web = sum(1 for r in records if r["group"] == "web" and r["status"] == "ok")
    last = query(served, f'max_over_time(torbed_transfers_finished_total{{group="web"}}[{span}s])', t)
    assert float(last[0]["value"][1]) == ok_web
    failed = query(served, f"max_over_time(torbed_transfers_failed_total[{span}s])", t)
    # "stall": a bulk stream the kill leaves silent for the default 15 s stallout ends as one
    # when its last byte came just before the kill (30 s in, the deadline 15 s after it).
    assert failed and {r["metric"]["cause"] for r in failed} <= {"circuit_failed", "stream_detached", "timeout",
                                                               "connection_error", "socks_error", "stall"}
    assert query(served, f"max_over_time(torbed_circuits_built_total[{span}s]) > 0", t)
    assert query(served, f"max_over_time(torbed_transfer_ttlb_seconds_bucket[{span}s])", t)
    cells = query(served, f"max_over_time(torbed_relay_cells_total[{span}s]) > 0", t)
    assert {r["metric"]["relay"] for r in cells} == {"guard0", "middle0", "exit0"}
    assert query(served, f"max_over_time(torbed_relay_cell_queue_wait_seconds_total[{span}s])", t)
    cpu = query(served, f"max_over_time(process_cpu_seconds_total[{span}s])", t)
    assert {r["metric"]["job"] for r in cpu} == {"prometheus", "driver", "collector"}
    ports = query(served, f"max_over_time(torbed_linkemu_port_tx_bytes_total[{span}s]) > 0", t)
    assert {"guard0", "exit0"} <= {r["metric"]["node"] for r in ports}


def test_prometheus_only_targets_the_private_network(run):
    import ipaddress
    conf = yaml.safe_load((run["rep"] / "config" / "prometheus.yml").read_text())
    net = ipaddress.ip_network(small_scenario("x").get("network", {}).get("subnet", "10.77.0.0/16"))
    for job in conf["scrape_configs"]:
        assert set(job) <= {"job_name", "static_configs", "honor_labels"}, "no service discovery of any kind"
        for sc in job["static_configs"]:
            for target in sc["targets"]:
                host = ipaddress.ip_address(target.rsplit(":", 1)[0])
                assert host.is_loopback or host in net, target
    assert "remote_write" not in conf and "alerting" not in conf


def test_nothing_left_running(run):
    p = subprocess.run(["pgrep", "-af", "prometheus"], capture_output=True, text=True)
    assert str(run["rep"]) not in p.stdout


def _tsdb_state(path: Path) -> dict:
    return {str(f.relative_to(path)): (f.stat().st_size, f.stat().st_mtime_ns) for f in path.rglob("*") if f.is_file()}


def test_cli_serves_the_tsdb_read_only(run, tmp_path):
    tsdb = run["rep"] / "prometheus"
    before = _tsdb_state(tsdb)
    # The served copy goes under TMPDIR (tempfile): a directory of this test's own, so what
    # is left there is this command's (other tests or checkouts may serve a run now too).
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    proc = subprocess.Popen(TORBED + ["prometheus", str(run["dir"])], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**env(), "TMPDIR": str(tmpdir)}, cwd=REPO)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else url
        assert query(url, 'up{job="tor"}', run["meta"]["t_end"] - 5)
        assert [d.name[:len("torbed-prometheus-")] for d in tmpdir.iterdir()] == ["torbed-prometheus-"]
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(30)
    assert rc == 0, proc.stderr.read()
    assert _tsdb_state(tsdb) == before
    assert not list(tmpdir.iterdir()), "the served copy was left behind"


def test_cli_rejects_a_directory_that_is_not_a_run(tmp_path):
    p = run_torbed(["prometheus", str(tmp_path)])
    assert p.returncode == 2 and "not a run directory" in p.stderr and "Traceback" not in p.stderr


def _colored_pixels(png: Path) -> int:
    """Pixels of a plotted line: saturated colours other than the page's blue buttons."""
    import numpy as np
    from PIL import Image
    hsv = np.asarray(Image.open(png).convert("HSV")).astype(int)
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    return int(((s > 90) & (v > 90) & ~((h >= 140) & (h <= 160))).sum())


def _screenshot_pixels(url: str, out: Path) -> int:
    p = subprocess.run([shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1280,900", "--virtual-time-budget=10000", f"--screenshot={out}", url],
                       capture_output=True, text=True, timeout=120)
    assert out.exists(), p.stderr[-2000:]
    return _colored_pixels(out)


def test_live_prometheus_has_every_target_up(run):
    """Through the live URL torbed printed, while the workload ran: every planned target up."""
    targets = run["live"].get("targets")
    assert targets is not None, "the live URL was never reachable while the run measured"
    jobs = run["meta"]["prometheus"]["jobs"]
    assert {(t["labels"]["job"], t["labels"]["instance"]) for t in targets} == \
        {(j, i) for j, insts in jobs.items() for i in insts}
    assert {t["labels"]["instance"]: t["health"] for t in targets if t["health"] != "up"} == {}


def test_browser_shows_live_relay_throughput(run):
    """Prometheus' own graph page in headless Chromium, during the run: the relay-throughput
    graph must draw lines a person can see (compared with the same page for a query with no
    data, taken at the same time)."""
    live = run["live"]
    assert "data_pixels" in live, "the live graph page was never loaded"
    assert live["data_pixels"] > live["empty_pixels"] + 500, live


def test_every_dashboard_panel_query_returns_series(run, served):
    """Each panel of the generated dashboards, its template variables filled in as Grafana
    would, against the run's real Prometheus: none may come back empty."""
    from torbed.backends.k8s import dashboards
    meta, release = run["meta"], run["dir"].name
    empty, n = [], 0
    for name, model in dashboards.dashboards().items():
        for title, expr in dashboards.panel_queries(model):
            q = {"query": dashboards.expand(expr, release=release), "start": f"{meta['t_start']:.3f}",
                 "end": f"{meta['t_end']:.3f}", "step": "2"}
            with urllib.request.urlopen(f"{served}/api/v1/query_range?" + urllib.parse.urlencode(q), timeout=30) as r:
                body = json.load(r)
            assert body["status"] == "success", (name, title, body)
            n += 1
            if not body["data"]["result"]:
                empty.append(f"{name}: {title}: {q['query']}")
    assert n >= 20 and not empty, "\n".join(empty)
    # The template variables' own queries (label_values) find this run, its variant and groups.
    for label, match, want in (("release", "up", {release}), ("variant", "up", {"kist"}),
                               ("group", "torbed_transfers_started_total", {"web", "bulk"})):
        q = urllib.parse.urlencode({"match[]": match, "start": meta["t_start"], "end": meta["t_end"]})
        with urllib.request.urlopen(f"{served}/api/v1/label/{label}/values?{q}", timeout=30) as r:
            assert want <= set(json.load(r)["data"]), label
