"""Workload kinds and the measurement driver's configuration, for every backend.

A client runs ``torbed.client.driver`` with one JSON configuration; ``driver_config`` builds
it (the local backend writes it to a file per client, a Kubernetes client pod builds it in
the pod). What a kind adds is its ``workload`` entry, made by its row of ``WORKLOADS``.

Adding a workload kind: its scenario model (``scenario.py``: a class in the ``Workload``
union and ``WORKLOAD_KINDS``), a row here (how ``torbed plan`` describes it, how its driver
entry is built), and its runner in ``client/driver.py`` (``WORKLOADS`` there). A backend that
cannot run it says so in its ``unsupported`` table (``workload.<kind>``).

Public API:

- ``WORKLOADS``: {kind: ``WorkloadKind``(describe, build)}
- ``Target``: the server a client's workload talks to (name, address, ports, files manifest)
- ``workload_entry(wl, target, **extra) -> dict``: the driver's ``workload`` entry
- ``driver_config(s, plan, ...) -> dict``: a client's whole driver configuration
- ``server_group(s, wl) -> str``: the server group a workload uses
- Replay: ``trace_name(path)``, ``assign_flows(trace, wl, clients)``,
  ``replay_traces(s, server_group, rep_dir)``
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import constants
from .client.driver import think_config


@dataclass
class Target:
    server: str                 # the server's node (local) or Service (k8s) name
    address: str
    ports: dict[str, int]       # {"http": 80, "replay": 8000}
    manifest: dict = field(default_factory=dict)   # {file: {"size", "sha256"}} of its group


def _transfer(wl, t: Target, **_) -> dict:
    entry = t.manifest[wl.file]
    return {"kind": wl.kind, "server": t.server, "address": t.address, "port": t.ports["http"],
            "file": wl.file, "size": entry["size"], "sha256": entry["sha256"], "concurrency": wl.concurrency,
            "repeat": getattr(wl, "repeat", None),
            "pause_s": wl.pause.seconds if wl.kind == "fetch" else 0.0,
            "think": think_config(getattr(wl, "think", None)),
            "timeout_s": wl.timeout.seconds if wl.timeout else constants.transfer_timeout(entry["size"]),
            "stallout_s": wl.stallout.seconds}


def _replay(wl, t: Target, *, trace: Path, flows: list[str], period_s: float, offset_s: float,
            cells_output: Path, **_) -> dict:
    return {"kind": "replay", "server": t.server, "address": t.address, "port": t.ports["replay"],
            "trace": str(trace), "trace_name": trace_name(trace), "flows": flows, "loop": wl.loop,
            "period_s": period_s, "offset_s": offset_s, "slack_s": wl.timeout.seconds,
            "timeout_s": wl.timeout.seconds, "concurrency": 1, "cells_output": str(cells_output),
            # The replay clock's exchanges with the server (replay/clock.py), beside the cells.
            "clock_output": str(Path(cells_output).with_name("clock.jsonl"))}


def _describe_transfer(wl) -> str:
    return f"{wl.kind} '{wl.file}'" + (f" x{wl.repeat}" if wl.kind == "fetch" else "")


def _describe_replay(wl) -> str:
    return f"replay {wl.trace}" + (f" ({len(wl.flows)} flows)" if wl.flows else "") + f", {wl.distribute}"


@dataclass(frozen=True)
class WorkloadKind:
    describe: Callable[[object], str]          # one line for `torbed plan`
    build: Callable[..., dict]                 # (workload, Target, **extra) -> driver entry


WORKLOADS: dict[str, WorkloadKind] = {
    "bulk": WorkloadKind(_describe_transfer, _transfer),
    "fetch": WorkloadKind(_describe_transfer, _transfer),
    "replay": WorkloadKind(_describe_replay, _replay),
}


def workload_entry(wl, target: Target, **extra) -> dict:
    return WORKLOADS[wl.kind].build(wl, target, **extra)


def server_group(s, wl) -> str:
    return wl.server or next(iter(s.servers))


def driver_config(s, plan, *, client: str, group: str, variant: str, rep: int, fingerprints: dict[str, str],
                  control: dict, socks_port: int, output: str | Path, workload: dict, t_work: float,
                  debug: bool = False) -> dict:
    """The driver configuration of one client: its tor (control, SOCKS), the fixed path
    (every relay of each path group, with fingerprints), the workload entry, and the
    common schedule (workload start, measurement start after warmup, end)."""
    cg = s.clients[group]
    return {
        "client": client, "group": group, "variant": variant, "rep": rep, "seed": s.seed + rep,
        "control": control, "socks_port": socks_port, "output": str(output),
        "path": [[{"node": r.name, "fingerprint": fingerprints[r.name]} for r in plan.group_nodes(g)]
                 for g in (cg.path or [])],
        "workload": workload,
        "t_workload": t_work, "t_measure": t_work + s.measure.warmup.seconds,
        "t_end": t_work + s.measure.duration.seconds, "debug": debug,
    }


# ---------------------------------------------------------------------------------------
# Replay: which trace, which flows

def trace_name(path: Path) -> str:
    """A trace's name in records: its file name without .gz / .jsonl / .trace."""
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".trace"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    return name


def replay_traces(s, server: str, rep_dir: Path) -> dict[str, Path]:
    """Traces of the replay workloads served by group ``server``: {name: path}. Each is
    copied into the repetition's directory (traces/), so a run keeps what it replayed."""
    out = {}
    for cg in s.clients.values():
        wl = cg.workload
        if wl.kind != "replay" or server_group(s, wl) != server:
            continue
        src = s.trace_path(wl.trace)
        dst = rep_dir / "traces" / src.name
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        out[trace_name(src)] = dst
    return out


def assign_flows(trace, wl, clients: list) -> dict[str, list[str]]:
    """Which flows each client of a group replays: ``each``: all; ``split``: whole circuit
    keys (flows sharing a circuit stay on one client) dealt round-robin in order of first
    appearance, so every client gets a similar share."""
    flows = [f for f in trace.flows if not wl.flows or f.id in wl.flows]
    if wl.distribute == "each":
        return {c.name: [f.id for f in flows] for c in clients}
    keys: list[str] = []
    by_key: dict[str, list[str]] = {}
    for f in sorted(flows, key=lambda f: f.start):
        k = f.circuit if f.circuit is not None else f"flow:{f.id}"
        if k not in by_key:
            keys.append(k)
            by_key[k] = []
        by_key[k].append(f.id)
    out = {c.name: [] for c in clients}
    for i, k in enumerate(keys):
        out[clients[i % len(clients)].name] += by_key[k]
    return out
