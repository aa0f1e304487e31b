"""The machine's budget for a generated network, and fitting relay rates into it.

A sampled relay's real capacity (tens of MB/s) cannot run on one machine: every relayed
byte costs CPU (TLS, AES, cell handling), and every tor costs memory. The budget says what
this machine can carry; ``fit_rates`` scales the sample's capacities into it, keeping their
ratios, and refuses (``BudgetError``, exit 2, with the numbers) what cannot fit.

Figures (constants below; each overridable on the command line, ``torbed generate --help``):

- memory per tor: the machine-level peak of the 750-tor density run (README "Density": 14.2 GiB
  used at the first consensus for 751 tors with 150 drivers, ~19.4 MiB per tor), rounded up
  to 20 MiB; the newest ``runs/bench/backend-*.json`` replaces it by the measured median
  relay RSS peak when that is larger
- idle CPU per tor after ready (README "Density", 300 tors): relay 0.2 %, authority 2.7 %
  (the larger of the measured 0.5-2.7 %), client tor plus its measurement driver 0.7 % (0.2 % +
  the three drivers' 1.6 % / 3, README "Observing costs little"); bench results replace the
  relay figure when present
- CPU per relayed MB/s: 0.04 cores. The mtrelay experiment's native run (images/relay/variants/
  mtrelay/README.md, C) saturated this 2-core machine at 16.6 MB/s end to end through 3 hops:
  2 cores / (3 x 16.6 MB/s), with clients, servers, drivers and the kernel included (the
  machine was shared then, so the figure errs on the expensive side)
- share of the cores the network may use at full load: 50 % (the rest: torbed, collectors,
  Prometheus, and headroom so measured latencies describe the relays, not a saturated machine)
- share of the available memory: 50 %
- tor's smallest relay rate: 75 KiB/s (RELAY_REQUIRED_MIN_BANDWIDTH, or.h; tor refuses a
  smaller BandwidthRate on a relay)

Public API: ``Budget``, ``machine(...) -> Budget``, ``fit_rates(capacities, budget, tors) -> Fit``,
``BudgetError``.
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
CPU_IDLE = {"relay": 0.002, "authority": 0.027, "client": 0.007}
CPU_PER_RELAYED_MBPS = 0.04
CPU_SHARE = 0.5
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
    cpu_idle_client: float = CPU_IDLE["client"]
    cpu_per_relayed_mbps: float = CPU_PER_RELAYED_MBPS
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
    newest bench figures when ``bench_dir`` has some, then ``overrides`` (Budget fields)."""
    fields = {"cores": float(cores or os.cpu_count() or 1), "memory_mib": float(memory_mib or _mem_available_mib())}
    found = _bench_figures(bench_dir) if bench_dir is not None else None
    if found:
        figures, path = found
        if figures["rss_peak_mib"] and figures["rss_peak_mib"] > MEM_PER_TOR_MIB:
            fields["mem_per_tor_mib"] = round(figures["rss_peak_mib"], 1)
        if figures["cpu_idle_relay"] is not None:
            fields["cpu_idle_relay"] = round(max(figures["cpu_idle_relay"], 0.0), 4)
        fields["source"] = f"bench results {path} and documented defaults (docs/generate.md)"
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return Budget(**fields)


@dataclass(frozen=True)
class Fit:
    rates: list[int]            # bytes/s per relay, same order as the capacities
    scale: float                # rate = capacity x scale, except relays raised to the floor
    floored: int                # relays raised to tor's minimum rate
    relayed_budget: float       # bytes/s all relays together may forward
    cpu_idle: float             # cores the idle network needs
    memory_mib: float           # memory the tors need

    def to_dict(self) -> dict:
        return {"scale": self.scale, "floored": self.floored, "relayed_budget_Bps": round(self.relayed_budget),
                "cpu_idle_cores": round(self.cpu_idle, 4), "memory_mib": round(self.memory_mib, 1)}


