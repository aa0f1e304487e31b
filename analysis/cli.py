"""CLI glue: the ``report`` and ``compare`` subcommands of ``torbed``.

    report RUN_DIR [--baseline V] [--out DIR]     RUN_DIR made by `torbed run`
    compare RUN_A RUN_B [--out DIR] [--force]     two RUN_DIRs of one scenario

Exit codes: 0 success, 1 failure (e.g. the report could not be written), 2 bad input
(not a run directory, missing run.json, a malformed record: the file and line are named;
an unknown --baseline; different scenarios without --force).

Public API:

- ``register(subparsers, formatter_class)``: adds both subcommands to an argparse
  subparsers object; each sets ``func(args) -> int`` (the exit code)
- ``cmd_report(args) -> int``, ``cmd_compare(args) -> int``
- ``EXIT_OK``, ``EXIT_FAILED``, ``EXIT_BAD_INPUT``
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

# ``from . import report`` would give the function the package re-exports, not the module.
from .compare import HEADERS, compare, output_stem, rows
from .report import report
from .errors import InputError
from .render import DASH, fmt_p, fmt_pct, fmt_value

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

console = Console(stderr=True)
out = Console()


def _error(msg: str) -> None:
    console.print(f"[red]error[/red] {msg}", highlight=False, markup=True, soft_wrap=True)


def _guard(fn):
    """Run a command body, mapping InputError to exit 2 and any other exception to 1."""
    def wrapped(args) -> int:
        try:
            return fn(args)
        except InputError as e:
            _error(str(e))
            return EXIT_BAD_INPUT
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - a failure, reported and mapped to exit 1
            _error(f"{type(e).__name__}: {e}")
            return EXIT_FAILED
    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = fn.__doc__
    return wrapped


def _report_table(summary: dict) -> Table:
    t = Table(title=f"{summary['run']['scenario']}: medians (baseline {summary['baseline']})")
    for col in ("metric", "variant", "n", "median", "Δ median", "MWU p"):
        t.add_column(col, justify="left" if col in ("metric", "variant") else "right")
    for mid, e in summary["metrics"].items():
        if e.get("class") in ("light", "heavy"):
            continue
        u = e["unit"]
        for v, d in sorted(e["variants"].items(), key=lambda kv: summary["run"]["variants"].index(kv[0])):
            vb = d.get("vs_baseline") or {}
            t.add_row(f"{mid} ({'MiB/s' if u == 'B/s' else u})", v, str(d.get("n", 0)),
                      fmt_value(d.get("median"), u),
                      fmt_pct(vb.get("median_change_pct")) if vb else "baseline",
                      fmt_p(vb.get("mwu_pvalue")) if vb else DASH)
    return t


@_guard
def cmd_report(args) -> int:
    """torbed report RUN_DIR: statistics, figures and report files."""
    with console.status("report") as status:
        summary = report(args.run_dir, baseline=getattr(args, "baseline", None), out_dir=getattr(args, "out", None),
                         progress=lambda msg: status.update(f"report: {msg}"))
    out_dir = Path(getattr(args, "out", None) or Path(args.run_dir) / "report")
    out.print(_report_table(summary))
    for line in summary["missing"]:
        console.print(f"[yellow]missing[/yellow] {line}", highlight=False, markup=True)
    out.print(f"[green]ok[/green] wrote {out_dir}/report.html, report.md, summary.json, "
              f"figures/, onionperf/", highlight=False)
    return EXIT_OK


@_guard
def cmd_compare(args) -> int:
    """torbed compare RUN_A RUN_B: per variant and metric, B against A."""
    with console.status("comparing"):
        c = compare(args.run_a, args.run_b, force=args.force, out_dir=getattr(args, "out", None))
    t = Table(title=f"{c['run_a']['directory']} (A) vs {c['run_b']['directory']} (B)")
    for col in HEADERS:
        t.add_column(col, justify="left" if col in ("metric", "variant") else "right")
    for row in rows(c):
        t.add_row(*row)
    out.print(t)
    if c["forced"]:
        console.print(f"[yellow]warning[/yellow] different scenarios ({c['run_a']['scenario']} vs "
                      f"{c['run_b']['scenario']}), compared because of --force", highlight=False)
    out_dir = Path(getattr(args, "out", None) or Path(args.run_b) / "report")
    stem = output_stem(c["run_a"]["directory"])
    out.print(f"[green]ok[/green] wrote {out_dir}/{stem}.md and {stem}.json", highlight=False)
    return EXIT_OK


def register(subparsers, formatter_class=argparse.ArgumentDefaultsHelpFormatter) -> None:
    """Add ``report`` and ``compare`` to ``subparsers`` (from ``add_subparsers``), using
    ``formatter_class`` for their help."""
    p = subparsers.add_parser(
        "report", formatter_class=formatter_class,
        help="statistics, figures and a report of a RUN_DIR made by `torbed run`",
        description="Turn a RUN_DIR made by `torbed run` into RUN_DIR/report/: report.html "
                    "(self-contained), report.md, summary.json, figures/*.png and an onionperf-format "
                    "export of the transfers. Exit codes: 0 ok, 1 failure, 2 bad input.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory made by `torbed run` (holds run.json)")
    # SUPPRESS: the real defaults depend on RUN_DIR, so the formatter must not print "None".
    p.add_argument("--baseline", metavar="V", default=argparse.SUPPRESS,
                   help="variant to compare the others against (default: run.json's baseline)")
    p.add_argument("--out", metavar="DIR", default=argparse.SUPPRESS,
                   help="output directory (default: RUN_DIR/report)")
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser(
        "compare", formatter_class=formatter_class,
        help="compare two RUN_DIRs of one scenario (each made by `torbed run`)",
        description="Compare two RUN_DIRs made by `torbed run` from the same scenario: per variant "
                    "and metric, the medians of A and B, the % change and KS / Mann-Whitney p-values. "
                    "Writes compare-<RUN_A name>.md and .json into RUN_B/report/. "
                    "Exit codes: 0 ok, 1 failure, 2 bad input.")
    p.add_argument("run_a", metavar="RUN_A", help="the reference: a RUN_DIR made by `torbed run`")
    p.add_argument("run_b", metavar="RUN_B", help="a RUN_DIR made by `torbed run`, compared against RUN_A")
    p.add_argument("--out", metavar="DIR", default=argparse.SUPPRESS,
                   help="output directory (default: RUN_B/report)")
    p.add_argument("--force", action="store_true", help="compare even if the scenario names differ")
    p.set_defaults(func=cmd_compare)
