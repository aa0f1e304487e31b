"""Fault injection on the local backend: each scenario fault applied at its time, undone at
the end of its duration, at the end of the workload (faults without a duration) and, always,
at teardown; a timeline of what was done in ``faults.jsonl`` (docs/records.md).

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

- ``FaultRunner(rep, t_work, emulator=None)``: ``.tick(now)`` applies/undoes what is due and
  returns when the next event is due (or None); ``.finish(reason)`` undoes every fault still
  in force (idempotent; never raises; errors go to meta.json ``teardown_errors``)
- ``check_cpu_cgroups() -> str | None``: why CPU faults cannot run here, or None
- ``remove_cgroups(paths)``: remove leftover fault cgroups (``torbed clean``)
- ``FAULTS``: kind -> action class; ``link_pairs(plan, fault) -> [(src, dst)]``
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from . import emulator as emulator_mod
from ...errors import RunFailed
from ...records import RecordWriter
from ...scenario import Fault, fault_nodes

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


class Action:
    """One fault in force. ``apply`` and ``undo`` return what they did (one line)."""
    undoable = True

    def __init__(self, index: int, fault: Fault, nodes: list[str]):
        self.index, self.fault, self.nodes = index, fault, nodes
        self.meta: dict | None = None   # its meta.json "faults" entry once applied

    def apply(self, ctx: _Ctx) -> str:
        raise NotImplementedError

    def undo(self, ctx: _Ctx, reason: str) -> str:
        raise NotImplementedError


class Kill(Action):
    undoable = False

    def apply(self, ctx):
        for n in self.nodes:
            ctx.sup.kill(n)
        return f"SIGKILL tor of {', '.join(self.nodes)}"

    def undo(self, ctx, reason):
        return "nothing to undo (a killed tor stays down)"


class Pause(Action):
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


def link_pairs(plan, fault: Fault) -> list[tuple[str, str]]:
    """The directed node pairs a link fault changes: both directions between the two sides
    of ``between``, or every link of the ``target``'s nodes."""
    s = plan.scenario
    if fault.between is not None:
        a, b = (fault_nodes(s, side) for side in fault.between)
        return [(x, y) for x in a for y in b] + [(y, x) for x in a for y in b]
    mine = fault_nodes(s, fault.target)
    others = [n.name for n in plan.nodes if n.name not in mine]
    return [(x, y) for x in mine for y in others] + [(y, x) for x in mine for y in others]


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
# The schedule and the timeline

def _params(f: Fault) -> dict:
    return {k: v for k, v in f.model_dump(mode="json", exclude_none=True).items()
            if k not in ("at", "kind", "target", "between", "duration") and v is not False}


