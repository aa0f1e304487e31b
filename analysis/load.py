"""Reading a run directory (docs/records.md, schema 1) into memory, tolerating partial runs.

A repetition that crashed, was interrupted or never ran is loaded as far as it got; what is
missing is described in ``Rep.notes`` (the report prints them), never raised. What *is* raised
is input that cannot be trusted: no run.json, or a record that is not a JSON object with its
required keys. The one exception is the last line of a JSON-lines file without a trailing
newline that does not parse: the writer died mid-record, so the line is dropped with a note.

Public API:

- ``load_run(run_dir) -> Run``               raises RunDirError, RecordError
- ``read_jsonl(path, kind) -> (records, notes)``  raises RecordError
- ``read_cells(path) -> (CellTable, notes)``  cells.jsonl as numpy columns
- ``Run``: ``path``, ``info`` (run.json), ``name`` (directory name), ``scenario_name``,
  ``variants``, ``baseline``, ``repetitions``, ``seed``, ``reps`` (variant-major order),
  ``rep(variant, k)``, ``reps_of(variant)``
- ``Rep``: ``variant``, ``index``, ``path``, ``meta``, ``status``, ``error``, ``transfers``,
  ``cellstats``, ``relay_bw``, ``cells`` (CellTable of cells.jsonl or None), ``notes``, ``t0`` (workload start), ``warmup_s``,
  ``measured_transfers`` (warmup and cancelled excluded), ``censored_transfers`` (cancelled,
  after warm-up), ``censor_time(transfer)``, ``window_end``, ``node(name)``
- ``FILES``: the record files read, with their record type and required keys
"""

from __future__ import annotations

import json
import math
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import RecordError, RunDirError

# file name -> (record "type", keys every record must have)
FILES: dict[str, tuple[str, tuple[str, ...]]] = {
    "transfers.jsonl": ("transfer", ("status", "warmup")),
    "cellstats.jsonl": ("cellstats", ("relay", "t")),
    "relay_bw.jsonl": ("relay_bw", ("relay", "t", "written")),
}
# Read when present, without a note when absent (the k8s backend has no resources.jsonl;
# metrics.jsonl only when the metrics collector ran): the report's relay-load and
# per-node resource figures.
OPTIONAL_FILES: dict[str, tuple[str, tuple[str, ...]]] = {
    "metrics.jsonl": ("metrics", ("relay", "t", "samples")),
    "resources.jsonl": ("resources", ("node", "t", "cpu_s", "rss_bytes")),
    # The clients' circuits and their guard-channel ids (runs before it existed lack it: their
    # circuits are not known by client, analysis/circuits.py).
    "circuits.jsonl": ("client_circuit", ("client", "event")),
}
# cells.jsonl (replay workloads; absent otherwise, without a note) can hold millions of
# records: it is read into columns (CellTable), not kept as dicts.
CELLS_FILE = "cells.jsonl"
CELL_REQUIRED = ("direction", "t_sched", "t_sent", "t_recv")

# Statuses a repetition can have here: meta.json's, plus the two we infer.
NOT_RUN = "not run"          # no rep-<k> directory at all
NO_META = "unknown"          # directory but no meta.json


