"""Voted consensus weights and a network sampled anew per block on Kubernetes: both run there
(the chart's key hook writes the authorities' bandwidth file; `torbed run --backend k8s`
installs each block's sample as its own release, while a plain `helm install`, one network,
refuses `samples:`: tests/chart)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.unit.test_scenario import patched
from torbed import engine, scenario
from torbed.backends.k8s.backend import K8sBackend

WEIGHTS = {"network.relays.guard.weights": [100], "network.relays.middle.weights": [200],
           "network.relays.exit.weights": [300]}
SAMPLE = {"seed": 2, "relays": {g: {"bandwidth": "2mbit", "weights": [w]}
                                for g, w in (("guard", 10), ("middle", 20), ("exit", 30))}}


def test_weights_run_on_kubernetes():
    """The chart's key hook writes the authorities' bandwidth file (torbed.pods.keygen)."""
    s = scenario.parse(patched(WEIGHTS), "t.yaml")
    assert "weights" in engine.features_used(s)
    assert engine.unsupported(s, K8sBackend) == []


def test_a_network_per_block_installs_each_blocks_sample_on_kubernetes(tmp_path):
    """Block k's release gets sample k mod n's network (Scenario.for_block): a values file per
    sample, with that sample's rates and weights and no `samples:` (the chart deploys one
    network per release and refuses the list)."""
    from types import SimpleNamespace
    other = {"seed": 3, "relays": {g: {"bandwidth": "4mbit", "weights": [w]}
                                   for g, w in (("guard", 40), ("middle", 50), ("exit", 60))}}
    s = scenario.parse(patched({**WEIGHTS, "samples": [SAMPLE, other], "repetitions": 3}), "t.yaml")
    assert engine.unsupported(s, K8sBackend) == []
    b = K8sBackend(console=None, scenario_path=Path("s.yaml"))
    run = SimpleNamespace(scenario=s, run_dir=tmp_path)
    b.values = b._write_values(tmp_path / "values.yaml", s)

    def rep(k):
        return SimpleNamespace(run=run, index=k, scenario=s.for_block(k))
    paths = [b.values_for(rep(k)) for k in range(3)]
    assert [p.name for p in paths] == ["values-sample-0.yaml", "values-sample-1.yaml", "values-sample-0.yaml"]
    for k, (path, smp) in enumerate(((paths[0], SAMPLE), (paths[1], other))):
        v = yaml.safe_load(path.read_text())
        assert not v.get("samples"), v.get("samples")
        got = scenario.parse(v, "v.yaml").network.relays
        for g, want in smp["relays"].items():
            assert got[g].weights == want["weights"]
            assert got[g].bandwidth == s.for_block(k).network.relays[g].bandwidth != s.for_block(1 - k).network.relays[g].bandwidth
    # A scenario without samples: the run's own values file for every repetition.
    plain = scenario.parse(patched(WEIGHTS), "t.yaml")
    run.scenario = plain
    assert b.values_for(SimpleNamespace(run=run, index=1, scenario=plain)) == b.values


def test_a_plain_scenario_uses_neither():
    s = scenario.parse(patched({}), "t.yaml")
    assert {"weights", "samples"}.isdisjoint(engine.features_used(s))
