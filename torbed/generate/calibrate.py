"""The budget's figures measured on this machine, from a finished run (``torbed calibrate RUN``).

``budget.py``'s CPU figures (per relayed MB/s in tor and in the shaper, per observed relay, per
measuring client, torbed and Prometheus, per authority, and relayed bytes per offered byte)
were read by hand from one pilot on one 2-core machine. Another machine, kernel or traffic mix
costs differently. This module reads the same per-process CPU readings the CPU gate recorded
for every repetition (meta.json ``gates.cpu.processes``: cores per process over the
measurement window, by role) and the relays' written bytes in that window (relay_bw.jsonl), and
derives each figure per repetition; the median over the usable repetitions becomes the
calibration, written as ``calibration-<time>.json`` beside the bench results, where
``budget.machine`` reads it (the newest one measured on a machine with as many cores).

Per repetition (window W seconds, R relays, C measuring clients, A authorities, M relayed MB/s):

    cpu_per_relayed_mbps = (relays' cores - R x idle relay) / M
    cpu_shaper_per_mbps  = shaper's cores / M            (linkemu; htb costs the kernel: none)
    cpu_observe_relay    = collector's cores / R
    cpu_client           = (client tors' + drivers' cores) / C
    cpu_fixed            = torbed's + Prometheus' cores
    cpu_idle_authority   = (authorities' + servers' cores) / A
    relayed_per_offered  = M / offered(median relay rate)   (fetch and bulk clients only)

A repetition is not used when a gate rejected it (its CPU readings include the queueing it was
rejected for), when it has no CPU readings (Kubernetes: each pod samples only itself), or when
its relays carried too little to divide by (``MIN_RELAYED_MBPS``). A calibration needs
``MIN_REPS`` usable repetitions; fewer is refused (``InputError``, exit 2) with the reasons.

Public API: ``calibrate(run_dir) -> dict``, ``write(calibration, bench_dir) -> Path``,
``newest(bench_dir, cores) -> (figures, path) | None``, ``FIGURES``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from pathlib import Path

from ..errors import InputError

KIND = "torbed-calibration"
VERSION = 1
# The Budget fields a calibration sets (the memory and idle-relay figures come from `make bench`).
FIGURES = ("cpu_per_relayed_mbps", "cpu_shaper_per_mbps", "cpu_observe_relay", "cpu_client", "cpu_fixed",
           "cpu_idle_authority", "relayed_per_offered")
MIN_REPS = 3
# Below this the per-MB/s figures divide noise by almost nothing (the pilot carried 2.9 MB/s).
MIN_RELAYED_MBPS = 0.2
MB = 1e6


def _cores_by_role(procs: dict) -> tuple[dict[str, float], dict[str, int]]:
    cores: dict[str, float] = {}
    count: dict[str, int] = {}
    for p in procs.values():
        role = p.get("role") or "?"
        c = p.get("cpu_cores")
        if not isinstance(c, (int, float)):
            continue
        cores[role] = cores.get(role, 0.0) + float(c)
        count[role] = count.get(role, 0) + 1
    return cores, count


def _relayed_mbps(rep, window: tuple[float, float]) -> float:
    """MB/s the relays wrote together in the window (BW events: bytes per sample)."""
    t0, t1 = window
    total = sum(float(b["written"]) for b in rep.relay_bw
                if isinstance(b.get("written"), (int, float)) and t0 < b.get("t", 0) <= t1)
    return total / max(t1 - t0, 1e-9) / MB


def _median_relay_rate(scenario: dict) -> float | None:
    from ..units import parse_rate
    rates = []
    for g in ((scenario.get("network") or {}).get("relays") or {}).values():
        if g.get("bandwidth"):
            rates += [parse_rate(g["bandwidth"]) / 8] * int(g.get("count", 1))   # bytes/s
    return statistics.median(rates) if rates else None


def _offered_mbps(scenario: dict) -> tuple[float | None, str]:
    """What the clients ask for at the median relay rate (budget.Demand), or None and why."""
    from . import budget
    clients = scenario.get("clients") or {}
    kinds = {(c.get("workload") or {}).get("kind") for c in clients.values()}
    if not clients or not kinds <= {"fetch", "bulk"}:
        return None, f"client workloads {sorted(k for k in kinds if k)}: the traffic model covers fetch and bulk only"
    rate = _median_relay_rate(scenario)
    if rate is None:
        return None, "no relay group has a bandwidth: no median rate to model the clients at"
    files: dict[str, str] = {}
    for srv in (scenario.get("servers") or {}).values():
        files.update(srv.get("files") or {})
    spec = {}
    for name, c in clients.items():
        w = dict(c.get("workload") or {})
        if isinstance(w.get("think"), dict) and w["think"].get("mean") is None:
            w.pop("think")
        spec[name] = {"count": c.get("count", 1), "workload": w}
    try:
        return budget.demand(spec, files).offered(rate) / MB, ""
    except (KeyError, ValueError) as e:
        return None, f"the traffic model cannot read the clients ({e})"


def _per_rep(rep, scenario: dict, idle_relay: float) -> tuple[dict | None, str]:
    g = (rep.meta or {}).get("gates") if rep.meta else None
    if rep.status != "ok" or not isinstance(g, dict):
        return None, f"status {rep.status}" + ("" if isinstance(g, dict) else ", no gates recorded")
    if not g.get("valid", True):
        return None, "rejected by a gate: " + "; ".join(g.get("invalid_reasons") or [])
    cpu = g.get("cpu") or {}
    procs = cpu.get("processes")
    window = g.get("window")
    if not procs or not window:
        return None, "no per-process CPU readings (" + str(cpu.get("text") or "not measured") + ")"
    if (cpu.get("host") or {}).get("samplers"):
        return None, "CPU sampled per pod (Kubernetes): the run's processes are not seen together"
    cores, count = _cores_by_role(procs)
    relays, clients, auths = count.get("relay", 0), count.get("client", 0), count.get("authority", 0)
    mbps = _relayed_mbps(rep, (float(window[0]), float(window[1])))
    if relays == 0 or mbps < MIN_RELAYED_MBPS:
        return None, f"relays wrote {mbps:.2f} MB/s (below {MIN_RELAYED_MBPS} MB/s: too little to divide by)"
    row = {"relays": relays, "clients": clients, "authorities": auths, "relayed_mbps": round(mbps, 4),
           "cores_by_role": {k: round(v, 4) for k, v in sorted(cores.items())},
           "cpu_per_relayed_mbps": max(0.0, cores.get("relay", 0.0) - relays * idle_relay) / mbps,
           "cpu_shaper_per_mbps": cores.get("shaper", 0.0) / mbps,
           "cpu_observe_relay": cores.get("collector", 0.0) / relays,
           "cpu_fixed": cores.get("torbed", 0.0) + cores.get("prometheus", 0.0)}
    if clients:
        row["cpu_client"] = (cores.get("client", 0.0) + cores.get("driver", 0.0)) / clients
    if auths:
        row["cpu_idle_authority"] = (cores.get("authority", 0.0) + cores.get("server", 0.0)) / auths
    offered, _ = _offered_mbps(scenario)
    if offered:
        row["relayed_per_offered"] = mbps / offered
    return row, ""


def calibrate(run_dir: str | Path, idle_relay: float | None = None) -> dict:
    """The calibration of the run at ``run_dir`` (module docstring). Raises InputError (exit 2)
    when the run cannot be read or has fewer than MIN_REPS usable repetitions."""
    from ..analysis.errors import AnalysisError
    from ..analysis.load import load_run
    from . import budget
    try:
        run = load_run(run_dir)
    except (AnalysisError, OSError) as e:
        raise InputError(f"{run_dir}: {e}") from None
    scenario = run.info.get("scenario") if isinstance(run.info.get("scenario"), dict) else {}
    idle = budget.CPU_IDLE["relay"] if idle_relay is None else idle_relay
    rows, skipped = [], []
    for rep in run.reps:
        row, why = _per_rep(rep, scenario, idle)
        if row is None:
            skipped.append({"rep": f"{rep.variant}/rep-{rep.index}", "reason": why})
        else:
            rows.append({"rep": f"{rep.variant}/rep-{rep.index}", **row})
    if len(rows) < MIN_REPS:
        reasons = "; ".join(f"{s['rep']}: {s['reason']}" for s in skipped[:5]) or "none"
        raise InputError(f"{run_dir}: {len(rows)} usable repetition(s), a calibration needs {MIN_REPS} "
                         f"(not used: {reasons})")
    figures, ranges = {}, {}
    for f in FIGURES:
        vals = [r[f] for r in rows if f in r]
        if vals:
            figures[f] = round(statistics.median(vals), 5)
            ranges[f] = [round(min(vals), 5), round(max(vals), 5)]
    _, no_offered = _offered_mbps(scenario)
    host = {}
    for rep in run.reps:
        h = (((rep.meta or {}).get("gates") or {}).get("cpu") or {}).get("host") or {}
        if h.get("cpus"):
            host = h
            break
    return {"kind": KIND, "version": VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "run": str(Path(run_dir).resolve()), "run_id": run.name,
            "scenario": run.scenario_name, "machine": {"cpus": host.get("cpus") or os.cpu_count(),
                                                       "host": socket.gethostname()},
            "idle_relay": idle, "figures": figures, "ranges": ranges, "repetitions": rows, "not_used": skipped,
            "notes": [no_offered] if no_offered else []}


def write(cal: dict, bench_dir: str | Path) -> Path:
    d = Path(bench_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"calibration-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(cal, indent=1, sort_keys=True) + "\n")
    return path


def newest(bench_dir: str | Path, cores: float) -> tuple[dict, str] | None:
    """The figures of the newest calibration measured on a machine with ``cores`` CPUs."""
    d = Path(bench_dir)
    for f in sorted(d.glob("calibration-*.json"), reverse=True) if d.is_dir() else []:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("kind") != KIND or data.get("version") != VERSION:
            continue
        if float((data.get("machine") or {}).get("cpus") or 0) != float(cores):
            continue
        figures = {k: float(v) for k, v in (data.get("figures") or {}).items()
                   if k in FIGURES and isinstance(v, (int, float)) and v >= 0}
        if figures:
            return figures, str(f)
    return None