@dataclass
class Rep:
    """One repetition of one variant, as far as it was recorded."""

    variant: str
    index: int
    path: Path
    meta: dict | None = None
    status: str = NOT_RUN
    error: str | None = None
    transfers: list[dict] = field(default_factory=list)
    cellstats: list[dict] = field(default_factory=list)
    relay_bw: list[dict] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)
    resources: list[dict] = field(default_factory=list)
    circuits: list[dict] = field(default_factory=list)
    cells: "CellTable | None" = None
    notes: list[str] = field(default_factory=list)
    files: set[str] = field(default_factory=set)

    @property
    def label(self) -> str:
        return f"variant {self.variant} rep {self.index}"

    @property
    def t0(self) -> float | None:
        """Workload start (meta.json t_workload_start), else the earliest record time, else None."""
        if self.meta and isinstance(self.meta.get("t_workload_start"), (int, float)):
            return float(self.meta["t_workload_start"])
        ts = [r["t"] for r in self.relay_bw + self.cellstats if _is_num(r.get("t"))]
        ts += [r["t_start"] for r in self.transfers if _is_num(r.get("t_start"))]
        return min(ts) if ts else None

    @property
    def warmup_s(self) -> float:
        """The scenario's warm-up (meta.json warmup_s), 0 when unknown."""
        if self.meta and _is_num(self.meta.get("warmup_s")):
            return float(self.meta["warmup_s"])
        return 0.0

    @property
    def measured_transfers(self) -> list[dict]:
        """Transfers outside the warm-up window (``warmup`` is not true) and not cut off by
        the end of the measurement (``status: cancelled``)."""
        return [t for t in self.transfers if t.get("warmup") is not True and t.get("status") != "cancelled"]

    @property
    def window_end(self) -> float | None:
        """End of the measurement window (t_workload_start + duration_s), None when unknown."""
        m = self.meta or {}
        if _is_num(m.get("t_workload_start")) and _is_num(m.get("duration_s")):
            return float(m["t_workload_start"]) + float(m["duration_s"])
        return None

    @property
    def censored_transfers(self) -> list[dict]:
        """Transfers outside the warm-up that the end of the measurement cut off (``status:
        cancelled``): right-censored observations (analysis/survival.py), not errors."""
        return [t for t in self.transfers if t.get("warmup") is not True and t.get("status") == "cancelled"]

    def censor_time(self, t: dict) -> float | None:
        """When a cancelled transfer stopped being observed: its ``t_censor``, else (records
        from before that field) the window end."""
        return float(t["t_censor"]) if _is_num(t.get("t_censor")) else self.window_end

    def node(self, name: str) -> dict | None:
        """The meta.json node entry called ``name``, or None."""
        for n in (self.meta or {}).get("nodes") or []:
            if isinstance(n, dict) and n.get("name") == name:
                return n
        return None

    def describe(self) -> str:
        """One line saying what this repetition holds, e.g. for the report's 'missing' list."""
        status = self.status
        if self.error:
            status += f" ({self.error})"
        n = len(self.transfers)
        m = len(self.measured_transfers)
        return f"{self.label}: {status}; {n} transfers ({m} after warm-up)"


@dataclass
class Run:
    """A run directory: run.json plus every (variant, repetition) it announces."""

    path: Path
    info: dict
    reps: list[Rep]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def scenario_name(self) -> str:
        sc = self.info.get("scenario")
        if isinstance(sc, dict) and sc.get("name"):
            return str(sc["name"])
        return str(self.info.get("name") or self.path.name)

    @property
    def variants(self) -> list[str]:
        return list(self.info["variants"])

    @property
    def baseline(self) -> str:
        b = self.info.get("baseline")
        return b if b in self.variants else self.variants[0]

    @property
    def repetitions(self) -> int:
        return int(self.info["repetitions"])

    @property
    def seed(self) -> int:
        s = self.info.get("seed")
        return int(s) if isinstance(s, int) and not isinstance(s, bool) else 0

    def rep(self, variant: str, k: int) -> Rep:
        """The repetition ``k`` of ``variant``; raises KeyError when the run has no such rep."""
        for r in self.reps:
            if r.variant == variant and r.index == k:
                return r
        raise KeyError(f"{variant} rep {k}")

    def reps_of(self, variant: str) -> list[Rep]:
        return [r for r in self.reps if r.variant == variant]


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def iter_jsonl(path: Path):
    """(line number, parsed value) for every non-blank line of a JSON-lines file; a final
    line without newline that does not parse (a crash mid-write) yields (line, None).
    Raises RecordError(path, line) for any other line that is not JSON."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    unterminated = not text.endswith("\n") and text != ""
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as e:
            if unterminated and i == len(lines):
                yield i, None
                continue
            raise RecordError(path, i, f"not valid JSON ({e.msg} at column {e.colno})") from None


def read_typed(path: Path, rtype: str, key: str, key_type: type) -> list[dict]:
    """The object records of type ``rtype`` whose ``key`` holds a ``key_type``, from a
    JSON-lines file that a process may have been killed while writing: unparseable lines
    (a cut last line) and other records are skipped, not errors (faults.jsonl, load.jsonl)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("type") == rtype and isinstance(rec.get(key), key_type):
            out.append(rec)
    return out


