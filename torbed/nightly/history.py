"""The nightly history store: one SQLite file per history directory.

Why SQLite: it is in Python's standard library, an append is one transaction (a crash or
Ctrl-C mid-ingest leaves the store as it was, never half a night), concurrent readers are
safe, and questions like "the last 7 nights of this variant on this hardware" are one query.
Parquet would need pyarrow and rewrites files to append.

Self-describing and versioned: table ``meta`` holds ``schema_version`` (``SCHEMA_VERSION``),
the torbed version that created the store and a description of every table; a store with
a newer schema is refused rather than misread.

Tables:

- ``runs``: one row per (run directory, variant): the night it belongs to, scenario name and
  identity hash, variant, tor and torbed versions, hardware, backend, host, status, run dir
- ``reps``: per run, metric and repetition: number of samples, median, mean
- ``samples``: per run, metric and repetition: the raw values (at most ``MAX_SAMPLES`` per
  repetition, an evenly spaced subsample of the sorted values beyond that, which keeps the
  distribution's quantiles)

Public API:

- ``History(directory)``: ``ingest(run_dir, night, nightly=None) -> list[int]``,
  ``series(key_fields, metric) -> {key: [Night]}``, ``keys()``, ``close()``
- ``Night``: ``night``, ``run_ids``, ``rep_medians`` (list), ``samples`` (np.ndarray)
- ``HistoryError``
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import RunFailed

SCHEMA_VERSION = 1
FILENAME = "history.sqlite"
MAX_SAMPLES = 2000

TABLES = {
    "meta": "key TEXT PRIMARY KEY, value TEXT NOT NULL",
    "runs": ("id INTEGER PRIMARY KEY, night TEXT NOT NULL, ingested TEXT NOT NULL, run_dir TEXT NOT NULL, "
             "nightly TEXT, scenario TEXT NOT NULL, scenario_sha256 TEXT, variant TEXT NOT NULL, "
             "tor_version TEXT, torbed_version TEXT, hardware TEXT, backend TEXT, host TEXT, "
             "status TEXT, repetitions INTEGER, UNIQUE(run_dir, variant)"),
    "reps": ("run_id INTEGER NOT NULL REFERENCES runs(id), metric TEXT NOT NULL, rep INTEGER NOT NULL, "
             "n INTEGER NOT NULL, median REAL, mean REAL, PRIMARY KEY(run_id, metric, rep)"),
    "samples": "run_id INTEGER NOT NULL REFERENCES runs(id), metric TEXT NOT NULL, rep INTEGER NOT NULL, value REAL NOT NULL",
}
DESCRIPTION = {
    "runs": "one row per run directory and variant; columns usable as comparison keys: "
            "scenario (name), scenario_sha256 (identity of its resolved content), variant, tor_version, torbed_version, hardware, backend, host",
    "reps": "per run, metric id (as in summary.json) and repetition: n, median, mean",
    "samples": f"raw metric values per repetition, at most {MAX_SAMPLES} (evenly spaced over the sorted values)",
}


class HistoryError(RunFailed):
    """The history store cannot be used (unreadable, newer schema, bad run directory)."""


@dataclass
class Night:
    night: str
    run_ids: list[int] = field(default_factory=list)
    rep_medians: list[float] = field(default_factory=list)
    samples: np.ndarray = field(default_factory=lambda: np.array([], dtype=float))

    @property
    def value(self) -> float:
        """The night's summary: the median of its repetitions' medians (the repetition, a fresh
        network, is the unit of replication)."""
        return float(np.median(self.rep_medians)) if self.rep_medians else float("nan")


def scenario_identity(resolved: dict) -> str:
    """Hash of the resolved scenario without the fields a nightly matrix varies (variants,
    baseline, repetitions): adding a variant keeps the others' history comparable, while any
    change to the network, links, workload or duration starts a new history."""
    core = {k: v for k, v in resolved.items() if k not in ("variants", "baseline", "repetitions")}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]


def hardware_of(host: dict) -> str:
    """A short, comparable description of the machine a run's host was."""
    mem = host.get("memory_bytes") or 0
    parts = [str(host.get("arch") or "?")]
    if host.get("cpu_model"):
        parts.append(str(host["cpu_model"]))
    parts.append(f"{host.get('cpus') or '?'} CPUs")
    parts.append(f"{round(mem / (1 << 30))} GiB")
    return ", ".join(parts)


