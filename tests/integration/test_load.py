"""Background load (Locust through tor) on the local backend: real tor, real Locust (needs root)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import require_root
from tests.integration.helpers import (namespaces, only_run_dir, records, run_torbed,
                                       small_scenario, start_torbed, wait_for, write_scenario)
from torbed import constants
from torbed.backends.local import prometheus

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _root():
    require_root()


def load_scenario(name: str, **overrides) -> dict:
    """A 2 MB/s middle relay shared by one foreground fetch client and Locust users pinned to
    the same path; the users start LOAD_START into the workload, so one run has transfers
    before and during the load."""
    data = small_scenario(name, **{
        "network.relays.middle": {"bandwidth": "2MB/s"},
        "clients.web.workload": {"kind": "fetch", "file": "small", "repeat": 1000, "pause": "1s"},
        "measure.duration": "45s",
        "load": {"users": 6, "spawn_rate": 3, "workers": 2, "path": ["guard", "middle", "exit"], "start": "15s",
                 "mix": {"web": {"weight": 1, "size": "50KiB", "think": {"distribution": "constant", "mean": "1s"}},
                         "bulk": {"weight": 1, "size": "1MiB"}}},
    })
    for key, value in overrides.items():
        node = data
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return data


def processes_with_env(text: str) -> list[int]:
    """Processes whose environment mentions ``text`` (Locust workers carry their run's
    TORBED_LOAD_CONFIG there, not in their arguments)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text.encode() in (d / "environ").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def load_records(rep: Path) -> list[dict]:
    return records(rep / "load.jsonl")


def _load_run(tmp_path) -> tuple[Path, Path, dict]:
    path = write_scenario(tmp_path, load_scenario("it-load"))
    out = tmp_path / "runs"
    p = run_torbed(["run", str(path), "--out", str(out), "--system-tor"], timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run = only_run_dir(out)
    rep = run / "kist" / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    assert meta["status"] == "ok", meta.get("error")
    return run, rep, meta


def test_load_crosses_the_relays_and_is_recorded(tmp_path):
    """Locust's statistics are recorded; every relay of the load's path moves at least the
    bytes Locust and the foreground client received; the run's Prometheus scraped Locust's
    exporter; the report has the load. (How much the load slows the foreground is an
    experiment: test_load_slows_the_foreground.)"""
    run, rep, meta = _load_run(tmp_path)

    recs = load_records(rep)
    assert recs and recs[-1]["label"] == "end", recs[-1:]
    total = recs[-1]["total"]
    assert total["requests"] >= 10 and total["bytes"] > 5e6, total
    assert total["failures"] <= 0.05 * total["requests"], total
    assert max(r["users"] for r in recs) == 6
    assert set(recs[-1]["by_name"]) == {"web", "bulk"}
    history = (rep / "locust" / "stats_stats_history.csv").read_text().splitlines()
    assert len(history) > 5 and "Requests/s" in history[0]

    transfers = [t for t in records(rep / "transfers.jsonl") if t["status"] == "ok"]
    fg_bytes = sum(t["bytes"] for t in transfers)
    bw = records(rep / "relay_bw.jsonl")
    for relay in ("guard0", "middle0", "exit0"):
        read = sum(r["read"] for r in bw if r["relay"] == relay)
        assert read >= total["bytes"] + fg_bytes, (relay, read, total["bytes"], fg_bytes)

    assert not processes_with_env(str(run)), "Locust processes left behind"

    # The master's exporter was scraped by the run's Prometheus: its target was up, and its
    # request counter agrees with load.jsonl (up to the requests of the last scrape interval).
    assert meta["prometheus"]["jobs"]["locust"] == [_master_target(rep)]
    with prometheus.serve(rep / "prometheus") as served:
        span = f"{int(meta['t_end'] - meta['t_start']) + 5}s"
        up = _query(served.url, f'max_over_time(up{{job="locust"}}[{span}])', meta["t_end"])
        assert [r["value"][1] for r in up] == ["1"], up
        reqs = _query(served.url, f"sum by (name) (max_over_time(torbed_load_requests_total[{span}]))", meta["t_end"])
        scraped = {r["metric"]["name"]: float(r["value"][1]) for r in reqs}
        assert set(scraped) == {"web", "bulk"} and all(v > 0 for v in scraped.values()), scraped
        assert sum(scraped.values()) <= total["requests"], (scraped, total)
        users = _query(served.url, f"max_over_time(torbed_load_users[{span}])", meta["t_end"])
        assert [float(r["value"][1]) for r in users] == [6.0], users

    r = run_torbed(["report", str(run)])
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert summary["load"][0]["requests"] == total["requests"]
    assert "Background load (Locust)" in (run / "report" / "report.md").read_text()


@pytest.mark.experiment
def test_load_slows_the_foreground(tmp_path):
    """The foreground's TTLB through the rate-limited middle is at least twice as long while
    the load runs as before it."""
    run, rep, meta = _load_run(tmp_path)
    transfers = [t for t in records(rep / "transfers.jsonl") if t["status"] == "ok"]
    t_load = meta["load"]["t_start"]
    before = [t["ttlb_s"] for t in transfers if t["t_last_byte"] < t_load]
    # Once every user runs (users / spawn_rate seconds), plus the workers' connecting.
    during = [t["ttlb_s"] for t in transfers if t["t_start"] > t_load + 6 / 3 + 3]
    assert len(before) >= 5 and len(during) >= 5, (len(before), len(during))
    assert statistics.median(during) >= 2 * statistics.median(before), (statistics.median(before),
                                                                        statistics.median(during))


def _master_target(rep: Path) -> str:
    cfg = json.loads((rep / "config" / "locust.json").read_text())
    return f"{cfg['metrics']['address']}:{cfg['metrics']['port']}"


def _query(url: str, expr: str, t: float) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr, "time": f"{t:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=30) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_a_locust_worker_that_dies_fails_the_repetition_and_stops_the_rest(tmp_path):
    data = load_scenario("it-load-fail", **{"measure.duration": "5m", "load.start": "0s"})
    path = write_scenario(tmp_path, data)
    out = tmp_path / "runs"
    proc = start_torbed(["run", str(path), "--out", str(out), "--system-tor"], tmp_path / "torbed.log")
    try:
        run = wait_for(lambda: out.exists() and any(out.iterdir()) and only_run_dir(out), 60, "run directory")
        rep = run / "kist" / "rep-0"
        wait_for(lambda: any(r["total"]["requests"] > 0 for r in load_records(rep)), 180, "Locust requests")
        run_id = json.loads((rep / "meta.json").read_text())["run_id"]
        pids = json.loads((constants.STATE_DIR / f"{run_id}.json").read_text())["pids"]
        os.kill(pids["load1.locust"], signal.SIGKILL)
        rc = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "torbed.log").read_text()
    meta = json.loads((rep / "meta.json").read_text())
    assert meta["status"] == "failed" and "load1.locust exited" in meta["error"], (meta["error"], log[-2000:])
    assert rc == 1, log[-2000:]
    assert not processes_with_env(str(run)), "Locust processes left behind"
    assert not namespaces(run), "namespaces left behind"