def fit_rates(capacities: list[int], budget: Budget, tors: dict[str, int], total: int | None = None) -> Fit:
    """Scale ``capacities`` (bytes/s) so that together they cost at most the budget's CPU
    share (minus what the idle network costs), keeping their ratios; never above the real
    capacity (scale <= 1) and never below tor's minimum relay rate. ``tors``: how many tors
    per role (relay, authority, client). ``total``: the user's sum of rates instead of the
    budget's (refused if larger). Raises BudgetError with the numbers."""
    n_tors = sum(tors.values())
    mem_need = n_tors * budget.mem_per_tor_mib
    mem_have = budget.memory_mib * budget.mem_share
    if mem_need > mem_have:
        raise BudgetError(
            f"{n_tors} tors ({', '.join(f'{v} {k}' for k, v in tors.items())}) need {mem_need:.0f} MiB at "
            f"{budget.mem_per_tor_mib:g} MiB per tor; this machine's budget is {mem_have:.0f} MiB "
            f"({budget.mem_share:.0%} of {budget.memory_mib:.0f} MiB available). Use fewer relays or clients "
            f"(at most {int(mem_have // budget.mem_per_tor_mib)} tors)")
    idle = (tors.get("relay", 0) * budget.cpu_idle_relay + tors.get("authority", 0) * budget.cpu_idle_authority
            + tors.get("client", 0) * budget.cpu_idle_client)
    cores = budget.cores * budget.cpu_share
    if idle >= cores:
        raise BudgetError(
            f"{n_tors} tors need {idle:.2f} cores when idle ({budget.cpu_idle_relay:.1%} per relay, "
            f"{budget.cpu_idle_authority:.1%} per authority, {budget.cpu_idle_client:.1%} per client); the "
            f"budget is {cores:.2f} cores ({budget.cpu_share:.0%} of {budget.cores:g}): use fewer relays or clients")
    relayed = (cores - idle) / budget.cpu_per_relayed_mbps * 1e6
    n = len(capacities)
    if total is not None:
        if total > relayed:
            raise BudgetError(
                f"--total-rate {total / 1e6:.2f} MB/s exceeds this machine's budget of {relayed / 1e6:.2f} MB/s "
                f"relayed ({cores:.2f} cores: {budget.cpu_share:.0%} of {budget.cores:g}, minus {idle:.2f} idle, "
                f"at {budget.cpu_per_relayed_mbps:g} cores per relayed MB/s)")
        relayed = float(total)
    if n * MIN_RELAY_RATE > relayed:
        raise BudgetError(
            f"{n} relays at tor's smallest relay rate ({MIN_RELAY_RATE // 1024} KiB/s each) need "
            f"{n * MIN_RELAY_RATE / 1e6:.2f} MB/s relayed, this machine's budget is {relayed / 1e6:.2f} MB/s "
            f"({cores:.2f} cores: {budget.cpu_share:.0%} of {budget.cores:g}, minus {idle:.2f} for the idle "
            f"network, at {budget.cpu_per_relayed_mbps:g} cores per relayed MB/s): use at most "
            f"{int(relayed // MIN_RELAY_RATE)} relays")
    # Water-filling: the relays the scale would put below the floor sit at the floor, the
    # others share what is left in proportion to their capacity.
    floored: set[int] = set()
    order = sorted(range(n), key=lambda i: capacities[i])
    scale = 1.0
    while True:
        rest = relayed - len(floored) * MIN_RELAY_RATE
        free = sum(capacities[i] for i in range(n) if i not in floored)
        scale = min(1.0, rest / free) if free else 1.0
        newly = [i for i in order if i not in floored and capacities[i] * scale < MIN_RELAY_RATE]
        if not newly:
            break
        floored.update(newly)
    rates = [MIN_RELAY_RATE if i in floored else max(MIN_RELAY_RATE, int(capacities[i] * scale)) for i in range(n)]
    return Fit(rates=rates, scale=scale, floored=len(floored), relayed_budget=relayed, cpu_idle=idle,
               memory_mib=mem_need)
