"""Variants differ for the right reason: round robin vs EWMA at a congested middle relay.

Tang & Goldberg (CCS 2010) section 3.2 scaled down: bulk clients and one light client
share guard -> middle -> exit; the middle's link toward the guard is the bottleneck, so
cells queue in the middle's circuit queues, where the circuitmux policy decides who waits.
Under round robin the light circuit waits its turn behind the bulk circuits; under EWMA it
has the lowest recent cell count and goes first. The paper measured 653 ms vs 115 ms with
two bulk clients; four make the contrast (at most about the number of competing circuits
under round robin) robust enough for a test. The web and bulk circuits are known by their
clients (no volume rule).
Uses the real variant builds (images/relay/build-tor.sh, cached by content hash).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import require_root
from tests.integration.helpers import records, only_run_dir, run_torbed, small_scenario, write_scenario

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _root():
    require_root()


# Not serial: its report keeps what the CPU gate would reject beside another network
# (--keep-gate-invalid); it checks what the report computes, not a verdict.
def test_round_robin_and_ewma_relays_run_as_configured(tmp_path):
    """Both arms of the Tang & Goldberg comparison, briefly: each variant's build and torrc
    are what its variant.yaml says, the round-robin policy is in effect on the vanilla relays
    (tor's notice line), CELL_STATS come from the middle, and the report has the per-circuit
    wait metric. Whether EWMA helps is an experiment (the test below)."""
    data = small_scenario("it-variants-ci", **{
        "variants": ["vanilla", "ewma-66"],
        "links.pairs": [{"between": ["guard", "middle"], "rate": "2mbit"}],
        "clients.bulk": {"path": ["guard", "middle", "exit"], "workload": {"kind": "bulk", "file": "bulk"}},
        "clients.web.workload": {"kind": "fetch", "file": "small", "repeat": 1000, "pause": "1s"},
        "measure.duration": "15s",
    })
    out = tmp_path / "runs"
    p = run_torbed(["run", str(write_scenario(tmp_path, data)), "--out", str(out)], timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run = only_run_dir(out)
    for v in ("vanilla", "ewma-66"):
        rep = run / v / "rep-0"
        meta = json.loads((rep / "meta.json").read_text())
        assert meta["status"] == "ok"
        torrc = (rep / "torrc" / f"variant-{v}.torrc").read_text()
        assert ("CircuitMuxPolicy RoundRobin" in torrc) == (v == "vanilla")
        assert ("CircuitPriorityHalflife 66" in torrc) == (v == "ewma-66"), torrc
        assert meta["builds"][v]["patches"] == (["0001-circuitmux-round-robin-policy.patch"] if v == "vanilla" else [])
        assert [c for c in records(rep / "cellstats.jsonl") if c["relay"] == "middle0"], v
        assert [t for t in records(rep / "transfers.jsonl") if t["status"] == "ok"], v
    mid_log = (run / "vanilla" / "rep-0" / "logs" / "middle0.log").read_text()
    assert "CircuitMuxPolicy" in mid_log and "RoundRobin" in mid_log
    assert "RoundRobin" not in (run / "ewma-66" / "rep-0" / "logs" / "middle0.log").read_text()
    p = run_torbed(["report", str(run), "--keep-gate-invalid"])
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert any(k.startswith("cell_wait_ms/middle0/") for k in summary["metrics"]), sorted(summary["metrics"])


# Not serial: nothing here depends on the gates' verdict or a tight time (a switch is never
# early, and at most 3 s late at the watch loop's wake-up).
def test_a_crossover_switches_one_network_between_round_robin_and_ewma(tmp_path):
    """The within-run crossover (torbed/crossover.py) on real tor: one network, the relays
    switched between the arms by SETCONF/RESETCONF at each period's start (tor's own notice says
    the policy changed on the existing channels), every switch on time and accepted by every
    relay, and the records split into one repetition per arm that the report pairs."""
    data = small_scenario("it-crossover", **{
        "variants": ["vanilla", "ewma-66"],
        "crossover": {"period": "15s", "washout": "3s", "cycles": 1},
        "links.pairs": [{"between": ["guard", "middle"], "rate": "2mbit"}],
        "clients.bulk": {"path": ["guard", "middle", "exit"], "workload": {"kind": "bulk", "file": "bulk"}},
        "clients.web.workload": {"kind": "fetch", "file": "small", "repeat": 1000, "pause": "1s"},
        "measure.warmup": "4s",
        "measure.duration": "30s",
    })
    out = tmp_path / "runs"
    p = run_torbed(["run", str(write_scenario(tmp_path, data)), "--out", str(out)], timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run = only_run_dir(out)
    info = json.loads((run / "run.json").read_text())
    assert info["order"] == [["crossover", 0]] and info["crossover"]["build_variant"] == "vanilla"
    raw = run / "crossover" / "rep-0"
    meta = json.loads((raw / "meta.json").read_text())
    assert meta["status"] == "ok" and meta["builds"]["vanilla"]["patches"] == ["0001-circuitmux-round-robin-policy.patch"]
    arms = [p["arm"] for p in meta["crossover"]["periods"]]
    switches = records(raw / "crossover.jsonl")
    assert [r["arm"] for r in switches] == arms and sorted(arms) == ["ewma-66", "vanilla"]
    assert all(set(r["relays"].values()) == {"ok"} and set(r["relays"]) == {"guard0", "middle0", "exit0"}
               for r in switches), switches
    # The first before the workload; the second at its period's start (the watch loop's wake-up).
    assert switches[0]["t"] <= meta["t_workload_start"] + 0.5
    assert 0 <= switches[1]["t"] - switches[1]["t_planned"] < 3.0, switches[1]   # never early
    mid_log = (raw / "logs" / "middle0.log").read_text()
    # The build starts on RoundRobin (its torrc); EWMA comes in by RESETCONF, on the open channels.
    assert "Circuit scheduling policy (CircuitMuxPolicy) is now EWMA; switched" in mid_log, mid_log[-2000:]
    if arms[0] == "ewma-66":
        assert "is now RoundRobin; switched" in mid_log.split("is now EWMA", 1)[1]
    for arm in ("vanilla", "ewma-66"):
        rep = run / arm / "rep-0"
        m = json.loads((rep / "meta.json").read_text())
        assert m["status"] == "ok" and m["crossover"]["source"] == "crossover/rep-0"
        (a, b), = m["crossover"]["spans"]
        assert b - a == pytest.approx(12.0)
        assert all(a <= t["t_start"] < b for t in records(rep / "transfers.jsonl")), arm
        assert [c for c in records(rep / "cellstats.jsonl") if c["relay"] == "middle0"], arm
        assert [t for t in records(rep / "transfers.jsonl") if t["status"] == "ok"], arm
    p = run_torbed(["report", str(run)])
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert summary["run"]["crossover"]["period_s"] == 15.0
    assert "within-run crossover" in (run / "report" / "report.md").read_text()


@pytest.mark.experiment
def test_light_circuit_waits_less_under_ewma_than_round_robin(tmp_path):
    data = small_scenario("it-variants", **{
        "variants": ["vanilla", "ewma-66"],
        "network.consensus_params": {"cc_alg": 0},
        "network.relays.middle": {"torrc": "ConstrainedSockets 1\nConstrainedSockSize 8192"},
        "links.pairs": [{"between": ["guard", "middle"], "rate": "2mbit"}],
        "servers.www.files": {"light": "50KB", "bulk": "100MB"},
        "clients.bulk": {"count": 4, "path": ["guard", "middle", "exit"],
                         "workload": {"kind": "bulk", "file": "bulk"}},
        "clients.web.workload": {"kind": "fetch", "file": "light", "repeat": 1000, "pause": "2s"},
        "measure.warmup": "10s",
        "measure.duration": "70s",
    })
    out = tmp_path / "runs"
    p = run_torbed(["run", str(write_scenario(tmp_path, data)), "--out", str(out)], timeout=1500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run = only_run_dir(out)
    for v in ("vanilla", "ewma-66"):
        meta = json.loads((run / v / "rep-0" / "meta.json").read_text())
        assert meta["status"] == "ok"
        torrc = (run / v / "rep-0" / "torrc" / f"variant-{v}.torrc").read_text()
        assert ("CircuitMuxPolicy RoundRobin" in torrc) == (v == "vanilla")
        assert meta["builds"][v]["patches"] == (["0001-circuitmux-round-robin-policy.patch"] if v == "vanilla" else [])
    # The round-robin policy is really in effect on the vanilla relays (its notice line).
    mid_log = (run / "vanilla" / "rep-0" / "logs" / "middle0.log").read_text()
    assert "CircuitMuxPolicy" in mid_log and "RoundRobin" in mid_log
    p = run_torbed(["report", str(run)])
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((run / "report" / "summary.json").read_text())
    # The web client's circuits at the middle, known by their client (analysis/circuits.py).
    light = summary["metrics"]["cell_wait_ms/client:web/middle/inbound"]["variants"]
    rr, ewma = light["vanilla"]["wait_per_cell_ms"], light["ewma-66"]["wait_per_cell_ms"]
    print(f"web client's mean circuit-queue wait at the middle: vanilla {rr:.0f} ms/cell, ewma-66 {ewma:.0f} ms/cell "
          f"(ratio {rr / ewma:.1f}; Tang & Goldberg: 653 vs 115 ms)")
    assert rr >= 2 * ewma
    heavy = summary["metrics"]["cell_wait_ms/client:bulk/middle/inbound"]["variants"]
    # EWMA trades the bulk circuits' wait for the light one's: they do not get faster.
    assert heavy["ewma-66"]["wait_per_cell_ms"] >= 0.8 * heavy["vanilla"]["wait_per_cell_ms"]
