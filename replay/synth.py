"""Synthetic traces with known timing (tests, calibration): interactive-looking flows whose
packet sizes and gaps come from a seeded generator, so every number is reproducible.

Public API: ``interactive(flows=4, duration=20.0, mean_gap=0.2, seed=1, own_circuits=True) -> Trace``.
"""

from __future__ import annotations

import random

from .trace import DOWN, UP, Flow, Packet, Trace


def interactive(flows: int = 4, duration: float = 20.0, mean_gap: float = 0.2, seed: int = 1,
                own_circuits: bool = True) -> Trace:
    """``flows`` flows over ``duration`` seconds: a request (upstream, 100-600 bytes) then
    1-4 cells of response every ``mean_gap`` s on average (exponential gaps), with a small
    upstream packet every fifth step. Flows start 0.1 s apart."""
    rng = random.Random(seed)
    out = []
    for i in range(flows):
        t = 0.1 * i
        pk = [Packet(round(t, 6), UP, rng.randint(100, 600))]
        k = 0
        while True:
            t += rng.expovariate(1.0 / mean_gap)
            if t >= duration:
                break
            pk.append(Packet(round(t, 6), DOWN, rng.randint(1, 4) * 498 - rng.randint(0, 200)))
            k += 1
            if k % 5 == 0:
                t += 0.001
                pk.append(Packet(round(t, 6), UP, rng.randint(36, 120)))
        out.append(Flow(f"synthetic-{i}", pk, None if own_circuits else "shared", label="synthetic interactive"))
    return Trace(out, {"source": "synthetic (torbed.replay.synth.interactive)", "tool": "torbed.replay.synth",
                       "licence": "CC0", "origin": "generated", "seed": seed})
