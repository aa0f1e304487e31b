"""``torbed generate``: a scenario sampled from the real Tor network (issue 41).

Reads one network-status consensus and the server descriptors the user downloaded from
CollecTor (docs/generate.md), draws N relays by consensus weight within position classes
(guard, exit, guard+exit, middle: ``sample``), scales their advertised bandwidths into this
machine's budget (``budget``), groups them into capacity bins (``build``) and writes a
scenario that ``torbed validate`` accepts, with the seed and the documents' digests and dates
in its ``generated`` section. The relay groups carry the sampled consensus weights (the
authorities vote them: torrc.bandwidth_file), the links a delay from a region model or the
user's matrix (``latency``), and with ``networks`` > 1 every block its own sampled network
(``samples:``).

Public API:

- ``generate(consensus, descriptors, relays=None, scale=None, seed=1, ...) -> Result``
- ``Result``: ``.data`` (the scenario mapping), ``.yaml`` (the file's text with its comment
  header), ``.summary`` (rows for the command's table), ``.sample``, ``.fit``
- errors: ``SourceError`` (a bad input file), ``SampleError`` (e.g. a class left empty),
  ``BudgetError`` (the sample does not fit the machine), ``LatencyError`` (a bad latency
  matrix file): all ``InputError`` (exit 2)

Nothing here imports torbed.backends: generating runs no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..errors import InputError
from . import budget as budget_mod, build, latency as latency_mod, sample as sample_mod, sources
from .budget import Budget, BudgetError, Fit
from .latency import LatencyError
from .sample import SampleError
from .sources import SourceError

__all__ = ["generate", "Result", "SourceError", "SampleError", "BudgetError", "Budget", "LatencyError"]

METHOD = (
    "Relays of the consensus that are Running, Valid, Fast and Stable and have a server descriptor, classed by "
    "position as tornettools does (guard: Guard flag; exit: Exit flag without BadExit; guardexit: both; "
    "middle: neither). N is split over the classes in proportion to their relay counts (largest remainder); "
    "within a class relays are drawn without replacement, each draw proportional to consensus weight, from a "
    "generator seeded by the seed and the class. A relay's capacity is the largest advertised bandwidth "
    "(min of rate, burst, observed) among its descriptors; capacities are scaled by one factor into the "
    "machine's budget (never above 1, never below tor's 75 KiB/s relay minimum) and binned per class into "
    "groups whose rate is their members' mean. Flags: Guard and Exit as in the consensus (voted strictly by "
    "the authorities); every relay is Fast and Stable (drawn only from such relays; torbed's authorities "
    "guarantee both). Consensus weights: each relay's weight in the source consensus, voted by the "
    "authorities as measured bandwidths (V3BandwidthsFile), so the testbed's consensus carries them. Exit policy: "
    "accept *:* (the testbed's servers; isolation is the network's). Link between two relay groups: the "
    "slower group's rate plus wire overhead; delays as latency_model says. Clients choose their own paths.")


@dataclass
class Result:
    data: dict
    yaml: str
    summary: list[dict]
    sample: sample_mod.Sample
    fit: Fit
    groups: list[build.RelayGroupSpec]


def _parse_check(data: dict, source: str) -> None:
    """A generated scenario must load like any other; a failure here is a generator bug,
    reported with the model's own messages."""
    from ..scenario import ScenarioError, parse
    try:
        parse(data, source)
    except ScenarioError as e:
        raise InputError(f"generated scenario does not validate (a torbed bug; please report it):\n{e}") from None


@dataclass
class _Inputs:
    """The parsed source documents."""
    joined: list[sources.Relay]
    missing: int
    cons_info: sources.SourceDocument
    desc_infos: list[sources.SourceDocument]


CAPACITY_FROM_DESCRIPTORS = "largest advertised bandwidth among the relay's server descriptors"
CAPACITY_FROM_CONSENSUS = ("consensus weight (w Bandwidth=) x 1000 B/s: no server descriptors were given "
                           "(--capacity-from-consensus, the documented fallback)")


def _read_sources(consensus: str | Path, descriptors: list[str | Path], capacity_from_consensus: bool) -> _Inputs:
    consensus = Path(consensus)
    if capacity_from_consensus == bool(descriptors):
        raise InputError(f"{consensus}: give server descriptors, or --capacity-from-consensus without any "
                         "(capacity from the consensus weights when no descriptors can be had), not "
                         + ("both" if descriptors else "neither"))
    cons_relays, cons_info = sources.read_consensus(consensus)
    if capacity_from_consensus:
        return _Inputs(sources.from_consensus(cons_relays), 0, cons_info, [])
    descs, desc_infos = sources.read_descriptors([Path(d) for d in descriptors])
    joined, missing = sources.join(cons_relays, descs, str(consensus), [str(d) for d in descriptors])
    return _Inputs(joined, missing, cons_info, desc_infos)


def _clients(n_clients: int, mix: dict[str, float], perf: bool) -> dict[str, dict]:
    specs = build.client_groups(n_clients, mix, perf)
    for c, spec in specs.items():
        if spec["count"] > 1000:
            raise InputError(f"--clients {n_clients}: {spec['count']} '{c}' clients, more than a client group holds "
                             "(1000); use fewer clients")
    return specs


