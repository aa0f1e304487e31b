"""Mechanism gates, the measuring half (issue 36 item 1): what a repetition's machine and links
did while it was measured, sampled about once a second into the repetition's run directory.

A comparison of schedulers means something only if the queueing happened where a scheduler
acts (tor's circuit queues), no process but the one under test was short of CPU, and the
transfers ran. The samples here are the evidence; ``torbed.analysis.gates`` turns them into a
verdict per repetition (meta.json ``gates``), with the thresholds (``THRESHOLDS``, stated here
once, explained in docs/statistics.md "Mechanism gates").

Records (JSON lines, appended and flushed as written):

- ``shaper.jsonl``: first a ``{"type": "shaper_links", "shaper", "links": [{"link": "SRC>DST",
  "rate_bps", "delay_s"}]}`` record (the rate-limited links sampled), then one ``{"type":
  "shaper", "t", "backlog": {"SRC>DST": bytes}, "senders": [SRC, ...], ["failed": [SRC, ...]]}``
  per sample with every link whose backlog was not zero (``senders``: whose links the sample
  covers, so a link of a sender not in it is missing from the sample, not empty: on
  Kubernetes each pod writes its own; ``failed``: senders that could not be read then). htb: the class of the destination in
  the sender's namespace (``tc -s class show``; iproute2 6.1 prints htb class statistics as
  text even with ``-j``, so both forms are read);
  its backlog is the class's leaf queue (the default 1000-frame FIFO, the ``queue:`` bfifo, or
  netem's queue, which also holds the frames serving the link's delay). linkemu: its control
  socket's ``backlog`` op (the queue only; the delay line is separate).
- ``sockets.jsonl``: one ``{"type": "sockets", "t", "send_q": {"SRC>DST":
  bytes}, "senders": [SRC, ...], ["failed": [SRC]]}`` per sample: the TCP send queues (``ss`` Send-Q: bytes written
  and not yet acknowledged, so what the shaper holds for the socket is part of it) of each
  relay toward each node (summed over its sockets to that node), non-zero ones only. Tor's Vanilla scheduler hands the kernel all a
  socket takes, and Linux keeps a local qdisc's share of it small (TCP small queues), so a
  bottleneck's backlog can sit here rather than in the shaper or in tor's circuit queues.
- ``cpu.jsonl``: one ``{"type": "cpu", "t", "hz", "host": {"busy", "total", "steal", "cpus",
  "load1"}, "procs": {NAME: {"role", "group", "ticks", "run_ns", "wait_ns", "slices"}}, ["threads":
  {NAME: {TID: ticks}}]}`` per sample: /proc/stat's counters, and for each supervised process
  its CPU ticks (/proc/PID/stat utime + stime, every thread) and its main thread's scheduler
  counters (/proc/PID/schedstat: time on a CPU, time runnable but waiting for one, times
  scheduled); ``threads`` for the CPU-bound target only (its busiest thread).

On Kubernetes the shaper sidecar of each pod samples its own pod the same way
(torbed.pods.shaper): its htb classes toward each peer *group* (``SRC>GROUP``: the sidecar
shapes per peer group) and, in a relay pod, the pod's TCP send queues summed per peer group;
the records reach the run directory through the results service. CPU: the relay pod's
collector and the client pod's driver sample their pod's processes (torbed.pods.cpusample;
``cpu.jsonl`` records carry their pod's node as ``source``).

Every parser takes text (tests pass canned output); every reader takes the /proc directory.

Public API:

- ``THRESHOLDS``: the gates' numbers, by name; ``SAMPLE_INTERVAL_S``
- ``parse_tc_classes(text) -> {minor: {"backlog_bytes", "backlog_packets", "drops", "sent_bytes"}}``
- ``parse_schedstat(text) -> (run_ns, wait_ns, slices)``
- ``parse_ss_send_queues(text) -> {peer address: bytes}``
- ``read_host(proc) -> dict``; ``read_process(pid, proc, threads=False, children=False) -> dict | None``
- ``Sampler(interval, sources)``: a thread calling each source every interval;
  ``.start()``, ``.stop() -> errors``; ``.durations``, ``.cpu_s`` (what the samples cost)
- ``HtbSource(links, meta, run_tc, writer)``, ``LinkemuSource(socket, writer)``,
  ``NoShaper(writer)`` (no link has a rate: the header alone),
  ``SocketSource(senders, peers, run_ss, writer)``, ``CpuSource(procs, writer, ...)``
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from . import hostload

SAMPLE_INTERVAL_S = 1.0
# The roles whose links carry the measured traffic (the authorities' carry the directory
# protocol): the shaper classes and send queues sampled are those between them.
DATA_ROLES = ("relay", "server", "client", "loadworker")

# The gates' thresholds, in one place (docs/statistics.md "Mechanism gates" says why each).
THRESHOLDS = {
    # Queueing: flag a repetition when the most-backlogged shaped link's median backlog, in
    # seconds at its rate, is at least this long ...
    "shaper_backlog_min_s": 0.1,
    # ... and at least this many times the most-queued relay's median circuit-queue wait.
    "shaper_dominance_ratio": 1.0,
    # CPU: a non-target tor, driver or the shaper is starved when its main thread spent at
    # least this fraction of the window runnable but waiting for a CPU (/proc/PID/schedstat).
    "max_runqueue_wait_fraction": 0.10,
    # The hypervisor took at least this fraction of the machine's CPU time (steal).
    "max_steal_fraction": 0.05,
    # Processes that are not this run used at least this fraction of the machine (a flag:
    # the starvation check above says whether it hurt).
    "max_others_busy_fraction": hostload.MAX_BUSY_FRACTION,
    # CPU-bound experiments: the target relay is saturated when its busiest thread ran at
    # least this fraction of the window, or the whole process this fraction of every core.
    "cpu_bound_min_busy": 0.85,
    # Transfer completion: invalid above this fraction of the started (after warm-up)
    # transfers ending in a stall or an error ...
    "max_failed_fraction": 0.10,
    # ... flagged when at least this fraction of a group's transfers were cut off by the window.
    "max_censored_fraction": 0.5,
    # Fewer samples than this in the window: the gate says "not enough samples", not a verdict.
    "min_samples": 5,
}


# ---------------------------------------------------------------------------------------
# Parsers

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMG]?)b$")
_DROPPED = re.compile(r"\(dropped (\d+)")
_MULT = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


def _size(text: str) -> int:
    """tc's printed size: "1514b", "15Kb", "1.5Mb" (iproute2 print_size: powers of 1024)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a tc size: {text!r}")
    return int(round(float(m.group(1)) * _MULT[m.group(2)]))


