"""Clock correction of per-cell delays: clock.jsonl (replay/clock.py exchanges) -> per-client
offset estimates -> corrected delays and their uncertainty.

A downstream chunk is stamped sent on the server's clock and received on the client's, an
upstream one the other way round; with the estimated offset theta(t) = server - client at
client time t:

    down: delay = t_recv + theta(t_recv) - t_sent        up: delay = t_recv - (t_sent + theta(t_sent))

Each corrected delay is off by at most the estimate's bound at that time, so a mean of
corrected delays is off by at most the mean of their bounds (``clock_bound_ms`` in
summary.json), and any quantile by at most the largest bound. Repetitions without
clock.jsonl (runs made before it existed) are left uncorrected and their bound is unknown.

Public API: ``read_clock(path) -> records`` (raises RecordError), ``estimates(rep) -> {client:
Estimate}``, ``correction(rep, table) -> (offset_s, bound_s)`` per cells.jsonl row,
``clock_rows(run) -> list[dict]`` (summary.json ``clock``), ``within(diff, bound) -> bool``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..replay.clock import Estimate, estimate, read_exchanges
from .errors import RecordError
from .load import Rep, Run, iter_jsonl

CLOCK_FILE = "clock.jsonl"
TYPES = ("clock_exchange", "clock_estimate")


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_clock(path: Path) -> list[dict]:
    """clock.jsonl's records; a truncated last line is dropped. Raises RecordError (file,
    line) for a record that is not a clock record or lacks its fields."""
    out = []
    for i, rec in iter_jsonl(path):
        if rec is None:
            continue
        if not isinstance(rec, dict) or rec.get("type") not in TYPES:
            raise RecordError(path, i, f"expected a clock record (type {' or '.join(TYPES)})")
        if not isinstance(rec.get("client"), str):
            raise RecordError(path, i, "clock record lacks 'client'")
        if rec["type"] == "clock_exchange" and rec.get("status") == "ok" and \
                not all(_num(rec.get(k)) for k in ("t1", "t2", "t3", "t4")):
            raise RecordError(path, i, "clock_exchange with status ok needs numeric t1, t2, t3, t4")
        out.append(rec)
    return out


def estimates(rep: Rep) -> dict[str, Estimate]:
    """Each replay client's estimate for this repetition (recomputed from the exchanges;
    cached on the Rep)."""
    cached = getattr(rep, "_clock_estimates", None)
    if cached is not None:
        return cached
    path = rep.path / CLOCK_FILE
    out: dict[str, Estimate] = {}
    if path.is_file():
        for client, (ex, lost) in read_exchanges(read_clock(path)).items():
            est = estimate(ex, lost)
            if est is not None:
                out[client] = est
    rep._clock_estimates = out   # type: ignore[attr-defined]
    return out


def correction(rep: Rep, table) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``table`` (a CellTable): the offset in seconds to add to t_recv - t_sent
    (already signed for the row's direction) and its bound in seconds (NaN: no estimate
    for that row's client)."""
    n = len(table)
    add = np.zeros(n)
    bound = np.full(n, np.nan)
    ests = estimates(rep)
    if not ests or not n:
        return add, bound
    clients = np.array([str(r[0]) for r in table.replays] or [""], dtype=object)
    row_client = clients[table.replay]
    down = table.direction == 0
    # Both clocks' times are compared on the client's: receive time down, send time up.
    t_client = np.where(down, table.t_recv, table.t_sent)
    for client, est in ests.items():
        sel = row_client == client
        if not sel.any():
            continue
        theta = est.offset_at(t_client[sel])
        add[sel] = np.where(down[sel], theta, -theta)
        bound[sel] = est.bounds_at(t_client[sel])
    return add, bound


def clock_rows(run: Run) -> list[dict]:
    """One row per (variant, repetition, client) with an estimate, for summary.json."""
    rows = []
    for r in run.reps:
        if r.path is None or not (r.path / CLOCK_FILE).is_file():
            continue
        for client, est in sorted(estimates(r).items()):
            rows.append({"variant": r.variant, "rep": r.index, "client": client, **est.to_record()})
    return rows


def within(diff: float | None, bound: float | None) -> bool:
    """Whether a difference of means is no larger than the clock uncertainty of the two."""
    return diff is not None and bound is not None and abs(diff) <= bound