def cluster_hardware_of(reps) -> str | None:
    """For a Kubernetes run: the nodes its repetitions ran on, counted by hardware kind
    (analysis.hardware: architecture the pods ran as, torbed.io/hardware label, emulated),
    CPU model and CPUs, e.g. "k8s: 1 x amd64, AMD EPYC, 2 CPUs; 1 x arm64/rpi (emulated), ...".
    Node names are left out, so a renamed node keeps the key; another kind of node changes
    it. None for a run without meta.json ``hardware`` (the local backend: its host is the
    hardware)."""
    from ..analysis.hardware import hardware_kind
    nodes: dict[str, dict] = {}
    for r in reps:
        hw = (r.meta or {}).get("hardware")
        if isinstance(hw, dict):
            nodes.update({name: h for name, h in hw.items() if isinstance(h, dict)})
    if not nodes:
        return None
    kinds: dict[str, int] = {}
    for h in nodes.values():
        k = f"{hardware_kind(h)}, {h.get('cpu_model') or '?'}, {h.get('cpus') or '?'} CPUs"
        kinds[k] = kinds.get(k, 0) + 1
    return "k8s: " + "; ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))


def _subsample(values: np.ndarray) -> np.ndarray:
    if len(values) <= MAX_SAMPLES:
        return values
    s = np.sort(values)
    idx = np.linspace(0, len(s) - 1, MAX_SAMPLES).round().astype(int)
    return s[idx]