def _minor(handle: str) -> int | None:
    major, _, minor = handle.partition(":")
    if major != "1" or not minor:
        return None
    return int(minor, 16)


def parse_tc_classes(text: str) -> dict[int, dict]:
    """The htb classes of ``tc -s [-j] class show dev DEV`` (root handle 1:), by minor number.

    JSON (a list of objects with "handle", "bytes", "drops", "backlog", "qlen") when tc
    prints it, else the text form:

        class htb 1:2 root leaf 2: prio 0 rate 3Mbit ...
         Sent 123 bytes 4 pkt (dropped 5, overlimits 0 requeues 0)
         backlog 1514b 1p requeues 0
    """
    text = text.strip()
    out: dict[int, dict] = {}
    if text.startswith("["):
        for c in json.loads(text):
            minor = _minor(str(c.get("handle", "")))
            if minor is not None:
                out[minor] = {"backlog_bytes": int(c.get("backlog", 0)), "backlog_packets": int(c.get("qlen", 0)),
                              "drops": int(c.get("drops", 0)), "sent_bytes": int(c.get("bytes", 0))}
        return out
    cur: dict | None = None
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "class" and len(f) >= 3:
            minor = _minor(f[2])
            cur = out.setdefault(minor, {"backlog_bytes": 0, "backlog_packets": 0, "drops": 0, "sent_bytes": 0}) \
                if minor is not None else None
        elif cur is None:
            continue
        elif f[0] == "Sent" and len(f) >= 2:
            cur["sent_bytes"] = int(f[1])
            dropped = _DROPPED.search(line)
            cur["drops"] = int(dropped.group(1)) if dropped else 0
        elif f[0] == "backlog" and len(f) >= 3:
            cur["backlog_bytes"] = _size(f[1])
            cur["backlog_packets"] = int(f[2].rstrip("p"))
    return out


