"""What a run of the circswitch variant must show (images/relay/variants/circswitch): the checks
its integration tests share.

A small network where bulk downloads and paced web fetches of several clients share the
guard's one connection to the middle, and the guard->middle link is the narrow one, so the
middle's output buffer toward the guard fills (downloads) and the control law there (EWMA of
the occupancy vs alpha/beta, CircSwitchDownstream) moves the busiest circuits to a second
connection of the guard's pair and back; the guard completes each move.

Public API:

- ``scenario(name, duration, middle_variant="circswitch", exit_variant="kist", ...) -> dict``
- ``analyse(run_dir, variant) -> dict``: ``torchestra.analyse`` (transfers, completed
  switches per relay, torchestra counters, warnings) plus the guard's circswitch notice lines
  and ``tor_relay_circswitch_total`` counters per relay
- ``problems(summary) -> list[str]``: ``torchestra.problems`` (failed transfers, protocol
  closes, abandoned switches, warnings of lost or reordered cells)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from . import torchestra

# The patch's notice lines (images/relay/variants/circswitch/README.md, A.3).
MOVE = re.compile(r"CircSwitch: (guard|middle \(toward the guard\)) moves circuit \d+ (to the second connection|back)")
ONSET = "CircSwitch: output buffer to "
METRIC = "tor_relay_circswitch_total"


def scenario(name: str, duration: str, guard_variant: str = "circswitch", middle_variant: str = "circswitch",
             exit_variant: str = "kist", bulk: int = 2, web: int = 4, link: str = "8mbit",
             middle_torrc: str = "") -> dict:
    """guard -> middle -> exit, every client on that path; guard->middle at ``link``, the
    rest at 100 mbit. Bulk clients fetch 5 MB back to back, web clients 320 KB with 1 s
    pauses (the paper's two kinds of client, section 4.3)."""
    relays: dict = {"guard": {"guard": True, "variant": guard_variant},
                    "middle": {"variant": middle_variant},
                    "exit": {"exit": True, "variant": exit_variant}}
    if middle_torrc:
        relays["middle"]["torrc"] = middle_torrc
    path = ["guard", "middle", "exit"]
    return {
        "apiVersion": "torbed/v1",
        "name": name,
        # Every group names its variant; the run is filed under "circswitch".
        "variants": ["circswitch"],
        "network": {"authorities": 3, "relays": relays, "consensus_params": {"cc_alg": 0}},
        "links": {"default": {"rate": "100mbit"}, "pairs": [{"between": ["guard", "middle"], "rate": link}]},
        "servers": {"www": {"files": {"web": "320KB", "bulk": "5MB"}}},
        "clients": {
            "bulk": {"count": bulk, "path": path, "workload": {"kind": "bulk", "file": "bulk"}},
            "web": {"count": web, "path": path,
                    "workload": {"kind": "fetch", "file": "web", "repeat": 1_000_000, "pause": "1s"}},
        },
        "measure": {"warmup": "0s", "duration": duration, "ready_timeout": "180s",
                    "collect": ["transfers", "metrics"], "metrics_interval": "2s"},
    }


def analyse(run_dir: Path, variant: str) -> dict:
    summary = torchestra.analyse(run_dir, variant)
    rep = Path(run_dir) / variant / "rep-0"
    for log in sorted((rep / "logs").glob("*.log")):
        r = summary["relays"].get(log.stem)
        if r is None:
            continue
        text = log.read_text(errors="replace")
        moves = {"to_second": 0, "back": 0}
        for m in MOVE.finditer(text):
            moves["to_second" if m.group(2).startswith("to") else "back"] += 1
        r["circswitch_moves"] = moves
        r["congestion_onsets_logged"] = text.count(ONSET)
    path = rep / "metrics.jsonl"
    last: dict[str, dict[str, float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                last[rec["relay"]] = rec["samples"]
    for name, samples in last.items():
        summary["relays"].setdefault(name, {})["circswitch"] = {
            k.split('event="')[1].rstrip('"}'): v for k, v in samples.items() if k.startswith(METRIC + "{")}
    return summary


def problems(summary: dict) -> list[str]:
    return torchestra.problems(summary)
