"""Circuits known by their client at every hop, with real tor (issue 36 item 2).

A quickstart-shaped network (a web client and two bulk clients on guard -> middle -> exit,
the guard-middle link the bottleneck) runs a short window; every circuit that carried a
client's transfers must be found at the guard, the middle and the exit and labelled with
that client's group (analysis/circuits.py: the client tor's circuit ids on its guard channel,
chained through the relays' CELL_STATS), and no relay-side circuit that carried data may be
left unlabelled.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from analysis import circuits
from tests.integration.helpers import namespaces, only_run_dir, records, run_torbed, small_scenario, write_scenario

pytestmark = pytest.mark.integration

DATA_CELLS = 20     # a hop "carried data" from this many relay cells (10 KB) over the window


# Not serial: its report keeps what the CPU gate would reject beside another network
# (--keep-gate-invalid); it checks what the report computes, not a verdict.
def test_web_and_bulk_circuits_are_labelled_at_guard_middle_and_exit(tmp_path):
    data = small_scenario("it-client-circuits", **{
        "network.relays.middle": {"torrc": "ConstrainedSockets 1\nConstrainedSockSize 8192"},
        "network.consensus_params": {"cc_alg": 0},
        "links.pairs": [{"between": ["guard", "middle"], "rate": "4mbit"}],
        "clients.bulk": {"count": 2, "path": ["guard", "middle", "exit"], "workload": {"kind": "bulk", "file": "bulk"}},
        "clients.web.workload": {"kind": "fetch", "file": "small", "repeat": 1000, "pause": "1s"},
        "measure.warmup": "10s",
        "measure.duration": "40s",
    })
    out = tmp_path / "runs"
    p = run_torbed(["run", str(write_scenario(tmp_path, data)), "--out", str(out), "--system-tor"])
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = only_run_dir(out)
    rep = run_dir / "kist" / "rep-0"
    cs, cc = records(rep / "cellstats.jsonl"), records(rep / "circuits.jsonl")
    transfers = records(rep / "transfers.jsonl")
    meta = json.loads((rep / "meta.json").read_text())
    names = {n["fingerprint"]: n["name"] for n in meta["nodes"] if n.get("fingerprint")}
    att = circuits.attribute(cs, cc, transfers, names=names)

    group_of = {t["client"]: t["group"] for t in transfers}
    used = {(t["client"], str(t["circuit"]["id"])) for t in transfers if t.get("circuit")}
    assert {g for c, _ in used for g in [group_of[c]]} == {"web", "bulk"}
    found: dict[tuple, dict[str, str]] = {}
    for lb in att.labels.values():
        if lb.origin == "client" and (lb.node, lb.circuit) in used:
            found.setdefault((lb.node, lb.circuit), {})[lb.position] = (lb.relay, lb.group)
    for c, cid in sorted(used):
        g = group_of[c]
        assert found.get((c, cid)) == {"guard": ("guard0", g), "middle": ("middle0", g), "exit": ("exit0", g)}, \
            (c, cid, found.get((c, cid)))

    relay_cells: Counter = Counter()
    for r in cs:
        key = circuits.hop_key(r)
        for side in ("inbound", "outbound"):
            if r.get(side):
                relay_cells[key] += r[side]["removed"].get("relay", 0)
    carried = [k for k, n in relay_cells.items() if n >= DATA_CELLS]
    unlabelled = [k for k in carried if k not in att.labels]
    by_group = Counter(att.labels[k].group for k in carried if k in att.labels and att.labels[k].origin == "client")
    print(f"workload circuits {len(used)} ({Counter(group_of[c] for c, _ in used)}); relay-side hops "
          f"{att.hops}, labelled {len(att.labels)} ({att.summary()}); hops with >= {DATA_CELLS} relay cells "
          f"{len(carried)}: by client group {dict(by_group)}, unlabelled {len(unlabelled)}")
    assert not unlabelled, unlabelled
    assert by_group["web"] >= 3 and by_group["bulk"] >= 6
    assert not att.mismatched and namespaces(run_dir) == []

    # The report's queue wait per client group and position comes from the same labels.
    p = run_torbed(["report", str(run_dir), "--keep-gate-invalid"])
    assert p.returncode == 0, p.stdout + p.stderr
    full = json.loads((run_dir / "report" / "summary.json").read_text())
    cov = full["repetitions"][0]["circuits"]
    assert cov["workload_complete"] == cov["workload_circuits"] == len(used) and cov["data_hops_unlabelled"] == 0, cov
    summary = full["metrics"]
    for g in ("web", "bulk"):
        for pos in ("guard", "middle", "exit"):
            entry = summary[f"cell_wait_ms/client:{g}/{pos}/inbound"]["variants"]["kist"]
            assert entry["n"] > 0, (g, pos)
    web, bulk = (summary[f"cell_wait_ms/client:{g}/middle/inbound"]["variants"]["kist"]["wait_per_cell_ms"]
                 for g in ("web", "bulk"))
    print(f"queue wait at the middle (inbound): web {web:.1f} ms/cell, bulk {bulk:.1f} ms/cell")
