"""Background load (scenario `load:`) on a real cluster: the chart's Locust master and worker
Deployments (the locust image), driven by `torbed run --backend k8s`.

Proves that the Locust users' requests go through the private Tor network (Locust's
statistics are recorded and every relay of the load's path moved at least the bytes Locust
and the foreground client received), that the load starts at the scenario's time, that the
report shows it, that the in-chart Prometheus scrapes the Locust master's statistics
(torbed_load_*, job locust), and that nothing of the release is left afterwards, nor after a
Ctrl-C while the load runs.

Shortened for a 2-core machine: one variant, one foreground client, four users on two load
workers, a 40 s workload with 30 s of load (in a 60 s run with 40 s of load: 22 requests and
9.1 MB after 30 s of it, where the test needs 10 and 2 MB)."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import ISOLATE, REPO, TORBED, leftovers, records, torbed_run

pytestmark = pytest.mark.e2e
VARIANT = "ewma-66"
LOAD_START_S = 5.0


def load_scenario(tmp_path: Path, **measure) -> Path:
    data = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    data.update(name="k8sload", variants=[VARIANT], repetitions=1,
                measure={"warmup": "10s", "duration": "40s", **measure})
    data["clients"] = {"web": {"count": 1, "path": ["guard", "middle", "exit"],
                               "workload": {"kind": "fetch", "file": "small", "repeat": 1000, "pause": "1s"}}}
    data["load"] = {"users": 4, "spawn_rate": 4, "workers": 2, "path": ["guard", "middle", "exit"],
                    "start": f"{LOAD_START_S:.0f}s", "stop": "35s",
                    "mix": {"web": {"weight": 1, "size": "50KiB", "think": {"distribution": "constant", "mean": "1s"}},
                            "bulk": {"weight": 1, "size": "1MiB"}}}
    path = tmp_path / "k8sload.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_locust_users_cross_the_private_network_and_nothing_is_left(kube, tmp_path):
    p, run_dir = torbed_run(tmp_path, load_scenario(tmp_path))
    assert p.returncode == 0 and run_dir, p.stdout[-4000:] + p.stderr[-4000:]
    rep = run_dir / VARIANT / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    assert meta["status"] == "ok", meta.get("error")

    # Locust's statistics, in the local backend's format.
    recs = records(rep / "load.jsonl")
    assert recs and recs[-1]["label"] == "end", recs[-1:]
    total = recs[-1]["total"]
    print(f"Locust: {total['requests']} requests, {total['failures']} failures, {total['bytes'] / 1e6:.1f} MB")
    assert total["requests"] >= 10 and total["bytes"] > 2e6, total
    assert total["failures"] <= 0.05 * total["requests"], total
    assert max(r["users"] for r in recs) == 4
    assert set(recs[-1]["by_name"]) == {"web", "bulk"}
    history = list(csv.DictReader((rep / "locust" / "stats_stats_history.csv").read_text().splitlines()))
    assert len(history) > 5 and "Requests/s" in history[0], history[:1]
    agg = [r for r in csv.DictReader((rep / "locust" / "stats_stats.csv").read_text().splitlines())
           if r["Name"] == "Aggregated"]
    assert agg and int(agg[0]["Request Count"]) == total["requests"], agg

    # The load starts at its scenario time (the master's first record comes with the users)
    # and both workers carried it.
    t_work = meta["t_workload_start"]
    assert meta["load"]["t_start"] and meta["load"]["t_stop"], meta["load"]
    assert LOAD_START_S - 1 <= recs[0]["t"] - t_work <= LOAD_START_S + 10, (recs[0]["t"], t_work)
    assert meta["load"]["users_max"] == 4 and len(meta["load"]["workers"]) == 2, meta["load"]

    # Through the private Tor network: every relay of the load's path moved at least what
    # Locust and the foreground client received.
    fg_bytes = sum(t["bytes"] for t in records(rep / "transfers.jsonl") if t["status"] == "ok")
    bw = records(rep / "relay_bw.jsonl")
    for relay in ("guard0", "middle0", "exit0"):
        read = sum(r["read"] for r in bw if r["relay"] == relay)
        print(f"{relay}: read {read / 1e6:.1f} MB (Locust {total['bytes'] / 1e6:.1f} MB + foreground "
              f"{fg_bytes / 1e6:.1f} MB)")
        assert read >= total["bytes"] + fg_bytes, (relay, read, total["bytes"], fg_bytes)
    # The load nodes' tors: socks5h, so the exit opened every connection to the server.
    logs = list((rep / "logs").glob(f"{meta['release']}-load-*.tor.log"))
    assert len(logs) == 2 and all("Bootstrapped 100%" in f.read_text() for f in logs), logs

    r = subprocess.run([*TORBED, "report", str(run_dir)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["load"][0]["requests"] == total["requests"]
    assert "Background load (Locust)" in (run_dir / "report" / "report.md").read_text()
    assert leftovers(kube, meta["release"]) == []


def _prometheus(kube, release: str, expr: str) -> list[dict]:
    """An instant query to the release's in-chart Prometheus through the API server's proxy."""
    r = kube.ApiClient().call_api(f"/api/v1/namespaces/default/services/{release}-prometheus:web/proxy/api/v1/query",
                                  "GET", query_params=[("query", expr)], auth_settings=["BearerToken"],
                                  _preload_content=False, _return_http_data_only=True, _request_timeout=30)
    body = json.loads(r.data)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_ctrl_c_while_the_load_runs_leaves_no_locust_pod(kube, tmp_path):
    scenario = load_scenario(tmp_path, duration="5m")
    out = tmp_path / "runs"
    log = open(tmp_path / "torbed.log", "w")
    # With the in-chart Prometheus: it must scrape the Locust master's exporter (job locust).
    proc = subprocess.Popen([*TORBED, "run", str(scenario), "--backend", "k8s", "--out", str(out), "--set", ISOLATE,
                             "--set", "prometheus.enabled=true", "--set", "prometheus.scrapeInterval=5s"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    core = kube.CoreV1Api()
    release = None
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            metas = list(out.glob(f"*/{VARIANT}/rep-0/meta.json"))
            rep = metas[0].parent if metas else None
            if rep and any(r["total"]["requests"] > 0 for r in records(rep / "load.jsonl")):
                break
            assert proc.poll() is None, (tmp_path / "torbed.log").read_text()[-3000:]
            time.sleep(2)
        else:
            pytest.fail("no Locust request recorded within 600 s:\n" + (tmp_path / "torbed.log").read_text()[-3000:])
        release = json.loads((rep / "meta.json").read_text())["release"]
        pods = core.list_namespaced_pod("default", label_selector=f"app.kubernetes.io/instance={release}").items
        roles = sorted((p.metadata.labels or {}).get("app.kubernetes.io/component", "") for p in pods
                       if p.status.phase == "Running")
        assert roles.count("load-worker") == 2 and roles.count("load-master") == 1, roles

        # The in-chart Prometheus scrapes the master's exporter through its Service, labelled
        # as the local backend's locust job, while the users run.
        expr = f'torbed_load_requests_total{{release="{release}", job="locust"}}'
        deadline, series, users = time.time() + 120, [], []
        while time.time() < deadline:
            try:
                series = _prometheus(kube, release, expr)
                users = _prometheus(kube, release, f'torbed_load_users{{release="{release}"}}')
            except Exception:      # Prometheus not up yet, proxy 503: keep polling
                series = []
            if series and sum(float(r["value"][1]) for r in series) > 0 and \
                    [float(r["value"][1]) for r in users] == [4.0]:
                break
            time.sleep(3)
        print(f"in-chart Prometheus: {[(r['metric'].get('name'), r['value'][1]) for r in series]}")
        assert series and {r["metric"].get("name") for r in series} <= {"web", "bulk"}, series
        assert sum(float(r["value"][1]) for r in series) > 0, series
        labels = series[0]["metric"]
        assert (labels["node"], labels["role"], labels["group"], labels["variant"]) == \
            ("locust0", "loadmaster", "locust", VARIANT), labels
        up = _prometheus(kube, release, f'up{{release="{release}", job="locust"}}')
        assert [r["value"][1] for r in up] == ["1"], up
        assert [float(r["value"][1]) for r in users] == [4.0], users
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(300)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert rc == 130, (tmp_path / "torbed.log").read_text()[-3000:]
    assert leftovers(kube, release) == []
    assert records(rep / "load.jsonl"), "load.jsonl lost"
