"""Checks an experiment's setup must pass before its first block (issue 37 item 2e): a
pre-registered experiment with ``precheck: cap-linearity`` runs this first, and halts with the
reason when it fails, so no block is spent on a setup that cannot show the effect.

**cap-linearity** (engler-goldberg-2021-slowcores): the target relay group runs with a CPU cap
per thread (``cpu_per_thread``) to emulate a slow multi-core CPU inside this machine's cores.
The relay's throughput must then be set by the cap and nothing else: proportional to it. The
baseline arm (stock tor, one busy thread) runs one repetition at each of ``FACTORS`` x the
scenario's cap (20%, 40%, 80% of a core for a 20% cap: up to what the most threaded arm
could use together), each its own ``torbed run``; a recorded point at another factor (an
earlier definition of the check) is kept in the record but not judged. Linear when, at every cap, the relay's
throughput per core of cap is within ``TOLERANCE`` of the scenario's own cap's (so the rest
of the network carries 4x its rate without becoming the bottleneck) and the gates found the
target at its cap (saturated: its busiest thread at 85% of the cap or more) and nothing else
starved. The result is committed as ``<records>/<experiment>/precheck-cap-linearity.json``
(the runs' values, gates, host); a later session reads it instead of running again.

Public API:

- ``KINDS``, ``path(records_root, exp, kind)``;
- ``status(records_root, exp, kind, scenario_file=None) -> dict | None``;
- ``scenario_digest(scenario_file) -> str``;
- ``judge(points, tolerance=TOLERANCE) -> (ok, why)``;
- ``run(kind, exp, e, records_root, runs_root, repo) -> dict``;
- ``seconds(kind, repo, e) -> float`` (machine time it takes).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

CAP_LINEARITY = "cap-linearity"
KINDS = (CAP_LINEARITY,)
# From the scenario's cap (stock tor's one busy thread) to 4x it (mtrelay-3: main thread and
# three connection threads). Below it (0.5x was tried) the clients' streams detach waiting for
# CONNECTED at a target that slow: a client-side failure outside every arm's operating range.
FACTORS = (1.0, 2.0, 4.0)
TOLERANCE = 1.25          # throughput per core of cap within a factor 1.25 of the scenario's cap's
PER_RUN_OVERHEAD_S = 90.0  # bring-up of the emulated target (slow to publish a descriptor) and teardown
INTERRUPTED = 130          # torbed's exit status after Ctrl-C (torbed.cli)


def path(records_root: Path, exp: str, kind: str) -> Path:
    return Path(records_root) / exp / f"precheck-{kind}.json"


def scenario_digest(scenario_file: Path) -> str:
    """The scenario as torbed resolves it (comments and layout do not count), as in a run's
    fingerprint (torbed.resume)."""
    from torbed import scenario as scenario_mod
    from torbed.resume import fingerprint
    return fingerprint(scenario_mod.load(str(scenario_file)), [])["scenario_sha256"]


def status(records_root: Path, exp: str, kind: str, scenario_file: Path | None = None) -> dict | None:
    """The committed result (``ok``, ``why``, ``points``...), or None when it has not run, or
    (given ``scenario_file``) ran on another version of the scenario: then it runs again."""
    p = path(records_root, exp, kind)
    if not p.is_file():
        return None
    try:
        rec = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(f"{p}: not a readable precheck record ({e})") from None
    if scenario_file is not None and rec.get("scenario_sha256") != scenario_digest(scenario_file):
        return None
    return rec


def judge(points: list[dict], tolerance: float = TOLERANCE) -> tuple[bool, str]:
    """``points``: per cap {cap (cores), factor (of the scenario's cap), throughput_Bps,
    saturation, valid, invalid_reasons}. Linear: every run valid (target at its cap, nothing
    else starved, the transfers ran) and throughput per core of cap within ``tolerance`` of
    the scenario's own cap's (factor 1; the smallest cap has the least CPU for tor's fixed
    per-second work, so it is no reference)."""
    pts = sorted((p for p in points if p.get("factor", 1.0) in FACTORS), key=lambda p: p["cap"])
    if not pts:
        return False, "no run"
    bad = [p for p in pts if not p.get("throughput_Bps")]
    if bad:
        return False, "no throughput at cap " + ", ".join(f"{100 * p['cap']:g}%" for p in bad)
    invalid = [p for p in pts if not p.get("valid")]
    if invalid:
        return False, "; ".join(f"cap {100 * p['cap']:g}%: " + "; ".join(p.get("invalid_reasons") or ["invalid"])
                                for p in invalid)
    ref = min(pts, key=lambda p: abs(p.get("factor", 1.0) - 1.0))     # the scenario's own cap
    base = ref["throughput_Bps"] / ref["cap"]
    ratios = [(p["throughput_Bps"] / p["cap"]) / base for p in pts]
    text = ", ".join(f"{100 * p['cap']:g}%: {p['throughput_Bps'] / 1e6:.2f} MB/s ({r:.2f})" for p, r in zip(pts, ratios))
    off = [p for p, r in zip(pts, ratios) if not 1 / tolerance <= r <= tolerance]
    if off:
        return False, (f"not proportional to the cap (throughput, and per core of cap relative to the scenario's "
                       f"cap of {100 * ref['cap']:g}%, allowed {1 / tolerance:.2f}..{tolerance:.2f}): {text}")
    return True, f"proportional to the cap within a factor {tolerance:g}: {text}"


def seconds(kind: str, repo: Path, e) -> float:
    from .campaign import scenario_duration_s
    return len(FACTORS) * (scenario_duration_s(repo, e.scenario) + PER_RUN_OVERHEAD_S)


def _scenario(repo: Path, e, cap: float) -> dict:
    """The experiment's scenario with its baseline arm only, one repetition, the target at ``cap``."""
    data = yaml.safe_load((repo / e.scenario).read_text())
    target = data["measure"]["mechanism"]["target"]
    data["network"]["relays"][target]["cpu_per_thread"] = f"{100 * cap:g}%"
    data["variants"], data["repetitions"] = [e.variants[0]], 1
    data.pop("baseline", None)
    return data


def _point(run_dir: Path, variant: str, cap: float) -> dict:
    """One cap's run: the target's throughput (best 30 s moving average after the warm-up)
    and its gates."""
    from .load import load_run
    from .metrics import throughput_series
    meta = json.loads((run_dir / variant / "rep-0" / "meta.json").read_text())
    g = meta.get("gates") or {}
    tgt = ((g.get("cpu") or {}).get("target") or {})
    names = sorted((tgt.get("saturation") or {}))
    series = throughput_series(load_run(run_dir))
    tput = sum((series.get(n, {}).get(variant, {}).get(0, {}).get("rate_max") or 0.0) for n in names)
    procs = (g.get("cpu") or {}).get("processes") or {}
    return {"cap": cap, "status": meta.get("status"), "throughput_Bps": tput or None,
            "saturation": {n: tgt["saturation"][n] for n in names},
            "busiest_thread_cores": {n: (procs.get(n) or {}).get("busiest_thread_cores") for n in names},
            "valid": bool(g.get("valid")) and meta.get("status") == "ok",
            "invalid_reasons": g.get("invalid_reasons") or ([meta.get("error")] if meta.get("error") else []),
            "run": str(run_dir)}


def run(kind: str, exp: str, e, records_root: Path, runs_root: Path, repo: Path) -> dict:
    """Run the check (one ``torbed run`` per cap, one at a time), commit its record, return it."""
    if kind != CAP_LINEARITY:
        raise ValueError(f"unknown precheck {kind!r} (known: {', '.join(KINDS)})")
    from torbed import scenario as scenario_mod
    sc_model = scenario_mod.load(str(repo / e.scenario))
    base_cap = sc_model.network.relays[sc_model.measure.mechanism.target].cpu_per_thread.fraction
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    points = []
    for f in FACTORS:
        cap = round(base_cap * f, 4)
        data = _scenario(repo, e, cap)
        out = Path(runs_root) / exp / "precheck" / f"{kind}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-cap{100 * cap:g}"
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            sc = Path(tmp) / f"{data['name']}.yaml"
            sc.write_text(yaml.safe_dump(data, sort_keys=False))
            print(f"precheck: {exp}: {kind}: {e.variants[0]} at {100 * cap:g}% of a core per thread", flush=True)
            p = subprocess.run([sys.executable, "-m", "torbed.cli", "run", str(sc), "--out", str(out)], cwd=repo)
        if p.returncode in (INTERRUPTED, -signal.SIGINT):
            raise KeyboardInterrupt(f"precheck {kind}: torbed run interrupted; nothing recorded, it runs again next time")
        dirs = [d for d in out.iterdir() if d.is_dir() and not d.is_symlink() and (d / "run.json").is_file()]
        if len(dirs) != 1:
            points.append({"cap": cap, "factor": f, "status": "failed", "throughput_Bps": None, "valid": False,
                           "invalid_reasons": [f"torbed run exited {p.returncode} without a run directory"]})
            continue
        points.append({**_point(dirs[0], e.variants[0], cap), "factor": f})
    ok, why = judge(points)
    rec = {"schema": 1, "experiment": exp, "kind": kind, "ok": ok, "why": why, "points": points,
           "scenario": e.scenario, "scenario_sha256": scenario_digest(repo / e.scenario),
           "factors": list(FACTORS), "tolerance": TOLERANCE, "variant": e.variants[0], "started": started,
           "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname()}
    dest = path(records_root, exp, kind)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    print(f"precheck: {exp}: {kind}: {'passed' if ok else 'FAILED'}: {why}", flush=True)
    return rec