class FaultRunner:
    """The repetition's faults on schedule. Times in faults.jsonl are Unix seconds;
    ``t_planned`` is when the event was due."""

    def __init__(self, rep, t_work: float, emulator=None, ctx=None, kinds: dict | None = None):
        st = rep.state
        self.rep = rep
        # Another backend (torbed.backends.k8s.faults) brings its own context and actions.
        self.ctx = ctx if ctx is not None else _Ctx(st["sup"], st["plan"], emulator, st["run_id"])
        kinds = kinds or FAULTS
        self.writer = RecordWriter(rep.dir / "faults.jsonl")
        self.active: dict[int, Action] = {}
        self.events: list[tuple[float, int, str]] = []   # (time due, fault index, "apply" | "undo")
        s = rep.scenario
        for i, f in enumerate(s.faults):
            nodes = fault_nodes(s, f.target) if f.target is not None else \
                [n for side in f.between for n in fault_nodes(s, side)]
            t_apply = t_work + f.at.seconds
            t_undo = None
            if f.kind == "restart":
                t_undo = t_apply + (f.duration.seconds if f.duration is not None else 0.0)
            elif f.kind != "kill" and f.duration is not None:
                t_undo = t_apply + f.duration.seconds
            self.events.append((t_apply, i, "apply"))
            if t_undo is not None:
                self.events.append((t_undo, i, "undo"))
            self._record(i, f, "planned", nodes=nodes, t_apply_planned=t_apply, t_undo_planned=t_undo,
                         params=_params(f), pairs=len(link_pairs(self.ctx.plan, f)) if f.kind == "link" else None)
            self.active[i] = kinds[f.kind](i, f, nodes)
        self.events.sort(key=lambda e: (e[0], e[2] == "apply", e[1]))   # undo before apply at one time
        self.applied: set[int] = set()

    def _record(self, i: int, f: Fault, event: str, **kw) -> None:
        self.writer.write({"type": "fault", "event": event, "fault": i, "kind": f.kind, "target": f.target,
                           "between": f.between, "at": f.at, "duration": f.duration, "t": time.time(),
                           "variant": self.rep.variant, "rep": self.rep.index, **kw})

    def tick(self, now: float) -> float | None:
        """Apply and undo what is due by ``now``; returns when the next event is due.
        Raises RunFailed when a fault cannot be applied (the run would not measure what the
        scenario says)."""
        while self.events and self.events[0][0] <= now:
            due, i, what = self.events.pop(0)
            action = self.active[i]
            if what == "apply":
                self._apply(action, due)
            elif i in self.applied:
                self._undo(action, due, "duration")
        return self.events[0][0] if self.events else None

    def _apply(self, action: Action, due: float) -> None:
        f, i = action.fault, action.index
        self.applied.add(i)
        t = time.time()
        try:
            done = action.apply(self.ctx)
        except (OSError, emulator_mod.EmulatorError, RunFailed) as e:
            self._record(i, f, "apply", t_planned=due, t_done=time.time(), error=str(e))
            raise RunFailed(f"faults[{i}] ({f.kind} {f.target or ' / '.join(f.between)}) could not be applied: {e}")
        extra = getattr(action, "record", {})   # what else an action wants kept (k8s: pods, objects)
        self._record(i, f, "apply", t_planned=due, t_done=time.time(), done=done, t=t,
                     pids=getattr(action, "pids", None),
                     cgroup=str(action.group) if getattr(action, "group", None) else None, **extra)
        action.meta = {"at": f.at, "kind": f.kind, "target": f.target, "between": f.between,
                       "nodes": action.nodes, "t": t, "t_undo": None, **extra}
        self.rep.meta["faults"].append(action.meta)
        self.rep.console.log(f"fault {i}: {done} (+{t - due:.2f} s late)")
        self.rep.write_meta()
        if not action.undoable:
            self.applied.discard(i)

    def _undo(self, action: Action, due: float | None, reason: str) -> None:
        f, i = action.fault, action.index
        self.applied.discard(i)
        t = time.time()
        try:
            done = action.undo(self.ctx, reason)
        except (OSError, emulator_mod.EmulatorError, RunFailed) as e:
            self._record(i, f, "undo", t_planned=due, reason=reason, error=str(e))
            raise RunFailed(f"faults[{i}] ({f.kind}) could not be undone: {e}")
        self._record(i, f, "undo", t_planned=due, t_done=time.time(), reason=reason, done=done, t=t)
        if action.meta is not None:
            action.meta["t_undo"] = t
        self.rep.console.log(f"fault {i} undone ({reason}): {done}")

    def finish(self, reason: str) -> None:
        """Undo every fault still in force (``reason``: "end" when the workload ended,
        "teardown" otherwise). Never raises: what could not be undone is recorded in
        meta.json ``teardown_errors``."""
        self.events = []
        for i in sorted(self.applied):
            try:
                self._undo(self.active[i], None, reason)
            except Exception as e:   # every other fault must still be undone
                self.rep.meta.setdefault("teardown_errors", []).append(f"faults[{i}] undo: {e}")
        cleanup = getattr(self.ctx, "cleanup", None)   # k8s: Chaos Mesh objects still there
        if cleanup is not None:
            self.rep.meta.setdefault("teardown_errors", []).extend(cleanup())
            if not self.rep.meta["teardown_errors"]:
                del self.rep.meta["teardown_errors"]
        self.rep.write_meta()
