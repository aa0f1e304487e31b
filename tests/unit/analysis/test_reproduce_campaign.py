"""The reproduction campaign (analysis/campaign.py, analysis/reproduce.py) without running
tor: records from a finished run directory, resuming from records, the document rendered
from records only, the machine-time estimate."""

import json
import shutil
import socket
import sys

import pytest

from torbed.analysis import campaign, prereg, reproduce
from torbed.analysis import gates as campaign_gates

from .conftest import GOLDEN_RUN

EXP = "tang-goldberg-2010-exp1"          # vanilla vs ewma-66, as the golden run
P = prereg.load()


def golden_copy(dest, status="ok"):
    shutil.copytree(GOLDEN_RUN, dest, ignore=shutil.ignore_patterns("report"))
    info = json.loads((dest / "run.json").read_text())
    info["status"] = status
    (dest / "run.json").write_text(json.dumps(info))
    return dest


class FakeProc:
    """`torbed run` that has already finished: the run directory is copied in at launch."""
    pid = -1

    def __init__(self, cmd, **kw):
        self.cmd = cmd
        FakeProc.launched.append(cmd)
        if "--out" in cmd:
            golden_copy(__import__("pathlib").Path(cmd[cmd.index("--out") + 1]) / "golden-run")

    def poll(self):
        return 0

    def wait(self):
        return 0


@pytest.fixture
def fake_torbed(monkeypatch):
    FakeProc.launched = []
    monkeypatch.setattr(campaign.subprocess, "Popen", FakeProc)
    monkeypatch.setattr(campaign, "POLL_S", 0)
    return FakeProc


def test_a_finished_repetition_becomes_a_record_once(tmp_path):
    rec = campaign.Records(tmp_path / "records")
    assert campaign.harvest(GOLDEN_RUN, EXP, P.of_experiment(EXP), rec, offset=4) == 6
    assert campaign.harvest(GOLDEN_RUN, EXP, P.of_experiment(EXP), rec, offset=4) == 0     # kept, not redone
    r = json.loads(rec.path(EXP, "ewma-66", 4).read_text())
    assert r["run"] == {"id": "golden-run", "rep": 0, "seed": 7, "path": str(GOLDEN_RUN)}
    assert r["values"]["ttlb_s/web:small"] > 0 and r["status"] == "ok"
    failed = json.loads(rec.path(EXP, "ewma-66", 5).read_text())      # the golden run's failed repetition
    assert failed["status"] == "failed" and failed["values"] == {} and "middle0" in failed["error"]
    assert r["provenance"]["tor_version"] == "0.4.9.11" and r["provenance"]["host"] == "testhost"
    assert r["gates"] == {"recorded": False, "valid": True}
    assert r["timing"]["seconds"] == pytest.approx(111.0)
    assert rec.complete_blocks(EXP, ("vanilla", "ewma-66")) == [4, 5, 6]


def test_a_gate_invalid_repetition_is_recorded_but_drops_its_pair(tmp_path):
    rec = campaign.Records(tmp_path)
    campaign.harvest(GOLDEN_RUN, EXP, P.of_experiment(EXP), rec, 0)
    p = rec.path(EXP, "vanilla", 2)
    r = json.loads(p.read_text())
    r["gates"] = {"recorded": True, "valid": False, "invalid_reasons": ["cpu: starved"]}
    p.write_text(json.dumps(r))
    blocks = rec.blocks(EXP, ("vanilla", "ewma-66"))
    assert sorted(blocks) == [0, 1, 2] and "vanilla" not in blocks[2] and "ewma-66" not in blocks[1]
    v = prereg.judge_all(P, lambda e: rec.blocks(e, P.experiments[e].variants))["tg-exp1"]
    assert v["n"] == 1 and v["verdict"] == "inconclusive"      # block 1 failed, block 2 gate-invalid


