"""torbed.analysis: a run directory -> statistics, figures and a report (``torbed report``),
and two runs of one scenario -> a comparison (``torbed compare``).

Modules, one concern each:

    errors     the exception tree (InputError -> exit 2)
    load       reading a run directory: load_run(run_dir) -> Run
    metrics    metric definitions and extraction: extract(run), error_rates(run)
    stats      statistics on samples: quantiles, bootstrap CI, % change, KS / MWU, moving average
    summary    summary.json: summarize(...), dumps(...)
    figures    matplotlib figures: CDFs with repetition bands, quantile bars, time series
    render     report.md / report.html
    onionperf  export of transfers in onionperf's analysis JSON layout
    report     report(run_dir, baseline=None, out_dir=None) -> summary dict
    compare    compare(run_a, run_b, force=False, out_dir=None) -> comparison dict
    cli        register(subparsers, formatter_class): the ``report`` and ``compare`` commands

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
