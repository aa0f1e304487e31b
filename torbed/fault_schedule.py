"""The fault schedule every backend shares: each scenario fault applied at its time, undone
at the end of its duration, at the end of the workload (faults without a duration) and,
always, at teardown; a timeline of what was done in ``faults.jsonl`` (docs/records.md).

How a kind is done is the backend's: it hands ``FaultRunner`` its context and one
``Action`` class per kind (torbed.backends.local.faults, torbed.backends.k8s.faults).

Public API:

- ``FaultRunner(rep, t_work, ctx, kinds)``: ``.tick(now)`` applies/undoes what is due and
  returns when the next event is due (or None); ``.finish(reason)`` undoes every fault still
  in force (idempotent; never raises; errors go to meta.json ``teardown_errors``)
- ``Action``: one fault in force (``apply``/``undo``), subclassed per kind by a backend
- ``link_pairs(plan, fault) -> [(src, dst)]``: the directed node pairs a link fault changes
"""

from __future__ import annotations

import time

from .errors import RunFailed
from .records import RecordWriter
from .scenario import Fault, fault_nodes


class Action:
    """One fault in force. ``apply`` and ``undo`` return what they did (one line);
    ``mechanism`` says how the backend carried it out (faults.jsonl, the report's timeline)."""
    undoable = True
    mechanism: str | None = None

    def __init__(self, index: int, fault: Fault, nodes: list[str]):
        self.index, self.fault, self.nodes = index, fault, nodes
        self.meta: dict | None = None   # its meta.json "faults" entry once applied

    def apply(self, ctx) -> str:
        raise NotImplementedError

    def undo(self, ctx, reason: str) -> str:
        raise NotImplementedError


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



def _params(f: Fault) -> dict:
    return {k: v for k, v in f.model_dump(mode="json", exclude_none=True).items()
            if k not in ("at", "kind", "target", "between", "duration") and v is not False}


class FaultRunner:
    """The repetition's faults on schedule. Times in faults.jsonl are Unix seconds;
    ``t_planned`` is when the event was due."""

    def __init__(self, rep, t_work: float, ctx, kinds: dict[str, type[Action]]):
        self.rep = rep
        # Each backend brings its context (``ctx.plan`` at least) and its action per kind.
        self.ctx = ctx
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
        except (OSError, RunFailed) as e:
            self._record(i, f, "apply", t_planned=due, t_done=time.time(), error=str(e))
            raise RunFailed(f"faults[{i}] ({f.kind} {f.target or ' / '.join(f.between)}) could not be applied: {e}")
        extra = getattr(action, "record", {})   # what else an action wants kept (k8s: pods, objects)
        # How the fault was carried out on this backend (the kind's meaning is the same on each).
        extra = {"mechanism": getattr(action, "mechanism", None), **extra}
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
        except (OSError, RunFailed) as e:
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
