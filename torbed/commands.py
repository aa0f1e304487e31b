"""Subcommands beyond validate/plan/schema: run, clean, variants, build, report, compare,
capture, trace.

Each ``register_*`` adds one subcommand to the argparse subparsers; ``REGISTER`` lists them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .backends.local import builds
from . import constants, variants as variants_mod
from .errors import EXIT_FAILED, EXIT_OK, InputError

console = Console(stderr=True)


def cmd_run(args) -> int:
    from . import engine, scenario as scenario_mod
    from .backends import backend_class
    from .shaping import ShapingError
    s = scenario_mod.load(args.scenario)
    if args.variant:
        bad = [v for v in args.variant if v not in s.variants]
        if bad:
            raise InputError(f"--variant {', '.join(bad)}: not in the scenario's variants ({', '.join(s.variants)})")
    s = scenario_mod.with_overrides(s, args.scenario, repetitions=args.repetitions, measure__duration=args.duration)
    host_load = check_host_load(require_quiet=args.require_quiet)
    backend = backend_class(args.backend).from_args(args, console)
    try:
        run_dir = engine.run(s, backend, Path(args.out), console, variants=args.variant, source=args.scenario,
                             host_load=host_load)
    except ShapingError as e:
        raise InputError(f"{args.scenario}: links: {e}") from None
    info = json.loads((run_dir / "run.json").read_text())
    # stdout carries only the run directory: RUN=$(torbed run ...) works.
    print(run_dir, flush=True)
    console.print(f"run directory: [bold]{run_dir}[/bold] (status {info['status']}); "
                  f"next: torbed report {run_dir}", highlight=False)
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


def register_run(sub, fmt) -> None:
    from .backends import BACKENDS
    p = sub.add_parser("run", help="run a scenario (local backend, or --backend k8s) -> RUN_DIR", formatter_class=fmt,
                       description="Bring the scenario's network up, measure, tear it down, for every variant "
                                   "x repetition. Prints the run directory on stdout (RUN=$(torbed run ...)); "
                                   "progress goes to stderr. Next: torbed report RUN_DIR.")
    p.add_argument("scenario", help="scenario YAML file (check it first with `torbed validate`)")
    p.add_argument("--out", default="runs", help="directory in which the run directory is created")
    p.add_argument("--variant", action="append", default=None, help="run only this variant (repeatable)")
    p.add_argument("--repetitions", type=int, default=None, help="override the scenario's repetitions")
    p.add_argument("--duration", default=None, help="override measure.duration, e.g. '60s'")
    p.add_argument("--system-tor", action="store_true",
                   help="config-only variants use the tor on PATH instead of the cached stock build")
    p.add_argument("--require-quiet", action="store_true",
                   help="refuse to start (exit 2) when the machine is busy with something else (1-minute "
                        "load average, other processes' CPU over a 1 s sample); by default only a warning. "
                        "Either way the reading is recorded in run.json (host_load)")
    p.add_argument("--backend", choices=list(BACKENDS), default="local",
                   help="local: network namespaces on this machine; k8s: helm install of charts/torbed "
                        "into the current kubeconfig context, one release per variant and repetition")
    p.add_argument("--namespace", default="default", help="k8s: namespace of the releases")
    p.add_argument("--context", default=None, help="k8s: kubeconfig context (default: the current one)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="k8s: extra chart values, e.g. images.registry=reg:5000 (repeatable)")
    p.set_defaults(func=cmd_run)


def cmd_clean(args) -> int:
    from .backends.local import backend as local
    if os.geteuid() != 0:
        console.print("nothing to clean: unprivileged runs live in a user namespace that dies with them")
        return EXIT_OK
    n = local.clean(console, force=args.force)
    console.print(f"removed {n} namespace(s)")
    return EXIT_OK


def register_clean(sub, fmt) -> None:
    p = sub.add_parser("clean", help="remove leftovers of runs killed with SIGKILL", formatter_class=fmt)
    p.add_argument("--force", action="store_true", help="also remove namespaces of runs that look alive")
    p.set_defaults(func=cmd_clean)


def cmd_variants(args) -> int:
    rows = []
    for fam in variants_mod.list_families():
        v = variants_mod.load_variant(fam)
        rows.append({"family": fam, "parameters": list(v.parameters), "description": v.description,
                     "patches": [p.name for p in v.patches], "build_key": v.build_key,
                     "built": builds.cached(v.build_key) is not None})
    if args.json:
        print(json.dumps({"variants_dir": str(constants.VARIANTS_DIR), "variants": rows}, indent=2))
        return EXIT_OK
    t = Table(title=f"relay variants ({constants.VARIANTS_DIR})")
    for col in ("family", "description", "patches", "build key", "built"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["family"] + (" (-<" + r["parameters"][0] + ">)" if r["parameters"] else ""), r["description"],
                  ", ".join(r["patches"]) or "-", r["build_key"], "[green]yes[/green]" if r["built"] else "no")
    Console().print(t)
    return EXIT_OK


def register_variants(sub, fmt) -> None:
    p = sub.add_parser("variants", help="list relay variants and their build status", formatter_class=fmt)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_variants)


def cmd_build(args) -> int:
    v = variants_mod.load_variant(args.variant) if args.variant != "stock" else None
    b = builds.ensure(v, console)
    console.print(f"{args.variant}: {b.tor} (key {b.key}, sha256 {str(b.describe()['tor_sha256'])[:16]}...)")
    return EXIT_OK


def register_build(sub, fmt) -> None:
    p = sub.add_parser("build", help="build (or reuse) the tor binary of a variant", formatter_class=fmt)
    p.add_argument("variant", help="variant name (e.g. vanilla, ewma-66) or 'stock'")
    p.set_defaults(func=cmd_build)


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


def cmd_prometheus(args) -> int:
    import signal
    import threading
    from .backends.local import prometheus
    run_dir = Path(args.run_dir)
    if not (run_dir / "run.json").is_file():
        raise InputError(f"{run_dir}: not a run directory (no run.json)")
    reps = prometheus.repetitions_with_tsdb(run_dir)
    if args.rep:
        rep = run_dir / args.rep
        if rep not in reps:
            have = ", ".join(str(r.relative_to(run_dir)) for r in reps) or "none"
            raise InputError(f"--rep {args.rep}: no Prometheus TSDB there (repetitions with one: {have})")
    elif reps:
        rep = reps[0]
    else:
        raise InputError(f"{run_dir}: no repetition has a Prometheus TSDB (measure.prometheus.enabled was false, "
                         "or the run used the k8s backend)")
    meta = json.loads((rep / "meta.json").read_text())
    t0 = meta.get("t_start") or 0
    t1 = meta.get("t_end") or meta.get("t_start") or 0
    if meta.get("status") == "running" and (meta.get("prometheus") or {}).get("live_url"):
        live = meta["prometheus"]["live_url"]
        console.print(f"{rep.relative_to(run_dir)} is still running: its Prometheus is live at {live} "
                      "(served by the torbed that runs it)", highlight=False)
        print(live, flush=True)
        return EXIT_OK
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with prometheus.serve(rep / "prometheus", port=args.port) as served:
        # stdout carries only the URL (URL=$(torbed prometheus RUN ...) &).
        print(served.url, flush=True)
        console.print(f"serving {rep.relative_to(run_dir)} read-only (a copy of its TSDB) at {served.url}\n"
                      f"relay throughput: {prometheus.graph_url(served.url, prometheus.RELAY_THROUGHPUT, t0, t1)}\n"
                      "Ctrl-C stops it", highlight=False, soft_wrap=True)
        while not stop.wait(1.0):
            if served.proc.poll() is not None:
                console.print(f"[red]error[/red] prometheus exited with status {served.proc.returncode}")
                return EXIT_FAILED
    return EXIT_OK


def register_prometheus(sub, fmt) -> None:
    p = sub.add_parser("prometheus", help="serve a run's Prometheus TSDB read-only and print its URL",
                       formatter_class=fmt,
                       description="Start Prometheus on a copy of one repetition's TSDB (RUN_DIR/VARIANT/rep-K/"
                                   "prometheus, written by `torbed run`) on 127.0.0.1 until Ctrl-C; prints the URL "
                                   "on stdout. For a repetition still running, prints its live URL instead.")
    p.add_argument("run_dir", help="run directory (from `torbed run`)")
    p.add_argument("--rep", default=None, help="repetition as VARIANT/rep-K (default: the first with a TSDB)")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    p.set_defaults(func=cmd_prometheus)


REGISTER = [register_run, register_prometheus, register_clean, register_variants, register_build, register_analysis, register_replay,
            register_nightly]