def read_jsonl(path: Path, kind: str) -> tuple[list[dict], list[str]]:
    """Read one JSON-lines record file of ``kind`` (a key of FILES).

    Returns (records, notes). Blank lines are skipped; records of the expected type missing
    a required key, of another type, or not objects raise RecordError(path, line). A final
    line without newline that does not parse is dropped with a note (a crash mid-write).
    """
    rtype, required = FILES[kind] if kind in FILES else OPTIONAL_FILES[kind]
    records: list[dict] = []
    notes: list[str] = []
    for i, rec in iter_jsonl(path):
        if rec is None:
            notes.append(f"{kind} line {i}: truncated record (written when the run stopped) ignored")
            continue
        if not isinstance(rec, dict):
            raise RecordError(path, i, f"expected a JSON object, got {type(rec).__name__}")
        if rec.get("type", rtype) != rtype:
            raise RecordError(path, i, f"record type {rec.get('type')!r} in {kind} (expected {rtype!r})")
        missing = [k for k in required if k not in rec]
        if missing:
            raise RecordError(path, i, f"{rtype} record lacks {', '.join(repr(k) for k in missing)}")
        if "t" in required and not _is_num(rec["t"]):
            raise RecordError(path, i, f"'t' must be a number, got {rec['t']!r}")
        records.append(rec)
    return records, notes


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RecordError(path, e.lineno, f"not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise RecordError(path, None, f"not UTF-8 text ({e.reason})") from None
    if not isinstance(data, dict):
        raise RecordError(path, None, "expected a JSON object")
    return data


def _load_rep(run_dir: Path, variant: str, k: int) -> Rep:
    rep = Rep(variant=variant, index=k, path=run_dir / variant / f"rep-{k}")
    if not rep.path.is_dir():
        rep.notes.append(f"no directory {variant}/rep-{k} (the repetition never started)")
        return rep
    meta_path = rep.path / "meta.json"
    if meta_path.is_file():
        rep.meta = _read_json(meta_path)
        rep.status = str(rep.meta.get("status") or NO_META)
        err = rep.meta.get("error")
        rep.error = str(err) if err else None
        if rep.status == "running":
            rep.notes.append("meta.json still says 'running': the run was killed before it finished")
    else:
        rep.status = NO_META
        rep.notes.append("no meta.json")
    for kind in FILES:
        p = rep.path / kind
        if not p.is_file():
            rep.notes.append(f"no {kind}")
            continue
        rep.files.add(kind)
        records, notes = read_jsonl(p, kind)
        rep.notes += notes
        setattr(rep, kind.split(".")[0], records)
    for kind in OPTIONAL_FILES:
        p = rep.path / kind
        if p.is_file():
            rep.files.add(kind)
            records, notes = read_jsonl(p, kind)
            rep.notes += notes
            setattr(rep, kind.split(".")[0], records)
    if (rep.path / CELLS_FILE).is_file():
        rep.files.add(CELLS_FILE)
        rep.cells, notes = read_cells(rep.path / CELLS_FILE)
        rep.notes += notes
    return rep


@dataclass
class CellTable:
    """cells.jsonl of one repetition as columns. ``group``, ``flow`` and ``replay`` are codes
    into ``groups``, ``flows`` ((trace, flow)) and ``replays`` ((client, trace, flow,
    iteration)); ``direction`` is 0 for "d" (downstream), 1 for "u"."""

    groups: list[str]
    flows: list[tuple[str, str]]
    replays: list[tuple]
    group: np.ndarray
    direction: np.ndarray
    flow: np.ndarray
    replay: np.ndarray
    t_sched: np.ndarray
    t_sent: np.ndarray
    t_recv: np.ndarray
    warmup: np.ndarray

    def __len__(self) -> int:
        return int(self.t_sent.size)


def read_cells(path: Path) -> tuple[CellTable, list[str]]:
    """Read cells.jsonl into a CellTable. Raises RecordError (file, line) like read_jsonl;
    a truncated last line is dropped with a note."""
    codes: dict[str, dict] = {"group": {}, "flow": {}, "replay": {}}
    cols = {k: array("i") for k in ("group", "direction", "flow", "replay")}
    fcols = {k: array("d") for k in ("t_sched", "t_sent", "t_recv")}
    warm = array("b")
    notes: list[str] = []
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    unterminated = not data.endswith(b"\n") and data != b""
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if unterminated and i == len(lines):
                notes.append(f"{CELLS_FILE} line {i}: truncated record (written when the run stopped) ignored")
                continue
            raise RecordError(path, i, f"not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(rec, dict) or rec.get("type", "cell") != "cell":
            raise RecordError(path, i, "expected a cell record (a JSON object with type 'cell')")
        missing = [k for k in CELL_REQUIRED if k not in rec]
        if missing:
            raise RecordError(path, i, f"cell record lacks {', '.join(repr(k) for k in missing)}")
        if rec["direction"] not in ("d", "u") or not all(_is_num(rec[k]) for k in ("t_sched", "t_sent", "t_recv")):
            raise RecordError(path, i, "cell record needs direction 'd'|'u' and numeric t_sched/t_sent/t_recv")
        for col, key in (("group", str(rec.get("group"))), ("flow", (rec.get("trace"), rec.get("flow"))),
                         ("replay", (rec.get("client"), rec.get("trace"), rec.get("flow"), rec.get("iteration")))):
            cols[col].append(codes[col].setdefault(key, len(codes[col])))
        cols["direction"].append(0 if rec["direction"] == "d" else 1)
        for k in fcols:
            fcols[k].append(float(rec[k]))
        warm.append(1 if rec.get("warmup") is True else 0)
    return CellTable(groups=list(codes["group"]), flows=list(codes["flow"]), replays=list(codes["replay"]),
                     **{k: np.frombuffer(v, dtype=np.int32) if v.itemsize == 4 else np.array(v, dtype=np.int32)
                        for k, v in cols.items()},
                     **{k: np.frombuffer(v, dtype=np.float64) for k, v in fcols.items()},
                     warmup=np.frombuffer(warm, dtype=np.int8).astype(bool)), notes


def load_run(run_dir: str | Path) -> Run:
    """Load run.json and every repetition it announces (variants x repetitions).

    Raises RunDirError when ``run_dir`` is not a directory or run.json is missing or lacks
    ``variants``/``repetitions``; RecordError (file and line) for malformed records.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory (expected a RUN_DIR made by `torbed run`)")
    rj = run_dir / "run.json"
    if not rj.is_file():
        raise RunDirError(f"{rj}: missing (is {run_dir} a RUN_DIR made by `torbed run`?)")
    info = _read_json(rj)
    variants = info.get("variants")
    if not isinstance(variants, list) or not variants or not all(isinstance(v, str) and v for v in variants):
        raise RecordError(rj, None, "'variants' must be a non-empty list of variant names")
    bad = [v for v in variants if not re.fullmatch(r"[A-Za-z0-9._+-]+", v)]
    if bad:
        raise RecordError(rj, None, f"'variants' has names that are not directory names: {bad}")
    reps = info.get("repetitions")
    if not isinstance(reps, int) or isinstance(reps, bool) or reps < 1:
        raise RecordError(rj, None, "'repetitions' must be a positive integer")
    return Run(path=run_dir, info=info,
               reps=[_load_rep(run_dir, v, k) for v in variants for k in range(reps)])
