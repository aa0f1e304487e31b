"""The readiness rule (torbed.readiness) on canned consensus flags, and the driver
configuration both backends build (torbed.workloads)."""

from __future__ import annotations

import copy

from torbed import network, readiness, scenario, workloads
from tests.unit.test_scenario import BASE


def _plan():
    s = scenario.parse(copy.deepcopy(BASE), "t.yaml")
    return s, network.plan(s, "kist")


def test_flags_rule():
    s, p = _plan()
    fprs = {n.name: f"{i:040X}" for i, n in enumerate(p.by_role("relay"))}
    full = {fprs[n.name]: readiness.wanted_flags(n) | {"V2Dir"} for n in p.by_role("relay")}
    assert readiness.flags_problem(p, full, fprs) is None
    guard = next(n for n in p.by_role("relay") if n.guard)
    exit_ = next(n for n in p.by_role("relay") if n.exit)
    assert readiness.wanted_flags(guard) == {"Running", "Valid", "Fast", "Stable", "Guard"}
    assert readiness.wanted_flags(exit_) == {"Running", "Valid", "Fast", "Stable", "Exit"}
    no_guard = dict(full, **{fprs[guard.name]: {"Running", "Valid", "Fast", "Stable"}})
    assert "waiting for" in readiness.flags_problem(p, no_guard, fprs)
    missing = {k: v for k, v in full.items() if k != fprs[exit_.name]}
    assert readiness.flags_problem(p, missing, fprs) == f"{exit_.name} not in the consensus yet"


def test_driver_config_schedule_and_path():
    s, p = _plan()
    fprs = {n.name: f"{i:040X}" for i, n in enumerate(p.nodes)}
    wl = s.clients["web"].workload
    target = workloads.Target(server="www0", address="10.0.0.9", ports={"http": 80},
                              manifest={"small": {"size": 300_000, "sha256": "ab"}})
    entry = workloads.workload_entry(wl, target)
    assert entry["pause_s"] == 1.0 and entry["repeat"] == 5 and entry["size"] == 300_000 and entry["port"] == 80
    assert entry["stallout_s"] == 15.0   # the scenario's default reaches the driver
    cfg = workloads.driver_config(s, p, client="web0", group="web", variant="kist", rep=2, fingerprints=fprs,
                                  control={"socket": "/x"}, socks_port=9050, output="/o", workload=entry, t_work=100.0)
    assert cfg["seed"] == s.seed + 2
    assert (cfg["t_workload"], cfg["t_measure"], cfg["t_end"]) == (100.0, 105.0, 160.0)
    assert [[h["node"] for h in hop] for hop in cfg["path"]] == [["guard0"], ["middle0"], ["exit0"]]
    bulk = workloads.workload_entry(s.clients["bulk"].workload,
                                    workloads.Target("www0", "10.0.0.9", {"http": 80},
                                                     {"bulk": {"size": 5 << 20, "sha256": "cd"}}))
    assert bulk["pause_s"] == 0.0 and bulk["repeat"] is None and bulk["timeout_s"] > 0
    data = copy.deepcopy(BASE)
    data["clients"]["bulk"]["workload"]["stallout"] = "2500ms"
    short = scenario.parse(data, "t.yaml").clients["bulk"].workload
    assert workloads.workload_entry(short, workloads.Target("www0", "10.0.0.9", {"http": 80},
                                                            {"bulk": {"size": 5 << 20, "sha256": "cd"}}))["stallout_s"] == 2.5
    assert workloads.WORKLOADS["fetch"].describe(wl) == "fetch 'small' x5"