class History:
    """The store in ``directory`` (created with its schema if missing)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.dir / FILENAME)
        except (OSError, sqlite3.Error) as e:
            raise HistoryError(f"{self.dir}: cannot open the history store: {e}") from None
        try:
            self._init_schema()
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise HistoryError(f"{self.dir / FILENAME}: not a torbed history store ({e})") from None

    def _init_schema(self) -> None:
        cur = self.db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='meta'")
        if cur.fetchone():
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise HistoryError(f"{self.dir / FILENAME}: schema version {version} is newer than this "
                                   f"torbed's ({SCHEMA_VERSION}); upgrade torbed")
            if version != SCHEMA_VERSION:
                raise HistoryError(f"{self.dir / FILENAME}: schema version {version} is not supported")
            return
        with self.db:
            for name, cols in TABLES.items():
                self.db.execute(f"CREATE TABLE {name} ({cols})")
            self.db.execute("CREATE INDEX samples_by_run ON samples(run_id, metric)")
            meta = {"schema_version": str(SCHEMA_VERSION), "created_by": f"torbed {__version__}",
                    "format": "torbed nightly history", **{f"table.{k}": v for k, v in DESCRIPTION.items()}}
            self.db.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))

    def close(self) -> None:
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- writing

    def ingest(self, run_dir: str | Path, night: str, nightly: str | None = None) -> list[int]:
        """Add every variant of a finished run directory under ``night`` (one transaction).
        Re-ingesting the same run directory replaces its rows. Returns the new run ids."""
        from ..analysis.load import load_run
        from ..analysis.metrics import extract
        from ..analysis.errors import AnalysisError
        run_dir = Path(run_dir).resolve()
        try:
            run = load_run(run_dir)
        except AnalysisError as e:
            raise HistoryError(f"{run_dir}: {e}") from None
        info = json.loads((run_dir / "run.json").read_text())
        resolved = info.get("scenario") or {}
        scenario = str(info.get("name"))
        host = info.get("host") or {}
        extracted = extract(run)
        runs = []
        for variant in run.variants:
            reps = [r for r in run.reps if r.variant == variant]
            fields = {"run_dir": str(run_dir), "nightly": nightly, "scenario": scenario,
                      "scenario_sha256": scenario_identity(resolved), "variant": variant,
                      "tor_version": info.get("tor_version"), "torbed_version": info.get("torbed_version"),
                      "hardware": cluster_hardware_of(reps) or hardware_of(host),
                      "backend": info.get("backend", "local"),
                      "host": host.get("hostname"), "repetitions": len(reps),
                      "status": "ok" if reps and all(r.status == "ok" for r in reps) else "partial"}
            metrics = {mid: ms.values.get(variant, {}) for mid, ms in extracted.metrics.items()}
            runs.append((fields, metrics))
        ids = []
        with self.db:
            old = [r[0] for r in self.db.execute("SELECT id FROM runs WHERE run_dir=?", (str(run_dir),))]
            for rid in old:
                for t in ("samples", "reps"):
                    self.db.execute(f"DELETE FROM {t} WHERE run_id=?", (rid,))
            self.db.execute("DELETE FROM runs WHERE run_dir=?", (str(run_dir),))
            for fields, metrics in runs:
                ids.append(self._record(night, fields, metrics))
        return ids

    RUN_FIELDS = ("run_dir", "nightly", "scenario", "scenario_sha256", "variant", "tor_version",
                  "torbed_version", "hardware", "backend", "host", "status", "repetitions")

    def record(self, night: str, fields: dict, metrics: dict[str, dict[int, object]]) -> int:
        """Add one run of one variant from values already at hand (``metrics``: metric id ->
        repetition -> values), in one transaction; ``fields`` fills the ``runs`` columns
        (``run_dir``, ``scenario`` and ``variant`` at least). Returns the run id."""
        with self.db:
            return self._record(night, fields, metrics)

    def _record(self, night: str, fields: dict, metrics: dict[str, dict[int, object]]) -> int:
        unknown = set(fields) - set(self.RUN_FIELDS)
        if unknown:
            raise HistoryError(f"unknown run field(s): {', '.join(sorted(unknown))}")
        cols = ["night", "ingested", *self.RUN_FIELDS]
        row = [night, None, *(fields.get(k) for k in self.RUN_FIELDS)]
        marks = ", ".join("datetime('now')" if c == "ingested" else "?" for c in cols)
        cur = self.db.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({marks})",
                              [v for c, v in zip(cols, row) if c != "ingested"])
        rid = cur.lastrowid
        for mid, reps in metrics.items():
            for k, vals in sorted(reps.items()):
                vals = np.asarray(vals, dtype=float)
                vals = vals[np.isfinite(vals)]
                if not len(vals):
                    continue
                self.db.execute("INSERT INTO reps VALUES (?, ?, ?, ?, ?, ?)",
                                (rid, mid, int(k), len(vals), float(np.median(vals)), float(np.mean(vals))))
                self.db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?)",
                                    [(rid, mid, int(k), float(v)) for v in _subsample(vals)])
        return rid

    # ---------------------------------------------------------------- reading

    def keys(self, key_fields: list[str]) -> list[tuple]:
        cols = ", ".join(key_fields)
        return [tuple(r) for r in self.db.execute(f"SELECT DISTINCT {cols} FROM runs ORDER BY {cols}")]

    def metrics(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT metric FROM reps ORDER BY metric")]

    def series(self, key_fields: list[str], metric: str) -> dict[tuple, list[Night]]:
        """Per comparison key, the nights (oldest first) with this metric's data."""
        cols = ", ".join(f"runs.{k}" for k in key_fields)
        rows = self.db.execute(
            f"SELECT {cols}, runs.night, runs.id, reps.rep, reps.median FROM reps JOIN runs ON runs.id = reps.run_id "
            f"WHERE reps.metric=? ORDER BY runs.night, runs.id, reps.rep", (metric,)).fetchall()
        out: dict[tuple, dict[str, Night]] = {}
        nk = len(key_fields)
        for row in rows:
            key, (night, rid, _rep, median) = tuple(row[:nk]), row[nk:]
            n = out.setdefault(key, {}).setdefault(night, Night(night))
            if rid not in n.run_ids:
                n.run_ids.append(rid)
            n.rep_medians.append(median)
        for nights in out.values():
            for n in nights.values():
                marks = ",".join("?" * len(n.run_ids))
                vals = self.db.execute(f"SELECT value FROM samples WHERE metric=? AND run_id IN ({marks})",
                                       (metric, *n.run_ids)).fetchall()
                n.samples = np.array([v[0] for v in vals], dtype=float)
        return {k: [v[night] for night in sorted(v)] for k, v in out.items()}
