"""Per-thread CPU caps (torbed.backends.local.threadcaps) on this kernel's cpu cgroups: each
thread of a process held to its own quota, late threads caught by the next scan, and
nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from torbed.backends.local import threadcaps

SPIN = """
import threading, time, sys
def spin():
    while True: pass
def later():
    time.sleep(1.0); spin()
for _ in range(2): threading.Thread(target=spin, daemon=True).start()
threading.Thread(target=later, daemon=True).start()
time.sleep(60)
"""


@pytest.fixture
def spinner():
    why = threadcaps.check()
    if why:
        pytest.skip(f"per-thread cpu cgroups unavailable here: {why}")
    p = subprocess.Popen([sys.executable, "-c", SPIN])
    time.sleep(0.3)
    yield p
    p.kill()
    p.wait()


def _cpu(pid: int) -> float:
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        f = open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
        total += int(f[11]) + int(f[12])
    return total / os.sysconf("SC_CLK_TCK")


def test_each_thread_is_held_to_its_cap_and_late_threads_are_caught(spinner):
    caps = threadcaps.ThreadCaps(spinner.pid, 0.05, f"test{spinner.pid}", interval=0.2).start()
    try:
        time.sleep(1.5)                        # the late thread starts and is caught
        a, t0 = _cpu(spinner.pid), time.time()
        time.sleep(2.0)
        used = (_cpu(spinner.pid) - a) / (time.time() - t0)
        threads = len(os.listdir(f"/proc/{spinner.pid}/task"))
        assert len(caps.capped) == threads and not caps.errors
        # Each thread is capped at 5%: the three spinning ones (and the idle main thread) at
        # most 15% plus a tick's granularity; uncapped they would take a core (the GIL).
        assert used <= 3 * 0.05 + 0.05, used
        for tid, cg in caps.capped.items():
            member = "tasks" if threadcaps.mode() == "v1" else "cgroup.threads"
            assert str(tid) in (cg / member).read_text().split()
    finally:
        caps.stop()
    left = [d for d in os.listdir(caps.home) if d.startswith(f"{threadcaps.PREFIX}test{spinner.pid}")]
    assert left == []
    # Every thread back in the process's own cgroup (its CPU then depends on the machine's load).
    member = "tasks" if threadcaps.mode() == "v1" else "cgroup.threads"
    home = set((caps.home / member).read_text().split())
    assert set(os.listdir(f"/proc/{spinner.pid}/task")) <= home


def test_a_cap_outside_one_percent_to_one_core_is_refused():
    with pytest.raises(ValueError, match="1%..100%"):
        threadcaps.ThreadCaps(os.getpid(), 1.5, "x")
