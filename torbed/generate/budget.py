"""The machine's budget for a generated network, and fitting relay rates into it.

A sampled relay's real capacity (tens of MB/s) cannot run on one machine: every relayed
byte costs CPU (in tor, and again in the shaper that carries it between namespaces), every tor
and every measurement client costs CPU while the network runs, the observers (collector,
Prometheus, torbed itself) cost CPU per relay, and every tor costs memory. ``fit_rates``
scales the sample's capacities into what this machine can carry, keeping their ratios, and
refuses (``BudgetError``, exit 2, with the numbers) what cannot fit.

The model (docs/generate.md, "The budget"): the testbed's CPU while it measures is

    fixed = relays x (idle + observe) + authorities x idle + clients x client + torbed/Prometheus
    load  = min(sum of rates, relayed_per_offered x offered(median rate))
    cpu   = fixed + load x (relay + shaper cost per relayed MB/s)

where ``offered`` is what the traffic model's clients ask for (a fetch client: its file over
its pause plus the file's time at the median relay rate; a bulk client: the median relay
rate, back to back) and ``load`` is the bytes the relays write, all relays together. The
rates are scaled by the largest factor (never above 1, never below tor's minimum) for which
``cpu`` stays within ``cpu_share`` of the cores and the expected load is at least
``min_utilization`` of the rates' sum (rates far above the load leave relays that never
queue: no scheduler has anything to do).

Figures (constants below; each overridable on the command line, ``torbed generate --help``).
Measured on the 60-relay pilot (scenarios/tor-sample-60.yaml, 2026-11-27, this 2-core machine
with nothing else running, median over 9 repetitions of the CPU gate's per-process readings;
docs/generate.md has the table):

- CPU per relayed MB/s in tor: 0.09 cores (60 relays used 0.39 cores, 0.12 of them idle, while
  writing 2.94 MB/s together); in the shaper (linkemu): 0.075 cores (0.22 / 2.94)
- observing one relay (the collector's CELL_STATS and bandwidth events): 0.0035 cores (0.21 / 60)
- one measuring client (its tor 0.08 / 63 and its driver 0.23 / 63): 0.005 cores
- torbed itself and Prometheus: 0.10 cores (0.06 + 0.04)
- an authority (with the file server: 0.03 for four processes): 0.01 cores
- relayed bytes per offered byte: 2.3. The pilot's relays wrote 2.94 MB/s while its clients,
  by the traffic model at its median rate of 114 kB/s, offered 1.29 MB/s: each delivered byte
  crosses three relays with cell and TLS overhead (4.6 relay bytes per delivered byte), and
  about half the offered load was delivered (bulk circuits shared the congested relays)
- share of the cores the testbed may use: 70 %. The pilot used 66 % (64-77 %); its CPU-wait
  fractions had a median of 3.7 % and reached 10.2 % once, the gate's threshold: more than that
  and repetitions measure CPU queueing
- minimum expected utilization: 0.3 (the pilot: 2.94 / 8.95 = 0.33)
- idle CPU per relay after ready: 0.2 % (README "Density", 300 tors); bench results replace it
- memory per tor: the machine-level peak of the 750-tor density run (~19.4 MiB per tor),
  rounded up to 20 MiB; the newest ``runs/bench/backend-*.json`` replaces it by the measured
  median relay RSS peak when that is larger
- share of the available memory: 50 %
- tor's smallest relay rate: 75 KiB/s (RELAY_REQUIRED_MIN_BANDWIDTH, or.h; tor refuses a
  smaller BandwidthRate on a relay)

One pilot calibrated these; a very different mix (all bulk, thousands of clients) or another
machine can differ, so a new sample's first run should be checked with the CPU gate, as the
pilot was (the reproduction records say whether a repetition waited for CPU), and calibrated:
``torbed calibrate RUN`` (calibrate.py) derives the CPU figures from that run's readings, and
``machine`` uses the newest calibration made on a machine with as many cores.

Public API: ``Budget``, ``machine(...) -> Budget``, ``Demand``, ``demand(clients, files) -> Demand``,
``fit_rates(capacities, budget, tors, total=None, demand=None) -> Fit``, ``BudgetError``.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import InputError

MIB = 1024 * 1024
MEM_PER_TOR_MIB = 20.0
CPU_IDLE = {"relay": 0.002, "authority": 0.01}
CPU_CLIENT = 0.005
CPU_OBSERVE_RELAY = 0.0035
CPU_FIXED = 0.10
CPU_PER_RELAYED_MBPS = 0.09
CPU_SHAPER_PER_MBPS = 0.075
RELAYED_PER_OFFERED = 2.3
MIN_UTILIZATION = 0.3
CPU_SHARE = 0.7
MEM_SHARE = 0.5
MIN_RELAY_RATE = 75 * 1024          # bytes/s


class BudgetError(InputError):
    """The sample does not fit this machine; the message gives the numbers."""


@dataclass(frozen=True)
class Budget:
    cores: float
    memory_mib: float                 # available memory
    mem_per_tor_mib: float = MEM_PER_TOR_MIB
    cpu_idle_relay: float = CPU_IDLE["relay"]
    cpu_idle_authority: float = CPU_IDLE["authority"]
    cpu_client: float = CPU_CLIENT
    cpu_observe_relay: float = CPU_OBSERVE_RELAY
    cpu_fixed: float = CPU_FIXED
    cpu_per_relayed_mbps: float = CPU_PER_RELAYED_MBPS
    cpu_shaper_per_mbps: float = CPU_SHAPER_PER_MBPS
    relayed_per_offered: float = RELAYED_PER_OFFERED
    min_utilization: float = MIN_UTILIZATION
    cpu_share: float = CPU_SHARE
    mem_share: float = MEM_SHARE
    source: str = "documented defaults (docs/generate.md)"

    def to_dict(self) -> dict:
        return asdict(self)


def _mem_available_mib(proc: str = "/proc") -> float:
    try:
        for line in Path(proc, "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 4096.0


def _bench_figures(bench_dir: Path) -> tuple[dict, str] | None:
    """Relay RSS peak and idle CPU from the newest backend bench result (torbed.bench_backend)."""
    files = sorted(bench_dir.glob("backend-*.json")) if bench_dir.is_dir() else []
    for f in reversed(files):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        peaks, cpus = [], []
        # {network name: {"runs": [one_run(), ...], ...}} (torbed.bench_backend)
        runs = [r for net in data.values() if isinstance(net, dict)
                for r in (net.get("runs") or []) if isinstance(r, dict)] if isinstance(data, dict) else []
        for r in runs:
            roles = r.get("roles") or {}
            peaks += [v for n, v in (r.get("rss_peak_mib") or {}).items() if roles.get(n) == "relay"]
            cpus += [v / 100 for n, v in (r.get("cpu_pct_ready_to_end") or {}).items() if roles.get(n) == "relay"]
        if peaks or cpus:
            return ({"rss_peak_mib": statistics.median(peaks) if peaks else None,
                     "cpu_idle_relay": statistics.median(cpus) if cpus else None}, str(f))
    return None


def machine(cores: float | None = None, memory_mib: float | None = None, bench_dir: Path | None = None,
            **overrides) -> Budget:
    """This machine's budget: its cores and available memory (or the given ones), the
    newest bench figures when ``bench_dir`` has some, the newest calibration (``torbed
    calibrate``) measured on a machine with as many cores, then ``overrides`` (Budget fields)."""
    from . import calibrate
    fields = {"cores": float(cores or os.cpu_count() or 1), "memory_mib": float(memory_mib or _mem_available_mib())}
    found = _bench_figures(bench_dir) if bench_dir is not None else None
    sources = []
    if found:
        figures, path = found
        if figures["rss_peak_mib"] and figures["rss_peak_mib"] > MEM_PER_TOR_MIB:
            fields["mem_per_tor_mib"] = round(figures["rss_peak_mib"], 1)
        if figures["cpu_idle_relay"] is not None:
            fields["cpu_idle_relay"] = round(max(figures["cpu_idle_relay"], 0.0), 4)
        sources.append(f"bench results {path}")
    cal = calibrate.newest(bench_dir, fields["cores"]) if bench_dir is not None else None
    if cal:
        figures, path = cal
        fields.update(figures)
        sources.append(f"calibration {path}")
    if sources:
        fields["source"] = " and ".join(sources) + " and documented defaults (docs/generate.md)"
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return Budget(**fields)


@dataclass(frozen=True)
class Demand:
    """What the clients ask for: fetch clients as (count, file bytes, pause s) and the number
    of bulk clients (downloads back to back)."""
    fetches: tuple[tuple[int, int, float], ...] = ()
    bulk: int = 0
    replays: tuple[tuple[int, float], ...] = ()    # (count, the trace's bytes per second of its loop)

    def offered(self, rate: float) -> float:
        """Bytes/s the clients ask for when a path carries ``rate`` bytes/s (a fetch takes its
        pause plus its file's time at that rate; a bulk client takes the rate; a replay client
        its trace's bytes over the trace's loop, at most the rate)."""
        rate = max(rate, 1.0)
        return (sum(n * size / (pause + size / rate) for n, size, pause in self.fetches) + self.bulk * rate
                + sum(n * min(bps, rate) for n, bps in self.replays))


def demand(clients: dict[str, dict], files: dict[str, str]) -> Demand:
    """The Demand of a scenario's client groups (the generator's: fetch with ``think`` (its
    mean) or ``pause``, or bulk) and its server's files."""
    from ..units import parse_duration, parse_size
    fetches, bulk, replays = [], 0, []
    for spec in clients.values():
        w, n = spec["workload"], int(spec["count"])
        if w["kind"] == "bulk":
            bulk += n
        elif w["kind"] == "fetch":
            gap = parse_duration(w["think"]["mean"]) if "think" in w else parse_duration(w.get("pause", "0s"))
            fetches.append((n, parse_size(files[w["file"]]), gap))
        elif w["kind"] == "replay":
            replays.append((n, _trace_rate(w["trace"], parse_duration(w.get("gap", "1s")))))
    return Demand(tuple(fetches), bulk, tuple(replays))


