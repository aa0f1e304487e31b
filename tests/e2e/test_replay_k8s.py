"""Trace replay on a real cluster: Gopal & Heninger's experiment 2 (scenarios/gopal-heninger-
2012-exp2.yaml) shortened, installed with `helm install` and run with `torbed run --backend
k8s`; its per-cell delays against a local-backend run of the same scenario, and the replay
clients' clock offset to their replay server, which on this one machine must come out ~0.

Shortened: one variant (ewma-66: config-only, so the local run needs no patched tor build),
one repetition, 60 s of workload (the helm-install test: 30 s) after 10 s of warm-up, two heavy clients instead of four
(a 2-core machine runs the whole network twice here)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ISOLATE, REPO, records, torbed_run, uninstall

pytestmark = pytest.mark.e2e
TORBED = [sys.executable, "-m", "torbed.cli"]
GOPAL = REPO / "scenarios" / "gopal-heninger-2012-exp2.yaml"
VARIANT = "ewma-66"
# One host: the clock bound is half a round trip between two pods of this node (plus the fit's
# residual); anything near a millisecond would mean the exchanges are queued somewhere.
MAX_BOUND_S = 5e-3


def short_scenario(tmp_path: Path, duration: str = "60s", weights: bool = False) -> Path:
    data = yaml.safe_load(GOPAL.read_text())
    data.update(variants=[VARIANT], repetitions=1, measure={"warmup": "10s", "duration": duration})
    data["clients"]["heavy"]["count"] = 2
    if weights:
        for gi, rg in enumerate(data["network"]["relays"].values()):
            rg["weights"] = [weight(gi, i) for i in range(rg.get("count", 1))]
    path = tmp_path / "gopal-short.yaml"
    # Traces named relative to the repository, as in the original (this file is elsewhere).
    for cg in data["clients"].values():
        if cg["workload"]["kind"] == "replay":
            cg["workload"]["trace"] = str(REPO / cg["workload"]["trace"])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def weight(group_index: int, i: int) -> int:
    """Consensus weights voted in the helm-install test: distinct per relay and far from what
    the relays would self-advertise, so the consensus shows whose they are."""
    return 5000 + 700 * group_index + 13 * i


def check_voted_weights(kube, rel: str, scenario: Path) -> dict:
    """The key hook wrote the authorities' bandwidth file (it alone knows every relay's
    fingerprint before a tor starts): each relay's 'w Bandwidth=' in an authority's consensus
    is its weight, measured (no Unmeasured=1), as on the local backend (tests/integration/
    test_generate.py)."""
    import io
    import stem.descriptor
    from conftest import exec_in
    data = yaml.safe_load(scenario.read_text())
    wanted = {f"{g}{i}": w for g, rg in data["network"]["relays"].items() for i, w in enumerate(rg["weights"])}
    text = exec_in(kube, f"{rel}-auth-0", "tor", "cat /var/lib/torbed/data/cached-consensus 2>/dev/null; true")
    doc = next(stem.descriptor.parse_file(io.BytesIO(text.encode()), descriptor_type="network-status-consensus-3 1.0",
                                          document_handler=stem.descriptor.DocumentHandler.DOCUMENT, validate=False))
    seen = {e.nickname: (e.bandwidth, e.is_unmeasured) for e in doc.routers.values()}
    print(f"consensus (w Bandwidth=, unmeasured) per relay: {seen}")
    assert {n: seen.get(n) for n in wanted} == {n: (w, False) for n, w in wanted.items()}, seen
    return seen


def check_clock(clock: list[dict]) -> list[dict]:
    """Every replay client measured its server and found ~0, within a small bound."""
    est = [r for r in clock if r["type"] == "clock_estimate"]
    assert sorted(r["client"] for r in est) == ["ssh0", "web0"], est
    for r in est:
        print(f"clock {r['client']}: offset {r['offset_s'] * 1e3:.3f} ms ± {r['uncertainty_s'] * 1e3:.3f} ms, "
              f"drift {r['drift_ppm']:.2f} ppm, {r['bursts']} bursts, {r['exchanges']} exchanges, {r['lost']} lost, "
              f"min round trip {r['min_delay_s'] * 1e3:.3f} ms")
        assert r["status"] == "ok" and r["bursts"] >= 3
        assert abs(r["offset_s"]) <= r["uncertainty_s"] < MAX_BOUND_S
    return est


def check_cells(cells: list[dict]) -> None:
    groups = {(c["group"], c["direction"]) for c in cells if not c["warmup"]}
    # Downstream at both clients; upstream (SSH keystrokes, page requests) at the replay server.
    assert {("web", "d"), ("ssh", "d"), ("ssh", "u")} <= groups, groups


def test_helm_install_replays_and_measures_the_clock_with_voted_weights(kube, helm, tmp_path):
    rel = "replay"
    # 30 s: the clock is measured before the replay, every 10 s during it and after it (5
    # bursts, 3 needed), and every group's cells flow from the first seconds.
    # With voted consensus weights: the key hook writes the authorities' bandwidth file.
    scenario = short_scenario(tmp_path, "30s", weights=True)
    p = subprocess.run([helm["bin"], "install", rel, str(REPO / "charts" / "torbed"), "-f", str(scenario),
                        "--set", ISOLATE, "--timeout", "300s"], capture_output=True, text=True, env=helm["env"])
    core, batch = kube.CoreV1Api(), kube.BatchV1Api()
    try:
        assert p.returncode == 0, p.stderr
        deadline = time.time() + 600
        while time.time() < deadline:
            jobs = batch.list_namespaced_job("default", label_selector=f"app.kubernetes.io/instance={rel},"
                                                                       "app.kubernetes.io/component=client").items
            if jobs and all((j.status.succeeded or 0) + (j.status.failed or 0) >= j.spec.completions for j in jobs):
                break
            time.sleep(3)
        assert jobs and all(not j.status.failed for j in jobs), [(j.metadata.name, j.status) for j in jobs]

        def fetch(name: str) -> list[dict]:
            r = core.connect_get_namespaced_service_proxy_with_path(f"{rel}-results:http", "default",
                                                                    f"files/{name}", _preload_content=False)
            return [json.loads(x) for x in r.data.decode().splitlines() if x.strip()]

        # The replay server's shipper sends its records every second: poll until they are in.
        deadline = time.time() + 60
        while True:
            try:
                check_cells(fetch("cells.jsonl"))
                check_clock(fetch("clock.jsonl"))
                break
            except AssertionError:
                if time.time() > deadline:
                    raise
                time.sleep(1)
        # The clients ran on this consensus: by now every authority has voted several rounds.
        check_voted_weights(kube, rel, scenario)
    finally:
        left = uninstall(kube, helm, rel)
    assert left == []


def _report(run_dir: Path) -> dict:
    r = subprocess.run([*TORBED, "report", str(run_dir)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((run_dir / "report" / "summary.json").read_text())


@pytest.mark.experiment
def test_torbed_run_k8s_delays_agree_with_the_local_backend(kube, tmp_path):
    scenario = short_scenario(tmp_path)
    p, k8s_run = torbed_run(tmp_path, scenario, "--variant", VARIANT)
    assert p.returncode == 0 and k8s_run, p.stdout[-4000:] + p.stderr[-4000:]
    rep = k8s_run / VARIANT / "rep-0"
    assert json.loads((rep / "meta.json").read_text())["status"] == "ok"
    check_cells(records(rep / "cells.jsonl"))
    check_clock(records(rep / "clock.jsonl"))

    loc = subprocess.run([*TORBED, "run", str(scenario), "--variant", VARIANT, "--out", str(tmp_path / "local"),
                          "--system-tor"], capture_output=True, text=True, cwd=REPO, timeout=1200)
    assert loc.returncode == 0, loc.stdout[-4000:] + loc.stderr[-4000:]
    local_run = next(d for d in (tmp_path / "local").iterdir() if d.is_dir() and not d.is_symlink())
    check_clock(records(local_run / VARIANT / "rep-0" / "clock.jsonl"))

    s_k8s, s_local = _report(k8s_run), _report(local_run)
    md = (k8s_run / "report" / "report.md").read_text()
    assert "Replay clock offsets" in md and "± clock" in md
    # The clock is not what could make the backends disagree: its bounds are ~0.1 ms, and an
    # offset error would shift every cell alike, which would show as delays below zero (none
    # may be, beyond the bound). The rest is queueing behind the heavy downloads, which varies
    # from run to run on this shared machine (one 60 s repetition each; measured in three
    # attempts: web upstream medians 22.9, 59.7 and 31.6 ms locally, the least-queued web
    # upstream cell 0.4 ms on k8s vs 4.6 ms locally under other helpers' load) and between
    # the two emulations of the links (htb per pod vs per namespace). So: SSH keystrokes
    # (upstream, the lightest traffic; medians 0.7-0.8 ms in every attempt) must agree within
    # the clock bounds plus half the local median, at least 2 ms; every other group and
    # direction only in regime (means within a factor of 4). The numbers are printed.
    for mid in ("cell_delay_ms/ssh/up", "cell_delay_ms/web/up", "cell_delay_ms/ssh/down", "cell_delay_ms/web/down"):
        a, b = s_k8s["metrics"][mid]["variants"][VARIANT], s_local["metrics"][mid]["variants"][VARIANT]
        assert a["n"] > 20 and b["n"] > 20, (mid, a["n"], b["n"])
        clock = a["clock_bound_ms"] + b["clock_bound_ms"]
        print(f"{mid}: k8s min {a['min']:.2f} median {a['median']:.1f} mean {a['mean']:.1f} ms "
              f"(± {a['clock_bound_ms']:.3f} clock); local min {b['min']:.2f} median {b['median']:.1f} "
              f"mean {b['mean']:.1f} ms (± {b['clock_bound_ms']:.3f})")
        assert clock < 2 * MAX_BOUND_S * 1e3
        assert a["min"] >= -a["clock_bound_ms"] and b["min"] >= -b["clock_bound_ms"], mid
        if mid == "cell_delay_ms/ssh/up":
            assert abs(a["median"] - b["median"]) <= clock + max(0.5 * b["median"], 2.0), mid
        else:
            # Not for the keystrokes: a handful of cells queued behind a page load make their
            # mean (measured: 2.5 ms on k8s vs 11.6 ms locally, medians both 0.6 ms).
            assert 0.25 <= a["mean"] / b["mean"] <= 4, mid
