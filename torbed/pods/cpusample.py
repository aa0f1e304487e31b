"""The mechanism gates' CPU samples of one pod on Kubernetes (torbed.gates.CpuSource, the
local backend's sampler per pod): the node's /proc/stat counters and, for each process of
the pod this container can see, its CPU ticks and its main thread's scheduler counters
(/proc/PID/schedstat: time runnable but waiting for a CPU), once a second.

A container sees the other containers' processes only in a pod that shares its process
namespace (the chart sets ``shareProcessNamespace`` on relay, client and server pods for
this), so the relay pod's collector sidecar samples tor, the shaper and itself, the client
pod's driver samples the client's tor, the shaper and itself, and a server pod's shaper
sidecar (the one container there that ships records) samples the servers and itself.
Processes are told apart by their command (``tor``; ``python -m torbed.pods.<module>``); the
pause container and shells are left out. Each record names its pod's node (``source``) and
each process its pid: the analysis sums each source's counter steps per process life in the
window (torbed.analysis.gates).

Public API: ``classify(comm, cmdline) -> role | None``, ``pod_processes(node, group, proc,
me) -> {name: (pid, role, group)}``, ``source(out, node, group, tor_role) -> CpuSource``,
``start(out, node, group, tor_role) -> Sampler``
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import gates
from ..records import RecordWriter

# python -m torbed.pods.<module>: the role the CPU gate knows it by (torbed.analysis.gates
# GATED_ROLES: relay, client, driver, server, shaper; "collector" is sampled, not gated).
MODULE_ROLES = {"torbed.pods.shaper": "shaper", "torbed.pods.client": "driver",
                "torbed.pods.relayside": "collector", "torbed.pods.server": "server",
                "torbed.pods.replayserver": "server"}
# A server pod's processes are named as the local backend names them: the file server as the
# node itself (srv0), the replay server as <node>.replay.
SERVER_NAMES = {"torbed.pods.server": "", "torbed.pods.replayserver": ".replay"}


def classify(comm: str, cmdline: list[str]) -> str | None:
    """The role of a process of the pod by its command: "tor", a torbed pod module's role,
    or None (the pause container, a shell, a probe's command)."""
    if comm == "tor":
        return "tor"
    module = _module(cmdline)
    return MODULE_ROLES[module] if module else None


def _module(cmdline: list[str]) -> str | None:
    for i, arg in enumerate(cmdline[:-1]):
        if arg == "-m" and cmdline[i + 1] in MODULE_ROLES:
            return cmdline[i + 1]
    return None


def pod_processes(node: str, group: str, tor_role: str, proc: str | Path = "/proc",
                  me: int | None = None) -> dict[str, tuple[int, str, str | None]]:
    """{name: (pid, role, group)} of the pod's processes: its tor as ``node`` (role
    ``tor_role``: relay or client), a server pod's servers as SERVER_NAMES says, the others as
    ``node.<role>``. ``me``: this process, which is known without reading its command line."""
    me = os.getpid() if me is None else me
    out: dict[str, tuple[int, str, str | None]] = {}
    for d in Path(proc).iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        try:
            comm = (d / "comm").read_text().strip()
            cmdline = [a for a in (d / "cmdline").read_bytes().decode(errors="replace").split("\0") if a]
        except OSError:
            continue        # gone between the listing and the read
        role = classify(comm, cmdline)
        if role is None:
            continue
        if role == "tor":
            out.setdefault(node, (pid, tor_role, group))
        else:
            name = node + SERVER_NAMES[_module(cmdline)] if role == "server" else f"{node}.{role}"
            if pid == me or name not in out:
                out[name] = (pid, role, group)
    return out


def source(out: Path, node: str, group: str, tor_role: str, threads: bool = False) -> gates.CpuSource:
    """The pod's samples into ``out/cpu.jsonl`` (the caller's Shipper sends it). ``threads``:
    the tor is a CPU-bound experiment's target (its threads are sampled too)."""
    def procs():
        return pod_processes(node, group, tor_role)
    return gates.CpuSource(procs, RecordWriter(out / "cpu.jsonl"), threads_of=(node,) if threads else (),
                           source=node)


def start(out: Path, node: str, group: str, tor_role: str, threads: bool = False) -> gates.Sampler:
    """Sample the pod (``source``) once a second."""
    return gates.Sampler(gates.SAMPLE_INTERVAL_S, [source(out, node, group, tor_role, threads)]).start()