def _trace_rate(trace: str, gap_s: float) -> float:
    """A replayed trace's bytes (both directions) per second of its loop (its duration plus the
    gap before it starts again). A relative path is torbed's own (the generator's traces)."""
    from ..replay import trace as trace_mod

    from .. import resources
    path = Path(trace) if Path(trace).is_absolute() else resources.path(trace)
    totals = trace_mod.info(trace_mod.read(path))
    return sum(totals["bytes"].values()) / max(totals["duration_s"] + gap_s, 1.0)


@dataclass(frozen=True)
class Fit:
    rates: list[int]            # bytes/s per relay, same order as the capacities
    scale: float                # rate = capacity x scale, except relays raised to the floor
    floored: int                # relays raised to tor's minimum rate
    relayed_budget: float       # bytes/s the relays may write together (what the CPU allows)
    cpu_idle: float             # cores the running network needs before it relays a byte
    memory_mib: float           # memory the tors need
    expected_load: float = 0.0  # bytes/s the relays are expected to write (the traffic model)
    cpu_expected: float = 0.0   # cores the testbed is expected to use
    binding: str = ""           # what set the scale: cpu, utilization, capacity or total-rate

    def to_dict(self) -> dict:
        return {"scale": self.scale, "floored": self.floored, "relayed_budget_Bps": round(self.relayed_budget),
                "cpu_idle_cores": round(self.cpu_idle, 4), "memory_mib": round(self.memory_mib, 1),
                "expected_load_Bps": round(self.expected_load), "cpu_expected_cores": round(self.cpu_expected, 3),
                "binding": self.binding}


