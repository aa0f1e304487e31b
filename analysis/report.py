"""``torbed report``: a run directory -> RUN_DIR/report/ (the stage after ``torbed run``).

Writes, into the output directory (default RUN_DIR/report/):

    summary.json                      machine-readable (summary.py), stable for golden tests
    report.md                         figures linked from figures/
    report.html                       self-contained (figures embedded)
    figures/*.png
    onionperf/<variant>-rep<k>.onionperf.analysis.json

Public API:

- ``report(run_dir, baseline=None, out_dir=None, progress=None, primary=None) -> dict``
  returns the summary as written to summary.json (floats rounded; in report order,
  where the file has sorted keys); raises RunDirError,
  RecordError, UnknownVariantError (InputError: bad input) and OSError (cannot write).
  ``primary``: "METRIC" or "METRIC@VARIANT", the comparison declared before the run
  (summary.add_primary); the report's first sentence is about it.
- ``analyse(run_dir, baseline=None, primary=None) -> (run, extracted, summary)``  everything but writing
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from . import figures as figures_mod
from . import gates, metrics, onionperf, render, summary as summary_mod
from .errors import UnknownVariantError
from .load import Run, load_run
from .metrics import Extracted


def analyse(run_dir: str | Path, baseline: str | None = None,
            primary: str | None = None, keep_gate_invalid: bool = False) -> tuple[Run, Extracted, dict]:
    """Load, extract and summarize a run (nothing written). ``keep_gate_invalid``: repetitions
    a mechanism gate rejected stay in the statistics (said in the report's warnings).

    Returns (run, extracted samples, unrounded summary). Raises RunDirError, RecordError,
    and UnknownVariantError when ``baseline`` is not one of the run's variants.
    """
    run = load_run(run_dir)
    if baseline is not None and baseline not in run.variants:
        raise UnknownVariantError(f"--baseline {baseline!r} is not a variant of {run.path} "
                                  f"(variants: {', '.join(run.variants)})")
    base = baseline or run.baseline
    # The mechanism gates first: a repetition they reject is excluded from every statistic.
    judged = gates.exclude_invalid(run, keep=keep_gate_invalid)
    ex = metrics.extract(run)
    summ = summary_mod.summarize(run, ex, metrics.error_rates(run), base)
    if (rows := gates.summary_rows(run, judged, kept=keep_gate_invalid)) is not None:
        summ["gates"] = rows
    if primary:
        metric, _, variant = primary.partition("@")
        summary_mod.add_primary(summ, metric, variant or None)
    return run, ex, summ


def report(run_dir: str | Path, baseline: str | None = None, out_dir: str | Path | None = None,
           progress: Callable[[str], None] | None = None, primary: str | None = None,
           keep_gate_invalid: bool = False) -> dict:
    """Analyse ``run_dir`` and write the report files (see the module docstring).

    ``baseline`` overrides run.json's baseline; ``out_dir`` defaults to RUN_DIR/report;
    ``progress`` (optional) is called with a short message before each step; ``primary``
    and ``keep_gate_invalid`` as for ``analyse``.
    Returns the summary dict exactly as written to summary.json.
    """
    say = progress or (lambda msg: None)
    say("reading the run directory")
    run, ex, summ = analyse(run_dir, baseline, primary, keep_gate_invalid)
    out = Path(out_dir) if out_dir is not None else run.path / "report"
    out.mkdir(parents=True, exist_ok=True)
    rounded = summary_mod.round_floats(summ)

    say("drawing figures")
    fig_dir = out / "figures"
    if fig_dir.is_dir():
        for old in fig_dir.glob("*.png"):
            old.unlink()
    figs = figures_mod.make_all(run, ex, rounded, fig_dir)

    say("writing summary.json, report.md, report.html")
    (out / "summary.json").write_text(summary_mod.dumps(summ))
    blocks = render.blocks(rounded, figs)
    (out / "report.md").write_text(render.to_markdown(blocks, out))
    (out / "report.html").write_text(render.to_html(blocks, f"torbed report: {run.scenario_name}"))

    say("exporting transfers in onionperf format")
    onionperf.export(run, out / "onionperf")
    return rounded
