"""Within-run crossover (torbed/crossover.py): the scenario's checks, the arms' control-port
commands, the period schedule, the switcher, the split of a repetition's records into its
arms, and the engine's crossover repetitions with a scripted backend."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from rich.console import Console

from torbed import crossover, engine, scenario
from torbed.errors import InputError, RunFailed
from tests.unit.test_engine import Scripted
from tests.unit.test_scenario import BASE, patched

XO = {"variants": ["vanilla", "ewma-66"], "crossover": {"period": "20s", "washout": "5s", "cycles": 2},
      "measure.warmup": "10s", "measure.duration": "80s"}


def _parse(changes: dict) -> scenario.Scenario:
    return scenario.parse(patched(copy.deepcopy({**XO, **changes})), "x.yaml")


def _problems(changes: dict) -> dict[str, str]:
    with pytest.raises(InputError) as e:
        _parse(changes)
    return str(e.value)


def test_a_round_robin_vs_ewma_crossover_is_valid_and_local_only():
    s = _parse({})
    assert s.crossover.cycles == 2 and "crossover" in engine.features_used(s)
    from torbed.backends.k8s.backend import K8sBackend
    assert [f for f, _ in engine.unsupported(s, K8sBackend)] == ["crossover"]
    with pytest.raises(InputError, match=r"^s\.yaml: crossover: .*local backend only"):
        K8sBackend(console=None, scenario_path=Path("s.yaml")).preflight(s)
    assert crossover.build_variant(s) == "vanilla"        # the patched arm: the round-robin policy exists there


@pytest.mark.parametrize("changes, field, text", [
    ({"variants": ["vanilla", "torchestra"]}, "crossover", "variant torchestra: the torchestra family's options do not"),
    ({"measure.duration": "60s"}, "measure.duration", "set measure.duration to 80s"),
    ({"crossover.washout": "20s"}, "crossover.washout", "leaves nothing of a 20 s period"),
    ({"network.relays.middle.variant": "kist"}, "network.relays.middle.variant", "no group may keep a variant"),
    ({"network.relays.middle.torrc": "CircuitPriorityHalflife 10"}, "network.relays.middle.torrc",
     "sets CircuitPriorityHalflife, which the crossover's arms switch"),
    ({"variants": ["vanilla"], "measure.duration": "40s"}, "crossover", "needs two or more variants"),
])
def test_a_crossover_that_cannot_run_is_refused_naming_the_field(changes, field, text):
    msg = _problems(changes)
    assert f"{field}: " in msg and text in msg, msg


def test_each_arm_sets_its_options_and_resets_the_others():
    cmds = crossover.commands(["vanilla", "ewma-66", "kist"])
    assert cmds["vanilla"] == ({"CircuitMuxPolicy": "RoundRobin", "Schedulers": "Vanilla"}, ["CircuitPriorityHalflife"])
    assert cmds["ewma-66"] == ({"Schedulers": "Vanilla", "CircuitPriorityHalflife": "66"}, ["CircuitMuxPolicy"])
    assert cmds["kist"] == ({"Schedulers": "KIST"}, ["CircuitMuxPolicy", "CircuitPriorityHalflife"])


def test_periods_alternate_within_a_repetition_and_the_first_arm_varies_by_repetition():
    s = _parse({"crossover.cycles": 3, "measure.duration": "120s"})
    firsts = set()
    for k in range(12):
        ps = crossover.schedule(s, k)
        arms = [p.arm for p in ps]
        assert arms[0:2] == list(reversed(arms[2:4])) == arms[4:6]          # A B | B A | A B
        assert sorted(arms) == ["ewma-66"] * 3 + ["vanilla"] * 3
        assert [(p.start, p.measured_from, p.end) for p in ps[:2]] == [(10, 15, 30), (30, 35, 50)]
        assert ps[-1].end == 10 + 120
        firsts.add(arms[0])
    assert firsts == {"vanilla", "ewma-66"}
    assert crossover.schedule(s, 3) == crossover.schedule(s, 3)       # seeded


class FakeControl:
    def __init__(self, log, fail=False):
        self.log, self.fail = log, fail

    def reset_conf(self, *keys):
        self.log.append(("reset", keys))

    def set_options(self, opts):
        if self.fail:
            raise ValueError("552 Unrecognized option")
        self.log.append(("set", dict(opts)))

    def close(self):
        self.log.append(("close",))


def test_the_switcher_applies_each_period_on_time_and_records_it(tmp_path):
    s = _parse({})
    logs: dict[str, list] = {"guard0": [], "middle0": []}
    sw = crossover.Switcher(s, 0, list(logs), lambda n: FakeControl(logs[n]), tmp_path, t_work=1000.0)
    arms = [p.arm for p in sw.periods]
    first = sw.first()
    assert first["arm"] == arms[0] and logs["guard0"][-1][0] == "set"
    assert sw.tick(1000.0 + 29.9) == 1000.0 + 30          # period 1 starts at warm-up 10 + 20
    assert sw.tick(1000.0 + 30.0) == 1000.0 + 50
    assert sw.tick(1000.0 + 200) is None                   # late: the rest applied in order
    recs = [json.loads(x) for x in (tmp_path / crossover.RECORDS).read_text().splitlines()]
    assert [r["arm"] for r in recs] == arms and [r["period"] for r in recs] == [0, 1, 2, 3]
    assert all(r["relays"] == {"guard0": "ok", "middle0": "ok"} for r in recs)
    sw.close()
    assert logs["middle0"][-1] == ("close",)


def test_a_relay_that_refuses_a_switch_fails_the_repetition(tmp_path):
    s = _parse({})
    sw = crossover.Switcher(s, 0, ["middle0"], lambda n: FakeControl([], fail=True), tmp_path, t_work=0.0)
    with pytest.raises(RunFailed, match="crossover: switching to .* failed at middle0: ValueError: 552"):
        sw.first()
    assert json.loads((tmp_path / crossover.RECORDS).read_text())["relays"]["middle0"].startswith("ValueError")


def _raw(run_dir: Path, s, t_work: float) -> None:
    raw = run_dir / crossover.SOURCE / "rep-0"
    raw.mkdir(parents=True)
    (raw / "meta.json").write_text(json.dumps({"status": "ok", "variant": "vanilla", "t_workload_start": t_work,
                                               "warmup_s": 10.0, "duration_s": 80.0, "gates": {"valid": True}}))
    tr = [
        {"t_start": t_work + 5, "status": "ok", "warmup": True, "t_last_byte": t_work + 6},       # warm-up
        {"t_start": t_work + 12, "status": "ok", "warmup": False, "t_last_byte": t_work + 13},   # washout of p0
        {"t_start": t_work + 16, "status": "ok", "warmup": False, "t_last_byte": t_work + 20},   # p0, done
        {"t_start": t_work + 28, "status": "ok", "warmup": False, "t_last_byte": t_work + 33},   # p0, runs into p1
        {"t_start": t_work + 36, "status": "ok", "warmup": False, "t_last_byte": t_work + 40},   # p1
        {"t_start": t_work + 85, "status": "cancelled", "warmup": False, "t_censor": t_work + 95},  # p3, cut at the end
    ]
    (raw / "transfers.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tr))
    cs = [{"relay": "middle0", "t": t_work + t} for t in (11, 17, 31, 37, 56, 77)]
    (raw / "cellstats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cs))
    (raw / "circuits.jsonl").write_text('{"type": "client_circuit", "client": "web0", "event": "built", "t": 1.0}\n')


def test_the_split_gives_each_arm_its_measured_periods(tmp_path):
    s = _parse({})
    periods = crossover.schedule(s, 0)
    t0 = 5000.0
    _raw(tmp_path, s, t0)
    dirs = crossover.split(tmp_path, 0, s, periods)
    assert sorted(d.parent.name for d in dirs) == ["ewma-66", "vanilla"]
    arm0, arm1 = periods[0].arm, periods[1].arm
    assert [p.arm for p in periods] == [arm0, arm1, arm1, arm0]

    def recs(arm, name):
        return [json.loads(x) for x in (tmp_path / arm / "rep-0" / name).read_text().splitlines()]

    a0 = recs(arm0, "transfers.jsonl")      # periods 0 and 3: measured 15-30 and 75-90
    assert [t["t_start"] - t0 for t in a0] == [16, 28, 85]
    assert a0[1]["status"] == "cancelled" and a0[1]["t_censor"] == t0 + 30 and a0[1]["crossover_cut"]
    assert a0[2]["status"] == "cancelled" and a0[2]["t_censor"] == t0 + 90      # the window end, in its span
    a1 = recs(arm1, "transfers.jsonl")      # periods 1 and 2: 35-50 and 55-70
    assert [t["t_start"] - t0 for t in a1] == [36] and a1[0]["status"] == "ok"
    assert [c["t"] - t0 for c in recs(arm0, "cellstats.jsonl")] == [17, 77]
    assert [c["t"] - t0 for c in recs(arm1, "cellstats.jsonl")] == [37, 56]
    assert recs(arm1, "circuits.jsonl") == recs(arm0, "circuits.jsonl") != []
    meta = json.loads((tmp_path / arm1 / "rep-0" / "meta.json").read_text())
    assert meta["variant"] == arm1 and meta["gates"] == {"valid": True}
    assert meta["crossover"]["source"] == "crossover/rep-0" and meta["crossover"]["build_variant"] == "vanilla"
    assert meta["crossover"]["spans"] == [[t0 + 35, t0 + 50], [t0 + 55, t0 + 70]]
    # The split loads as a run: the arms are the variants, block 0 pairs them.
    (tmp_path / "run.json").write_text(json.dumps({"schema": 1, "variants": ["vanilla", "ewma-66"],
                                                   "repetitions": 1}))
    from torbed.analysis.load import load_run
    run = load_run(tmp_path)
    assert {r.variant: len(r.measured_transfers) for r in run.reps} == {arm0: 1, arm1: 1}
    assert {r.variant: len(r.censored_transfers) for r in run.reps} == {arm0: 2, arm1: 0}


def test_the_engine_runs_one_network_per_repetition_and_splits_it(tmp_path):
    data = copy.deepcopy(BASE)
    data.update(variants=["vanilla", "ewma-66"], repetitions=2,
                crossover={"period": "1s", "washout": "0.2s", "cycles": 1})
    data["measure"] = {"warmup": "0s", "duration": "2s"}
    s = scenario.parse(data, "t.yaml")
    b = Scripted()
    run_dir = engine.run(s, b, tmp_path / "runs", Console(stderr=True, quiet=True))
    info = json.loads((run_dir / "run.json").read_text())
    assert info["order"] == [["crossover", 0], ["crossover", 1]] and info["status"] == "ok"
    assert info["crossover"]["build_variant"] == "vanilla" and len(info["crossover"]["orders"]) == 2
    # One bring-up per repetition, on the build every arm runs on.
    assert [c for c in b.calls if c[0] == "bring_up"] == [("bring_up", "vanilla", 0), ("bring_up", "vanilla", 1)]
    for k in (0, 1):
        raw = json.loads((run_dir / "crossover" / f"rep-{k}" / "meta.json").read_text())
        assert raw["status"] == "ok" and [p["arm"] for p in raw["crossover"]["periods"]] == info["crossover"]["orders"][k]
        for arm in ("vanilla", "ewma-66"):
            m = json.loads((run_dir / arm / f"rep-{k}" / "meta.json").read_text())
            assert m["status"] == "ok" and m["variant"] == arm and m["crossover"]["source"] == f"crossover/rep-{k}"
    with pytest.raises(InputError, match="a crossover runs every arm"):
        engine.run(s, Scripted(), tmp_path / "runs", Console(stderr=True, quiet=True), variants=["vanilla"])
