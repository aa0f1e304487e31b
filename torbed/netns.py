"""Network namespaces of the local backend: one switch, one namespace per node.

The switch namespace holds a bridge and the switch-side end of every node's veth; each node
namespace holds its ``eth0`` (the planned address) and ``lo``. Nothing is created in the
caller's namespace, and no namespace has a default route or an uplink, so the private
network cannot reach anything outside it. The bridge carries the control-plane address
(``plan.control_address``) so collectors running in the switch namespace reach every node.

Names start with ``tb-<run id>-`` so ``torbed clean`` can find leftovers of a killed run.

Public API:

- ``Topology(run_id, plan)``: ``.create()``, ``.destroy()``, ``.ns(node_name)``, ``.switch``
- ``exec_prefix(ns) -> list[str]`` argv prefix that runs a command inside a namespace
- ``list_namespaces(prefix) -> list[str]``, ``namespace_pids(ns) -> list[int]``,
  ``delete_namespace(ns)``
- ``NetnsError`` when ``ip`` fails (the message has the command and its output)
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import tempfile

from . import constants
from .network import Plan


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, batch: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *args]
    if batch is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".ip", delete=False) as f:
            f.write(batch)
        cmd += ["-batch", f.name]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        if batch is not None:
            os.unlink(f.name)
    if check and p.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}"
                         + (f"\nbatch:\n{batch}" if batch and len(batch) < 4000 else ""))
    return p


def exec_prefix(ns: str) -> list[str]:
    return ["ip", "netns", "exec", ns]


def list_namespaces(prefix: str = constants.NETNS_PREFIX) -> list[str]:
    p = _ip("netns", "list", check=False)
    names = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def namespace_pids(ns: str) -> list[int]:
    p = _ip("netns", "pids", ns, check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def kill_namespace_processes(ns: str) -> int:
    pids = namespace_pids(ns)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def delete_namespace(ns: str) -> None:
    kill_namespace_processes(ns)
    _ip("netns", "delete", ns, check=False)


class Topology:
    """The switch and node namespaces of one run (a variant x repetition)."""

    def __init__(self, run_id: str, plan: Plan):
        self.run_id = run_id
        self.plan = plan
        self.prefix = f"{constants.NETNS_PREFIX}{run_id}-"
        self.switch = f"{self.prefix}sw"
        self.created: list[str] = []

    def ns(self, node_name: str) -> str:
        return f"{self.prefix}{node_name}"

    def create(self) -> None:
        net = ipaddress.IPv4Network(self.plan.subnet)
        plen = net.prefixlen
        for name in [self.switch] + [self.ns(n.name) for n in self.plan.nodes]:
            _ip("netns", "add", name)
            self.created.append(name)
        # Switch side in one batch: bridge, then one veth per node with its peer moved
        # straight into the node's namespace (never visible in the caller's namespace).
        sw = [
            "link set lo up",
            "link add br0 type bridge forward_delay 0 stp_state 0",
            f"addr add {self.plan.control_address}/{plen} dev br0",
            "link set br0 up",
        ]
        for i, node in enumerate(self.plan.nodes):
            sw.append(f"link add s{i} type veth peer name eth0 netns {self.ns(node.name)}")
            sw.append(f"link set s{i} master br0")
            sw.append(f"link set s{i} up")
        _ip("-n", self.switch, batch="\n".join(sw) + "\n")
        for node in self.plan.nodes:
            _ip("-n", self.ns(node.name), batch=(
                "link set lo up\n"
                f"addr add {node.address}/{plen} dev eth0\n"
                "link set eth0 up\n"))

    def destroy(self) -> None:
        for name in reversed(self.created):
            delete_namespace(name)
        self.created.clear()
