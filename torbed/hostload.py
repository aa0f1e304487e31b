"""Is the machine quiet enough to measure on? A reading of the host's load before a run.

A run's numbers are only as good as the machine was quiet: on a shared machine another job's
CPU use lands in the measured latencies (tor's scheduling, the shaper, the clients), and
niceness does not remove it. So `torbed run` looks before the networks come up:

- the 1-minute load average (/proc/loadavg), and
- over a short sample (``SAMPLE_S``), the fraction of the machine's CPU time that was busy
  (/proc/stat: everything but idle and iowait) minus what our own process tree used, and
  which processes that are not ours used it (/proc/<pid>/stat utime + stime; ours = this
  process and its descendants).

The machine is *busy* when the busy fraction is at least ``MAX_BUSY_FRACTION`` or the load
average at least ``MAX_LOAD_PER_CPU`` x CPUs. By default that is a warning naming the top CPU
consumers; ``torbed run --require-quiet`` refuses to start (exit 2). Either way the reading
is recorded in run.json (``host_load``), so a report can be judged by it.

Every reader takes the /proc directory as a path (tests pass canned files).

Public API:

- ``SAMPLE_S``, ``MAX_BUSY_FRACTION``, ``MAX_LOAD_PER_CPU``, ``TOP_N``
- ``read_loadavg(proc) -> (l1, l5, l15)``
- ``read_cpu_times(proc) -> (busy_ticks, total_ticks, cpus)``
- ``read_processes(proc) -> {pid: (name, ppid, cpu_ticks)}``
- ``descendants(procs, root) -> set[int]``
- ``measure(proc="/proc", interval=SAMPLE_S, self_pid=None, sleep=time.sleep) -> dict``
- ``judge(reading, max_busy=..., max_load_per_cpu=...) -> dict``  adds "busy" and "reasons"
- ``describe(reading) -> str``   the warning's text
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SAMPLE_S = 1.0
# Busy: others used at least a fifth of the machine's CPU during the sample, or the load
# average says that on average three quarters of the CPUs had something to run in the last minute.
MAX_BUSY_FRACTION = 0.20
MAX_LOAD_PER_CPU = 0.75
TOP_N = 5


def _ticks_per_s() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not on Linux
        return 100


def read_loadavg(proc: str | Path = "/proc") -> tuple[float, float, float]:
    """The 1-, 5- and 15-minute load averages from <proc>/loadavg."""
    parts = (Path(proc) / "loadavg").read_text().split()
    return float(parts[0]), float(parts[1]), float(parts[2])


def read_cpu_times(proc: str | Path = "/proc") -> tuple[int, int, int]:
    """(busy ticks, total ticks, number of CPUs) from <proc>/stat's aggregate "cpu" line.

    Fields: user nice system idle iowait irq softirq steal guest guest_nice. guest and
    guest_nice are already counted in user and nice, so they are left out of the total; idle
    and iowait are not busy."""
    total = busy = 0
    cpus = 0
    for line in (Path(proc) / "stat").read_text().splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "cpu":
            vals = [int(x) for x in f[1:]] + [0] * 10
            user, nice, system, idle, iowait, irq, softirq, steal = vals[:8]
            total = user + nice + system + idle + iowait + irq + softirq + steal
            busy = total - idle - iowait
        elif f[0].startswith("cpu") and f[0][3:].isdigit():
            cpus += 1
    return busy, total, max(cpus, 1)


def _parse_pid_stat(text: str) -> tuple[str, int, int] | None:
    """(name, ppid, utime + stime) of one /proc/<pid>/stat line. The name is in parentheses
    and may itself hold spaces and parentheses, so the fields are counted after the last ')'."""
    lo, hi = text.find("("), text.rfind(")")
    if lo < 0 or hi < lo:
        return None
    rest = text[hi + 1:].split()
    # rest[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    if len(rest) < 13:
        return None
    try:
        return text[lo + 1:hi], int(rest[1]), int(rest[11]) + int(rest[12])
    except ValueError:
        return None


def read_processes(proc: str | Path = "/proc") -> dict[int, tuple[str, int, int]]:
    """{pid: (name, ppid, cpu ticks used so far)} for every process readable under <proc>
    (processes that exit while being read are skipped)."""
    out = {}
    for d in Path(proc).iterdir():
        if not d.name.isdigit():
            continue
        try:
            parsed = _parse_pid_stat((d / "stat").read_text())
        except OSError:
            continue
        if parsed:
            out[int(d.name)] = parsed
    return out


def descendants(procs: dict[int, tuple[str, int, int]], root: int) -> set[int]:
    """``root`` and every process whose parent chain leads to it."""
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.add(p)
        todo.extend(children.get(p, []))
    return out


def measure(proc: str | Path = "/proc", interval: float = SAMPLE_S, self_pid: int | None = None,
            sleep=time.sleep, ticks_per_s: int | None = None) -> dict:
    """Read the load average, sample CPU times over ``interval`` seconds, and judge.

    Returns {"loadavg": [l1, l5, l15], "cpus", "interval_s", "machine_busy_fraction",
    "ours_fraction", "busy_fraction" (machine minus ours), "others_cpu_fraction" (the
    processes seen in both readings), "top": [{"pid", "name", "cpu_cores"}], "busy",
    "reasons", "thresholds"}."""
    self_pid = os.getpid() if self_pid is None else self_pid
    hz = ticks_per_s or _ticks_per_s()
    b0, t0, cpus = read_cpu_times(proc)
    p0 = read_processes(proc)
    sleep(interval)
    b1, t1, cpus = read_cpu_times(proc)
    p1 = read_processes(proc)
    load = read_loadavg(proc)
    ours = descendants(p1, self_pid) | descendants(p0, self_pid)
    dt_total = max(t1 - t0, 1)
    machine = max(0, b1 - b0) / dt_total
    # Per process: CPU ticks used during the sample (processes seen in both readings).
    used = {pid: p1[pid][2] - p0[pid][2] for pid in p1 if pid in p0 and p1[pid][2] >= p0[pid][2]}
    capacity = interval * hz * cpus           # ticks the machine had in the interval
    ours_ticks = sum(u for pid, u in used.items() if pid in ours)
    others = {pid: u for pid, u in used.items() if pid not in ours and u > 0}
    top = sorted(others.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_N]
    reading = {
        "loadavg": list(load), "cpus": cpus, "interval_s": interval,
        "machine_busy_fraction": machine,
        "ours_fraction": min(1.0, ours_ticks / capacity) if capacity else 0.0,
        "others_cpu_fraction": min(1.0, sum(others.values()) / capacity) if capacity else 0.0,
        "top": [{"pid": pid, "name": p1[pid][0], "cpu_cores": u / (interval * hz)} for pid, u in top],
    }
    reading["busy_fraction"] = max(0.0, machine - reading["ours_fraction"])
    return judge(reading)


def judge(reading: dict, max_busy: float = MAX_BUSY_FRACTION, max_load_per_cpu: float = MAX_LOAD_PER_CPU) -> dict:
    """The reading with "busy" (bool), "reasons" (sentences) and "thresholds" added."""
    reasons = []
    cpus = reading.get("cpus") or 1
    if reading["busy_fraction"] >= max_busy:
        reasons.append(f"{100 * reading['busy_fraction']:.0f}% of the machine's CPU time was busy with other "
                       f"processes during a {reading['interval_s']:g} s sample (limit {100 * max_busy:.0f}%)")
    l1 = reading["loadavg"][0]
    if l1 >= max_load_per_cpu * cpus:
        reasons.append(f"1-minute load average {l1:.2f} on {cpus} CPU(s) (limit {max_load_per_cpu * cpus:.2f})")
    return {**reading, "busy": bool(reasons), "reasons": reasons,
            "thresholds": {"max_busy_fraction": max_busy, "max_load_per_cpu": max_load_per_cpu}}


def describe(reading: dict) -> str:
    """One paragraph for the warning (or the refusal): why busy, and the top CPU consumers."""
    top = ", ".join(f"{p['name']} (pid {p['pid']}, {100 * p['cpu_cores']:.0f}% of a CPU)" for p in reading["top"])
    text = "the machine is busy: " + "; ".join(reading["reasons"]) + "."
    text += f" Top CPU consumers that are not this run: {top}." if top else ""
    return text + (" Measurements taken now include that load; niceness does not remove it. "
                   "The reading is recorded in run.json (host_load).")
