"""``torbed nightly NIGHTLY.yaml --history DIR``: one night of the benchmark matrix.

For each matrix entry (in order): run the scenario with its overrides on the chosen backend
(each run directory under ``--out``, default DIR/runs), write its report, add it to the
history store, then assess tonight against the lookback nights and write the nightly
report under DIR/reports/<night>/. A failed run does not stop the others; whatever was
measured before a failure or Ctrl-C is still ingested and assessed.

Exit status (for a cron job or CI schedule): 0 nothing flagged (improvements are reported,
not failed, unless --fail-on any), 3 a regression flagged, 1 a run failed (takes precedence
over 3 when both), 2 bad input, 130 interrupted. Two nightlies never share a history at
once: DIR/.lock is held for the whole night.

Public API: ``run_night(spec, history_dir, ...) -> (exit_code, report_dict)`` (the codes are
torbed.errors'; ``EXIT_REGRESSION`` is 3)
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import time
from pathlib import Path
from typing import Callable

from .. import scenario as scenario_mod
from ..errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_REGRESSION, Interrupted, RunFailed
from .history import History
from .spec import NightlySpec

FAIL_ON = ("regression", "any", "never")


class NightlyBusy(RunFailed):
    """Another nightly holds the history directory."""


def tonight() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")


def prepare(spec: NightlySpec, entry) -> tuple[scenario_mod.Scenario, list[str]]:
    """The entry's scenario with its overrides applied (validated like `torbed run`'s
    options), and the variants to run."""
    path = spec.scenario_path(entry)
    s = scenario_mod.load(path)
    s = scenario_mod.with_overrides(s, str(path), repetitions=entry.repetitions,
                                    measure__duration=entry.duration)
    return s, list(entry.variants or s.variants)


def overrides_of(entry) -> dict:
    """The matrix entry's overrides as `torbed run` records its options in run.json
    (``{"repetitions": 5, "duration": "60s"}``, only those given): what ``torbed run
    --resume`` rebuilds the scenario from, and what tonight's report says was run."""
    return {k: v for k, v in (("repetitions", entry.repetitions), ("duration", entry.duration)) if v}


def run_night(spec: NightlySpec, history_dir: Path, run_scenario: Callable, console,
              out_dir: Path | None = None, night: str | None = None, fail_on: str = "regression",
              detect_only: bool = False) -> tuple[int, dict]:
    """Run the matrix (``run_scenario(scenario, out_dir, variants, source=, overrides=) ->
    run_dir``, source the scenario file and overrides the entry's, for run.json; it raises
    the backend's own errors, which count as a failed run, or KeyboardInterrupt-like
    ``Interrupted``), ingest, detect, report. Returns (exit code, the nightly report's JSON)."""
    history_dir.mkdir(parents=True, exist_ok=True)
    out_dir = out_dir or history_dir / "runs"
    night = night or tonight()
    lock = open(history_dir / ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise NightlyBusy(f"{history_dir}: another nightly is running (it holds {history_dir / '.lock'})") from None
    runs: list[dict] = []
    failed = interrupted = False
    t0 = time.monotonic()
    try:
        with History(history_dir) as hist:
            for i, entry in enumerate([] if detect_only else spec.matrix):
                s, variants = prepare(spec, entry)
                rec = {"scenario": s.name, "variants": variants, "status": "skipped", "run_dir": "",
                       "source": str(spec.scenario_path(entry)), "overrides": overrides_of(entry)}
                runs.append(rec)
                if time.monotonic() - t0 > spec.deadline_s:
                    rec["error"] = f"deadline {spec.deadline} passed before it started"
                    failed = True
                    continue
                console.log(f"nightly {spec.name} {night}: matrix[{i}] {s.name} x {', '.join(variants)}")
                ok, interrupted = _run_entry(rec, s, variants, run_scenario, out_dir, hist, night, spec.name)
                failed |= not ok
                if interrupted:
                    break
            from .detect import detect    # scipy: imported when a night is assessed, not by `torbed`'s start
            findings = detect(hist, spec, night)
    finally:
        lock.close()
    from .report import write_report   # matplotlib, likewise
    report = write_report(findings, spec, night, history_dir / "reports" / night, runs)
    if interrupted:
        return EXIT_INTERRUPTED, report
    if failed:
        return EXIT_FAILED, report
    flagged = {"regression": report["regressions"], "any": report["flagged"], "never": 0}[fail_on]
    return (EXIT_REGRESSION if flagged else EXIT_OK), report


def _run_entry(rec: dict, s, variants: list[str], run_scenario: Callable, out_dir: Path, hist: History,
               night: str, nightly: str) -> tuple[bool, bool]:
    """Run one matrix entry (``rec``: its record in tonight's report, updated), report it and
    add it to the history. Returns (ok, interrupted)."""
    from ..analysis.report import report as run_report
    failed = interrupted = False
    run_dir = None
    try:
        run_dir = run_scenario(s, out_dir, variants, source=rec["source"], overrides=rec["overrides"])
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as e:  # noqa: BLE001 - a failed run is recorded, then the next
        rec["status"], rec["error"] = "failed", f"{type(e).__name__}: {e}"
        run_dir = getattr(e, "run_dir", None)
        if isinstance(e, (Interrupted, KeyboardInterrupt)):
            rec["status"], interrupted = "interrupted", True
        failed = True
    if run_dir is None:
        return not failed, interrupted
    rec["run_dir"] = str(run_dir)
    info = json.loads((Path(run_dir) / "run.json").read_text())
    if rec["status"] == "skipped":
        rec["status"] = info.get("status", "?")
    failed |= rec["status"] != "ok"
    try:
        run_report(run_dir)
        hist.ingest(run_dir, night=night, nightly=nightly)
    except Exception as e:  # noqa: BLE001 - a run whose records cannot be read is a failed night
        rec["status"], rec["error"] = "failed", f"report/ingest: {type(e).__name__}: {e}"
        failed = True
    return not failed, interrupted