def _water_fill(capacities: list[int], total: float) -> tuple[list[int], float, int]:
    """Rates summing to ``total``: relays the common scale would put below tor's floor sit at
    the floor, the others share what is left in proportion to their capacity (scale <= 1)."""
    n = len(capacities)
    floored: set[int] = set()
    order = sorted(range(n), key=lambda i: capacities[i])
    while True:
        rest = total - len(floored) * MIN_RELAY_RATE
        free = sum(capacities[i] for i in range(n) if i not in floored)
        scale = min(1.0, rest / free) if free else 1.0
        newly = [i for i in order if i not in floored and capacities[i] * scale < MIN_RELAY_RATE]
        if not newly:
            break
        floored.update(newly)
    rates = [MIN_RELAY_RATE if i in floored else max(MIN_RELAY_RATE, int(capacities[i] * scale)) for i in range(n)]
    return rates, scale, len(floored)


def _median(xs: list[int]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _at(capacities: list[int], budget: Budget, demand: Demand | None,
        total_rate: float) -> tuple[list[int], float, int, float]:
    """Rates summing to ``total_rate``, their scale, how many sit at the floor, and the load
    the relays are expected to write with them (their sum without a traffic model)."""
    rates, scale, floored = _water_fill(capacities, total_rate)
    full = float(sum(rates))
    load = full if demand is None else min(full, budget.relayed_per_offered * demand.offered(_median(rates)))
    return rates, scale, floored, load


def _largest_total(capacities: list[int], budget: Budget, demand: Demand | None,
                   relayed: float) -> tuple[float, str]:
    """The largest rates' sum whose expected load the CPU carries (``relayed``) and that is at
    least min_utilization of the sum, and which condition set it."""
    def fits(total_rate: float) -> bool:
        rates, _, _, load = _at(capacities, budget, demand, total_rate)
        return load <= relayed and load >= budget.min_utilization * sum(rates) * (1 - 1e-6)

    lo, hi = float(len(capacities) * MIN_RELAY_RATE), float(sum(max(c, MIN_RELAY_RATE) for c in capacities))
    if fits(hi):
        return hi, "capacity"
    if not fits(lo):
        # Even at the floor the clients load less than min_utilization of the rates: the
        # floor it is (tor allows no smaller rate); the expected utilization is recorded.
        return lo, "utilization"
    for _ in range(60):     # bisection: cpu and utilization both bind above the answer
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, "cpu" if _at(capacities, budget, demand, hi)[3] > relayed else "utilization"


def _check_memory(budget: Budget, tors: dict[str, int]) -> float:
    """The tors' memory (MiB); BudgetError with the numbers when it exceeds the budget's."""
    n_tors = sum(tors.values())
    mem_need = n_tors * budget.mem_per_tor_mib
    mem_have = budget.memory_mib * budget.mem_share
    if mem_need > mem_have:
        raise BudgetError(
            f"{n_tors} tors ({', '.join(f'{v} {k}' for k, v in tors.items())}) need {mem_need:.0f} MiB at "
            f"{budget.mem_per_tor_mib:g} MiB per tor; this machine's budget is {mem_have:.0f} MiB "
            f"({budget.mem_share:.0%} of {budget.memory_mib:.0f} MiB available). Use fewer relays or clients "
            f"(at most {int(mem_have // budget.mem_per_tor_mib)} tors)")
    return mem_need


def fit_rates(capacities: list[int], budget: Budget, tors: dict[str, int], total: int | None = None,
              demand: Demand | None = None) -> Fit:
    """Scale ``capacities`` (bytes/s) into the budget, keeping their ratios: never above the
    real capacity (scale <= 1), never below tor's minimum relay rate. ``tors``: how many tors
    per role (relay, authority, client). ``demand``: the clients' traffic (default: none
    beyond the clients' own cost, so the rates fill the CPU at full load). ``total``: the
    rates' sum instead of the fitted one (refused if the CPU cannot carry what it brings).
    Raises BudgetError with the numbers."""
    n_tors = sum(tors.values())
    mem_need = _check_memory(budget, tors)
    relays = tors.get("relay", 0)
    fixed = (relays * (budget.cpu_idle_relay + budget.cpu_observe_relay)
             + tors.get("authority", 0) * budget.cpu_idle_authority
             + tors.get("client", 0) * budget.cpu_client + budget.cpu_fixed)
    cores = budget.cores * budget.cpu_share
    per_byte = (budget.cpu_per_relayed_mbps + budget.cpu_shaper_per_mbps) / 1e6
    costs = (f"{budget.cpu_idle_relay + budget.cpu_observe_relay:g} per relay, {budget.cpu_idle_authority:g} per "
             f"authority, {budget.cpu_client:g} per client, {budget.cpu_fixed:g} for torbed and Prometheus")
    if fixed >= cores:
        raise BudgetError(
            f"{n_tors} tors and their observers need {fixed:.2f} cores before relaying a byte ({costs}); the "
            f"budget is {cores:.2f} cores ({budget.cpu_share:.0%} of {budget.cores:g}): use fewer relays or clients")
    relayed = (cores - fixed) / per_byte
    per_mbps = f"{budget.cpu_per_relayed_mbps + budget.cpu_shaper_per_mbps:g} cores per relayed MB/s (tor and shaper)"
    n = len(capacities)
    if n * MIN_RELAY_RATE > relayed and demand is None:
        raise BudgetError(
            f"{n} relays at tor's smallest relay rate ({MIN_RELAY_RATE // 1024} KiB/s each) need "
            f"{n * MIN_RELAY_RATE / 1e6:.2f} MB/s relayed, this machine's budget is {relayed / 1e6:.2f} MB/s "
            f"({cores:.2f} cores: {budget.cpu_share:.0%} of {budget.cores:g}, minus {fixed:.2f} for the running "
            f"network, at {per_mbps}): use at most {int(relayed // MIN_RELAY_RATE)} relays")

    def at(total_rate: float) -> tuple[list[int], float, int, float]:
        return _at(capacities, budget, demand, total_rate)

    lo = float(n * MIN_RELAY_RATE)
    if total is not None:
        chosen, binding = float(total), "total-rate"
        if at(chosen)[3] > relayed:
            raise BudgetError(
                f"--total-rate {total / 1e6:.2f} MB/s: the relays would write {at(chosen)[3] / 1e6:.2f} MB/s, more than "
                f"this machine's budget of {relayed / 1e6:.2f} MB/s relayed ({cores:.2f} cores: "
                f"{budget.cpu_share:.0%} of {budget.cores:g}, minus {fixed:.2f} for the running network, at {per_mbps})")
    elif at(lo)[3] > relayed:
        rates, _, _, load = at(lo)
        raise BudgetError(
            f"{n} relays at tor's smallest relay rate ({MIN_RELAY_RATE // 1024} KiB/s each) would write "
            f"{load / 1e6:.2f} MB/s for {tors.get('client', 0)} clients, this machine's budget is "
            f"{relayed / 1e6:.2f} MB/s ({cores:.2f} cores: {budget.cpu_share:.0%} of {budget.cores:g}, minus "
            f"{fixed:.2f} for the running network ({costs}), at {per_mbps}): use fewer relays or clients")
    else:
        chosen, binding = _largest_total(capacities, budget, demand, relayed)
    rates, scale, floored, load = at(chosen)
    return Fit(rates=rates, scale=scale, floored=floored, relayed_budget=relayed, cpu_idle=fixed,
               memory_mib=mem_need, expected_load=load, cpu_expected=fixed + load * per_byte, binding=binding)
