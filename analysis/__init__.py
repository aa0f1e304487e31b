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
    headline   the report's first sentence (finding, interval, p) and its figure; the terminal's
               80-column table of the outcome comparisons
    onionperf  export of transfers in onionperf's analysis JSON layout
    report     report(run_dir, baseline=None, out_dir=None) -> summary dict
    compare    compare(run_a, run_b, force=False, out_dir=None) -> comparison dict
    aa         A/A calibration: one variant's repetitions split into two arms
    reproduce  ``make reproduce``: the seed papers' experiments -> docs/reproduction.md
    prereg     the pre-registered comparisons (preregistration.yaml) and their verdict rules
    campaign   the reproduction as records per repetition (docs/reproduction/records/), resumed
               across sessions and machines
    gates      per-repetition mechanism gates (queueing location, CPU, completion)
    circuits   circuits labelled by client group at every hop (CELL_STATS chains)
    survival   censored transfers: Kaplan-Meier estimates
    torchestra, circswitch  what a run of that variant must show (its notice lines, counters,
               transfers) and the small network that shows it; integration tests and make bench
    cli        register(subparsers, formatter_class): the ``report``, ``compare`` and ``aa`` commands

The re-exported names are loaded on first use (PEP 562 ``__getattr__``): importing
``torbed.analysis.cli`` to register the subcommands must not load scipy and matplotlib, which
took most of the 2 s before `torbed run` did anything (issue 26). Once a submodule such as
``torbed.analysis.report`` has been imported, its name on the package is the module, not
the function: import the functions from their modules by name
(``from torbed.analysis.report import report``).

Public API (re-exported here): ``report``, ``compare``, ``load_run``, ``AnalysisError``,
``InputError``, ``RunDirError``, ``RecordError``, ``UnknownVariantError``,
``ScenarioMismatchError``.
"""

from __future__ import annotations

import importlib

# name -> the module that defines it
_EXPORTS = {"report": "report", "compare": "compare", "load_run": "load",
            **{name: "errors" for name in ("AnalysisError", "InputError", "RecordError", "RunDirError",
                                           "ScenarioMismatchError", "UnknownVariantError")}}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