def _parameters(smp: sample_mod.Sample, fit: Fit, budget: Budget, tors: dict[str, int], missing: int,
                n_clients: int, mix: dict[str, float], perf: bool, bin_ratio: float, descriptors: bool) -> dict:
    params = {
        "relays": tors["relay"], "clients": tors["client"], "authorities": tors["authority"],
        "bin_ratio": round(bin_ratio, 4), "perf_probes": perf, "rate_scale": fit.scale, "relays_at_min_rate": fit.floored,
        "relayed_budget_bytes_per_s": round(fit.relayed_budget), "cpu_running_network_cores": round(fit.cpu_idle, 4),
        "expected_relayed_bytes_per_s": round(fit.expected_load), "expected_cpu_cores": round(fit.cpu_expected, 3),
        "expected_utilization": round(fit.expected_load / max(sum(fit.rates), 1), 3), "rate_scale_set_by": fit.binding,
        "memory_mib": round(fit.memory_mib, 1), "machine_cores": budget.cores,
        "machine_memory_mib": round(budget.memory_mib), "mem_per_tor_mib": budget.mem_per_tor_mib,
        "cpu_per_relayed_mbps": budget.cpu_per_relayed_mbps, "cpu_shaper_per_relayed_mbps": budget.cpu_shaper_per_mbps,
        "cpu_per_client": budget.cpu_client, "cpu_observe_per_relay": budget.cpu_observe_relay,
        "relayed_per_offered": budget.relayed_per_offered, "min_utilization": budget.min_utilization,
        "cpu_share": budget.cpu_share, "budget_model": "per-role costs measured on the 60-relay pilot, expected load from the traffic model (docs/generate.md)",
        "budget_source": budget.source, "consensus_relays_without_descriptor": missing,
        "consensus_weights": "voted as sampled (authorities' V3BandwidthsFile)",
        "capacity_source": CAPACITY_FROM_DESCRIPTORS if descriptors else CAPACITY_FROM_CONSENSUS,
        **build.traffic_parameters(n_clients, tors["relay"], mix, perf),
    }
    for p in sample_mod.POSITIONS:
        params[f"{p}_sampled"] = smp.per_class[p]
        params[f"{p}_available"] = smp.available[p]
    for why, count in sorted(smp.excluded.items()):
        params["excluded_" + why.replace(" ", "_").lower()] = count
    return params


def _summary(groups: list[build.RelayGroupSpec]) -> list[dict]:
    return [{"group": g.name, "class": g.position, "nickname": r.nickname, "fingerprint": r.fingerprint,
             "weight": r.weight, "capacity_Bps": r.capacity, "rate_Bps": rate, "group_rate_Bps": g.rate}
            for g in groups for r, rate in zip(g.relays, g.rates)]


def _header(inp: _Inputs, seed: int, fit: Fit, budget: Budget, summary: list[dict]) -> list[str]:
    cons = inp.cons_info
    return [f"Generated by torbed generate {__version__} (docs/generate.md); regenerate rather than edit.",
            f"Consensus {cons.path} valid-after {cons.valid_after} sha256 {cons.sha256}",
            *([f"Descriptors {d.path} ({d.entries}, published {d.published}) sha256 {d.sha256}"
               for d in inp.desc_infos] or [f"No server descriptors: capacity = {CAPACITY_FROM_CONSENSUS}"]),
            f"Seed {seed}; rate scale {fit.scale:.4g} ({fit.floored} relay(s) raised to tor's 75 KiB/s minimum); "
            f"budget: {fit.relayed_budget / 1e6:.2f} MB/s relayed on {budget.cores:g} cores; expected "
            f"{fit.expected_load / 1e6:.2f} MB/s relayed ({fit.expected_load / max(sum(fit.rates), 1):.0%} of the rates' "
            f"{sum(fit.rates) / 1e6:.2f} MB/s), {fit.cpu_expected:.2f} cores; scale set by {fit.binding}",
            "",
            "Sampled relays: group  class  nickname  fingerprint  consensus weight  capacity B/s  -> rate B/s",
            *[f"  {s['group']}  {s['class']}  {s['nickname']}  {s['fingerprint']}  {s['weight']}  "
              f"{s['capacity_Bps']}  -> {s['rate_Bps']}" for s in summary],
            ""]


def _latency(model: latency_mod.Model | None, relays: list[sources.Relay], seed: int,
             clients: dict[str, dict], servers: list[str] | None = None) -> build.Latency | None:
    """The latency model placed on a sample: every client group to the guards and every server
    group (the file server, and the replay server when a client replays) from the exits."""
    if model is None:
        return None
    if servers is None:
        replays = any((c.get("workload") or {}).get("kind") == "replay" for c in clients.values())
        servers = [build.SERVER] + ([build.REPLAY_SERVER] if replays else [])
    return build.Latency(model, latency_mod.relay_regions([r.fingerprint for r in relays], model, seed),
                         clients=list(clients), servers=servers)


