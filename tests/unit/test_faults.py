"""Faults: scenario validation (table of invalid faults, each failing on its field), the
link changes a fault makes, the report's before/during/after split, and `torbed validate`'s
exit status. Applying faults to real tor is tests/integration/test_faults.py."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from torbed.analysis.faults import fault_rows, planned_windows
from torbed.analysis.load import load_run
from torbed import scenario
from torbed.backends.local.faults import faulted_props
from torbed.fault_schedule import link_pairs
from torbed.network import plan as make_plan

REPO = Path(__file__).resolve().parents[2]

BASE = {
    "apiVersion": "torbed/v1", "name": "t", "variants": ["kist"],
    "network": {"authorities": 3, "relays": {"guard": {"guard": True}, "middle": {"count": 2}, "exit": {"exit": True}}},
    "servers": {"www": {"files": {"small": "300KB"}}},
    "clients": {"web": {"count": 2, "path": ["guard", "middle", "exit"],
                        "workload": {"kind": "fetch", "file": "small"}}},
    "measure": {"warmup": "5s", "duration": "1m"},
}


def with_faults(*faults) -> dict:
    data = copy.deepcopy(BASE)
    data["faults"] = list(faults)
    return data


VALID = [
    {"at": "10s", "kind": "pause", "target": "middle", "duration": "5s"},
    {"at": "20s", "kind": "restart", "target": "middle1"},
    {"at": "30s", "kind": "restart", "target": "middle1", "duration": "10s"},
    {"at": "10s", "kind": "cpu", "target": "exit0", "cpu": "20%", "duration": "20s"},
    {"at": "10s", "kind": "link", "between": ["web", "guard"], "delay": "50ms", "jitter": "5ms", "duration": "10s"},
    {"at": "25s", "kind": "link", "between": ["guard0", "middle1"], "loss": "5%", "rate": "1mbit", "duration": "5s"},
    {"at": "35s", "kind": "link", "target": "exit", "partition": True, "duration": "10s"},
    {"at": "50s", "kind": "link", "between": ["authority", "www0"], "partition": True},
    {"at": "55s", "kind": "kill", "target": "middle0"},                       # the old form still works
]


def test_every_kind_validates_together_and_old_scenarios_stay_valid():
    s = scenario.parse(with_faults(*VALID))
    assert [f.kind for f in s.faults] == [f["kind"] for f in VALID]
    for path in sorted((REPO / "scenarios").glob("*.yaml")):
        scenario.load(path)


# (case id, faults, field path, text the message must contain)
INVALID = [
    ("unknown-kind", [{"at": "10s", "kind": "freeze", "target": "middle0"}], "faults[0].kind", "must be"),
    ("target-missing", [{"at": "10s", "kind": "pause"}], "faults[0].target", "required for pause"),
    ("target-not-relay", [{"at": "10s", "kind": "pause", "target": "web0"}], "faults[0].target", "not a relay group"),
    ("target-index", [{"at": "10s", "kind": "cpu", "target": "middle2", "cpu": "5%"}], "faults[0].target", "has 2 node"),
    ("kill-duration", [{"at": "10s", "kind": "kill", "target": "middle0", "duration": "5s"}],
     "faults[0].duration", "stays down"),
    ("delay-on-pause", [{"at": "10s", "kind": "pause", "target": "middle0", "delay": "5ms"}],
     "faults[0].delay", "link faults only"),
    ("between-on-cpu", [{"at": "10s", "kind": "cpu", "between": ["guard", "middle"], "cpu": "5%"}],
     "faults[0].between", "link faults only"),
    ("cpu-missing", [{"at": "10s", "kind": "cpu", "target": "middle0"}], "faults[0].cpu", "required for cpu"),
    ("cpu-tiny", [{"at": "10s", "kind": "cpu", "target": "middle0", "cpu": "0.1%"}], "faults[0].cpu", "below 1%"),
    ("cpu-on-link", [{"at": "10s", "kind": "link", "target": "middle0", "delay": "5ms", "cpu": "5%"}],
     "faults[0].cpu", "cpu faults only"),
    ("link-no-where", [{"at": "10s", "kind": "link", "delay": "5ms"}], "faults[0]", "either 'target'"),
    ("link-both", [{"at": "10s", "kind": "link", "target": "exit", "between": ["web", "guard"], "delay": "5ms"}],
     "faults[0]", "not both"),
    ("link-nothing", [{"at": "10s", "kind": "link", "target": "exit"}], "faults[0]", "sets none of"),
    ("link-unknown-side", [{"at": "10s", "kind": "link", "between": ["web", "core"], "delay": "5ms"}],
     "faults[0].between[1]", "'core' is not a group"),
    ("link-node-out-of-range", [{"at": "10s", "kind": "link", "between": ["web5", "guard"], "delay": "5ms"}],
     "faults[0].between[0]", "has 2 node"),
    ("link-sides-overlap", [{"at": "10s", "kind": "link", "between": ["middle", "middle1"], "delay": "5ms"}],
     "faults[0].between", "share node"),
    ("partition-and-delay", [{"at": "10s", "kind": "link", "target": "exit", "partition": True, "delay": "5ms"}],
     "faults[0].partition", "drops everything"),
    ("jitter-without-delay", [{"at": "10s", "kind": "link", "target": "exit", "jitter": "5ms"}],
     "faults[0].jitter", "needs a delay"),
    ("jitter-over-delay", [{"at": "10s", "kind": "link", "target": "exit", "delay": "5ms", "jitter": "6ms"}],
     "faults[0].jitter", "reorder"),
    ("rate-too-low", [{"at": "10s", "kind": "link", "target": "exit", "rate": "1kbit"}], "faults[0].rate", "below 8kbit"),
    ("at-after-end", [{"at": "2m", "kind": "pause", "target": "middle0"}], "faults[0].at", "after the end"),
    ("ends-after-end", [{"at": "50s", "kind": "pause", "target": "middle0", "duration": "20s"}],
     "faults[0].duration", "after the end of the workload"),
    ("zero-duration", [{"at": "10s", "kind": "pause", "target": "middle0", "duration": "0s"}],
     "faults[0].duration", "longer than 0s"),
    ("pause-during-restart", [{"at": "10s", "kind": "restart", "target": "middle0", "duration": "10s"},
                              {"at": "15s", "kind": "pause", "target": "middle", "duration": "2s"}],
     "faults[1]", "overlaps faults[0]: node(s) middle0"),
    ("pause-after-kill", [{"at": "10s", "kind": "kill", "target": "middle"},
                          {"at": "40s", "kind": "pause", "target": "middle1", "duration": "2s"}],
     "faults[1]", "kill and pause"),
    ("two-quotas", [{"at": "10s", "kind": "cpu", "target": "exit", "cpu": "5%", "duration": "10s"},
                    {"at": "15s", "kind": "cpu", "target": "exit0", "cpu": "50%"}],
     "faults[1]", "two CPU quotas"),
    ("quota-then-restart", [{"at": "10s", "kind": "cpu", "target": "exit", "cpu": "5%", "duration": "10s"},
                            {"at": "15s", "kind": "restart", "target": "exit0"}],
     "faults[1]", "would not hold the new tor"),
    ("two-link-faults-one-link", [{"at": "10s", "kind": "link", "between": ["web", "guard"], "delay": "5ms",
                                   "duration": "10s"},
                                  {"at": "15s", "kind": "link", "between": ["guard0", "web1"], "loss": "1%",
                                   "duration": "10s"}],
     "faults[1]", "same link"),
    ("link-target-meets-between", [{"at": "10s", "kind": "link", "target": "guard", "delay": "5ms"},
                                   {"at": "15s", "kind": "link", "between": ["middle", "guard"], "loss": "1%",
                                    "duration": "10s"}],
     "faults[1]", "same link"),
]


@pytest.mark.parametrize("faults,field,text", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_faults_fail_on_their_field(faults, field, text):
    with pytest.raises(scenario.ScenarioError) as err:
        scenario.parse(with_faults(*faults), "s.yaml")
    assert any(path == field and text in msg for path, msg in err.value.problems), err.value.problems


def test_overlaps_that_do_not_contradict_are_allowed():
    scenario.parse(with_faults(
        # one after the other on one node
        {"at": "10s", "kind": "pause", "target": "middle0", "duration": "5s"},
        {"at": "15s", "kind": "restart", "target": "middle0", "duration": "5s"},
        # a quota and a pause on one node at once; link faults on links that do not meet
        {"at": "30s", "kind": "cpu", "target": "middle1", "cpu": "10%", "duration": "10s"},
        {"at": "32s", "kind": "pause", "target": "middle1", "duration": "2s"},
        {"at": "30s", "kind": "link", "between": ["web0", "guard"], "delay": "5ms", "duration": "10s"},
        {"at": "30s", "kind": "link", "between": ["web1", "guard"], "loss": "5%", "duration": "10s"},
    ))


def test_link_pairs_and_props():
    s = scenario.parse(with_faults(
        {"at": "10s", "kind": "link", "between": ["web", "guard"], "delay": "50ms", "duration": "5s"},
        {"at": "20s", "kind": "link", "target": "exit0", "partition": True}))
    plan = make_plan(s, "kist")
    assert sorted(link_pairs(plan, s.faults[0])) == sorted(
        [("web0", "guard0"), ("web1", "guard0"), ("guard0", "web0"), ("guard0", "web1")])
    every = link_pairs(plan, s.faults[1])
    others = [n.name for n in plan.nodes if n.name != "exit0"]
    assert sorted(every) == sorted([("exit0", o) for o in others] + [(o, "exit0") for o in others])
    # delay adds to the link's own; loss/rate replace; a partition drops all and ends bursts
    base = {"rate_bps": 10_000_000, "delay_s": 0.02, "loss": 0.01, "loss_burst": 3.0}
    assert faulted_props(base, s.faults[0]) == {**base, "delay_s": pytest.approx(0.07)}
    assert faulted_props(base, s.faults[1]) == {"rate_bps": 10_000_000, "delay_s": 0.02, "loss": 1.0}
    lossy = scenario.parse(with_faults({"at": "1s", "kind": "link", "target": "exit", "loss": "5%", "rate": "1mbit"}))
    assert faulted_props(base, lossy.faults[0]) == {"rate_bps": 1_000_000, "delay_s": 0.02, "loss": 0.05}


def test_link_faults_choose_linkemu_and_tc_is_refused():
    from torbed import shaping
    caps = shaping.KernelCaps(htb=True, netem=True)   # even a kernel with netem: faults need runtime changes
    data = with_faults({"at": "10s", "kind": "link", "target": "exit", "delay": "5ms"})
    assert shaping.choose_shaper(make_plan(scenario.parse(data), "kist"), caps) == "linkemu"
    data["links"] = {"emulator": "tc"}
    with pytest.raises(shaping.ShapingError, match="link faults"):
        shaping.choose_shaper(make_plan(scenario.parse(data), "kist"), caps)


def test_validate_exits_2_with_one_line_per_problem(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(with_faults({"at": "10s", "kind": "cpu", "target": "middle0"})))
    p = subprocess.run([sys.executable, "-m", "torbed.cli", "validate", str(path)], capture_output=True, text=True,
                       cwd=REPO)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert f"{path}: faults[0].cpu: required for cpu faults" in " ".join((p.stdout + p.stderr).split())


def _rep_dir(tmp_path: Path, t0: float, faults: list[dict], transfers: list[dict]) -> Path:
    run = tmp_path / "run"
    rep = run / "kist" / "rep-0"
    rep.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"variants": ["kist"], "repetitions": 1, "name": "t"}))
    (rep / "meta.json").write_text(json.dumps({"status": "ok", "t_workload_start": t0, "t_end": t0 + 60,
                                               "warmup_s": 0}))
    (rep / "faults.jsonl").write_text("".join(json.dumps(r) + "\n" for r in faults))
    (rep / "transfers.jsonl").write_text("".join(json.dumps({"type": "transfer", "warmup": False, **t}) + "\n"
                                                 for t in transfers))
    return run


def test_report_splits_transfers_around_each_fault_and_measures_recovery(tmp_path):
    t0 = 1000.0
    fault = {"type": "fault", "fault": 0, "kind": "link", "target": None, "between": ["web", "guard"],
             "params": {"partition": True}}
    recs = [{**fault, "event": "planned", "t_apply_planned": t0 + 10, "t_undo_planned": t0 + 20},
            {**fault, "event": "apply", "t": t0 + 10.1, "t_planned": t0 + 10, "done": "linkemu: partition",
             "mechanism": "linkemu: runtime link change"},
            {**fault, "event": "undo", "t": t0 + 20.0, "t_planned": t0 + 20, "reason": "duration"},
            {"type": "fault", "fault": 1, "kind": "kill", "target": "middle0", "between": None, "params": {},
             "event": "apply", "t": t0 + 40, "t_planned": t0 + 40}]
    ok = lambda s, e: {"t_start": t0 + s, "t_last_byte": t0 + e, "status": "ok", "error": None}  # noqa: E731
    bad = lambda s, cause: {"t_start": t0 + s, "t_last_byte": None, "status": "error",  # noqa: E731
                            "error": {"cause": cause}}
    transfers = [ok(1, 2), ok(5, 6), bad(9, "timeout"), bad(12, "circuit_failed"), bad(15, "timeout"),
                 ok(18, 23.5), ok(25, 26), ok(41, 42)]
    rows = fault_rows(load_run(_rep_dir(tmp_path, t0, recs, transfers)))
    assert len(rows) == 2
    r = rows[0]
    assert r["what"] == "link web <-> guard (partition)"
    assert r["mechanism"] == "linkemu: runtime link change" and rows[1]["mechanism"] is None
    assert r["apply_s"] == pytest.approx(10.1) and r["apply_late_s"] == pytest.approx(0.1)
    assert r["undo_s"] == pytest.approx(20.0)
    assert r["before"] == {"transfers": 3, "ok": 2, "errors": 1, "causes": {"timeout": 1}}
    assert r["during"] == {"transfers": 3, "ok": 1, "errors": 2, "causes": {"circuit_failed": 1, "timeout": 1}}
    # 'after' stops where the next fault (the kill at 40 s) begins
    assert r["after"]["transfers"] == 1 and r["after_until_s"] == pytest.approx(40)
    assert r["recover_s"] == pytest.approx(3.5)       # the transfer started during, done after the undo
    kill = rows[1]
    assert kill["undo_s"] is None and kill["after"] is None and kill["recover_s"] is None
    assert kill["during"]["transfers"] == 1
    assert planned_windows(load_run(tmp_path / "run")) == [(10.0, 20.0, "fault 0: link web <-> guard (partition)")]


def test_k8s_backend_refuses_kinds_it_cannot_inject_before_touching_the_cluster():
    """A link fault's delay/jitter/loss (sch_netem), a link fault naming one pod of a
    server group behind one Service, and a restart the kubelet's back-off would lengthen are not done on Kubernetes:
    refused as input (exit 2) naming the scenario file and the field; the other kinds pass
    (rate and partition link faults too: the shaper sidecar)."""
    from pathlib import Path

    from torbed.backends.k8s.backend import K8sBackend
    from torbed.engine import unsupported
    from torbed.errors import InputError
    ok = [{"at": "10s", "kind": "kill", "target": "middle0"},
          {"at": "20s", "kind": "pause", "target": "middle1", "duration": "5s"},
          {"at": "30s", "kind": "link", "target": "middle1", "partition": True, "duration": "5s"},
          {"at": "40s", "kind": "link", "between": ["web0", "guard"], "rate": "1mbit", "duration": "5s"}]
    assert unsupported(scenario.parse(with_faults(*ok)), K8sBackend) == []
    for field, fault in (("loss", {"loss": "5%", "rate": "1mbit"}), ("delay", {"delay": "10ms"}),
                         ("jitter", {"jitter": "1ms", "delay": "2ms"})):
        s = scenario.parse(with_faults(*ok, {"at": "50s", "kind": "link", "between": ["web", "guard"], **fault}))
        assert [f for f, _ in unsupported(s, K8sBackend)] == ["faults.link.netem"]
        first = "delay" if field == "jitter" else field   # the first field named, in this order
        with pytest.raises(InputError, match=rf"^s\.yaml: faults\[4\]\.{first}: .*sch_netem"):
            K8sBackend(console=None, scenario_path=Path("s.yaml")).preflight(s)
    data = with_faults({"at": "10s", "kind": "link", "between": ["web", "www1"], "partition": True})
    data["servers"]["www"]["count"] = 2
    s = scenario.parse(data)
    assert [f for f, _ in unsupported(s, K8sBackend)] == ["faults.link.node"]
    with pytest.raises(InputError, match=r"^s\.yaml: faults\[0\]\.between\[1\]: www1: .*name the whole group"):
        K8sBackend(console=None, scenario_path=Path("s.yaml")).preflight(s)
    # A restart's downtime runs there now (the pod held); a second restart of the same relay
    # within the kubelet's back-off is refused (tests/unit/test_fault_parity.py).
    s = scenario.parse(with_faults({"at": "20s", "kind": "restart", "target": "middle1", "duration": "5s"},
                                   {"at": "30s", "kind": "restart", "target": "middle1"},
                                   {"at": "40s", "kind": "cpu", "target": "middle0", "cpu": "10%", "duration": "5s"}))
    assert unsupported(s, K8sBackend) == []
    with pytest.raises(InputError, match=r"^s\.yaml: faults\[1\]\.duration: restart of middle1 at 30s .*exit #2"):
        K8sBackend(console=None, scenario_path=Path("s.yaml")).preflight(s)


def test_plan_lists_what_of_the_link_faults_the_k8s_backend_refuses(tmp_path):
    """`torbed plan --json`: a partition runs on both backends; a delay is listed as not on k8s."""
    path = tmp_path / "s.yaml"
    for extra, gaps in (({"partition": True}, {}),
                        ({"delay": "10ms"}, {"k8s": ["faults.link.netem"]})):
        path.write_text(yaml.safe_dump(with_faults({"at": "10s", "kind": "link", "between": ["web", "guard"], **extra})))
        p = subprocess.run([sys.executable, "-m", "torbed.cli", "plan", "--json", str(path)], capture_output=True,
                           text=True, cwd=REPO)
        assert p.returncode == 0, p.stderr
        found = {b: sorted(g) for b, g in json.loads(p.stdout)["unsupported"].items() if b == "k8s"}
        assert found == gaps, found
