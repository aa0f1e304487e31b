"""Network namespaces of the local backend: one switch, one namespace per node.

The switch namespace holds a bridge and the switch-side end of every node's veth; each node
namespace holds its ``eth0`` (the planned address) and ``lo``, and a relay with a second
address (``network.relays.<g>.second_address``) an ``eth1`` with it: a switch port of its own,
and a policy route (table ``SECOND_TABLE``) so that what is sent from that address leaves there. Nothing is created in the
caller's namespace, and no namespace has a default route or an uplink, so the private
network cannot reach anything outside it. The bridge carries the control-plane address
(``plan.control_address``) so collectors running in the switch namespace reach every node.

With ``switch="linkemu"`` there is no bridge: the userspace link emulator forwards between
the switch-side veth ends (``Topology.ports()``), and the control plane gets a port of its
own, a veth pair inside the switch namespace (``ctl`` with the control address, ``ctlp``
the emulator's port). The switch-side ends answer no ARP and have no IPv6 address, so the
switch namespace's own stack never takes part in the forwarding.

Names start with ``tb-<run id>-`` so ``torbed clean`` can find leftovers of a killed run. A
Topology made outside a run (a test, a benchmark) claims its namespaces with a state file of
its own (``STATE_DIR/<run id>.json``, owner pid) unless a run's Supervisor wrote one already,
so ``torbed clean`` leaves them alone while their owner lives.

Public API:

- ``Topology(run_id, plan, switch="bridge"|"linkemu")``: ``.create()``, ``.destroy()``,
  ``.ns(node_name)``, ``.switch``, ``.ports()`` (switch-side device per endpoint: every node,
  then every second address; linkemu), ``.device(endpoint) -> (namespace, eth0|eth1)``
- ``exec_prefix(ns) -> list[str]`` argv prefix that runs a command inside a namespace
- ``mac_address(index) -> str`` the fixed MAC of node ``index`` (plan order + 1; 0 = control)
- ``list_namespaces(prefix) -> list[str]``, ``namespace_pids(ns) -> list[int]``,
  ``delete_namespace(ns)``
- ``socket_in(ns) -> socket`` a TCP socket that lives in namespace ``ns`` (its connections
  are made there), for talking to a service inside a run from outside it
- ``private_tcp_hash()``: context in which created namespaces get a TCP hash of their own;
  ``restore_tcp_hash()`` for ``torbed clean``; ``Topology.tcp_hash`` says what they got
- ``NetnsError`` when ``ip`` fails (the message has the command and its output)
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

from ... import constants
from ...network import Node, Plan, owner
from ...errors import RunFailed


class NetnsError(RunFailed):
    pass


# Each namespace's own TCP hash table (Linux >= 6.1, net.ipv4.tcp_child_ehash_entries): by
# default every namespace shares the host's established-socket hash (262,144 buckets here), and
# reading one namespace's sockets (/proc/PID/net/tcp, ss) walks all of it: ~10-14 ms per read
# on this machine, a third of a core for the gates' once-a-second reading of 60 relays. With a
# table of its own a read walks only these buckets (0.7 ms). Only lookup speed changes; TCP
# behaves the same.
CHILD_EHASH = Path("/proc/sys/net/ipv4/tcp_child_ehash_entries")
TCP_HASH_BUCKETS = 2048
EHASH_RESTORE = "tcp-child-ehash.restore"      # in STATE_DIR: the value to put back after a crash


@contextlib.contextmanager
def private_tcp_hash(buckets: int = TCP_HASH_BUCKETS, sysctl: Path = CHILD_EHASH):
    """While namespaces are created inside it, give each its own TCP hash of ``buckets``;
    yields what they got ("private N buckets" or "shared: <why>"). The sysctl is read when a
    namespace is created, so it is set only for that moment and put back afterwards, under a
    lock (two runs creating namespaces at once must not restore each other's value) and with
    the old value written to ``STATE_DIR/EHASH_RESTORE`` first, for ``torbed clean`` after a
    crash. A value the user set (non-zero) is left alone and used."""
    try:
        old = int(sysctl.read_text())
    except (OSError, ValueError):
        yield "shared: this kernel has no per-namespace TCP hash (net.ipv4.tcp_child_ehash_entries, Linux 6.1)"
        return
    if old:
        yield f"private {old} buckets (net.ipv4.tcp_child_ehash_entries as set on this machine)"
        return
    constants.STATE_DIR.mkdir(parents=True, exist_ok=True)
    marker = constants.STATE_DIR / EHASH_RESTORE
    with open(constants.STATE_DIR / ".ehash.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            now = int(sysctl.read_text())
            if now:                       # set by someone else meanwhile: used as it is
                yield f"private {now} buckets (net.ipv4.tcp_child_ehash_entries as set on this machine)"
                return
            marker.write_text("0\n")
            try:
                sysctl.write_text(f"{buckets}\n")
            except OSError as e:
                marker.unlink(missing_ok=True)
                yield f"shared: net.ipv4.tcp_child_ehash_entries not writable ({e.strerror})"
                return
            try:
                yield f"private {buckets} buckets"
            finally:
                sysctl.write_text("0\n")
                marker.unlink(missing_ok=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def restore_tcp_hash(sysctl: Path = CHILD_EHASH) -> bool:
    """``torbed clean``: put back the value a crashed run left set (its marker file), unless a
    live run is creating namespaces right now (the lock is held). True when restored."""
    marker = constants.STATE_DIR / EHASH_RESTORE
    if not marker.exists():
        return False
    with open(constants.STATE_DIR / ".ehash.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            value = marker.read_text().strip() or "0"
            sysctl.write_text(f"{int(value)}\n")
            marker.unlink(missing_ok=True)
            return True
        except (OSError, ValueError):
            return False
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


SECOND_TABLE = 2    # routing table of a relay's second address (eth1)


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


def mac_address(index: int) -> str:
    """Locally administered MAC of node ``index`` (0 = the control plane, nodes from 1)."""
    return "02:74:62:%02x:%02x:%02x" % ((index >> 16) & 255, (index >> 8) & 255, index & 255)


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


_CLONE_NEWNET = 0x40000000


def socket_in(ns: str) -> socket.socket:
    """A TCP socket created inside network namespace ``ns``. setns() moves only the
    calling thread, so a short-lived thread enters the namespace, makes the socket and
    ends; the socket keeps its namespace. Raises OSError (no such namespace, not root)."""
    got: dict = {}

    def make() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
                got["sock"] = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            finally:
                os.close(fd)
        except OSError as e:
            got["error"] = e

    t = threading.Thread(target=make, name=f"setns-{ns}")
    t.start()
    t.join()
    if "error" in got:
        raise got["error"]
    return got["sock"]


def delete_namespace(ns: str) -> None:
    kill_namespace_processes(ns)
    _ip("netns", "delete", ns, check=False)


class Topology:
    """The switch and node namespaces of one run (a variant x repetition)."""

    CONTROL_DEV = "ctl"     # linkemu: the control plane's veth end (holds plan.control_address)
    CONTROL_PORT = "ctlp"   # linkemu: its peer, an emulator port

    def __init__(self, run_id: str, plan: Plan, switch: str = "bridge"):
        if switch not in ("bridge", "linkemu"):
            raise ValueError(f"switch must be 'bridge' or 'linkemu', not {switch!r}")
        self.run_id = run_id
        self.plan = plan
        self.switch_kind = switch
        self.prefix = f"{constants.NETNS_PREFIX}{run_id}-"
        self.switch = f"{self.prefix}sw"
        self.created: list[str] = []
        self.claim: Path | None = None      # the state file this Topology wrote (outside a run)
        self.tcp_hash = "not created"       # private_tcp_hash()'s answer once created

    def ns(self, node_name: str) -> str:
        return f"{self.prefix}{node_name}"

    def ports(self) -> list[tuple[str, Node | None]]:
        """Switch-side device of every endpoint (``Plan.endpoints()``: the nodes, then the
        relays' second addresses), then the control plane's port (node None)."""
        return [(f"s{i}", n) for i, n in enumerate(self.plan.endpoints())] + [(self.CONTROL_PORT, None)]

    def device(self, endpoint: Node) -> tuple[str, str]:
        """(namespace, device) of an endpoint: a node's eth0, a second address's eth1."""
        name, dev = owner(endpoint)
        return self.ns(name), dev

    def create(self) -> None:
        net = ipaddress.IPv4Network(self.plan.subnet)
        plen = net.prefixlen
        self._claim_namespaces()
        with private_tcp_hash() as self.tcp_hash:
            for name in [self.switch] + [self.ns(n.name) for n in self.plan.nodes]:
                _ip("netns", "add", name)
                self.created.append(name)
        # Switch side in one batch: bridge, then one veth per node with its peer moved
        # straight into the node's namespace (never visible in the caller's namespace).
        if self.switch_kind == "bridge":
            sw = [
                "link set lo up",
                "link add br0 type bridge forward_delay 0 stp_state 0",
                f"addr add {self.plan.control_address}/{plen} dev br0",
                "link set br0 up",
            ]
        else:
            ctl, port = self.CONTROL_DEV, self.CONTROL_PORT
            sw = ["link set lo up",
                  f"link add {ctl} type veth peer name {port}",
                  f"addr add {self.plan.control_address}/{plen} dev {ctl}",
                  f"link set {port} arp off addrgenmode none",
                  f"link set {port} up",
                  f"link set {ctl} up"]
        for i, node in enumerate(self.plan.endpoints()):
            ns, dev = self.device(node)
            sw.append(f"link add s{i} type veth peer name {dev} netns {ns}")
            if self.switch_kind == "bridge":
                sw.append(f"link set s{i} master br0")
            else:
                sw.append(f"link set s{i} arp off addrgenmode none")
            sw.append(f"link set s{i} up")
        _ip("-n", self.switch, batch="\n".join(sw) + "\n")
        # Fixed MACs and permanent neighbour entries for every peer: the kernel's ARP table
        # is shared by all namespaces (gc_thresh3, 1024 entries by default), and a network
        # of ~100 nodes overflows it ("neighbor table overflow"; connects fail with
        # EHOSTUNREACH). Permanent entries do not count against that limit and no ARP runs.
        peers = [(self.plan.control_address, mac_address(0))] + \
            [(n.address, mac_address(i + 1)) for i, n in enumerate(self.plan.endpoints())]
        ctl_dev = "br0" if self.switch_kind == "bridge" else self.CONTROL_DEV
        _ip("-n", self.switch, batch=f"link set {ctl_dev} address {mac_address(0)}\n" + "".join(
            f"neigh replace {ip} lladdr {mac} dev {ctl_dev} nud permanent\n" for ip, mac in peers[1:]))
        macs = {n.name: mac_address(i + 1) for i, n in enumerate(self.plan.endpoints())}
        for node in self.plan.nodes:
            own = {node.address, node.address2}
            _ip("-n", self.ns(node.name), batch=(
                "link set lo up\n"
                f"link set eth0 address {macs[node.name]}\n"
                f"addr add {node.address}/{plen} dev eth0\n"
                "link set eth0 up\n" + "".join(
                    f"neigh replace {ip} lladdr {mac} dev eth0 nud permanent\n"
                    for ip, mac in peers if ip not in own)
                + (self._second_lines(node, macs, peers, net) if node.address2 else "")))

    @staticmethod
    def _second_lines(node: Node, macs: dict[str, str], peers: list[tuple[str, str]],
                      net: ipaddress.IPv4Network) -> str:
        """A relay's second address on eth1, and a policy route so that what is sent from it
        (a socket bound to it: tor's CircSwitchBindAddress) leaves by eth1. No prefix route in
        the main table: everything else still leaves by eth0."""
        a2 = node.address2
        own = {node.address, a2}
        return (f"link set eth1 address {macs[node.name + ':second']}\n"
                f"addr add {a2}/{net.prefixlen} dev eth1 noprefixroute\n"
                "link set eth1 up\n"
                f"rule add from {a2} lookup {SECOND_TABLE} pref 100\n"
                f"route add {net} dev eth1 src {a2} table {SECOND_TABLE}\n" + "".join(
                    f"neigh replace {ip} lladdr {mac} dev eth1 nud permanent\n"
                    for ip, mac in peers if ip not in own))

    def port_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes each node has sent and received so far, read from its switch-side veth end
        (one ``ip -s -j link`` in the switch namespace, whatever the switch is): frames the
        node sent are the port's rx, frames it received the port's tx."""
        p = _ip("-n", self.switch, "-s", "-j", "link", "show")
        stats = {d["ifname"]: d.get("stats64", {}) for d in json.loads(p.stdout or "[]")}
        out = {}
        for dev, node in self.ports():
            st = stats.get(dev)
            if node is not None and st:
                out[node.name] = {"sent": st["rx"]["bytes"], "received": st["tx"]["bytes"]}
        return out

    def _claim_namespaces(self) -> None:
        """A state file naming these namespaces and this process, unless a run's has."""
        state_file = constants.STATE_DIR / f"{self.run_id}.json"
        if state_file.exists():
            return
        from .lifetime import process_start
        constants.STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {"run_id": self.run_id, "claim": "topology", "owner_pid": os.getpid(),
                 "owner_start": process_start(os.getpid()), "pids": {},
                 "namespaces": [self.switch] + [self.ns(n.name) for n in self.plan.nodes]}
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(state_file)
        self.claim = state_file

    def destroy(self) -> None:
        for name in reversed(self.created):
            delete_namespace(name)
        self.created.clear()
        if self.claim is not None:
            self.claim.unlink(missing_ok=True)
            self.claim = None