def parse_ss_send_queues(text: str) -> dict[str, int]:
    """``ss -Htn state established``: the send queues (bytes written by the application and
    not yet acknowledged, i.e. in the kernel) summed per peer IPv4 address."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 4:
            continue
        peer = f[3].rsplit(":", 1)[0]
        out[peer] = out.get(peer, 0) + int(f[1])
    return out


TCP_ESTABLISHED = "01"     # the kernel's state code in /proc/net/tcp's "st" column


def parse_proc_net_tcp(text: str) -> dict[str, int]:
    """/proc/PID/net/tcp (the sockets of PID's network namespace): the established sockets'
    send queues (``tx_queue``: write_seq - snd_una, the number ``ss`` prints as Send-Q) summed
    per peer IPv4 address. Addresses are the kernel's network-order words printed as native
    integers, hence the native-order pack."""
    out: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 5 or f[3] != TCP_ESTABLISHED:
            continue
        peer = socket.inet_ntoa(struct.pack("=I", int(f[2].split(":")[0], 16)))
        out[peer] = out.get(peer, 0) + int(f[4].split(":")[0], 16)
    return out


def parse_send_queues(text: str) -> dict[str, int]:
    """Either reading of a sender's send queues: /proc/PID/net/tcp (its header names
    ``local_address``) or ``ss -Htn state established``."""
    head = text.split("\n", 1)[0]
    return parse_proc_net_tcp(text) if "local_address" in head else parse_ss_send_queues(text)


def parse_schedstat(text: str) -> tuple[int, int, int]:
    """/proc/PID/schedstat: (ns on a CPU, ns runnable but waiting on a run queue, times scheduled)."""
    f = text.split()
    return int(f[0]), int(f[1]), int(f[2])


def read_host(proc: str | Path = "/proc") -> dict:
    """The machine's CPU counters (/proc/stat's "cpu" line, in ticks) and 1-minute load."""
    busy, total, cpus = hostload.read_cpu_times(proc)
    steal = 0
    for line in (Path(proc) / "stat").read_text().splitlines():
        f = line.split()
        if f and f[0] == "cpu":
            steal = int(f[8]) if len(f) > 8 else 0
            break
    return {"busy": busy, "total": total, "steal": steal, "cpus": cpus, "load1": hostload.read_loadavg(proc)[0]}


def _reaped_children_ticks(stat: str) -> int:
    """cutime + cstime of a /proc/PID/stat line (fields 16 and 17): its reaped children's CPU."""
    rest = stat[stat.rfind(")") + 1:].split()
    return int(rest[13]) + int(rest[14])


def read_process(pid: int, proc: str | Path = "/proc", threads: bool = False,
                 children: bool = False) -> dict | None:
    """One process' counters: ``ticks`` (utime + stime of every thread; ``children``: plus
    its reaped children's, e.g. torbed's tc and ss), its main thread's ``run_ns``,
    ``wait_ns``, ``slices`` (schedstat); ``threads``: {tid: ticks}. None once it has exited."""
    d = Path(proc) / str(pid)
    try:
        stat = (d / "stat").read_text()
        parsed = hostload._parse_pid_stat(stat)
        run_ns, wait_ns, slices = parse_schedstat((d / "schedstat").read_text())
        extra = _reaped_children_ticks(stat) if children else 0
    except (OSError, ValueError, IndexError):
        return None
    if parsed is None:
        return None
    out = {"ticks": parsed[2] + extra, "run_ns": run_ns, "wait_ns": wait_ns, "slices": slices}
    if threads:
        per = {}
        try:
            for t in (d / "task").iterdir():
                got = hostload._parse_pid_stat((t / "stat").read_text())
                if got:
                    per[t.name] = got[2]
        except OSError:
            pass
        out["threads"] = per
    return out


# ---------------------------------------------------------------------------------------
# Sources: each called once per sample

