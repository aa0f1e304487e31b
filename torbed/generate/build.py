"""From a sample and its fitted rates to a scenario (a mapping the strict model accepts).

Public API:

- ``capacity_groups(relays, rates, bin_ratio) -> list[RelayGroupSpec]``
- ``client_groups(n_clients, mix, perf) -> dict``
- ``scenario(...) -> dict``; ``to_yaml(data, header) -> str``

Why groups per capacity bin. A scenario's relay group has one rate (``bandwidth``) and one
set of flags for all its relays, and node names are ``<group><index>``. N individually rated
relays would be N groups of one relay each, and a link per pair of groups grows with N^2. So
each position class is cut into bins of rates whose edges are ``bin_ratio`` apart (log
scale, default 2^(1/2): every relay within a factor 1.19 of its bin's rate), and the relays
of one bin form one group at their mean rate (the class's total capacity is kept). The model
needs no new field for it, both backends and the chart run it unchanged, and ``torbed plan``
shows the network in a few rows. Groups are named by class and bin, slowest first: guarda,
guardb, ..., exita, guardexita, middlea (letters: no group name is another's plus digits, so
node names stay unique).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import yaml

from . import latency
from .budget import MIN_RELAY_RATE
from .sample import POSITIONS
from .sources import Relay

DEFAULT_BIN_RATIO = math.sqrt(2)
# Wire bytes per byte tor counts: TCP/IP and Ethernet headers (~66 of 1514 per full frame)
# and TCP acknowledgements; a relay's links are this much faster than its token bucket so
# that tor's own rate limit is the one that binds, as on a real relay's access link.
LINK_WIRE_OVERHEAD = 1.06

REPLAY_SERVER, REPLAY_PORT = "replay", 8000   # the replayed sessions' server group
# Client mix (item 2 of issue 41). Fractions of the clients; sizes as tgen's/OnionPerf's.
DEFAULT_MIX = {"web": 0.9, "bulk": 0.1}
FILES = {"page": "50KiB", "bulk": "5MiB", "p50k": "50KiB", "p1m": "1MiB", "p5m": "5MiB"}
WORKLOADS = {
    # Web-like browsing: one 50 KiB page, then a pause drawn from an exponential distribution
    # (mean 5 s), as torbed's background load's web users (docs/load.md).
    "web": {"kind": "fetch", "file": "page", "repeat": 1000000,
            "think": {"distribution": "exponential", "mean": "5s"}},
    # Bulk: 5 MiB downloads back to back (tornettools' bulk clients).
    "bulk": {"kind": "bulk", "file": "bulk"},
    # Replayed sessions, cell by cell with their captured timing (replay/traces/README.md): a
    # headless browser's session and an interactive SSH session, each client of the group
    # replaying the whole trace from its own offset (distribute: each), looped for the window,
    # through the replay server beside the file server.
    "http": {"kind": "replay", "server": REPLAY_SERVER, "trace": "replay/traces/http-browsing.trace.jsonl.gz",
             "distribute": "each"},
    "ssh": {"kind": "replay", "server": REPLAY_SERVER, "trace": "replay/traces/ssh-session.trace.jsonl.gz",
            "distribute": "each"},
}
# OnionPerf-style probes: one client per size, one fetch every 30 s (OnionPerf fetches every
# 5 minutes; a testbed window is minutes long).
PERF = {"perf50k": "p50k", "perf1m": "p1m", "perf5m": "p5m"}
PERF_PAUSE = "30s"
SERVER = "www"
# Clients per sampled relay (default). Tor Metrics counts ~2.5 million daily users for ~7,000
# relays, but most users are idle most of the time; one active measurement client per relay
# keeps the sampled network about as loaded as its relay count, and scales with it.
CLIENTS_PER_RELAY = 1.0

TRAFFIC_MODEL = (
    "Clients scale with the network (clients_per_relay x relays, split over the workload mix by largest "
    "remainder); every client is a tor of its own that chooses its own paths from the testbed's consensus "
    "(no fixed paths), so the sampled consensus weights decide which relays carry it. Workloads: web = "
    "one 50 KiB page, then a think time drawn from an exponential distribution of mean 5 s, repeated "
    "(tgen's web size); bulk = 5 MiB downloads back to back (tornettools' bulk clients); http and ssh "
    "(when the mix names them) = captured sessions replayed cell by cell with their timing, looped, each "
    "client from its own offset in the trace; perf = three OnionPerf-style probes, one per size (50 KiB, "
    "1 MiB, 5 MiB), a fetch every 30 s.")


def traffic_parameters(n_clients: int, relays: int, mix: dict[str, float], perf: bool) -> dict:
    """The traffic model's parameters, flat, for ``generated.parameters`` (and the report)."""
    return {"traffic_model": TRAFFIC_MODEL, "clients_per_relay": round(n_clients / relays, 4),
            "workload_web": "fetch 50KiB page, think exponential mean 5s", "workload_bulk": "bulk 5MiB back to back",
            **{f"workload_{k}": f"replay {WORKLOADS[k]['trace']}, looped, each client from its own offset"
               for k in ("http", "ssh") if mix.get(k)},
            "workload_perf": f"fetch 50KiB / 1MiB / 5MiB every {PERF_PAUSE}" if perf else "off",
            "mix": ",".join(f"{k}={v:g}" for k, v in mix.items())}


