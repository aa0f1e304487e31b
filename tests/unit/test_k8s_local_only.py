"""What only the local backend carries out is refused on Kubernetes, by `torbed run --backend
k8s` before anything starts (K8sBackend.preflight) and by the chart (tests/chart): a network
sampled anew per block. Voted consensus weights run on both."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_scenario import patched
from torbed import engine, scenario
from torbed.backends.k8s.backend import K8sBackend
from torbed.errors import InputError

WEIGHTS = {"network.relays.guard.weights": [100], "network.relays.middle.weights": [200],
           "network.relays.exit.weights": [300]}
SAMPLE = {"seed": 2, "relays": {g: {"bandwidth": "2mbit", "weights": [w]}
                                for g, w in (("guard", 10), ("middle", 20), ("exit", 30))}}


def test_weights_run_on_kubernetes():
    """The chart's key hook writes the authorities' bandwidth file (torbed.pods.keygen)."""
    s = scenario.parse(patched(WEIGHTS), "t.yaml")
    assert "weights" in engine.features_used(s)
    assert engine.unsupported(s, K8sBackend) == []


def test_a_network_per_block_is_refused_on_kubernetes():
    s = scenario.parse(patched({**WEIGHTS, "samples": [SAMPLE]}), "t.yaml")
    assert "samples" in [f for f, _ in engine.unsupported(s, K8sBackend)]
    with pytest.raises(InputError, match=r"^s\.yaml: samples: .*local backend only"):
        K8sBackend(console=None, scenario_path=Path("s.yaml")).preflight(s)


def test_a_plain_scenario_uses_neither():
    s = scenario.parse(patched({}), "t.yaml")
    assert {"weights", "samples"}.isdisjoint(engine.features_used(s))
