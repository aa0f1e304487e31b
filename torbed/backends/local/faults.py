"""Fault injection on the local backend: the actions ``torbed.fault_schedule.FaultRunner``
applies and undoes on schedule (the schedule and the faults.jsonl timeline are shared with
the Kubernetes backend).

How each kind is done here (docs/faults.md has the table):

- kill: SIGKILL of the node's tor (no undo: it stays down);
- pause: SIGSTOP of the tor's process group, SIGCONT to undo;
- restart: SIGTERM (SIGKILL after a grace), then the same command again after ``duration``;
- link: linkemu's runtime link changes (``emulator.set_link``) on every directed node pair
  the fault names; the properties in force before are read first and set back to undo;
- cpu: a CFS quota (cgroup v1 ``cpu`` controller, or ``cpu.max`` on cgroup v2) on a cgroup of
  torbed's own holding the tor, which moves back to its old cgroup to undo (the cgroup is
  then removed; ``torbed clean`` removes it after a SIGKILLed run).

Public API:

- ``make_runner(rep, t_work, emulator=None) -> FaultRunner``: the repetition's faults on
  these actions
- ``check_cpu_cgroups() -> str | None``: why CPU faults cannot run here, or None
- ``remove_cgroups(paths)``: remove leftover fault cgroups (``torbed clean``)
- ``FAULTS``: kind -> action class; ``faulted_props(props, fault)``
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from ...errors import RunFailed
from ...fault_schedule import Action, FaultRunner, link_pairs
from ...scenario import Fault

CGROUP_ROOT = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000        # the kernel's default period; the quota is a share of it
RESTART_GRACE_S = 5.0


# ---------------------------------------------------------------------------------------
# cgroups

def _cgroup_mode() -> str | None:
    """'v1' (a mounted cpu controller), 'v2' (unified hierarchy) or None."""
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        return "v1"
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return "v2"
    return None


def _cpu_base() -> Path:
    return CGROUP_ROOT / "cpu" if _cgroup_mode() == "v1" else CGROUP_ROOT


def check_cpu_cgroups() -> str | None:
    """Why CPU faults cannot be applied on this machine (None: they can). Makes and removes
    a probe cgroup: only writing tells whether we may (a user namespace may not)."""
    mode = _cgroup_mode()
    if mode is None:
        return f"no cgroup cpu controller under {CGROUP_ROOT}"
    if mode == "v2" and "cpu" not in (CGROUP_ROOT / "cgroup.subtree_control").read_text().split():
        return f"cgroup v2 without the cpu controller enabled in {CGROUP_ROOT}/cgroup.subtree_control"
    probe = _cpu_base() / f"torbed-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        return f"cannot create a cgroup in {_cpu_base()} ({e.strerror}); run as root outside a user namespace"
    return None


def _cgroup_of(pid: int) -> Path:
    """The cpu cgroup directory ``pid`` is in now."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (_cgroup_mode() == "v1" and "cpu" in controllers.split(",")) or \
                (_cgroup_mode() == "v2" and controllers == ""):
            return _cpu_base() / path.lstrip("/")
    raise OSError(f"no cpu cgroup for pid {pid}")