@dataclass
class RelayGroupSpec:
    name: str
    position: str
    rate: int                       # bytes/s, the group's BandwidthRate
    relays: list[Relay]
    rates: list[int]                # the members' own fitted rates

    @property
    def guard(self) -> bool:
        return self.position in ("guard", "guardexit")

    @property
    def exit(self) -> bool:
        return self.position in ("exit", "guardexit")


def _letters(i: int) -> str:
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(ord("a") + r) + s
    return s


def capacity_groups(relays: list[Relay], rates: list[int], bin_ratio: float = DEFAULT_BIN_RATIO) -> list[RelayGroupSpec]:
    if bin_ratio <= 1:
        raise ValueError("bin_ratio must be larger than 1")
    groups = []
    for pos in POSITIONS:
        members = sorted(((r, rate) for r, rate in zip(relays, rates) if r.position == pos),
                         key=lambda t: (t[1], t[0].fingerprint))
        bins: dict[int, list] = {}
        for r, rate in members:
            bins.setdefault(int(math.floor(math.log(rate / MIN_RELAY_RATE) / math.log(bin_ratio) + 1e-9)), []).append((r, rate))
        for k, b in enumerate(sorted(bins)):
            rs = bins[b]
            mean = sum(rate for _, rate in rs) / len(rs)
            groups.append(RelayGroupSpec(name=f"{pos}{_letters(k)}", position=pos,
                                         rate=max(MIN_RELAY_RATE, int(round(mean / 1024)) * 1024),
                                         relays=[r for r, _ in rs], rates=[rate for _, rate in rs]))
    return groups


def rank_groups(relays: list[Relay], rates: list[int], like: list[RelayGroupSpec]) -> list[RelayGroupSpec]:
    """Groups with the names and sizes of ``like`` (another sample's groups): each class's
    relays sorted by rate and cut, slowest first, into consecutive runs of those sizes. So
    another block's network has the same group structure (names, counts, links) and only its
    rates and weights differ; within a class a capacity bin is such a run too."""
    out = []
    for pos in POSITIONS:
        members = sorted(((r, rate) for r, rate in zip(relays, rates) if r.position == pos),
                         key=lambda t: (t[1], t[0].fingerprint))
        at = 0
        for g in (g for g in like if g.position == pos):
            chunk = members[at:at + len(g.relays)]
            at += len(g.relays)
            mean = sum(rate for _, rate in chunk) / len(chunk)
            out.append(RelayGroupSpec(name=g.name, position=pos,
                                      rate=max(MIN_RELAY_RATE, int(round(mean / 1024)) * 1024),
                                      relays=[r for r, _ in chunk], rates=[rate for _, rate in chunk]))
    return out


@dataclass
class Latency:
    """Delays to put on the links (torbed/generate/latency.py): the model, each relay's region,
    and the client and server groups (whose regions are the model's shares)."""
    model: latency.Model
    regions: dict[str, str]             # relay fingerprint -> region
    clients: list[str]
    servers: list[str]

    def side(self, g: RelayGroupSpec | None) -> list[str] | None:
        return None if g is None else [self.regions[r.fingerprint] for r in g.relays]

    def delay(self, a: RelayGroupSpec | None, b: RelayGroupSpec | None) -> str:
        # A whole millisecond at least: a 0 delay would be no delay, which the model did not say.
        return f"{max(1, round(latency.pair_delay(self.side(a), self.side(b), self.model)))}ms"