class HtbSource:
    """The htb classes of rate-limited links. ``links``: {(sender namespace key, minor):
    "SRC>DST"}; ``run_tc(sender) -> text``: ``tc -s -j class show dev eth0`` in that sender's
    namespace. Writes the shaper_links record at once."""

    def __init__(self, links: dict[tuple[str, int], str], meta: list[dict], run_tc: Callable[[str], str], writer):
        self.links, self.run_tc, self.writer = links, run_tc, writer
        self.senders = sorted({s for s, _ in links})
        self.errors: list[str] = []
        writer.write({"type": "shaper_links", "shaper": "htb", "links": meta})

    def __call__(self, now: float) -> None:
        backlog: dict[str, int] = {}
        read, failed = _read_senders(self.senders, self.run_tc, parse_tc_classes, self.errors)
        for sender, classes in read.items():
            for minor, c in classes.items():
                name = self.links.get((sender, minor))
                if name and c["backlog_bytes"]:
                    backlog[name] = c["backlog_bytes"]
        # A sender that could not be read is missing from this sample, not a zero backlog.
        self.writer.write({"type": "shaper", "t": now, "backlog": backlog, "senders": self.senders,
                           **({"failed": failed} if failed else {})})


def _read_senders(senders: list[str], run: Callable[[str], str], parse: Callable[[str], dict],
                  errors: list[str]) -> tuple[dict[str, dict], list[str]]:
    """Each sender's parsed reading, and the senders that could not be read (missing from
    this sample, not zero); the first 10 errors are kept in ``errors``."""
    read, failed = {}, []
    for sender in senders:
        try:
            read[sender] = parse(run(sender))
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            failed.append(sender)
            if len(errors) < 10:
                errors.append(f"{sender}: {e}")
    return read, failed


class SocketSource:
    """The kernel's TCP send queues of each sender toward each node (/proc/PID/net/tcp of a
    process in the sender's namespace, or ``ss`` there): data tor has handed to the kernel that
    the link has not carried yet, where neither the shaper's statistics nor CELL_STATS see it.
    ``peers``: {IPv4 address: node}; ``run_ss(sender) -> text`` in either format. Records ``{"type": "sockets", "t", "send_q": {"SRC>DST":
    bytes}, ["failed": [SRC]]}`` (only non-zero queues)."""

    def __init__(self, senders: list[str], peers: dict[str, str], run_ss: Callable[[str], str], writer):
        self.senders, self.peers, self.run_ss, self.writer = sorted(senders), peers, run_ss, writer
        self.errors: list[str] = []

    def __call__(self, now: float) -> None:
        send_q: dict[str, int] = {}
        read, failed = _read_senders(self.senders, self.run_ss, parse_send_queues, self.errors)
        for sender, queues in read.items():
            for addr, q in queues.items():
                if q and addr in self.peers:
                    # Several sockets toward one peer (Torchestra's pair, circswitch's second
                    # connection, every pod of a peer group on Kubernetes) share its link: summed.
                    key = f"{sender}>{self.peers[addr]}"
                    send_q[key] = send_q.get(key, 0) + q
        self.writer.write({"type": "sockets", "t": now, "send_q": send_q, "senders": self.senders,
                           **({"failed": failed} if failed else {})})


class LinkemuSource:
    """linkemu's rate-limited links, from its control socket's ``backlog`` op."""

    def __init__(self, socket_path: str | Path, writer, request=None):
        from .linkemu_control import request as default_request
        self.socket_path, self.writer = socket_path, writer
        self.request = request or default_request
        self.seen: dict[str, dict] = {}
        self.errors: list[str] = []
        writer.write({"type": "shaper_links", "shaper": "linkemu", "links": []})

    def __call__(self, now: float) -> None:
        from .linkemu_control import EmulatorError
        try:
            links = self.request(self.socket_path, {"op": "backlog"}, timeout=2.0)["backlog"]["links"]
        except (EmulatorError, OSError, KeyError) as e:
            if len(self.errors) < 10:
                self.errors.append(str(e))
            return
        new = []
        for entry in links:
            name = f"{entry['src']}>{entry['dst']}"
            if name not in self.seen:
                self.seen[name] = {"link": name, "rate_bps": entry["rate_bps"], "delay_s": 0.0}
                new.append(self.seen[name])
        if new:   # links appear as they first carry a frame
            self.writer.write({"type": "shaper_links", "shaper": "linkemu", "links": new})
        self.writer.write({"type": "shaper", "t": now,
                           "backlog": {f"{e['src']}>{e['dst']}": e["backlog_bytes"]
                                       for e in links if e["backlog_bytes"]}})


