"""CLI glue: the ``report``, ``compare`` and ``aa`` subcommands of ``torbed``.

    report RUN_DIR [--baseline V] [--primary M] [--out DIR] [--json]   RUN_DIR made by `torbed run`
    compare RUN_A RUN_B [--out DIR] [--force] [--json]     two RUN_DIRs of one scenario
    aa SCENARIO|RUN_DIR [--variant V] [--repetitions N] [--duration D] [--runs DIR] [--json]
                                                          A/A calibration (aa.py)

``--json`` prints the written JSON (summary.json, the compare JSON, the aa JSON) on stdout
instead of the table, for scripts.

Exit codes: 0 success, 1 failure (e.g. the report could not be written), 2 bad input
(not a run directory, missing run.json, a malformed record: the file and line are named;
an unknown --baseline; different scenarios without --force).

Public API:

- ``register(subparsers, formatter_class)``: adds both subcommands to an argparse
  subparsers object; each sets ``func(args) -> int`` (the exit code)
- ``cmd_report(args) -> int``, ``cmd_compare(args) -> int``, ``cmd_aa(args) -> int``
- ``EXIT_OK``, ``EXIT_FAILED``, ``EXIT_BAD_INPUT``
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

# Only light imports here: `torbed` registers these commands on every start, and the report's
# modules (scipy, matplotlib) take seconds to import, so each command imports them itself.
from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, RunFailed, TorbedError  # noqa: F401 (EXIT_*: tests)
from .errors import InputError

# `torbed aa`'s default repetitions per arm: stats.MIN_REPS (a test checks they agree).
AA_REPETITIONS = 3

console = Console(stderr=True)
out = Console()


def _guard(fn):
    """Run a command body; torbed's errors (InputError: exit 2) go to the CLI's one mapper
    (torbed.cli.report), any other exception as a RunFailed naming its type (exit 1, no
    traceback: a report that cannot be written is a failure, not a crash)."""
    def wrapped(args) -> int:
        from ..cli import report
        try:
            return fn(args)
        except KeyboardInterrupt:
            raise
        except TorbedError as e:
            return report(e)
        except Exception as e:  # noqa: BLE001 - a failure, reported and mapped to exit 1
            return report(RunFailed(f"{type(e).__name__}: {e}"))
    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = fn.__doc__
    return wrapped


def report_table(summary: dict) -> tuple[Table, list[str]]:
    """The terminal's compact table (fits 80 columns: headline.outcome_table) and the short
    lines under it (what p is, what was left out, what is missing); the full tables are in
    report.md / report.html."""
    from rich import box
    from .headline import outcome_table
    headers, rows, left_out = outcome_table(summary)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True,
              title=f"{summary['run']['scenario']}: per-repetition statistic (geometric mean), Δ vs {summary['baseline']}")
    for col in headers:
        t.add_column(col, justify="left" if col in ("outcome", "variant", "verdict", "Δ [95% CI]") else "right",
                     no_wrap=True)
    for row in rows:
        t.add_row(*row)
    inf = summary["inference"]
    notes = [f"p: Holm-adjusted over {inf['family_size']} comparisons"
             + ("; * the primary comparison (declared before the run): its own p" if inf.get("primary") else "")
             + "; sig. = p < 0.05, n.s. = not significant, equiv. = within ±10% (TOST); descr. = "
             "descriptive, not tested (too few repetitions with data)"]
    if left_out > 0:
        notes.append(f"{left_out} more comparisons, the full tables and the figures: report.md / report.html")
    bad = [r for r in summary["repetitions"] if r["status"] != "ok"]
    for r in bad:
        why = (r.get("error") or "").removeprefix("mechanism gate: ")
        why = why if len(why) <= 60 else why[:59] + "…"
        notes.append(f"variant {r['variant']} rep {r['rep']}: {r['status']}" + (f" ({why})" if why else ""))
    if bad:
        notes.append("  (a block with one is compared unpaired; an invalid one is left out of every statistic)")
    if summary["missing"]:
        notes.append(f"{len(summary['missing'])} notes on missing or incomplete data: report.md, "
                     "'Missing or incomplete data'")
    return t, notes


@_guard
def cmd_report(args) -> int:
    """torbed report RUN_DIR: statistics, figures and report files."""
    from .report import report
    with console.status("report") as status:
        summary = report(args.run_dir, baseline=getattr(args, "baseline", None), out_dir=getattr(args, "out", None),
                         progress=lambda msg: status.update(f"report: {msg}"), primary=getattr(args, "primary", None),
                         keep_gate_invalid=args.keep_gate_invalid)
    out_dir = Path(getattr(args, "out", None) or Path(args.run_dir) / "report")
    if getattr(args, "json", False):
        print((out_dir / "summary.json").read_text(), end="")
        return EXIT_OK
    from .headline import lead
    out.print(lead(summary).text.replace("**", ""), highlight=False, markup=False)
    table, notes = report_table(summary)
    if table.row_count:
        out.print(table)
    for line in notes:
        console.print(line, highlight=False, markup=False)
    out.print(f"[green]ok[/green] wrote {out_dir}/report.html, report.md, summary.json, "
              f"figures/, onionperf/", highlight=False)
    return EXIT_OK


@_guard
def cmd_compare(args) -> int:
    """torbed compare RUN_A RUN_B: per variant and metric, B against A."""
    from .compare import HEADERS, compare, output_stem, rows
    with console.status("comparing"):
        c = compare(args.run_a, args.run_b, force=args.force, out_dir=getattr(args, "out", None))
    if getattr(args, "json", False):
        out_dir = Path(getattr(args, "out", None) or Path(args.run_b) / "report")
        print((out_dir / f"{output_stem(c['run_a']['directory'])}.json").read_text(), end="")
        return EXIT_OK
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


def _run_aa_scenario(args) -> Path:
    """`torbed run` the scenario's variant with 2 x N repetitions (the run entry point itself,
    in a child process, so its privilege handling and cleanup apply) and return the new run
    directory. Raises InputError for a bad scenario, RuntimeError when the run fails."""
    import subprocess
    import sys
    import time
    try:
        from ..scenario import load as load_scenario
    except ImportError as e:  # pragma: no cover - torbed.analysis without torbed
        raise RuntimeError(f"torbed's scenario loader is not importable: {e}") from None
    try:
        sc = load_scenario(args.target)
    except Exception as e:  # noqa: BLE001 - the loader's own errors name the file and field
        raise InputError(str(e) if str(args.target) in str(e) else f"{args.target}: {e}") from None
    variant = getattr(args, "variant", None) or sc.variants[0]
    if variant not in sc.variants:
        raise InputError(f"--variant {variant!r}: not a variant of {args.target} ({', '.join(sc.variants)})")
    runs = Path(args.runs) / f"aa-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    runs.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torbed.cli", "run", str(args.target), "--variant", variant,
           "--repetitions", str(2 * args.repetitions), "--out", str(runs)]
    if getattr(args, "duration", None):
        cmd += ["--duration", args.duration]
    console.print(f"A/A: running {args.target} variant {variant} x {2 * args.repetitions} repetitions "
                  f"(two arms of {args.repetitions}) into {runs}", highlight=False)
    rc = subprocess.call(cmd)
    made = sorted(p.parent for p in runs.glob("*/run.json") if not p.parent.is_symlink())
    if not made:
        raise RuntimeError(f"`torbed run` exited {rc} and made no run directory in {runs}")
    if rc not in (0, 1):
        raise RuntimeError(f"`torbed run` exited {rc}; partial run directory kept at {made[-1]}")
    args.variant = variant
    return made[-1]


@_guard
def cmd_aa(args) -> int:
    """torbed aa SCENARIO|RUN_DIR: A/A calibration of the report's tests."""
    from . import stats
    from .aa import aa_report
    from .render import DASH
    target = Path(args.target)
    if target.is_dir():
        run_dir = target
    elif target.is_file():
        if args.repetitions < 1:
            raise InputError(f"--repetitions {args.repetitions}: must be at least 1 (per arm)")
        run_dir = _run_aa_scenario(args)
    else:
        raise InputError(f"{target}: neither a scenario file nor a RUN_DIR")
    with console.status("A/A analysis"):
        r = aa_report(run_dir, getattr(args, "variant", None), getattr(args, "out", None))
    out_dir = Path(getattr(args, "out", None) or run_dir / "report")
    if getattr(args, "json", False):
        print((out_dir / f"aa-{r['variant']}.json").read_text(), end="")
        return EXIT_OK
    rt = r["rates"]

    def pct(x):
        return DASH if x is None else f"{100 * x:.1f}%"
    t = Table(title=f"A/A: {r['run']}, variant {r['variant']}, {len(r['repetitions'])} repetitions, {r['splits']} splits")
    for col in ("test", "false-positive rate", "nominal", "based on"):
        t.add_column(col)
    t.add_row("report: per comparison", pct(rt["per_test"]), f"{r['alpha']:.0%}", f"{rt['per_test_n']} comparisons")
    t.add_row("  of which paired", pct(rt["per_test_paired"]), f"{r['alpha']:.0%}",
              f"{rt['per_test_paired_n']} comparisons")
    t.add_row("unpaired Welch, same splits", pct(rt["per_test_welch"]), f"{r['alpha']:.0%}",
              f"{rt['per_test_welch_n']} comparisons")
    t.add_row("report: headline (Holm)", pct(rt["family"]), f"<= {r['alpha']:.0%}", f"{rt['family_n']} splits")
    t.add_row("pooled KS (descriptive)", pct(rt["pooled_ks"]), "-", f"{rt['pooled_n']} comparisons")
    t.add_row("pooled MWU (descriptive)", pct(rt["pooled_mwu"]), "-", f"{rt['pooled_n']} comparisons")
    out.print(t)
    if not r["enough_repetitions"]:
        console.print(f"[yellow]not enough repetitions[/yellow]: {len(r['repetitions'])} with records; "
                      f"two arms of {stats.MIN_REPS} need {2 * stats.MIN_REPS}", highlight=False)
    out.print(f"[green]ok[/green] wrote {out_dir}/aa-{r['variant']}.md and .json", highlight=False)
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
    p.add_argument("--primary", metavar="METRIC[@VARIANT]", default=argparse.SUPPRESS,
                   help="the one comparison declared before the run (a metric id of summary.json, e.g. "
                        "ttlb_s/web:small; VARIANT: which variant against the baseline, needed with more than two), "
                        "tested alone at alpha 0.05 and named in the report's first sentence; the rest stay "
                        "exploratory under Holm. Declare it before looking at the data, as `make demo` does")
    p.add_argument("--keep-gate-invalid", action="store_true", help="keep the repetitions a mechanism gate "
                   "rejected in the statistics (the report says so): a look at a busy machine's run, not a result")
    p.add_argument("--json", action="store_true", help="print summary.json on stdout instead of the table")
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
    p.add_argument("--json", action="store_true", help="print the comparison JSON on stdout instead of the table")
    p.set_defaults(func=cmd_compare)

    p = subparsers.add_parser(
        "aa", formatter_class=formatter_class,
        help="A/A calibration: false-positive rate of the report's tests (one variant split in two arms)",
        description="A/A calibration. With a SCENARIO file: `torbed run` (local backend) of one variant "
                    "with 2 x N repetitions, split into two arms of N that differ only by chance, compared "
                    "with the report's own tests; with a RUN_DIR: the same split of its existing "
                    "repetitions. Reports the false-positive rate per comparison and per report headline "
                    "(averaged over balanced splits), and what the pooled per-sample tests would have "
                    "claimed. Writes aa-<variant>.md and .json into RUN_DIR/report. "
                    "Exit codes: 0 ok, 1 failure (e.g. the run failed), 2 bad input.")
    p.add_argument("target", metavar="SCENARIO|RUN_DIR", help="a scenario YAML file, or a RUN_DIR made by `torbed run`")
    p.add_argument("--variant", metavar="V", default=None,
                   help="the variant to split (default: the scenario's first variant / the run's baseline)")
    p.add_argument("--repetitions", metavar="N", type=int, default=AA_REPETITIONS,
                   help="SCENARIO: repetitions per arm (the run has 2 x N)")
    p.add_argument("--duration", metavar="D", default=None, help="SCENARIO: override measure.duration, e.g. '120s'")
    p.add_argument("--runs", metavar="DIR", default="runs", help="SCENARIO: where the run directory is created")
    p.add_argument("--out", metavar="DIR", default=argparse.SUPPRESS, help="output directory (default: RUN_DIR/report)")
    p.add_argument("--json", action="store_true", help="print the A/A JSON on stdout instead of the table")
    p.set_defaults(func=cmd_aa)