def link_pairs(groups: list[RelayGroupSpec], lat: Latency | None = None) -> list[dict]:
    """A link per pair of relay groups (and a group with itself) at the slower side's rate plus
    wire overhead; with ``lat``, each with its delay, and delay-only links from the client
    groups to the guards and from the exits to the servers."""
    pairs = []
    for i, a in enumerate(groups):
        for b in groups[i:]:
            if a is b and len(a.relays) < 2:
                continue
            bits = min(a.rate, b.rate) * 8 * LINK_WIRE_OVERHEAD
            pairs.append({"between": [a.name, b.name], "rate": f"{max(8, int(math.ceil(bits / 1000)))}kbit"})
            if lat:
                pairs[-1]["delay"] = lat.delay(a, b)
    if lat:
        pairs += [{"between": [c, g.name], "delay": lat.delay(None, g)} for c in lat.clients for g in groups if g.guard]
        pairs += [{"between": [g.name, s], "delay": lat.delay(g, None)} for s in lat.servers for g in groups if g.exit]
    return pairs


def sample_entry(seed: int, groups: list[RelayGroupSpec], lat: Latency | None = None) -> dict:
    """One block's network for ``samples:``."""
    return {"seed": seed,
            "relays": {g.name: {"bandwidth": _rate_str(g.rate), "weights": [r.weight for r in g.relays]} for g in groups},
            "pairs": link_pairs(groups, lat)}


def _rate_str(bytes_per_s: int) -> str:
    return f"{bytes_per_s // 1024}KiB/s"


def _largest_remainder(total: int, shares: dict[str, float]) -> dict[str, int]:
    s = sum(shares.values())
    exact = {k: total * v / s for k, v in shares.items()}
    out = {k: math.floor(x) for k, x in exact.items()}
    for k in sorted(shares, key=lambda k: -(exact[k] - out[k]))[:total - sum(out.values())]:
        out[k] += 1
    return out


def client_groups(n_clients: int, mix: dict[str, float], perf: bool) -> dict[str, dict]:
    """Client groups: ``n_clients`` split over the mix's workloads (largest remainder),
    plus three OnionPerf-style probes when ``perf``. No fixed paths: tor chooses, so the
    consensus weights decide which relays a client uses."""
    out = {}
    for name, count in _largest_remainder(n_clients, mix).items():
        if count:
            out[name] = {"count": count, "workload": dict(WORKLOADS[name])}
    if perf:
        for name, file in PERF.items():
            out[name] = {"count": 1, "workload": {"kind": "fetch", "file": file, "repeat": 1000000,
                                                  "pause": PERF_PAUSE}}
    return out


def scenario(name: str, description: str, seed: int, variants: list[str], groups: list[RelayGroupSpec],
             clients: dict[str, dict], duration: str, warmup: str, authorities: int,
             generated: dict, lat: Latency | None = None) -> dict:
    relays = {}
    for g in groups:
        # The sampled consensus weights, voted by the authorities (V3BandwidthsFile), so
        # clients weight paths as the real network does; the rate is each relay's capacity.
        spec = {"count": len(g.relays), "bandwidth": _rate_str(g.rate), "weights": [r.weight for r in g.relays]}
        if g.guard:
            spec["guard"] = True
        if g.exit:
            spec["exit"] = True
        relays[g.name] = spec
    pairs = link_pairs(groups, lat)
    files = {"page": FILES["page"], "bulk": FILES["bulk"]}
    if any(c.startswith("perf") for c in clients):
        files.update({k: FILES[k] for k in ("p50k", "p1m", "p5m")})
    servers = {SERVER: {"files": files}}
    if any(c["workload"]["kind"] == "replay" for c in clients.values()):
        # Two server groups: every workload names its own.
        servers[REPLAY_SERVER] = {"replay": {"port": REPLAY_PORT}}
        for c in clients.values():
            c["workload"].setdefault("server", SERVER)
    return {
        "apiVersion": "torbed/v1",
        "name": name,
        "description": description,
        "seed": seed,
        "variants": variants,
        "repetitions": 1,
        "network": {"authorities": authorities, "relays": relays},
        "links": {"pairs": pairs},
        "servers": servers,
        "clients": clients,
        "measure": {"warmup": warmup, "duration": duration},
        "generated": generated,
    }


def to_yaml(data: dict, header: list[str]) -> str:
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110, allow_unicode=False)
    return "".join(f"# {line}".rstrip() + "\n" for line in header) + body
