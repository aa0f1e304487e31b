"""Drawing N relays from a consensus: how many per position class, and which ones.

Public API:

- ``POSITIONS``: the classes in a fixed order (guard, exit, guardexit, middle)
- ``eligible(relays) -> (list[Relay], dict[reason, count])``: Running, Valid, Fast and Stable relays
  with a positive weight and capacity (what a client would use)
- ``allocate(counts, n, source) -> dict[position, int]``: N split over the classes in
  proportion to their relay counts (largest remainder); raises SampleError when a class
  present in the network would get no relay
- ``weighted_sample(items, weights, k, rng) -> list``: k items without replacement, each
  draw proportional to weight among those left (Efraimidis & Spirakis' keys u^(1/w))
- ``draw(relays, n, seed, source) -> Sample``

As tornettools (``generate``): relays are classed by position, and the sampled network
keeps each class's share of the relays. Unlike tornettools, which takes the relays at
evenly spaced ranks of each class's weight distribution, relays are drawn at random with
probability proportional to consensus weight (the issue asks for it), seeded: the heavy
relays that carry most of the real traffic are the likely ones, and a different seed gives an
independently sampled network (Jansen, Tracey & Goldberg 2021).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ..errors import InputError
from .sources import Relay

POSITIONS = ("guard", "exit", "guardexit", "middle")
# Stable too: torbed's authorities vote Stable for every relay (a minutes-old network has no
# uptime history, and tor has no option to vote it per relay), so only Stable relays are
# drawn and every sampled relay's Fast and Stable flags are as in the consensus.
REQUIRED_FLAGS = ("Running", "Valid", "Fast", "Stable")


class SampleError(InputError):
    """A sample that cannot be drawn from this consensus (e.g. a class would be empty)."""


@dataclass
class Sample:
    relays: list[Relay]
    per_class: dict[str, int]
    available: dict[str, int]                      # eligible relays per class in the consensus
    class_weight: dict[str, int]                   # their total consensus weight per class
    excluded: dict[str, int] = field(default_factory=dict)


def eligible(relays: list[Relay]) -> tuple[list[Relay], dict[str, int]]:
    out, excluded = [], {}
    for r in relays:
        why = next((f"no {f} flag" for f in REQUIRED_FLAGS if f not in r.flags), None)
        if why is None and r.weight <= 0:
            why = "consensus weight 0"
        if why is None and r.capacity <= 0:
            why = "advertised bandwidth 0"
        if why:
            excluded[why] = excluded.get(why, 0) + 1
        else:
            out.append(r)
    return out, excluded


def allocate(counts: dict[str, int], n: int, source: str) -> dict[str, int]:
    total = sum(counts.values())
    if n > total:
        raise SampleError(f"{source}: {n} relays asked for, the consensus has {total} usable ones "
                          "(Running, Valid, Fast, Stable, with a descriptor)")
    exact = {p: n * counts.get(p, 0) / total for p in POSITIONS}
    out = {p: math.floor(x) for p, x in exact.items()}
    # Largest remainder; ties by the fixed class order.
    for p in sorted(POSITIONS, key=lambda p: (-(exact[p] - out[p]), POSITIONS.index(p)))[:n - sum(out.values())]:
        out[p] += 1
    empty = [p for p in POSITIONS if counts.get(p, 0) and not out[p]]
    if empty:
        need = max(math.ceil(0.5 * total / counts[p]) for p in empty)
        raise SampleError(
            f"{source}: at {n} relays the class(es) {', '.join(empty)} would be empty ("
            + ", ".join(f"{p}: {counts[p]} of {total} relays, {exact[p]:.2f} expected" for p in empty)
            + f"); use at least {need} relays (--relays) so every position class of the network is sampled")
    for p in POSITIONS:
        out[p] = min(out[p], counts.get(p, 0))
    if not out["exit"] and not out["guardexit"]:
        raise SampleError(f"{source}: the consensus has no usable exit relay (Exit flag without BadExit)")
    return out


def weighted_sample(items: list, weights: list[float], k: int, rng: random.Random) -> list:
    """k distinct items; successive draws proportional to weight among the items left."""
    keyed = []
    for item, w in zip(items, weights):
        u = rng.random()
        # log(u)/w is a monotone transform of u^(1/w), without underflow for large w.
        keyed.append((math.log(u) / w if u > 0 else -math.inf, item))
    keyed.sort(key=lambda t: t[0], reverse=True)
    return [item for _, item in keyed[:k]]


def draw(relays: list[Relay], n: int, seed: int, source: str) -> Sample:
    usable, excluded = eligible(relays)
    by_class: dict[str, list[Relay]] = {p: [] for p in POSITIONS}
    for r in sorted(usable, key=lambda r: r.fingerprint):    # input order never matters
        by_class[r.position].append(r)
    counts = {p: len(rs) for p, rs in by_class.items()}
    per_class = allocate(counts, n, source)
    chosen = []
    for p in POSITIONS:
        # One generator per class, seeded from the seed and the class: changing N for one
        # class leaves the others' draws as they were.
        rng = random.Random(f"{seed}:{p}")
        chosen += weighted_sample(by_class[p], [r.weight for r in by_class[p]], per_class[p], rng)
    return Sample(relays=chosen, per_class=per_class, available=counts,
                  class_weight={p: sum(r.weight for r in rs) for p, rs in by_class.items()}, excluded=excluded)