def test_a_gate_rejected_repetition_keeps_its_values_apart(tmp_path):
    """Its values are not used by any test (``values`` empty) but kept as ``values_invalid``,
    the same numbers an unjudged harvest gives, so another gate can be tried without the raw run."""
    run = golden_copy(tmp_path / "golden-run")
    plain = campaign.Records(tmp_path / "plain")
    campaign.harvest(run, EXP, P.of_experiment(EXP), plain, 0)
    meta_p = run / "vanilla" / "rep-2" / "meta.json"
    meta = json.loads(meta_p.read_text())
    meta["gates"] = {"version": campaign_gates.VERSION, "valid": False, "flags": [],
                     "invalid_reasons": ["11% of 815 transfers stalled or failed (limit 10%)"],
                     "completion": {"status": "invalid"}}
    meta_p.write_text(json.dumps(meta))
    rec = campaign.Records(tmp_path / "records")
    campaign.harvest(run, EXP, P.of_experiment(EXP), rec, 0)
    r = json.loads(rec.path(EXP, "vanilla", 2).read_text())
    want = json.loads(plain.path(EXP, "vanilla", 2).read_text())["values"]
    assert r["gates"]["valid"] is False and r["values"] == {}
    assert want and r["values_invalid"] == want
    assert "vanilla" not in rec.blocks(EXP, ("vanilla", "ewma-66"))[2]
    ok = json.loads(rec.path(EXP, "vanilla", 0).read_text())
    assert "values_invalid" not in ok and ok["values"] == json.loads(plain.path(EXP, "vanilla", 0).read_text())["values"]


def synthetic_records(rec, n=6, ratio=0.67):
    """n complete blocks of EXP (the golden run's record as template), ewma-66 = ratio x vanilla."""
    campaign.harvest(GOLDEN_RUN, EXP, P.of_experiment(EXP), rec, 100)
    template = json.loads(rec.path(EXP, "vanilla", 100).read_text())
    shutil.rmtree(rec.root / EXP)
    for k in range(n):
        base = 2.0 + 0.3 * k
        for v, x in (("vanilla", base), ("ewma-66", base * ratio * (1.02 if k % 2 else 0.98))):
            rec.write({**template, "variant": v, "block": k, "values": {"ttlb_s/web:small": x}})


def test_the_document_renders_from_records_alone(tmp_path, monkeypatch):
    rec = campaign.Records(tmp_path / "records")
    synthetic_records(rec)
    monkeypatch.setattr(campaign.subprocess, "Popen", lambda *a, **k: pytest.fail("render ran something"))
    doc = tmp_path / "reproduction.md"
    assert reproduce.main(["--render-only", "--records", str(rec.root), "--doc", str(doc)]) == 0
    text = doc.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| tg-exp1 "))
    assert "-33.0% [" in row and "6 blocks" in row and "(Holm)" in row
    # Holm over all five pre-registered primaries, the four not yet run counting as p = 1.
    raw = prereg.judge(*[[b[v]["ttlb_s/web:small"] for b in rec.blocks(EXP, ("vanilla", "ewma-66")).values()]
                         for v in ("ewma-66", "vanilla")], P.primaries[0], P)["test"]["pvalue"]
    assert f"p = {min(1.0, 5 * raw):.2g} (Holm)" in row
    assert "12/12 repetitions valid; 12 without gates" in row and row.rstrip(" |").endswith("agrees")
    bulk = next(line for line in text.splitlines() if line.startswith("| tg-bulk-not-harmed "))
    assert "no values in 6 block(s)" in bulk and "not yet run" not in bulk      # ran, metric absent
    ipsj = next(line for line in text.splitlines() if line.startswith("| ipsj-ttfb "))
    assert "not yet run" in ipsj
    assert "The campaign has not run yet" not in text          # one experiment has records
    # The golden run's raw directory is gone: the records still render the same row.
    recs = list((rec.root / EXP).glob("*.json"))
    assert recs and all(str(GOLDEN_RUN) in p.read_text() for p in recs)
    assert reproduce.main(["--render-only", "--records", str(rec.root), "--doc", str(doc)]) == 0


