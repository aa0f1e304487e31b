"""Background load (Locust, load.jsonl) in the report: what each repetition carried.

load.jsonl holds the Locust master's statistics every load.stats_interval and at the end
(docs/records.md). The report shows one row per repetition beside the foreground clients'
own numbers, so a reader sees how much load each variant carried while it was measured.

Public API:

- ``LOAD_FILE``; ``read(path) -> [dict]`` (a line cut by a crash is skipped)
- ``load_rows(run) -> [dict]``: one row per repetition that has load.jsonl
- ``rep_row(records) -> dict | None``: totals of one repetition's records
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .load import Run, read_typed

LOAD_FILE = "load.jsonl"


def read(path: Path) -> list[dict]:
    return read_typed(path, "load", "total", dict)


def rep_row(records: list[dict]) -> dict | None:
    """Totals and whole-run response-time percentiles of the last record; peak users; mean
    requests/s and bytes/s between the first and last record with users running."""
    if not records:
        return None
    last = records[-1]["total"]
    busy = [r for r in records if r.get("users", 0) > 0]
    span = busy[-1]["t"] - busy[0]["t"] if len(busy) > 1 else 0.0
    first = busy[0]["total"] if busy else last
    return {"users": max(r.get("users", 0) for r in records), "requests": last["requests"],
            "failures": last["failures"], "bytes": last["bytes"],
            "requests_per_s": (last["requests"] - first["requests"]) / span if span else None,
            "bytes_per_s": (last["bytes"] - first["bytes"]) / span if span else None,
            **{k: last.get(f"{k}_all") for k in ("p50_ms", "p90_ms", "p99_ms")}}


def load_rows(run: Run) -> list[dict]:
    rows = []
    for r in run.reps:
        if r.path is None or not (r.path / LOAD_FILE).is_file():
            continue
        row = rep_row(read(r.path / LOAD_FILE))
        if row is None:
            continue
        ttlb = [t["ttlb_s"] for t in r.measured_transfers if t.get("status") == "ok" and t.get("ttlb_s") is not None]
        rows.append({"variant": r.variant, "rep": r.index, **row,
                     "foreground_transfers": len(r.measured_transfers),
                     "foreground_ttlb_median_s": float(np.median(ttlb)) if ttlb else None})
    return rows
