"""`torbed nightly` end to end with real tor: normal nights, then a night whose network is
deliberately slower (the link rate lowered under the same scenario name) is flagged as a
regression, with exit status 3 and the history and report updated."""

from __future__ import annotations

import json
import sqlite3

import pytest
import yaml

from .helpers import run_torbed, small_scenario, write_scenario

pytestmark = pytest.mark.integration


def _nightly(tmp_path, scenario_path):
    n = {"apiVersion": "torbed/v1", "kind": "Nightly", "name": "itest",
         "matrix": [{"scenario": str(scenario_path), "repetitions": 1, "duration": "8s"}],
         "metrics": ["ttlb_s/*"], "lookback": 5, "min_history": 3,
         # Three nights are few: Student's t with 2 degrees of freedom at z = 3's level needs
         # a 19-sd change; z = 2 (4.6% nominal) keeps the test short and still demands a
         # large effect. The rate drop below makes 300 KB take ~10x longer.
         "thresholds": {"z": 2.0, "p": 0.01, "min_change": "20%"},
         # The slow night edits the scenario (its content hash changes): compare by name.
         "compare_by": ["scenario", "variant", "hardware"]}
    path = tmp_path / "itest.nightly.yaml"
    path.write_text(yaml.safe_dump(n))
    return path


def test_a_slower_night_is_flagged(tmp_path):
    hist = tmp_path / "history"
    base = small_scenario("nightly", **{"clients.web.workload.repeat": 200,
                                        "measure.warmup": "2s"})
    # The slow night at 4 mbit: 300 KB takes ~15x longer, and enough downloads still finish in
    # the 8 s window (every transfer is cut at its end) for the test to reach p < 0.01; at
    # 1 mbit only two finished and p was 0.015 for a 62x change.
    for i, rate in enumerate(["100mbit", "100mbit", "100mbit", "4mbit"]):
        s = dict(base, links={"default": {"rate": rate}})
        spath = write_scenario(tmp_path, s)
        p = run_torbed(["nightly", str(_nightly(tmp_path, spath)), "--history", str(hist),
                        "--night", f"2026-11-0{i + 1}"], timeout=400)
        report = json.loads((hist / "reports" / f"2026-11-0{i + 1}" / "nightly.json").read_text())
        statuses = {f["status"] for f in report["findings"]}
        if i < 2:
            assert p.returncode == 0, p.stderr[-3000:]
            assert statuses == {"insufficient-history"}, report["findings"]
        elif i == 2:
            assert p.returncode == 0, p.stderr[-3000:]
            assert "regression" not in statuses and "improvement" not in statuses, report["findings"]
        else:
            assert p.returncode == 3, p.stderr[-3000:]
            reg = [f for f in report["findings"] if f["status"] == "regression"]
            assert reg and reg[0]["metric"] == "ttlb_s/web:small" and reg[0]["change"] > 1.0, report["findings"]
            assert (hist / "reports" / "2026-11-04" / "nightly.html").exists()
    db = sqlite3.connect(hist / "history.sqlite")
    nights = [r[0] for r in db.execute("SELECT night FROM runs ORDER BY night")]
    assert nights == ["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]
    assert len(list((hist / "runs").glob("nightly-2*"))) == 4
    # Each run's run.json names its scenario file and the entry's overrides, as `torbed run`
    # records its options (what `torbed run --resume` rebuilds the scenario from).
    for run_json in (hist / "runs").glob("nightly-2*/run.json"):
        info = json.loads(run_json.read_text())
        assert info["overrides"] == {"repetitions": 1, "duration": "8s"}, info["overrides"]
        assert info["source"] == str(tmp_path / "nightly.yaml"), info["source"]
