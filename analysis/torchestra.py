"""What a run of the Torchestra variant must show: the checks its integration tests and its
stress run (``make bench``, torbed.bench.torchestra) share.

A small network where bulk clients and bursty fetch clients share one middle->exit
connection, so the exit's classifier moves circuits light->heavy and back for the whole
run. Every transfer is sha256-checked by the client driver; a lost, reordered or corrupted
cell would show up as a failed transfer or a closed circuit.

Public API:

- ``scenario(name, duration, guard_variant=None, bulk=1, surge=2, light=4) -> dict``
- ``analyse(run_dir, variant) -> dict``: transfers, switches counted from the relays' notice
  lines, the relays' last MetricsPort counters, warnings
- ``problems(summary) -> list[str]``: what makes a run fail (empty = fine): failed transfers,
  abandoned switches, warnings of a lost or reordered cell, protocol-violation closes other
  than the one stock tor itself produces in a 3-relay network
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# The patch's notice lines (images/relay/variants/torchestra/README.md, A.3).
EXIT_MOVE = re.compile(r"Torchestra: exit moves circuit \d+ (light|heavy)->(light|heavy)")
SWITCHED = re.compile(r"Torchestra: switched circuit \d+ on channel \d+ to circuit \d+ on (light|heavy) "
                      r"channel \d+ \((initiator|receiver)")
ABANDONED = "Torchestra: abandoning switch"
# Warnings that mean a cell was lost, reordered or corrupted on a circuit.
CELL_ORDER_WARNINGS = ("Didn't recognize a cell", "circuit_receive_relay_cell", "Unexpected sendme",
                       "Torchestra")
# A stock-tor protocol close that tiny test networks produce on their own (a path that
# would leave through the hop it came from); tor counts it as a protocol violation too.
TINY_NETWORK_CLOSE = "Client asked me to extend back to the previous hop"
METRIC = "tor_relay_torchestra_total"
PROTO = "tor_relay_circ_proto_violation_total"


def scenario(name: str, duration: str, guard_variant: str | None = None, bulk: int = 1, surge: int = 2,
             light: int = 4, variant: str = "torchestra") -> dict:
    """Continuous bulk downloads, "surge" clients (3 MB, then 4 s idle: heavy while they
    download, back to light once idle) and bursty light clients (200 KB every 2 s) over
    guard -> middle -> exit. All relays run ``variant`` unless ``guard_variant`` names
    another one for the guard (e.g. ``kist``, the unpatched build)."""
    relays = {"guard": {"guard": True}, "middle": {}, "exit": {"exit": True}}
    if guard_variant:
        relays["guard"]["variant"] = guard_variant
    path = ["guard", "middle", "exit"]
    clients = {
        "bulk": {"count": bulk, "path": path, "workload": {"kind": "bulk", "file": "bulk"}},
        "surge": {"count": surge, "path": path,
                  "workload": {"kind": "fetch", "file": "surge", "repeat": 1_000_000, "pause": "4s"}},
        "burst": {"count": light, "path": path,
                  "workload": {"kind": "fetch", "file": "burst", "repeat": 1_000_000, "pause": "2s"}},
    }
    return {
        "apiVersion": "torbed/v1",
        "name": name,
        "variants": [variant],
        "network": {"authorities": 3, "relays": relays, "consensus_params": {"cc_alg": 0}},
        "links": {"default": {"rate": "100mbit"}, "pairs": [{"between": ["middle", "exit"], "rate": "20mbit"}]},
        "servers": {"www": {"files": {"burst": "200KB", "surge": "3MB", "bulk": "20MB"}}},
        "clients": {k: v for k, v in clients.items() if v["count"] > 0},
        "measure": {"warmup": "0s", "duration": duration, "ready_timeout": "180s",
                    "collect": ["transfers", "metrics"], "metrics_interval": "2s"},
    }


def _last_metrics(rep: Path) -> dict[str, dict[str, float]]:
    last: dict[str, dict[str, float]] = {}
    path = rep / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                last[r["relay"]] = r["samples"]
    return last


def analyse(run_dir: Path, variant: str) -> dict:
    rep = Path(run_dir) / variant / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    transfers = [json.loads(x) for x in (rep / "transfers.jsonl").read_text().splitlines() if x.strip()]
    ok = [t for t in transfers if t.get("status") == "ok"]
    bad = [t for t in transfers if t.get("status") not in ("ok", "in_flight", "cancelled")]
    relays: dict[str, dict] = {}
    for log in sorted((rep / "logs").glob("*.log")):
        name = log.stem
        if "." in name or not any(name.startswith(g) for g in ("guard", "middle", "exit")):
            continue
        text = log.read_text(errors="replace")
        moves = {"to_heavy": 0, "to_light": 0}
        for m in EXIT_MOVE.finditer(text):
            moves["to_heavy" if m.group(2) == "heavy" else "to_light"] += 1
        done = {"initiator": 0, "receiver": 0, "to_heavy": 0, "to_light": 0}
        for m in SWITCHED.finditer(text):
            done[m.group(2)] += 1
            done["to_heavy" if m.group(1) == "heavy" else "to_light"] += 1
        relays[name] = {
            "exit_moves": moves, "switched": done, "abandoned": text.count(ABANDONED),
            "tiny_network_closes": text.count(TINY_NETWORK_CLOSE),
            "warnings": [line for line in text.splitlines() if "[warn]" in line or "[err]" in line],
        }
    for name, samples in _last_metrics(rep).items():
        r = relays.setdefault(name, {})
        r["metrics"] = {k.split('event="')[1].rstrip('"}'): v for k, v in samples.items()
                        if k.startswith(METRIC + "{")}
        r["proto_violations"] = samples.get(PROTO, 0.0)
    return {
        "variant": variant, "status": meta.get("status"),
        "transfers_ok": len(ok), "transfers_failed": len(bad),
        "failures": sorted({f"{t.get('status')}: {t.get('error')}" for t in bad})[:10],
        "bytes_ok": sum(t.get("bytes") or 0 for t in ok),
        "relays": relays,
        "switches_completed": sum(r.get("switched", {}).get("initiator", 0) for r in relays.values()),
    }


def problems(summary: dict) -> list[str]:
    """Reasons a Torchestra run is not correct: failed transfers (lost/corrupted bytes show
    up as checksum or short-read failures), circuits closed for a protocol reason, aborted
    switches, warnings from our code."""
    out = []
    if summary["status"] != "ok":
        out.append(f"run status {summary['status']}")
    if summary["transfers_ok"] == 0:
        out.append("no transfer completed")
    if summary["transfers_failed"]:
        out.append(f"{summary['transfers_failed']} transfers failed: {summary['failures']}")
    for name, r in summary["relays"].items():
        unexplained = r.get("proto_violations", 0) - r.get("tiny_network_closes", 0)
        if unexplained > 0:
            out.append(f"{name}: {unexplained:.0f} circuits closed for a protocol violation")
        if r.get("abandoned") or r.get("metrics", {}).get("aborted"):
            out.append(f"{name}: {max(r.get('abandoned', 0), r.get('metrics', {}).get('aborted', 0)):.0f} "
                       f"switches abandoned (a circuit closed mid-switch)")
        torch_warn = [w for w in r.get("warnings", []) if any(x in w for x in CELL_ORDER_WARNINGS)]
        if torch_warn:
            out.append(f"{name}: warnings {torch_warn[:3]}")
    return out
