"""`torbed run --resume` with real tor (needs root; issue 36 item 6): a run of two variants x
two repetitions is interrupted with SIGINT during its second repetition, then resumed. The
first repetition is kept, the cut one discarded (moved aside, in the re-run's meta.json
history) and run again, the rest follows the recorded order, and run.json has one entry per
session. A bulk client on a slow link leaves a transfer running at the end of each window,
so the records also carry censored transfers (t_censor) and the report counts them.
"""

from __future__ import annotations

import json
import signal

import pytest

from tests.conftest import require_root
from tests.integration.helpers import (namespaces, only_run_dir, records, run_torbed, small_scenario, start_torbed,
                                       wait_for, write_scenario)

pytestmark = pytest.mark.integration


# Not serial: its report keeps what the CPU gate would reject beside another network
# (--keep-gate-invalid); it checks what the report computes, not a verdict.
def test_interrupted_run_resumes_and_its_records_are_a_straight_runs(tmp_path):
    require_root()
    data = small_scenario("it-resume", **{
        "variants": ["kist", "ewma-66"],
        "repetitions": 2,
        "links.pairs": [{"between": ["guard", "middle"], "rate": "4mbit"}],
        "clients.web.workload": {"kind": "fetch", "file": "small", "repeat": 1000, "pause": "1s"},
        "clients.bulk": {"path": ["guard", "middle", "exit"], "workload": {"kind": "bulk", "file": "bulk"}},
        "measure.duration": "12s",
    })
    path = write_scenario(tmp_path, data)
    out = tmp_path / "runs"
    proc = start_torbed(["run", str(path), "--out", str(out), "--system-tor"], tmp_path / "session1.log")
    try:
        # The run directory is made before its run.json is written (atomically): wait for the file.
        run_dir = wait_for(lambda: out.exists() and any(out.iterdir()) and (only_run_dir(out) / "run.json").is_file()
                           and only_run_dir(out), 60, "run directory with its run.json")
        order = [tuple(x) for x in json.loads((run_dir / "run.json").read_text())["order"]]
        second = run_dir / order[1][0] / f"rep-{order[1][1]}"
        wait_for(lambda: len(records(second / "transfers.jsonl")) >= 1, 300, "a transfer of the second repetition")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, (tmp_path / "session1.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "interrupted" and len(info["sessions"]) == 1
    assert json.loads((second / "meta.json").read_text())["status"] == "interrupted"
    first_meta = json.loads((run_dir / order[0][0] / f"rep-{order[0][1]}" / "meta.json").read_text())
    assert first_meta["status"] == "ok"
    assert namespaces(run_dir) == []

    r = run_torbed(["run", "--resume", str(run_dir), "--system-tor"], timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str(run_dir)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "ok" and [s["status"] for s in info["sessions"]] == ["interrupted", "ok"]
    s2 = info["sessions"][1]
    assert s2["resumed"] and s2["kept"] == 1 and s2["discarded"] == [f"{order[1][0]}/rep-{order[1][1]}"]
    assert s2["ran"] == [f"{v}/rep-{k}" for v, k in order[1:]]
    metas = {(v, k): json.loads((run_dir / v / f"rep-{k}" / "meta.json").read_text()) for v, k in order}
    assert all(m["status"] == "ok" for m in metas.values())
    # The kept repetition is untouched; the re-run one says what happened to its first attempt.
    assert metas[order[0]] == first_meta and metas[order[0]]["session"] == 1
    hist = metas[order[1]]["history"]
    assert metas[order[1]]["session"] == 2 and len(hist) == 1 and hist[0]["status"] == "interrupted"
    assert (run_dir / hist[0]["moved_to"] / "meta.json").is_file()
    assert all(metas[x]["session"] == 2 and metas[x]["history"] == [] for x in order[2:])
    # Every repetition's transfers are its own network's (one run id each, no mix).
    for (v, k), m in metas.items():
        recs = records(run_dir / v / f"rep-{k}" / "transfers.jsonl")
        assert recs and all(t["variant"] == v and t["rep"] == k for t in recs)
        assert all(t["t_start"] >= m["t_start"] for t in recs)
    assert namespaces(run_dir) == []

    rep = run_torbed(["report", str(run_dir), "--keep-gate-invalid"], timeout=600)
    assert rep.returncode == 0, rep.stderr[-3000:]
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    outcomes = summary["transfer_outcomes"]
    assert set(outcomes) == {"kist", "ewma-66"}
    cut = [t for v, k in order for t in records(run_dir / v / f"rep-{k}" / "transfers.jsonl")
           if t["status"] == "cancelled" and not t["warmup"]]
    assert sum(o["censored"] for o in outcomes.values()) == len(cut)
    assert all(isinstance(t.get("t_censor"), float) for t in cut)
    assert "censored in all" in (run_dir / "report" / "report.md").read_text()