def _block_samples(inp: _Inputs, relays: int, seed: int, networks: int, groups: list[build.RelayGroupSpec],
                   budget: Budget, tors: dict[str, int], total_rate: int | None, source: str,
                   lat: build.Latency | None, dem: budget_mod.Demand) -> list[dict]:
    """``networks`` independently drawn networks (seeds seed, seed+1, ...), each fitted to the
    budget on its own and cut into the groups of the first (build.rank_groups)."""
    out = [build.sample_entry(seed, groups, lat)]
    for k in range(1, networks):
        smp = sample_mod.draw(inp.joined, relays, seed + k, source)
        fit = budget_mod.fit_rates([r.capacity for r in smp.relays], budget, tors, total_rate, dem)
        lat_k = lat and _latency(lat.model, smp.relays, seed, {c: {} for c in lat.clients}, lat.servers)
        out.append(build.sample_entry(seed + k, build.rank_groups(smp.relays, fit.rates, groups), lat_k))
    return out


def generate(consensus: str | Path, descriptors: list[str | Path], relays: int | None = None,
             scale: float | None = None, seed: int = 1, clients: int | None = None,
             mix: dict[str, float] | None = None, perf: bool = True, name: str | None = None,
             variants: list[str] | None = None, duration: str = "5m", warmup: str = "30s",
             authorities: int = 3, bin_ratio: float = build.DEFAULT_BIN_RATIO, total_rate: int | None = None,
             budget: Budget | None = None, networks: int = 1,
             latency: latency_mod.Model | None = latency_mod.DEFAULT, check: bool = True,
             capacity_from_consensus: bool = False) -> Result:
    """Sample a scenario. ``relays`` or ``scale`` (a fraction of the usable relays).
    ``clients``: measurement clients besides the OnionPerf probes (default: one per relay).
    ``total_rate``: the relays' summed rate in bytes/s (default: the budget's). ``networks`` > 1:
    an independently sampled network per block (``samples:``, repetitions = networks).
    ``latency``: the delay model for the links (None: no delays). ``capacity_from_consensus``
    (with no descriptors): capacities from the consensus weights (sources.from_consensus). Raises
    SourceError, SampleError, BudgetError (all exit 2), naming the file or the numbers."""
    if (relays is None) == (scale is None):
        raise InputError("give either the number of relays or a scale, not both")
    if authorities < 3:
        raise InputError(f"--authorities {authorities}: the sampled weights need 3 or more authorities "
                         "(tor uses voted measured bandwidths only when more than two authorities vote them)")
    inp = _read_sources(consensus, descriptors, capacity_from_consensus)
    if scale is not None:
        relays = max(1, round(scale * len(sample_mod.eligible(inp.joined)[0])))
    smp = sample_mod.draw(inp.joined, relays, seed, str(consensus))
    mix = mix or dict(build.DEFAULT_MIX)
    n_clients = round(build.CLIENTS_PER_RELAY * relays) if clients is None else clients
    client_specs = _clients(n_clients, mix, perf)
    tors = {"authority": authorities, "relay": relays, "client": sum(c["count"] for c in client_specs.values())}
    budget = budget or budget_mod.machine()
    dem = budget_mod.demand(client_specs, build.FILES)
    fit = budget_mod.fit_rates([r.capacity for r in smp.relays], budget, tors, total_rate, dem)
    groups = build.capacity_groups(smp.relays, fit.rates, bin_ratio)
    name = name or f"tor-sample-{relays}"
    generated = {
        "tool": f"torbed generate {__version__}", "seed": seed, "method": METHOD if inp.desc_infos else f"{METHOD} Capacities: {CAPACITY_FROM_CONSENSUS}.",
        "sources": [{k: v for k, v in vars(d).items() if v is not None} for d in [inp.cons_info, *inp.desc_infos]],
        "parameters": _parameters(smp, fit, budget, tors, inp.missing, n_clients, mix, perf, bin_ratio,
                                  bool(inp.desc_infos)),
    }
    desc = (f"{relays} relays sampled by consensus weight from the consensus of {inp.cons_info.valid_after} "
            f"(seed {seed}), rates scaled x{fit.scale:.4g} into this machine's budget; {tors['client']} clients")
    lat = _latency(latency, smp.relays, seed, client_specs)
    generated["parameters"].update(network_design="network-per-block" if networks > 1 else "one-network",
                                   networks=networks, latency_model=latency.describe() if latency else "none")
    data = build.scenario(name, desc, seed, variants or ["kist"], groups, client_specs, duration, warmup,
                          authorities, generated, lat)
    if networks > 1:
        data["repetitions"] = networks
        data["samples"] = _block_samples(inp, relays, seed, networks, groups, budget, tors, total_rate,
                                         str(consensus), lat, dem)
    if check:
        _parse_check(data, name)
    summary = _summary(groups)
    return Result(data=data, yaml=build.to_yaml(data, _header(inp, seed, fit, budget, summary)), summary=summary,
                  sample=smp, fit=fit, groups=groups)
