"""`torbed run --resume` and the sequential stopping rule (issue 36 item 6), against the
scripted backend of test_engine: what a resumed run keeps, discards and records, what it
refuses, and a design that stops on a narrow interval or at its maximum."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml
from rich.console import Console

from torbed import cli, engine, resume, scenario
from torbed.errors import InputError, Interrupted
from tests.unit.test_engine import Scripted
from tests.unit.test_scenario import BASE

QUIET = Console(stderr=True, quiet=True)


def write_scenario(tmp_path, **changes) -> str:
    data = copy.deepcopy(BASE)
    data["measure"] = {"warmup": "0s", "duration": "1s"}
    data["repetitions"] = 3
    data.update(changes)
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(f)


def interrupt_at(n):
    """A scripted action that raises Interrupted (as the signal handler does) on the n-th measure."""
    count = {"n": 0}

    def act(rep):
        count["n"] += 1
        if count["n"] == n:
            rep.run.engine.signalled = "SIGINT"
            raise Interrupted("SIGINT")
    return act


class Counting(Scripted):
    """Interrupts the n-th measure of the whole run (any repetition)."""

    def __init__(self, n=None):
        super().__init__()
        self.act = interrupt_at(n) if n else None

    def measure(self, rep):
        if self.act:
            self.act(rep)
        super().measure(rep)


def start(tmp_path, backend, path):
    s = scenario.load(path)
    return engine.run(s, backend, tmp_path / "runs", QUIET, source=path)


def test_interrupted_run_resumes_at_its_next_repetition_and_records_sessions(tmp_path):
    path = write_scenario(tmp_path)
    with pytest.raises(Interrupted):
        start(tmp_path, Counting(n=3), path)          # the third repetition in run order is cut
    run_dir = next(p for p in (tmp_path / "runs").iterdir() if not p.is_symlink())
    info = json.loads((run_dir / "run.json").read_text())
    order = [tuple(x) for x in info["order"]]
    assert info["status"] == "interrupted" and len(info["sessions"]) == 1
    cut = order[2]
    assert json.loads((run_dir / cut[0] / f"rep-{cut[1]}" / "meta.json").read_text())["status"] == "interrupted"

    s = scenario.load(path)
    resume.check_unchanged(resume.load_for_resume(run_dir), s, s.variants, run_dir / "run.json")
    b = Scripted()
    engine.resume(run_dir, s, b, QUIET)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "ok" and [x["status"] for x in info["sessions"]] == ["interrupted", "ok"]
    assert info["sessions"][1]["resumed"] and info["sessions"][1]["discarded"] == [f"{cut[0]}/rep-{cut[1]}"]
    assert info["sessions"][1]["kept"] == 2
    # The resumed session ran exactly the rest of the order, the cut repetition first.
    ran = [(v, k) for step, v, k in b.calls if step == "measure"]
    assert ran == order[2:]
    assert info["sessions"][1]["ran"] == [f"{v}/rep-{k}" for v, k in order[2:]]
    meta = json.loads((run_dir / cut[0] / f"rep-{cut[1]}" / "meta.json").read_text())
    assert meta["status"] == "ok" and meta["session"] == 2
    assert meta["history"][0]["status"] == "interrupted" and meta["history"][0]["session"] == 1
    assert (run_dir / meta["history"][0]["moved_to"] / "meta.json").is_file()
    kept = json.loads((run_dir / order[0][0] / f"rep-{order[0][1]}" / "meta.json").read_text())
    assert kept["session"] == 1 and kept["history"] == []
    for key in ("fingerprint", "torbed_commit", "overrides", "order", "seed", "started"):
        assert key in info


def test_a_crashed_session_is_marked_and_a_running_repetition_discarded(tmp_path):
    path = write_scenario(tmp_path)
    with pytest.raises(Interrupted):
        start(tmp_path, Counting(n=2), path)
    run_dir = next(p for p in (tmp_path / "runs").iterdir() if not p.is_symlink())
    # Make it look like a power loss: run.json and the repetition still say running.
    info = json.loads((run_dir / "run.json").read_text())
    info["status"] = info["sessions"][0]["status"] = "running"
    (run_dir / "run.json").write_text(json.dumps(info))
    v, k = info["order"][1]
    meta_p = run_dir / v / f"rep-{k}" / "meta.json"
    meta_p.write_text(json.dumps({**json.loads(meta_p.read_text()), "status": "running"}))
    s = scenario.load(path)
    engine.resume(run_dir, s, Scripted(), QUIET)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["sessions"][0]["status"].startswith("ended without a record")
    assert json.loads(meta_p.read_text())["history"][0]["status"] == "running"


def test_resume_refuses_a_changed_scenario_or_variants(tmp_path, capsys):
    path = write_scenario(tmp_path)
    with pytest.raises(Interrupted):
        start(tmp_path, Counting(n=2), path)
    run_dir = next(p for p in (tmp_path / "runs").iterdir() if not p.is_symlink())
    data = yaml.safe_load(open(path))
    data["links"]["default"]["rate"] = "7mbit"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    s = scenario.load(path)
    with pytest.raises(InputError, match=r"links\.default\.rate: changed since the run began"):
        resume.check_unchanged(resume.load_for_resume(run_dir), s, s.variants, run_dir / "run.json")
    # Through the command line: exit 2, the file and field named.
    assert cli.main(["run", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "s.yaml" in err and "links.default.rate" in err
    with pytest.raises(InputError, match="variants"):
        resume.check_unchanged(resume.load_for_resume(run_dir), s, s.variants[:1], run_dir / "run.json")


def test_resume_refuses_what_it_cannot_resume(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run.json").write_text(json.dumps({"variants": ["a"], "repetitions": 1}))
    with pytest.raises(InputError, match="no 'fingerprint'"):
        resume.load_for_resume(tmp_path / "old")
    assert cli.main(["run", "--resume", str(tmp_path / "nope")]) == 2
    assert "run.json: missing" in capsys.readouterr().err
    path = write_scenario(tmp_path)
    run_dir = start(tmp_path, Scripted(), path)
    with pytest.raises(InputError, match="nothing to resume"):
        resume.load_for_resume(run_dir)
    assert cli.main(["run", path, "--resume", str(run_dir)]) == 2


def test_fingerprint_sees_overrides_and_variant_definitions(tmp_path):
    s = scenario.load(write_scenario(tmp_path))
    f1 = resume.fingerprint(s, s.variants)
    s2 = scenario.with_overrides(s, "s.yaml", measure__duration="2s")
    assert resume.fingerprint(s2, s.variants)["scenario_sha256"] != f1["scenario_sha256"]
    assert set(f1["variants"]) >= set(s.variants)


def test_seed_override_reaches_the_workload_seed_and_the_fingerprint(tmp_path):
    s = scenario.load(write_scenario(tmp_path))
    s7 = scenario.with_overrides(s, "s.yaml", seed=s.seed + 7)
    assert s7.seed == s.seed + 7
    assert resume.fingerprint(s7, s.variants)["scenario_sha256"] != resume.fingerprint(s, s.variants)["scenario_sha256"]
    args = cli.build_parser().parse_args(["run", "--resume", str(tmp_path), "--seed", "3"])
    with pytest.raises(InputError, match="--seed"):
        args.func(args)


# -- sequential designs -----------------------------------------------------------------

DESIGN = {"pilot": 3, "max_repetitions": 6, "stop_when": {"metric": "ttlb_s/bulk:bulk", "ci_width_pct": 20}}


def test_design_is_validated_strictly(tmp_path):
    s = scenario.load(write_scenario(tmp_path, design=DESIGN, repetitions=6))
    assert s.design.pilot == 3 and s.repetitions == 6
    data = copy.deepcopy(BASE)
    data["design"] = DESIGN
    assert scenario.parse(data, "t.yaml").repetitions == 6          # repetitions defaults to the maximum
    bad = [({**DESIGN, "pilot": 2}, "design.pilot"), ({**DESIGN, "pilot": 7}, "design.pilot"),
           ({**DESIGN, "stop_when": {"metric": "ttlb_s/nope:bulk", "ci_width_pct": 20}}, "design.stop_when.metric"),
           ({**DESIGN, "stop_when": {"metric": "ttlb_s/bulk:small", "ci_width_pct": 20}}, "design.stop_when.metric"),
           ({**DESIGN, "stop_when": {"metric": "queue", "ci_width_pct": 20}}, "design.stop_when.metric"),
           ({**DESIGN, "stop_when": {"metric": "ttlb_s/bulk:bulk", "ci_width_pct": 0}}, "design.stop_when.ci_width_pct"),
           ({**DESIGN, "stop_when": {**DESIGN["stop_when"], "variant": "vanilla"}}, "design.stop_when.variant"),
           ({**DESIGN, "extra": 1}, "design")]
    for design, field in bad:
        d = copy.deepcopy(BASE)
        d["design"] = design
        with pytest.raises(scenario.ScenarioError) as e:
            scenario.parse(d, "t.yaml")
        assert any(p == field or p.startswith(field) for p, _ in e.value.problems), (design, e.value.problems)
    d = copy.deepcopy(BASE)
    d.update(design=DESIGN, repetitions=4)
    with pytest.raises(scenario.ScenarioError, match="repetitions"):
        scenario.parse(d, "t.yaml")


class Timed(Scripted):
    """Writes bulk transfers whose TTLB is 10 s in the baseline and 10 * factor(k) in the other
    variant: a constant ratio stops the design at the pilot, a noisy one runs to the maximum."""

    def __init__(self, ratios):
        super().__init__()
        self.ratios = ratios

    def measure(self, rep):
        self.calls.append(("measure", rep.variant, rep.index))
        base = rep.run.info["baseline"]
        f = 1.0 if rep.variant == base else self.ratios[rep.index]
        recs = [{"type": "transfer", "status": "ok", "warmup": False, "group": "bulk", "file": "bulk",
                 "size": 1, "t_start": 0.0, "t_request": 0.0, "ttlb_s": 10.0 * f * (1 + 0.01 * i)} for i in range(5)]
        (rep.dir / "transfers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        for name in ("cellstats.jsonl", "relay_bw.jsonl"):
            (rep.dir / name).write_text("")


def base_with_big_file():
    data = copy.deepcopy(BASE)
    data["measure"] = {"warmup": "0s", "duration": "1s"}
    return data


def test_design_stops_when_the_interval_is_narrow(tmp_path):
    data = base_with_big_file()
    data["design"] = DESIGN
    s = scenario.parse(data, "t.yaml")
    b = Timed([1.20, 1.21, 1.19, 1.2, 1.2, 1.2])
    run_dir = engine.run(s, b, tmp_path / "runs", QUIET)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["repetitions"] == 3 and info["sequential"]["outcome"] == "interval"
    assert len(info["sequential"]["checks"]) == 1 and info["sequential"]["checks"][0]["test"] == "paired"
    assert info["status"] == "ok" and not (run_dir / s.variants[0] / "rep-3").exists()


def test_design_runs_to_its_maximum_and_says_so(tmp_path):
    data = base_with_big_file()
    data["design"] = {**DESIGN, "max_repetitions": 4}
    s = scenario.parse(data, "t.yaml")
    b = Timed([1.5, 0.7, 1.3, 0.8])
    run_dir = engine.run(s, b, tmp_path / "runs", QUIET)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["repetitions"] == 4 and info["sequential"]["outcome"] == "maximum"
    assert [c["blocks"] for c in info["sequential"]["checks"]] == [3, 4]
    assert "maximum of 4 blocks was reached" in info["sequential"]["text"]


def test_resume_refuses_a_run_that_is_still_going(tmp_path):
    path = write_scenario(tmp_path)
    with pytest.raises(Interrupted):
        start(tmp_path, Counting(n=2), path)
    run_dir = next(p for p in (tmp_path / "runs").iterdir() if not p.is_symlink())
    info = json.loads((run_dir / "run.json").read_text())
    # A live process whose command line names torbed stands in for the session's torbed.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "torbed"])
    try:
        info["sessions"][-1].update(status="running", pid=proc.pid)
        (run_dir / "run.json").write_text(json.dumps(info))
        with pytest.raises(InputError, match="still running"):
            resume.load_for_resume(run_dir)
    finally:
        proc.kill()
        proc.wait()
    resume.load_for_resume(run_dir)          # gone: a crashed session, resumable
