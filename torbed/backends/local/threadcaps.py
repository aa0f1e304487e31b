"""Per-thread CPU caps: a slow multi-core CPU emulated inside a few fast cores.

A relay group's ``cpu_per_thread: 20%`` gives every thread of its tor a CFS quota of its own
(20 ms of CPU per 100 ms period), so a relay with N busy threads can use N x 20% of a core,
as on a multi-core CPU whose every core is a fifth as fast. A quota on the whole process
(the ``cpu`` fault) would cap the threads together and hide what extra threads buy, which
is what Engler & Goldberg measure (issue 37 item 2e).

The kernel allows this where a cpu cgroup holds single threads: cgroup v1's ``cpu``
controller (its ``tasks`` file takes thread ids), or cgroup v2 in threaded mode
(``cgroup.type`` = ``threaded``; ``cpu`` is a threaded controller). Each thread gets a
cgroup of its own, ``torbed-tcap-<label>-<tid>``, beside the cgroup the process is in.
Threads tor starts later share their creator's cgroup until the next ``scan()``; a
``ThreadCaps`` started with ``start()`` scans every ``interval`` seconds.

Public API:

- ``mode() -> str | None``: "v1", "v2" or None (no per-thread cpu cgroups here)
- ``check() -> str | None``: why per-thread caps cannot run here, or None
- ``ThreadCaps(pid, fraction, label, interval=1.0)``: ``.scan() -> int`` (threads newly
  capped), ``.start()``, ``.stop()`` (threads back to the process's cgroup, cgroups
  removed), ``.describe() -> dict`` for meta.json
- ``leftovers(run_id) -> [Path]``: a killed run's per-thread cgroups (torbed.backends.local.lifetime)
- ``PERIOD_US``: the CFS period of every cap
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
PREFIX = "torbed-tcap-"


def mode() -> str | None:
    if (ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        return "v1"
    if (ROOT / "cgroup.controllers").exists() and "cpu" in (ROOT / "cgroup.controllers").read_text().split():
        return "v2"
    return None


def _base() -> Path:
    return ROOT / "cpu" if mode() == "v1" else ROOT


def _cgroup_of(pid: int) -> Path:
    m = mode()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (m == "v1" and "cpu" in controllers.split(",")) or (m == "v2" and controllers == ""):
            return _base() / path.lstrip("/")
    raise OSError(f"no cpu cgroup for pid {pid}")


def check() -> str | None:
    """Why per-thread caps cannot run here (None: they can). Creates and removes a probe."""
    m = mode()
    if m is None:
        return f"no cgroup cpu controller under {ROOT}"
    probe = _base() / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
        _set_quota(probe, 0.5)
    except OSError as e:
        return f"cannot make a capped cgroup in {_base()} ({e.strerror}); run as root outside a user namespace"
    finally:
        try:
            probe.rmdir()
        except OSError:
            pass
    return None


def _set_quota(cg: Path, fraction: float) -> None:
    quota = max(1000, int(round(fraction * PERIOD_US)))
    if mode() == "v1":
        (cg / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (cg / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        (cg / "cpu.max").write_text(f"{quota} {PERIOD_US}")


class ThreadCaps:
    """Every thread of ``pid`` in a cpu cgroup of its own with a quota of ``fraction`` of a core."""

    def __init__(self, pid: int, fraction: float, label: str, interval: float = 1.0):
        if not 0.01 <= fraction <= 1.0:
            raise ValueError(f"a per-thread cap is 1%..100% of a core, got {fraction:.0%}")
        self.pid, self.fraction, self.label, self.interval = pid, fraction, label, interval
        self.home = _cgroup_of(pid)
        self.capped: dict[int, Path] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tids(self) -> list[int]:
        try:
            return sorted(int(t) for t in os.listdir(f"/proc/{self.pid}/task"))
        except OSError:
            return []

    def scan(self) -> int:
        """Cap the threads not capped yet; returns how many."""
        new = 0
        for tid in self._tids():
            if tid in self.capped:
                continue
            cg = self.home / f"{PREFIX}{self.label}-{tid}"
            try:
                cg.mkdir(exist_ok=True)
                if mode() == "v2":
                    (cg / "cgroup.type").write_text("threaded")
                _set_quota(cg, self.fraction)
                (cg / ("tasks" if mode() == "v1" else "cgroup.threads")).write_text(str(tid))
            except OSError as e:
                if os.path.exists(f"/proc/{self.pid}/task/{tid}"):
                    self.errors.append(f"thread {tid}: {e.strerror or e}")
                continue
            self.capped[tid] = cg
            new += 1
        return new

    def start(self) -> "ThreadCaps":
        self.scan()
        self._thread = threading.Thread(target=self._loop, name=f"threadcaps-{self.label}", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.scan()

    def stop(self) -> None:
        """Threads back to the process's cgroup, the per-thread cgroups removed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        member = "tasks" if mode() == "v1" else "cgroup.threads"
        for tid, cg in self.capped.items():
            try:
                (self.home / member).write_text(str(tid))
            except OSError:
                pass   # the thread has ended
            for _ in range(20):
                try:
                    cg.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)

    def describe(self) -> dict:
        return {"pid": self.pid, "cap_per_thread": self.fraction, "period_us": PERIOD_US, "cgroup_mode": mode(),
                "threads_capped": sorted(self.capped), "errors": self.errors[:20]}


def leftovers(run_id: str) -> list[Path]:
    """Per-thread cgroups of a run that died before its teardown (its watchdog and ``torbed
    clean`` remove them): anywhere in the cpu hierarchy, beside the cgroup its tor was in."""
    if mode() is None:
        return []
    return sorted(p for p in _base().rglob(f"{PREFIX}{run_id}-*") if p.is_dir())


def start_for(rep) -> list[ThreadCaps]:
    """Cap every thread of the tors of relay groups with ``cpu_per_thread`` (local backend);
    recorded in meta.json ``thread_caps``. Nothing for a scenario without it."""
    from . import state
    st = state.of(rep)
    groups = {g: rg.cpu_per_thread for g, rg in rep.scenario.network.relays.items() if rg.cpu_per_thread}
    caps = []
    for n in st.plan.nodes:
        if n.role != "relay" or n.group not in groups:
            continue
        proc = st.sup.procs.get(n.name)
        if not proc or proc[0].poll() is not None:
            continue
        caps.append(ThreadCaps(proc[0].pid, groups[n.group].fraction, f"{st.run_id}-{n.name}").start())
    if caps:
        rep.meta["thread_caps"] = {c.label: c.describe() for c in caps}
    return caps


def stop_all(rep, caps: list[ThreadCaps]) -> None:
    """Undo ``start_for`` and record every thread that was capped."""
    for c in caps:
        c.stop()
    if caps:
        rep.meta["thread_caps"] = {c.label: c.describe() for c in caps}
