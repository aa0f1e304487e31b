"""Per-pair one-way delays for a generated network: a documented region model, or the user's matrix.

Each sampled relay is placed in a region, drawn (seeded by the seed and its fingerprint) with
the regions' shares of the real network's relays; clients and servers are spread over the
regions with the same shares. The one-way delay between two regions is a matrix entry. A
scenario's links are per pair of groups, so the delay between two groups is the mean of the
matrix over their members' region pairs (a client or server group counts as the share-weighted
mix of regions), rounded to a millisecond; the shapers (htb + netem, or linkemu) apply it on
the pair's link in each direction.

The default model (``DEFAULT``): shares of relays by continent, rounded from Tor Metrics'
relays by country (Europe about 70 %, North America about 20 %, Asia, South America and
Oceania the rest); delays are half of typical round-trip times between and within continents
(public inter-city ping tables: Frankfurt-Amsterdam ~10 ms, Frankfurt-New York ~90 ms,
Frankfurt-Tokyo ~230 ms, New York-Sao Paulo ~120 ms). A model, stated as such: it gives
relays, clients and servers the distances of the real network's geography, not any one
relay's own.

A user's matrix (``--latency FILE``, YAML)::

    regions: {eu: 0.7, na: 0.3}        # shares (any positive numbers; normalised)
    delay_ms:                          # one-way; symmetric, one of (a, b) / (b, a) is enough
      eu: {eu: 10, na: 45}
      na: {na: 20}

Public API:

- ``Model``: ``regions`` (name -> share), ``delay_ms`` ((a, b) -> ms), ``source``
- ``DEFAULT``; ``load(path) -> Model`` (raises LatencyError naming the file and the reason)
- ``relay_regions(fingerprints, model, seed) -> dict[fingerprint, region]``
- ``pair_delay(a, b, model) -> ms``: a and b are lists of member regions (None: the shares)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError


class LatencyError(InputError):
    """A latency matrix file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Model:
    regions: dict[str, float]
    delay_ms: dict[tuple[str, str], float]
    source: str

    def delay(self, a: str, b: str) -> float:
        return self.delay_ms[(a, b)] if (a, b) in self.delay_ms else self.delay_ms[(b, a)]

    def describe(self) -> str:
        shares = ", ".join(f"{r} {s:.0%}" for r, s in self.regions.items())
        names = list(self.regions)
        delays = ", ".join(f"{a}-{b} {self.delay(a, b):g}" for i, a in enumerate(names) for b in names[i:])
        return (f"{self.source}: regions (share of relays, clients and servers) {shares}; one-way delay ms {delays}; "
                "a group pair's delay is the mean over its members' region pairs")


def _model(regions: dict[str, float], matrix: dict[str, dict[str, float]], source: str) -> Model:
    total = sum(regions.values())
    delay = {(a, b): float(ms) for a, row in matrix.items() for b, ms in row.items()}
    return Model({r: s / total for r, s in regions.items()}, delay, source)


DEFAULT = _model(
    {"eu": 0.70, "na": 0.20, "as": 0.05, "sa": 0.03, "oc": 0.02},
    {"eu": {"eu": 10, "na": 45, "as": 115, "sa": 100, "oc": 140},
     "na": {"na": 20, "as": 80, "sa": 60, "oc": 80},
     "as": {"as": 30, "sa": 150, "oc": 60},
     "sa": {"sa": 30, "oc": 160},
     "oc": {"oc": 15}},
    "torbed's region model (docs/generate.md)")


def load(path: str | Path) -> Model:
    """A user's matrix (module docstring). Raises LatencyError naming the file and what is wrong."""
    import yaml
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise LatencyError(f"{path}: cannot read the latency matrix: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise LatencyError(f"{path}: not YAML: {e}") from None
    if not isinstance(data, dict) or set(data) != {"regions", "delay_ms"}:
        raise LatencyError(f"{path}: a latency matrix has exactly the keys 'regions' and 'delay_ms'")
    regions, matrix = data["regions"], data["delay_ms"]
    if not isinstance(regions, dict) or not regions or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in regions.values()):
        raise LatencyError(f"{path}: regions: give each region a positive share, e.g. {{eu: 0.7, na: 0.3}}")
    if not isinstance(matrix, dict) or not all(isinstance(row, dict) for row in matrix.values()):
        raise LatencyError(f"{path}: delay_ms: give a mapping of region to (region to milliseconds)")
    for a, row in matrix.items():
        for b, ms in row.items():
            if a not in regions or b not in regions:
                raise LatencyError(f"{path}: delay_ms.{a}.{b}: '{a if a not in regions else b}' is not in regions")
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms <= 10_000:
                raise LatencyError(f"{path}: delay_ms.{a}.{b}: {ms!r} is not a delay in milliseconds (0 to 10000)")
    model = _model(regions, matrix, f"matrix {path}")
    missing = [f"{a}-{b}" for i, a in enumerate(regions) for b in list(regions)[i:]
               if (a, b) not in model.delay_ms and (b, a) not in model.delay_ms]
    if missing:
        raise LatencyError(f"{path}: delay_ms: no delay for {', '.join(missing)}")
    return model


def relay_regions(fingerprints: list[str], model: Model, seed: int) -> dict[str, str]:
    """Each relay's region, drawn with the model's shares from a generator seeded by the seed
    and the relay's fingerprint (a relay keeps its region whatever else is sampled)."""
    names, shares = list(model.regions), list(model.regions.values())
    return {fp: random.Random(f"{seed}:region:{fp}").choices(names, shares)[0] for fp in fingerprints}


def _mix(members: list[str] | None, model: Model) -> dict[str, float]:
    """A side's regions as weights: its members' regions, or the model's shares (clients, servers)."""
    if members is None:
        return dict(model.regions)
    out: dict[str, float] = {}
    for r in members:
        out[r] = out.get(r, 0) + 1 / len(members)
    return out


def pair_delay(a: list[str] | None, b: list[str] | None, model: Model) -> float:
    """Mean one-way delay between two sides (lists of member regions; None: the share mix)."""
    ma, mb = _mix(a, model), _mix(b, model)
    return sum(wa * wb * model.delay(ra, rb) for ra, wa in ma.items() for rb, wb in mb.items())
