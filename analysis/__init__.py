"""torbed.analysis: a run directory -> statistics, figures and a report (``torbed report``),
and two runs of one scenario -> a comparison (``torbed compare``).

Modules, one concern each:

    errors     the exception tree (InputError -> exit 2)
    load       reading a run directory: load_run(run_dir) -> Run
    metrics    metric definitions and extraction: extract(run), error_rates(run)
    stats      statistics: quantiles, % change, KS / MWU (descriptive), moving average; Welch on
               per-repetition summaries, permutation p, Holm, power, cluster bootstrap
    inference  what is tested: per-repetition primary statistics, the Holm family, headline
    summary    summary.json: summarize(...), dumps(...)
    figures    matplotlib figures: CDFs with repetition bands, quantile bars, time series
    render     report.md / report.html
    onionperf  export of transfers in onionperf's analysis JSON layout
    report     report(run_dir, baseline=None, out_dir=None) -> summary dict
    compare    compare(run_a, run_b, force=False, out_dir=None) -> comparison dict
    aa         A/A calibration: one variant's repetitions split into two arms
    reproduce  ``make reproduce``: the seed papers' experiments -> docs/reproduction.md
    cli        register(subparsers, formatter_class): the ``report``, ``compare`` and ``aa`` commands

The functions ``report`` and ``compare`` re-exported here shadow their modules as package
attributes: import from the modules by name (``from torbed.analysis.report import analyse``).

Public API (re-exported here): ``report``, ``compare``, ``load_run``, ``AnalysisError``,
``InputError``, ``RunDirError``, ``RecordError``, ``UnknownVariantError``,
``ScenarioMismatchError``.
"""

from .compare import compare
from .errors import (AnalysisError, InputError, RecordError, RunDirError, ScenarioMismatchError,
                     UnknownVariantError)
from .load import load_run
from .report import report

__all__ = ["report", "compare", "load_run", "AnalysisError", "InputError", "RunDirError", "RecordError",
           "UnknownVariantError", "ScenarioMismatchError"]
