"""Relay groups with ``cpu: qemu`` (a slow, emulated CPU for the target relay of the
throughput experiment): parsed, run under qemu-user by the local backend, refused on
Kubernetes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.unit.test_scenario import BASE
from torbed import engine, scenario
from torbed.backends.local import backend as local
from torbed.backends.k8s.backend import K8sBackend
from torbed.errors import InputError
from torbed.network import plan as make_plan


def _scenario(cpu: str | None) -> scenario.Scenario:
    data = copy.deepcopy(BASE)
    if cpu is not None:
        data["network"]["relays"]["middle"]["cpu"] = cpu
    return scenario.parse(data, "t.yaml")


def test_only_the_groups_relays_run_under_qemu():
    s = _scenario("qemu")
    p = make_plan(s, "kist")
    prefixes = {n.name: local.cpu_prefix(p, n) for n in p.nodes if n.runs_tor}
    qemu = [name for name, pre in prefixes.items() if pre]
    assert qemu == ["middle0"]
    assert prefixes["middle0"][0].endswith(("qemu-x86_64-static", "qemu-x86_64"))
    assert not local.cpu_prefix(make_plan(_scenario(None), "kist"), next(n for n in p.nodes if n.name == "middle0"))


def test_bad_cpu_value_names_the_field():
    with pytest.raises(scenario.ScenarioError) as e:
        _scenario("arm64")
    assert "network.relays.middle.cpu" in str(e.value)


def test_kubernetes_refuses_an_emulated_cpu():
    s = _scenario("qemu")
    assert "cpu" in engine.features_used(s)
    assert [f for f, _ in engine.unsupported(s, K8sBackend)] == ["cpu"]
    assert "cpu" not in engine.features_used(_scenario("native"))
    with pytest.raises(InputError, match=r"^s\.yaml: network\.relays\.\*\.cpu .*local backend only"):
        K8sBackend(console=None, scenario_path=Path("s.yaml")).preflight(s)