class NoShaper:
    """No link has a rate (shaper "none"): the header says so, and there is nothing to sample."""

    def __init__(self, writer):
        self.writer = writer
        writer.write({"type": "shaper_links", "shaper": "none", "links": []})

    def __call__(self, now: float) -> None:
        pass


class CpuSource:
    """The machine's CPU counters and each process' (``procs() -> {name: (pid, role, group)}``);
    ``threads_of``: names whose threads are sampled too (a CPU-bound target); ``source``: the
    sampler's name in each record, where several write one file (a Kubernetes pod each)."""

    def __init__(self, procs: Callable[[], dict[str, tuple[int, str, str | None]]], writer,
                 proc: str | Path = "/proc", threads_of: tuple[str, ...] = (), source: str | None = None):
        self.procs, self.writer, self.proc, self.threads_of = procs, writer, proc, set(threads_of)
        self.source = source
        self.hz = hostload._ticks_per_s()

    def __call__(self, now: float) -> None:
        rec: dict = {"type": "cpu", "t": now, "hz": self.hz, "host": read_host(self.proc), "procs": {}}
        if self.source is not None:
            rec["source"] = self.source
        threads = {}
        for name, (pid, role, group) in sorted(self.procs().items()):
            # torbed's own entry counts its reaped children (the sampler's tc and ss), so the
            # gate's cost is "ours", not "other processes'".
            got = read_process(pid, self.proc, threads=name in self.threads_of, children=role == "torbed")
            if got is None:
                continue
            if "threads" in got:
                threads[name] = got.pop("threads")
            # The pid marks a restarted process: its counters start again (analysis.gates).
            rec["procs"][name] = {"role": role, "group": group, "pid": pid, **got}
        if threads:
            rec["threads"] = threads
        self.writer.write(rec)


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


class Sampler:
    """A daemon thread calling every source once per ``interval`` seconds (on a fixed grid,
    so a slow sample does not shift the next), until ``stop()``. A source that raises is
    recorded in ``errors`` and called again at the next sample."""

    def __init__(self, interval: float, sources: list[Callable[[float], None]]):
        self.interval, self.sources = interval, sources
        self.errors: list[str] = []
        self.durations: list[float] = []      # seconds each sample took (wall time)
        self.cpu_s = 0.0                       # CPU time the samples cost: this thread and its tc/ss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gate-sampler", daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        next_t = time.time()
        while not self._stop.is_set():
            now = time.time()
            cpu0, kids0 = time.thread_time(), _children_cpu()
            for src in self.sources:
                try:
                    src(now)
                except Exception as e:    # noqa: BLE001 - a sample lost is recorded, the run goes on
                    if len(self.errors) < 10:
                        self.errors.append(f"{type(src).__name__}: {type(e).__name__}: {e}")
            self.durations.append(time.time() - now)
            # Children reaped meanwhile are this sample's tc and ss processes (the supervised
            # processes are reaped only when they stop, after the sampler).
            self.cpu_s += time.thread_time() - cpu0 + _children_cpu() - kids0
            next_t += self.interval
            self._stop.wait(max(0.0, next_t - time.time()))

    def stop(self) -> list[str]:
        """Stop after a last sample; returns the errors (the sources' own included)."""
        self._stop.set()
        self._thread.join(10)
        if not self._thread.is_alive():
            now = time.time()
            for src in self.sources:
                try:
                    src(now)
                except Exception as e:    # noqa: BLE001
                    self.errors.append(f"{type(src).__name__}: {e}")
        for src in self.sources:
            if hasattr(src, "writer"):
                src.writer.close()
        return self.errors + [e for s in self.sources for e in getattr(s, "errors", [])]

