"""The setup checks an experiment passes before its first block (analysis/precheck.py): the
per-thread cap's linearity judged from its runs' figures, and the campaign waiting for,
running, or halting on it."""

import json

import pytest

from torbed.analysis import campaign, precheck, prereg, reproduce

SLOW = "engler-goldberg-2021-slowcores"
P = prereg.load()


def pt(cap, mbps, valid=True, why=()):
    return {"cap": cap, "factor": cap / 0.2, "throughput_Bps": mbps * 1e6, "valid": valid, "invalid_reasons": list(why)}


def test_proportional_throughput_passes():
    # The first precheck's figures (2026-11-28): per core of cap 0.96 and 1.04 of 20%'s at 40
    # and 80%; the 10% point (a factor no longer in the check) is not judged.
    ok, why = precheck.judge([pt(0.2, 0.415), pt(0.1, 0.172, False, ["94% failed"]), pt(0.4, 0.797), pt(0.8, 1.724)])
    assert ok, why
    assert why.startswith("proportional to the cap") and "20%: 0.41 MB/s (1.00)" in why and "80%: 1.72 MB/s (1.04)" in why
    assert "10%" not in why


@pytest.mark.parametrize("points,want", [
    # The network, not the cap, binds at 80%: 3.0 MB/s is 0.62 of 4 x the 20% rate.
    ([pt(0.1, 0.6), pt(0.2, 1.2), pt(0.4, 2.3), pt(0.8, 3.0)], "relative to the scenario's cap of 20%"),
    ([pt(0.2, 1.2), pt(0.8, 4.8, False, ["CPU-starved: 1 process(es) ... (entry0 14%)"])],
     "cap 80%: CPU-starved"),
    ([pt(0.4, 2.4), {"cap": 0.2, "factor": 1.0, "throughput_Bps": None, "valid": False}], "no throughput at cap 20%"),
    ([], "no run"),
])
def test_a_network_that_binds_or_a_run_the_gates_reject_fails(points, want):
    ok, why = precheck.judge(points)
    assert not ok and want in why


def test_the_slowcores_experiment_is_preregistered_with_its_precheck():
    e = P.experiments[SLOW]
    assert e.precheck == precheck.CAP_LINEARITY
    assert next(c for c in P.primaries if c.id == "eg-3-threads").experiment == SLOW


def test_an_unknown_precheck_is_refused_naming_the_entry(tmp_path):
    raw = (prereg.PATH).read_text().replace("precheck: cap-linearity", "precheck: warp-drive")
    (tmp_path / "p.yaml").write_text(raw)
    with pytest.raises(prereg.PreregError, match=f"experiments.{SLOW}.precheck: 'warp-drive'"):
        prereg.load(tmp_path / "p.yaml")


def _record(rec, ok, digest=None):
    p = precheck.path(rec.root, SLOW, precheck.CAP_LINEARITY)
    p.parent.mkdir(parents=True, exist_ok=True)
    digest = digest or precheck.scenario_digest(reproduce.REPO / P.experiments[SLOW].scenario)
    p.write_text(json.dumps({"ok": ok, "why": "proportional" if ok else "not proportional to the cap: ...",
                             "points": [], "finished": "2026-11-28T02:00:00Z", "host": "vm",
                             "scenario_sha256": digest}))


def test_a_precheck_of_another_version_of_the_scenario_runs_again(tmp_path):
    rec = campaign.Records(tmp_path / "records")
    _record(rec, True, digest="0" * 64)
    assert campaign.plan(P, rec)[SLOW]["precheck"] == "cap-linearity"
    _record(rec, True)
    assert not campaign.plan(P, rec)[SLOW]["precheck"]


def test_the_campaign_waits_for_runs_and_halts_on_the_precheck(tmp_path, monkeypatch):
    rec = campaign.Records(tmp_path / "records")
    p = campaign.plan(P, rec)[SLOW]
    assert p["precheck"] == "cap-linearity" and not p["halted"] and not p["concluded"]
    assert p["reason"].startswith("precheck cap-linearity first")
    est = campaign.estimate(P, rec, reproduce.REPO, only=[SLOW])["experiments"][SLOW]
    check = precheck.seconds("cap-linearity", reproduce.REPO, P.experiments[SLOW])
    assert check == pytest.approx(3 * (150 + precheck.PER_RUN_OVERHEAD_S))
    assert est["pilot_s"] == pytest.approx(campaign.FIRST_BRINGUP_S + 3 * est["block_s"] + check)
    # run_experiment runs the precheck before any block; a failed one halts without a block.
    ran = []
    monkeypatch.setattr(precheck, "run", lambda kind, exp, e, root, runs, repo: (ran.append(exp), _record(rec, False)))
    monkeypatch.setattr(campaign, "_launch", lambda *a, **k: pytest.fail("a block started after a failed precheck"))
    res = campaign.run_experiment(P, SLOW, rec, tmp_path / "runs", reproduce.REPO)
    assert ran == [SLOW] and res["halted"].startswith("halted: its precheck (cap-linearity) failed")
    # A retry runs it again (e.g. on another machine); passing, the pilot's blocks may start.
    monkeypatch.setattr(precheck, "run", lambda kind, exp, e, root, runs, repo: (ran.append(exp), _record(rec, True)))
    monkeypatch.setattr(campaign, "_launch", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("launched")))
    with pytest.raises(RuntimeError, match="launched"):
        campaign.run_experiment(P, SLOW, rec, tmp_path / "runs", reproduce.REPO, retry=True)
    assert ran == [SLOW, SLOW] and campaign.plan(P, rec)[SLOW]["reason"] == "pilot"


def test_the_document_lists_the_prechecks(tmp_path):
    rec = campaign.Records(tmp_path / "records")
    doc = tmp_path / "r.md"
    assert reproduce.main(["--render-only", "--records", str(rec.root), "--doc", str(doc)]) == 0
    assert f"| {SLOW} | cap-linearity | not run yet (or not on this version of the scenario) | – |" in doc.read_text()
    _record(rec, False)
    assert reproduce.main(["--render-only", "--records", str(rec.root), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "| cap-linearity | failed: not proportional to the cap: ... | 2026-11-28T02:00:00Z, vm |" in text
    assert "halted: its precheck (cap-linearity) failed" in text
