"""The mechanism gates' samples on the local backend (torbed.gates): the shaper's backlog and
the CPU of every supervised process, once a second, from the workload's start to its end.

- htb: ``tc -s -j class show dev eth0`` (a relay's second address: ``eth1``, labelled
  ``<node>:second``) in each sender's namespace that has a rate-limited
  class toward a relay, server or client (authorities' links carry the directory protocol,
  not the measured traffic, and leaving them out saves a tc process per second each);
- linkemu: its control socket's ``backlog`` op;
- the kernel's TCP send queues of every relay (/proc/PID/net/tcp of its tor, ``ss -N NS`` where
  that pid is not in the relay's namespace);
- CPU: /proc of each tor, driver, server, collector and linkemu process under the
  Supervisor, and of torbed itself (so "other processes" means processes not of this run).

Public API: ``start(rep, shaper) -> torbed.gates.Sampler``
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from . import state
from .emulator import NETNS_DIR
from ... import gates
from ...records import RecordWriter

DATA_ROLES = gates.DATA_ROLES


def htb_links(plan) -> tuple[dict[tuple[str, int], str], list[dict]]:
    """{(sender, minor): "SRC>DST"} and the shaper_links entries of every rate-limited class
    between nodes that carry the measured traffic."""
    from ... import shaping
    links, meta = {}, []
    for n in plan.endpoints():      # a relay's second address is a sender of its own (<node>:second)
        if n.role not in DATA_ROLES:
            continue
        for minor, dst, spec in shaping.shaped_classes(plan, n):
            if not spec.rate_bps or dst.role not in DATA_ROLES:
                continue
            name = f"{n.name}>{dst.name}"
            links[(n.name, minor)] = name
            meta.append({"link": name, "rate_bps": spec.rate_bps, "delay_s": spec.delay_s or 0.0})
    return links, meta


class SendQueueReader:
    """A relay's TCP send queues, read from /proc/PID/net/tcp of its tor (the file lists the
    sockets of the reader's network namespace) instead of forking ``ss`` into the namespace
    once per relay per second (60 forks a second on the sampled network; the larger cost, the
    walk of a shared socket hash, is gone with netns.private_tcp_hash). The pid is used only once its namespace is checked to be
    the relay's (the inode of /proc/PID/ns/net is that of /run/netns/NS); otherwise, and for a
    relay whose tor is not running, ``ss`` reads it. ``how``: {"proc": n, "ss": n} readings so far."""

    def __init__(self, sup, ns_of, run_ss):
        self.sup, self.ns_of, self.run_ss = sup, ns_of, run_ss
        self.checked: dict[tuple[str, int], bool] = {}
        self.how = {"proc": 0, "ss": 0}

    def _pid(self, sender: str) -> int | None:
        entry = self.sup.procs.get(sender)
        if entry is None or entry[0].poll() is not None:
            return None
        pid = entry[0].pid
        key = (sender, pid)
        if key not in self.checked:
            try:
                ours = os.stat(f"/proc/{pid}/ns/net")
                want = os.stat(NETNS_DIR / self.ns_of(sender))
                self.checked[key] = (ours.st_dev, ours.st_ino) == (want.st_dev, want.st_ino)
            except OSError:
                self.checked[key] = False
        return pid if self.checked[key] else None

    def __call__(self, sender: str) -> str:
        pid = self._pid(sender)
        if pid is not None:
            try:
                text = Path(f"/proc/{pid}/net/tcp").read_text()
                self.how["proc"] += 1
                return text
            except OSError:
                pass            # tor ended between the check and the read: ss below
        self.how["ss"] += 1
        return self.run_ss(sender)


def _roles(plan):
    nodes = {n.name: n for n in plan.nodes}

    def role(name: str) -> tuple[str, str | None]:
        base, _, suffix = name.partition(".")
        n = nodes.get(base)
        if suffix == "driver":
            return "driver", n.group if n else None
        if name == "linkemu":
            return "shaper", None
        if n is None:
            return name, None                   # collector, prometheus, ...
        if suffix:
            return ("server" if n.role == "server" else suffix), n.group   # web0.replay, load0.locust
        return n.role, n.group
    return role


def start(rep, shaper: str) -> gates.Sampler:
    st = state.of(rep)
    plan, sup = st.plan, st.sup
    role = _roles(plan)
    mech = rep.scenario.measure.mechanism
    target = tuple(n.name for n in plan.by_role("relay") if mech.kind == "cpu-bound" and n.group == mech.target)

    def procs() -> dict[str, tuple[int, str, str | None]]:
        out = {"torbed": (os.getpid(), "torbed", None)}
        for name, (p, _) in list(sup.procs.items()):
            if p.poll() is None:
                out[name] = (p.pid, *role(name))
        return out

    sources = [gates.CpuSource(procs, RecordWriter(rep.dir / "cpu.jsonl"), threads_of=target)]
    if shaper == "linkemu" and st.emulator is not None:
        sources.append(gates.LinkemuSource(st.emulator.socket, RecordWriter(rep.dir / "shaper.jsonl")))
    elif shaper == "none":
        sources.append(gates.NoShaper(RecordWriter(rep.dir / "shaper.jsonl")))
    elif shaper in ("htb", "htb+netem"):
        links, meta = htb_links(plan)

        ends = {n.name: n for n in plan.endpoints()}

        def run_tc(sender: str) -> str:
            ns, dev = st.topo.device(ends[sender])
            p = subprocess.run(["tc", "-n", ns, "-s", "-j", "class", "show", "dev", dev],
                               capture_output=True, text=True, timeout=5)
            if p.returncode:
                raise OSError(p.stderr.strip() or f"tc exited {p.returncode}")
            return p.stdout
        sources.append(gates.HtbSource(links, meta, run_tc, RecordWriter(rep.dir / "shaper.jsonl")))
    # The relays' kernel send queues (where a circuit scheduler has handed data on). Not the
    # servers': a bulk server's socket toward the exit fills whenever tor's flow control stops
    # reading from it (seen: 7.7 MB), which is the source waiting, not a queue on the path.
    senders = [n.name for n in plan.by_role("relay")]
    peers = {n.address: n.name for n in plan.endpoints() if n.role in DATA_ROLES}

    def run_ss(sender: str) -> str:
        p = subprocess.run(["ss", "-N", st.topo.ns(sender), "-Htn", "state", "established"],
                           capture_output=True, text=True, timeout=5)
        if p.returncode:
            raise OSError(p.stderr.strip() or f"ss exited {p.returncode}")
        return p.stdout
    reader = SendQueueReader(sup, st.topo.ns, run_ss)
    sources.append(gates.SocketSource(senders, peers, reader, RecordWriter(rep.dir / "sockets.jsonl")))
    rep.meta["gate_sampling"] = {"interval_s": gates.SAMPLE_INTERVAL_S, "shaper": shaper, "socket_senders": senders,
                                 "cpu_bound_target": list(target), "socket_reader": reader.how,
                                 "tcp_hash_per_namespace": st.topo.tcp_hash}
    return gates.Sampler(gates.SAMPLE_INTERVAL_S, sources).start()
