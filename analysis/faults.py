"""Faults in the report: what each repetition's faults did to its transfers.

faults.jsonl (local backend; docs/records.md) holds every fault's planned times and the
times it was actually applied and undone. For each applied fault of each repetition the
report splits the transfers (cancelled ones left out, warm-up ones kept: a fault may fall in
the warm-up) by their start: *before* the fault was applied, *during* it (applied, not yet
undone) and *after* it was undone (until the next fault is applied), each with its errors
by cause; and the time to recover: from the undo to the last byte of the first successful
transfer that completed after it.

Public API:

- ``FAULTS_FILE``; ``read(path) -> [dict]`` (a line cut by a crash is skipped)
- ``fault_rows(run) -> [dict]``: one row per applied fault per repetition
- ``planned_windows(run) -> [(start_s, end_s or None, label)]``: the faults' planned windows
  in seconds after the workload start (the same in every repetition), for time series
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .load import Run, read_typed

FAULTS_FILE = "faults.jsonl"


def read(path: Path) -> list[dict]:
    return read_typed(path, "fault", "fault", int)


def _describe(rec: dict) -> str:
    where = rec.get("target") or " <-> ".join(rec.get("between") or [])
    params = rec.get("params") or {}
    extra = ", ".join(f"{k} {v}" if v is not True else k for k, v in params.items())
    return f"{rec.get('kind')} {where}" + (f" ({extra})" if extra else "")


def _phase_counts(transfers: list[dict]) -> dict:
    causes = Counter((t.get("error") or {}).get("cause") or t.get("status") for t in transfers if t.get("status") != "ok")
    return {"transfers": len(transfers), "ok": sum(t.get("status") == "ok" for t in transfers),
            "errors": len(transfers) - sum(t.get("status") == "ok" for t in transfers),
            "causes": dict(sorted(causes.items()))}


def fault_rows(run: Run) -> list[dict]:
    rows = []
    for r in run.reps:
        if r.path is None or not (r.path / FAULTS_FILE).is_file() or r.t0 is None:
            continue
        recs = read(r.path / FAULTS_FILE)
        planned = {x["fault"]: x for x in recs if x.get("event") == "planned"}
        applied = {x["fault"]: x for x in recs if x.get("event") == "apply" and not x.get("error")}
        undone = {x["fault"]: x for x in recs if x.get("event") == "undo" and not x.get("error")}
        transfers = [t for t in r.transfers if t.get("status") != "cancelled" and isinstance(t.get("t_start"), (int, float))]
        t_end = (r.meta or {}).get("t_end")
        for i, a in sorted(applied.items()):
            p = planned.get(i, a)
            t_on = a["t"]
            u = undone.get(i)
            # A fault undone only at the end (no duration) lasts the whole rest of the run.
            t_off = u["t"] if u and u.get("reason") == "duration" else None
            before = [t for t in transfers if t["t_start"] < t_on]
            during = [t for t in transfers if t["t_start"] >= t_on and (t_off is None or t["t_start"] < t_off)]
            # 'After' ends where the next fault begins: its effects are its own row's.
            t_next = min((x["t"] for j, x in applied.items() if j != i and t_off is not None and x["t"] >= t_off),
                          default=None)
            after = [t for t in transfers if t_off is not None and t["t_start"] >= t_off
                     and (t_next is None or t["t_start"] < t_next)]
            recovered = sorted(t["t_last_byte"] for t in transfers if t.get("status") == "ok"
                               and t_off is not None and (t.get("t_last_byte") or 0) >= t_off)
            rows.append({
                "variant": r.variant, "rep": r.index, "fault": i, "kind": a.get("kind"),
                "what": _describe(p), "done": a.get("done"), "mechanism": a.get("mechanism"),
                "apply_s": t_on - r.t0, "apply_late_s": t_on - a["t_planned"] if a.get("t_planned") else None,
                "undo_s": None if t_off is None else t_off - r.t0,
                "undo_late_s": None if t_off is None or not u.get("t_planned") else t_off - u["t_planned"],
                "undone_at_end": bool(u) and t_off is None,
                "undo_reason": u.get("reason") if u else None,
                "before": _phase_counts(before), "during": _phase_counts(during),
                "after": _phase_counts(after) if t_off is not None else None,
                "after_until_s": None if t_next is None else t_next - r.t0,
                "recover_s": recovered[0] - t_off if recovered else None,
                "run_end_s": t_end - r.t0 if isinstance(t_end, (int, float)) else None,
            })
    return rows


def planned_windows(run: Run) -> list[tuple[float, float | None, str]]:
    """(start, end or None for 'to the end', label) of each fault as planned, in seconds
    after the workload start, from the first repetition with a faults.jsonl (the schedule is
    the same in every repetition)."""
    for r in run.reps:
        if r.path is None or not (r.path / FAULTS_FILE).is_file() or r.t0 is None:
            continue
        out = []
        for x in read(r.path / FAULTS_FILE):
            if x.get("event") != "planned" or not isinstance(x.get("t_apply_planned"), (int, float)):
                continue
            end = x.get("t_undo_planned")
            out.append((x["t_apply_planned"] - r.t0, None if end is None else end - r.t0,
                        f"fault {x['fault']}: {_describe(x)}"))
        return out
    return []