def test_the_gates_column_shows_each_arms_censored_share(tmp_path):
    rec = campaign.Records(tmp_path / "records")
    synthetic_records(rec, n=3)
    doc = tmp_path / "reproduction.md"

    def row():
        assert reproduce.main(["--render-only", "--records", str(rec.root), "--doc", str(doc)]) == 0
        return next(line for line in doc.read_text().splitlines() if line.startswith("| tg-exp1 "))

    assert "censored" not in row()
    for k, share in enumerate((0.10, 0.12, 0.30)):
        p = rec.path(EXP, "vanilla", k)
        r = json.loads(p.read_text())
        r["gates"] = {**r["gates"], "censored_fraction": share}
        p.write_text(json.dumps(r))
    assert "censored transfers (median per repetition): vanilla 12%" in row()
    # Not beside a throughput comparison of the same experiment: censoring does not bear on it.
    bulk = next(line for line in doc.read_text().splitlines() if line.startswith("| tg-bulk-not-harmed "))
    assert "censored" not in bulk


def test_without_records_the_document_says_the_campaign_has_not_run(tmp_path):
    doc = tmp_path / "d.md"
    assert reproduce.main(["--render-only", "--records", str(tmp_path / "none"), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "The campaign has not run yet" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.count("|") == 10]
    assert len(rows) == len(P.comparisons) + 2                 # two header rows
    assert all("| not yet run |" in r for r in rows if not r.startswith(("| id ", "|---")))


def test_a_campaign_session_runs_records_and_concludes(tmp_path, fake_torbed):
    rec = campaign.Records(tmp_path / "records")
    pilot = prereg.Prereg(**{**P.__dict__, "experiments": {EXP: P.experiments[EXP]}})
    res = campaign.run_experiment(pilot, EXP, rec, tmp_path / "runs", reproduce.REPO)
    cmd = fake_torbed.launched[0]
    assert "--resume" not in cmd and cmd[cmd.index("--repetitions") + 1] == str(P.experiments[EXP].max_blocks)
    assert cmd[0] == sys.executable and "nice" not in cmd      # a measurement never runs at a lower priority
    assert res["done"] == 3 and res["concluded"]               # the golden run's spread is tiny
    assert rec.runs(EXP)[0]["offset"] == 0 and rec.runs(EXP)[0]["host"] == socket.gethostname()
    # Concluded: the next session starts nothing.
    campaign.run_experiment(pilot, EXP, rec, tmp_path / "runs", reproduce.REPO)
    assert len(fake_torbed.launched) == 1


def resumable_copy(dest, variants_then=None):
    """An interrupted run that `torbed run --resume` accepts: run.json with the experiment's
    scenario as its source and the fingerprint taken now (``variants_then``: variant digests
    as they were when it began)."""
    from torbed import resume, scenario as scenario_mod
    run = golden_copy(dest, status="interrupted")
    src = reproduce.REPO / P.experiments[EXP].scenario
    info = json.loads((run / "run.json").read_text())
    fp = resume.fingerprint(scenario_mod.load(str(src)), info["variants"])
    fp["variants"].update(variants_then or {})
    info.update(source=str(src), sessions=[], fingerprint=fp,
                order=[[v, k] for k in range(int(info["repetitions"])) for v in info["variants"]])
    (run / "run.json").write_text(json.dumps(info))
    return run


def test_an_unfinished_run_on_this_host_is_resumed_a_missing_one_is_not(tmp_path, fake_torbed):
    rec = campaign.Records(tmp_path / "records")
    run = resumable_copy(tmp_path / "raw" / "golden-run")
    entry = {"offset": 0, "repetitions": 12, "out": str(run.parent), "path": str(run),
             "host": socket.gethostname(), "started": "x"}
    rec.add_run(EXP, entry)
    proc, got = campaign._launch(P, EXP, rec, tmp_path / "runs", reproduce.REPO, None, 12)
    assert proc.cmd[-2:] == ["--resume", str(run)] and got == entry
    shutil.rmtree(run)                                          # another machine, or cleaned up
    proc, got = campaign._launch(P, EXP, rec, tmp_path / "runs", reproduce.REPO, None, 9)
    assert "--resume" not in proc.cmd and got["offset"] == 12  # blocks 0-11 belong to the first run
    # ... and its repetition 0 is block 12: it draws block 12's workload, not block 0's again.
    from torbed import scenario as scenario_mod
    base = scenario_mod.load(str(reproduce.REPO / P.experiments[EXP].scenario)).seed
    assert int(proc.cmd[proc.cmd.index("--seed") + 1]) == base + 12


def test_a_run_whose_variant_changed_since_is_left_and_the_next_blocks_start_anew(tmp_path, fake_torbed, capsys):
    """torbed run --resume refuses a run whose variant build inputs changed (a new build-tor.sh,
    a new patch): the campaign then starts the next blocks as a new run instead of stopping."""
    rec = campaign.Records(tmp_path / "records")
    run = resumable_copy(tmp_path / "raw" / "golden-run", variants_then={"ewma-66": "0" * 64})
    rec.add_run(EXP, {"offset": 0, "repetitions": 12, "out": str(run.parent), "path": str(run),
                      "host": socket.gethostname(), "started": "x"})
    proc, got = campaign._launch(P, EXP, rec, tmp_path / "runs", reproduce.REPO, None, 9)
    assert "--resume" not in proc.cmd and got["offset"] == 12
    out = capsys.readouterr().out
    assert "cannot be resumed" in out and "fingerprint.variants.ewma-66" in out and "start as a new run" in out


def test_the_estimate_uses_the_model_then_the_records_own_times(tmp_path):
    rec = campaign.Records(tmp_path)
    e = P.experiments[EXP]
    dur = campaign.scenario_duration_s(reproduce.REPO, e.scenario)
    est = campaign.estimate(P, rec, reproduce.REPO, only=[EXP])["experiments"][EXP]
    block = len(e.variants) * (dur + campaign.PER_REP_OVERHEAD_S)
    assert est["basis"] == "model" and est["block_s"] == pytest.approx(block)
    assert est["pilot_s"] == pytest.approx(campaign.FIRST_BRINGUP_S + e.pilot_blocks * block)
    assert est["planned_s"] == est["max_s"] == pytest.approx(campaign.FIRST_BRINGUP_S + e.max_blocks * block)
    campaign.harvest(GOLDEN_RUN, EXP, P.of_experiment(EXP), rec, 0)
    est = campaign.estimate(P, rec, reproduce.REPO, only=[EXP])["experiments"][EXP]
    # The golden run's ok repetitions took 111 s for 90 s of workload (its failed one is left out).
    assert est["basis"].startswith("measured") and est["block_s"] == pytest.approx(2 * (dur + 21.0 + 10.0))
    assert est["pilot_s"] == 0 and est["planned_s"] == 0     # concluded at its pilot


def test_estimate_prints_the_total_and_bad_arguments_exit_2(tmp_path, capsys):
    assert reproduce.main(["--estimate", "--records", str(tmp_path)]) == 0
    assert "machine time still needed" in capsys.readouterr().out
    assert reproduce.main(["--only", "nope", "--estimate"]) == 2
    with pytest.raises(SystemExit) as e:
        reproduce.main(["--duration", "30s"])
    assert e.value.code == 2


def test_a_run_still_going_is_stopped_once_the_plan_has_concluded(tmp_path, fake_torbed, monkeypatch):
    """`torbed run` was started for the maximum (12 blocks); after the pilot's 3 the spread
    says no more are needed, so the campaign interrupts its own child's process group."""
    monkeypatch.setattr(FakeProc, "poll", lambda self: None)
    sent = []
    monkeypatch.setattr(campaign.os, "killpg", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(campaign.time, "sleep", lambda s: pytest.fail("kept waiting after the plan concluded"))
    rec = campaign.Records(tmp_path / "records")
    res = campaign.run_experiment(P, EXP, rec, tmp_path / "runs", reproduce.REPO)
    assert res["concluded"] and res["done"] == 3
    assert sent == [(FakeProc.pid, campaign.signal.SIGINT)]


def test_finished_blocks_counts_leading_blocks_whose_repetitions_all_ended(tmp_path):
    run = golden_copy(tmp_path / "golden-run")
    assert campaign.finished_blocks(run) == 3                  # a failed repetition has ended too
    meta = run / "vanilla" / "rep-1" / "meta.json"
    m = json.loads(meta.read_text())
    meta.write_text(json.dumps({**m, "status": "running"}))
    assert campaign.finished_blocks(run) == 1
    (run / "ewma-66" / "rep-0" / "meta.json").unlink()
    assert campaign.finished_blocks(run) == 0
    assert campaign.finished_blocks(tmp_path / "nothing") == 0


def test_provenance_names_the_commit_each_session_ran():
    """The record's torbed_commit is the last session's (run.json sessions[].torbed_commit)."""
    from torbed.analysis import campaign
    info = {"sessions": [{"torbed_commit": "aaa"}, {"torbed_commit": "bbb-dirty"}], "torbed_version": "0.1.0",
            "fingerprint": {"scenario_sha256": "f" * 64}, "host": {"hostname": "h", "cpus": 2, "arch": "x86_64"}}
    p = campaign._provenance(info, {"builds": {"kist": {"tor_version": "0.4.9.11"}}}, "kist")
    assert p["torbed_commit"] == "bbb-dirty" and p["tor_version"] == "0.4.9.11" and p["cpus"] == 2


def _invalidate(rec, blocks, reason="CPU-starved: 3 process(es) waited ..."):
    for k in blocks:
        for v in P.experiments[EXP].variants:
            p = rec.path(EXP, v, k)
            r = json.loads(p.read_text())
            r["gates"] = {"recorded": True, "valid": False, "invalid_reasons": [reason]}
            p.write_text(json.dumps(r))


def test_a_pilot_without_one_valid_pair_halts_the_experiment(tmp_path, fake_torbed):
    """Every repetition of the pilot failed a mechanism gate: the experiment halts (no more
    blocks planned, nothing launched, the reasons counted) instead of running to its maximum;
    --retry runs another pilot's worth (fresh, not resuming) and is judged on those blocks."""
    rec = campaign.Records(tmp_path / "records")
    campaign.harvest(GOLDEN_RUN, EXP, P.of_experiment(EXP), rec, 0)
    assert not campaign.plan(P, rec)[EXP]["halted"]              # valid pairs: sized as usual
    _invalidate(rec, [0, 1, 2])
    p = campaign.plan(P, rec)[EXP]
    assert p["halted"] and not p["concluded"] and p["planned"] == 3
    assert "no valid pair in the last 3 blocks" in p["reason"] and "CPU-starved in 5" in p["reason"]
    assert "repetition failed in 1" in p["reason"]               # the golden run's failed repetition
    assert campaign.estimate(P, rec, reproduce.REPO, only=[EXP])["experiments"][EXP]["planned_s"] == 0
    assert campaign.run_experiment(P, EXP, rec, tmp_path / "runs", reproduce.REPO)["halted"]
    assert fake_torbed.launched == []
    # One valid pair among the last pilot's worth of blocks is enough not to halt.
    for v in P.experiments[EXP].variants:
        r = json.loads(rec.path(EXP, v, 0).read_text())
        r["gates"]["valid"] = True
        rec.path(EXP, v, 0).write_text(json.dumps(r))
    assert not campaign.plan(P, rec)[EXP]["halted"]
    _invalidate(rec, [0])
    # A retry starts a new run directory at the next block and is not halted by the old blocks.
    assert not campaign.plan(P, rec, since={EXP: 3})[EXP]["halted"]
    res = campaign.run_experiment(P, EXP, rec, tmp_path / "runs", reproduce.REPO, retry=True)
    assert "--resume" not in fake_torbed.launched[0] and rec.runs(EXP)[-1]["offset"] == 3
    assert res["done"] == 6 and not res["halted"]                # the new blocks are valid
