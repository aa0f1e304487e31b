"""``torbed nightly``: the command (registered by torbed.commands).

    torbed nightly NIGHTLY.yaml --history DIR [--out DIR/runs] [--night YYYY-MM-DD]
                   [--backend local|k8s [--set K=V]...] [--fail-on regression|any|never]
                   [--detect-only] [--check] [--json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console

from . import runner, spec as spec_mod
from ..errors import EXIT_BAD_INPUT, EXIT_OK
from .history import HistoryError

console = Console(stderr=True)


def _runner_for(args):
    """A function (scenario, out_dir, variants) -> run_dir on the chosen backend, through
    the run engine as `torbed run` does."""
    from .. import engine
    face = engine.backend_module(args.backend)
    backend = face.create(face.Options.from_args(args), console, Path(args.nightly))

    def run(s, out, variants, source=None, overrides=None):
        # source: the entry's scenario file and overrides its repetitions/duration, in
        # run.json as `torbed run` records its own (before, source was the nightly file and
        # the overrides were missing: `torbed run --resume` could not rebuild the scenario).
        return engine.run(s, backend, Path(out), console, variants=variants, source=source or args.nightly,
                          overrides=overrides)
    return run


class _Tee:
    """stderr and a log file at once (the runner's own log, kept with the history)."""

    def __init__(self, *files):
        self.files = files

    def write(self, text: str) -> int:
        for f in self.files:
            f.write(text)
            f.flush()
        return len(text)

    def flush(self) -> None:
        for f in self.files:
            f.flush()

    def isatty(self) -> bool:
        return False


def cmd_nightly(args) -> int:
    global console
    if args.log:
        import datetime as dt
        log_dir = Path(args.log)
        log_dir.mkdir(parents=True, exist_ok=True)
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        console = Console(file=_Tee(sys.stderr, open(log_dir / f"nightly-{stamp}.log", "a")), width=160)
    try:
        spec = spec_mod.load(args.nightly)
    except spec_mod.NightlyError as e:   # printed here too: this console also writes --log's file
        for line in str(e).splitlines():
            console.print(f"[red]error[/red] {line}", highlight=False)
        return e.exit_code
    if args.check:
        entries = ", ".join(f"{e.scenario} x {', '.join(e.variants or ['all variants'])}" for e in spec.matrix)
        console.print(f"[green]ok[/green] {args.nightly}: nightly {spec.name}, {entries}", highlight=False)
        return EXIT_OK
    if not args.history:
        console.print("[red]error[/red] --history DIR is required (where the history store and reports live)")
        return EXIT_BAD_INPUT
    if args.backend == "local" and not args.detect_only:
        import os
        if os.geteuid() != 0:
            console.print("[red]error[/red] the local backend needs root (network namespaces)")
            return EXIT_BAD_INPUT
    try:
        code, report = runner.run_night(spec, Path(args.history), _runner_for(args), console,
                                        out_dir=Path(args.out) if args.out else None, night=args.night,
                                        fail_on=args.fail_on, detect_only=args.detect_only)
    except (runner.NightlyBusy, HistoryError) as e:   # RunFailed: exit 1
        console.print(f"[red]error[/red] {e}", highlight=False)
        return e.exit_code
    where = Path(args.history) / "reports" / report["night"]
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        print(where)
    console.print(f"nightly {spec.name} {report['night']}: {report['regressions']} regression(s), "
                  f"{report['improvements']} improvement(s) flagged; report {where}/nightly.html", highlight=False)
    return code


def register(sub, fmt) -> None:
    from ..commands import add_backend_arguments
    p = sub.add_parser("nightly", formatter_class=fmt,
                       help="run a nightly benchmark matrix, add it to a history, flag changes -> report")
    p.add_argument("nightly", help="nightly definition file (kind: Nightly; see scenarios/nightly/)")
    p.add_argument("--history", default=None,
                   help="history directory (history.sqlite, runs/, reports/); required unless --check")
    p.add_argument("--out", default=None, help="where run directories go (default: HISTORY/runs)")
    p.add_argument("--night", default=None, help="label of this night (default: today's UTC date)")
    add_backend_arguments(p)   # --backend and each backend's own options, as `torbed run` has them
    p.add_argument("--fail-on", choices=runner.FAIL_ON, default="regression",
                   help="which flags make the exit status 3")
    p.add_argument("--detect-only", action="store_true",
                   help="run nothing: assess the night already in the history and rewrite its report")
    p.add_argument("--check", action="store_true",
                   help="only validate the definition and every scenario it names (exit 0 or 2); nothing runs")
    p.add_argument("--json", action="store_true", help="print the nightly report's JSON on stdout")
    p.add_argument("--log", default=None, metavar="DIR", help="also write this command's messages to DIR/nightly-<time>.log")
    p.set_defaults(func=cmd_nightly)