def remove_cgroups(paths) -> None:
    """Empty (into their parent) and remove fault cgroups left by a run that died."""
    for p in map(Path, paths):
        for _ in range(20):   # a process killed just before may take a moment to leave
            if not p.is_dir():
                break
            try:
                pids = (p / "cgroup.procs").read_text().split()
            except OSError:
                break
            for pid in pids:
                try:
                    (p.parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass   # gone already
            try:
                p.rmdir()
            except OSError:
                time.sleep(0.05)


# ---------------------------------------------------------------------------------------
# The kinds

class _Ctx:
    """What an action may use: the supervisor, the plan, linkemu, the run id."""

    def __init__(self, sup, plan, emulator, run_id: str):
        self.sup, self.plan, self.emulator, self.run_id = sup, plan, emulator, run_id

    def pid(self, node: str) -> int | None:
        proc = self.sup.procs.get(node)
        return proc[0].pid if proc and proc[0].poll() is None else None


class Kill(Action):
    undoable = False
    mechanism = "torbed supervisor: SIGKILL to tor"

    def apply(self, ctx):
        for n in self.nodes:
            ctx.sup.kill(n)
        return f"SIGKILL tor of {', '.join(self.nodes)}"

    def undo(self, ctx, reason):
        return "nothing to undo (a killed tor stays down)"


class Pause(Action):
    mechanism = "torbed supervisor: SIGSTOP / SIGCONT to tor's process group"

    def apply(self, ctx):
        self.stopped: dict[str, int] = {}
        for n in self.nodes:
            pid = ctx.pid(n)
            if pid is not None:
                os.killpg(pid, signal.SIGSTOP)
                self.stopped[n] = pid
        self.pids = dict(self.stopped)
        return "SIGSTOP " + ", ".join(f"{n} (pid {p})" for n, p in self.stopped.items())

    def undo(self, ctx, reason):
        done = []
        for n, pid in self.stopped.items():
            try:
                os.killpg(pid, signal.SIGCONT)
                done.append(n)
            except ProcessLookupError:
                pass
        self.stopped = {}
        return "SIGCONT " + ", ".join(done)


class Restart(Action):
    mechanism = "torbed supervisor: SIGTERM to tor (SIGKILL after 5 s), the same command again after the duration"

    def apply(self, ctx):
        self.down = []
        for n in self.nodes:
            if ctx.pid(n) is None:
                continue
            ctx.sup.killed.add(n)   # on purpose: not an unexpected exit
            ctx.sup.stop([n], grace=RESTART_GRACE_S)
            self.down.append(n)
        return f"stopped tor of {', '.join(self.down)} (SIGTERM)"

    def undo(self, ctx, reason):
        if reason != "duration":   # the run is over: nothing to come back for
            down, self.down = self.down, []
            return f"not started again ({reason}): {', '.join(down)}"
        started = []
        for n in self.down:
            started.append(f"{n} (pid {ctx.sup.respawn(n).pid})")
        self.down = []
        return "started again: " + ", ".join(started)


def faulted_props(props: dict, f: Fault) -> dict:
    """A link's linkemu properties with the fault applied: delay added, the others replaced."""
    out = dict(props)
    if f.partition:
        out["loss"] = 1.0
        out.pop("loss_burst", None)
        return out
    if f.delay is not None:
        out["delay_s"] = out.get("delay_s", 0.0) + f.delay.seconds
    if f.jitter is not None:
        out["jitter_s"] = f.jitter.seconds
    if f.loss is not None:
        out["loss"] = f.loss.fraction
        out.pop("loss_burst", None)
    if f.rate is not None:
        out["rate_bps"] = f.rate.bps
    return out


class Link(Action):
    mechanism = "linkemu: runtime link change"

    def apply(self, ctx):
        if ctx.emulator is None:
            raise RunFailed("a link fault needs linkemu as the shaper (links.emulator: auto or linkemu)")
        self.saved: dict[tuple[str, str], dict] = {}
        pairs = link_pairs(ctx.plan, self.fault)
        for src, dst in pairs:
            old = ctx.emulator.get_link(src, dst)
            # Saved before the change: a failure halfway leaves only saved pairs to undo.
            self.saved[(src, dst)] = old
            ctx.emulator.set_link(src, dst, faulted_props(old, self.fault), symmetric=False)
        what = "partition" if self.fault.partition else ", ".join(
            f"{k} {getattr(self.fault, k)}" for k in ("delay", "jitter", "loss", "rate") if getattr(self.fault, k))
        return f"linkemu: {what} on {len(pairs)} directed links"

    def undo(self, ctx, reason):
        saved, self.saved = self.saved, {}
        for (src, dst), props in saved.items():
            ctx.emulator.set_link(src, dst, props, symmetric=False)
        return f"linkemu: {len(saved)} directed links set back"


class Cpu(Action):
    mechanism = "torbed: CFS quota on a cgroup of its own"

    def apply(self, ctx):
        self.moved: dict[str, tuple[int, Path]] = {}
        self.group = _cpu_base() / f"torbed-{ctx.run_id}-fault{self.index}"
        self.group.mkdir()
        ctx.sup.update_state(cgroups=ctx.sup.state.get("cgroups", []) + [str(self.group)])
        quota = max(1000, int(self.fault.cpu.fraction * CFS_PERIOD_US))
        if _cgroup_mode() == "v1":
            (self.group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (self.group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.group / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
        for n in self.nodes:
            pid = ctx.pid(n)
            if pid is None:
                continue
            old = _cgroup_of(pid)
            (self.group / "cgroup.procs").write_text(str(pid))
            self.moved[n] = (pid, old)
        self.pids = {n: p for n, (p, _) in self.moved.items()}
        return f"cgroup {self.group.name}: quota {quota} us per {CFS_PERIOD_US} us on " + \
            ", ".join(f"{n} (pid {p})" for n, (p, _) in self.moved.items())

    def undo(self, ctx, reason):
        moved, self.moved = self.moved, {}
        for pid, old in moved.values():
            try:
                (old / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                pass
            except OSError as e:
                if e.errno != 3:   # ESRCH: the process is gone
                    raise
        remove_cgroups([self.group])
        if self.group.exists():
            raise OSError(f"cgroup {self.group} could not be removed")
        ctx.sup.update_state(cgroups=[c for c in ctx.sup.state.get("cgroups", []) if c != str(self.group)])
        return f"quota removed, {', '.join(moved)} back in their cgroup"


FAULTS: dict[str, type[Action]] = {"kill": Kill, "pause": Pause, "restart": Restart, "link": Link, "cpu": Cpu}


# ---------------------------------------------------------------------------------------


def make_runner(rep, t_work: float, emulator=None) -> FaultRunner:
    """The repetition's faults on this backend's actions (``emulator``: linkemu, for link faults)."""
    st = rep.state
    return FaultRunner(rep, t_work, _Ctx(st.sup, st.plan, emulator, st.run_id), FAULTS)
