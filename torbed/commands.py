"""Subcommands beyond validate/plan/schema: run, report, compare, capture, trace, nightly
(each backend adds its own: torbed.backends.*.register_commands).

Each ``register_*`` adds one subcommand to the argparse subparsers; ``REGISTER`` lists them.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from .errors import EXIT_FAILED, EXIT_OK, InputError

console = Console(stderr=True)


def cmd_run(args) -> int:
    from . import engine, scenario as scenario_mod
    from .shaping import ShapingError
    if args.resume:
        return cmd_resume(args)
    if not args.scenario:
        raise InputError("torbed run: give a SCENARIO file, or --resume RUN_DIR")
    s = scenario_mod.load(args.scenario)
    if args.variant:
        bad = [v for v in args.variant if v not in s.variants]
        if bad:
            raise InputError(f"--variant {', '.join(bad)}: not in the scenario's variants ({', '.join(s.variants)})")
    s = scenario_mod.with_overrides(s, args.scenario, repetitions=args.repetitions, measure__duration=args.duration,
                                    measure__warmup=args.warmup, seed=args.seed)
    host_load = check_host_load(require_quiet=args.require_quiet)
    face = engine.backend_module(args.backend)
    backend = face.create(face.Options.from_args(args), console, Path(args.scenario))
    overrides = {k: v for k, v in (("repetitions", args.repetitions), ("duration", args.duration),
                                   ("warmup", args.warmup), ("seed", args.seed)) if v is not None}
    try:
        run_dir = engine.run(s, backend, Path(args.out), console, variants=args.variant, source=args.scenario,
                             host_load=host_load, overrides=overrides)
    except ShapingError as e:
        raise InputError(f"{args.scenario}: links: {e}") from None
    info = json.loads((run_dir / "run.json").read_text())
    # stdout carries only the run directory: RUN=$(torbed run ...) works.
    print(run_dir, flush=True)
    console.print(f"run directory: [bold]{run_dir}[/bold] (status {info['status']}); "
                  f"next: torbed report {run_dir}", highlight=False)
    return EXIT_OK if info["status"] == "ok" else EXIT_FAILED


def cmd_resume(args) -> int:
    """``torbed run --resume RUN_DIR``: the run's own scenario file and overrides (run.json
    ``source``, ``overrides``), checked against the fingerprint taken when it began."""
    from . import engine, resume
    from .shaping import ShapingError
    run_dir = Path(args.resume)
    run_json = run_dir / "run.json"
    if args.scenario or args.repetitions or args.duration or args.warmup or args.seed is not None:
        raise InputError(f"--resume {run_dir}: SCENARIO, --repetitions, --duration, --warmup and --seed come from "
                         f"{run_json} (source, overrides); give none of them")
    info, s, variants = resume.resumable(run_dir, args.variant)
    source = info.get("source_resolved") or info["source"]
    if args.backend != info.get("backend", "local"):
        raise InputError(f"{run_json}: backend: the run used '{info.get('backend')}', not '{args.backend}'")
    host_load = check_host_load(require_quiet=args.require_quiet)
    face = engine.backend_module(args.backend)
    backend = face.create(face.Options.from_args(args), console, Path(source))
    try:
        engine.resume(run_dir, s, backend, console, host_load=host_load)
    except ShapingError as e:
        raise InputError(f"{source}: links: {e}") from None
    info = json.loads(run_json.read_text())
    print(run_dir, flush=True)
    console.print(f"run directory: [bold]{run_dir}[/bold] (status {info['status']}, session "
                  f"{len(info['sessions'])}); next: torbed report {run_dir}", highlight=False)
    return EXIT_OK if info["status"] == "ok" else EXIT_FAILED


def check_host_load(require_quiet: bool = False, proc: str = "/proc") -> dict | None:
    """Read the host's load before anything starts (torbed.hostload): a warning naming the
    top CPU consumers when the machine is busy, or HostBusy (exit 2) with ``require_quiet``.
    Returns the reading for run.json (None when /proc cannot be read: not Linux)."""
    from . import hostload
    from .errors import HostBusy
    try:
        reading = hostload.measure(proc)
    except (OSError, ValueError, IndexError) as e:
        console.print(f"[yellow]warning[/yellow]: cannot read the host's load from {proc}: {e}", highlight=False)
        return None
    if reading["busy"]:
        if require_quiet:
            raise HostBusy(hostload.describe(reading) + " Refusing to start (--require-quiet).")
        console.print(f"[yellow]warning[/yellow]: {hostload.describe(reading)}", highlight=False)
    return reading


def add_backend_arguments(p) -> None:
    """``--backend`` and every backend's own options (``torbed run``, ``torbed nightly``)."""
    from .engine import BACKENDS, backend_module
    faces = {name: backend_module(name) for name in BACKENDS}
    p.add_argument("--backend", choices=list(BACKENDS), default="local",
                   help="; ".join(f"{name}: {face.HELP}" for name, face in faces.items()))
    for face in faces.values():
        face.add_arguments(p)


def register_run(sub, fmt) -> None:
    p = sub.add_parser("run", help="run a scenario (local backend, or --backend k8s) -> RUN_DIR", formatter_class=fmt,
                       description="Bring the scenario's network up, measure, tear it down, for every variant "
                                   "x repetition. Prints the run directory on stdout (RUN=$(torbed run ...)); "
                                   "progress goes to stderr. Next: torbed report RUN_DIR.")
    p.add_argument("scenario", nargs="?", default=None,
                   help="scenario YAML file (check it first with `torbed validate`); not with --resume")
    p.add_argument("--out", default="runs", help="directory in which the run directory is created")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue an interrupted run at its next unfinished (variant, repetition): finished "
                        "repetitions are kept, an unfinished one is discarded and run again (run.json sessions, "
                        "meta.json history); refused (exit 2) when the scenario file or a variant changed")
    p.add_argument("--variant", action="append", default=None, help="run only this variant (repeatable)")
    p.add_argument("--repetitions", type=int, default=None, help="override the scenario's repetitions")
    p.add_argument("--duration", default=None, help="override measure.duration, e.g. '60s'")
    p.add_argument("--warmup", default=None, help="override measure.warmup, e.g. '5s' (part of the duration)")
    p.add_argument("--seed", type=int, default=None,
                   help="override the scenario's seed (repetition k's workload uses seed + k); a campaign that "
                        "adds blocks in a new run passes the seed its first new block needs, so no two blocks repeat")
    p.add_argument("--require-quiet", action="store_true",
                   help="refuse to start (exit 2) when the machine is busy with something else (1-minute "
                        "load average, other processes' CPU over a 1 s sample); by default only a warning. "
                        "Either way the reading is recorded in run.json (host_load)")
    add_backend_arguments(p)
    p.set_defaults(func=cmd_run)


def register_analysis(sub, fmt) -> None:
    try:
        from .analysis import cli as analysis_cli
    except ImportError:
        return
    analysis_cli.register(sub, fmt)


def register_replay(sub, fmt) -> None:
    from .replay import cli as replay_cli
    replay_cli.register(sub, fmt)


def register_nightly(sub, fmt) -> None:
    from .nightly import cli as nightly_cli
    nightly_cli.register(sub, fmt)


REGISTER = [register_run, register_analysis, register_replay, register_nightly]
