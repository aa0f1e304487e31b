"""Subcommands beyond validate/plan/schema: run, clean, variants, build, report, compare,
capture, trace.

Each ``register_*`` adds one subcommand to the argparse subparsers; ``REGISTER`` lists them.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import builds, constants, variants as variants_mod

console = Console(stderr=True)
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def _reexec_in_userns() -> None:
    """Unprivileged (or TORBED_USERNS=1): re-run this command as root of a new user + network
    + mount namespace, with a private /run (so `ip netns` works); everything we create dies
    with it."""
    if os.environ.get("TORBED_IN_USERNS"):
        raise SystemExit("torbed: still unprivileged inside the user namespace")
    unshare = shutil.which("unshare")
    if not unshare:
        raise SystemExit("torbed: not root and no `unshare` (util-linux) to make a user namespace")
    inner = ("mount -t tmpfs torbed /run && mkdir -p /run/netns /run/torbed && "
             'exec "$0" "$@"')
    os.environ["TORBED_IN_USERNS"] = "1"
    os.execv(unshare, [unshare, "--user", "--map-root-user", "--net", "--mount", "--fork", "--kill-child",
                       "sh", "-c", inner, sys.executable, "-m", "torbed.cli", *sys.argv[1:]])


def cmd_run(args) -> int:
    from .backends import local
    from .scenario import load
    s = load(args.scenario)
    if args.variant:
        bad = [v for v in args.variant if v not in s.variants]
        if bad:
            console.print(f"[red]error[/red] --variant {', '.join(bad)}: not in the scenario's variants ({', '.join(s.variants)})")
            return EXIT_BAD_INPUT
    if args.repetitions:
        s.repetitions = args.repetitions
    if args.duration:
        s.measure.duration = args.duration
    if args.backend == "k8s":
        return _run_k8s(args, s)
    if os.geteuid() != 0 or (os.environ.get("TORBED_USERNS") == "1" and not os.environ.get("TORBED_IN_USERNS")):
        _reexec_in_userns()
    try:
        run_dir = local.run_scenario(s, Path(args.out), console, system_tor=args.system_tor, variants=args.variant)
    except local.Interrupted:
        console.print("[yellow]interrupted[/yellow]: everything started was stopped and removed; "
                      "records measured so far are kept")
        return EXIT_INTERRUPTED
    except (local.RunFailed, builds.BuildError) as e:
        console.print(f"[red]error[/red] {e}", highlight=False)
        return EXIT_FAILED
    return _finished(run_dir)


def _finished(run_dir: Path) -> int:
    import json
    info = json.loads((run_dir / "run.json").read_text())
    console.print(f"run directory: [bold]{run_dir}[/bold] (status {info['status']}); "
                  f"next: torbed report {run_dir}")
    return EXIT_OK if info["status"] == "ok" else EXIT_FAILED


def _run_k8s(args, s) -> int:
    from .backends import k8s
    try:
        run_dir = k8s.run_scenario(s, Path(args.scenario), Path(args.out), console, namespace=args.namespace,
                                   context=args.context, variants=args.variant, extra_set=args.set or [])
    except k8s.Interrupted:
        console.print("[yellow]interrupted[/yellow]: the release was uninstalled; records fetched so far are kept")
        return EXIT_INTERRUPTED
    except k8s.RunFailed as e:
        console.print(f"[red]error[/red] {e}", highlight=False)
        return EXIT_FAILED
    return _finished(run_dir)


def register_run(sub, fmt) -> None:
    p = sub.add_parser("run", help="run a scenario (local backend, or --backend k8s) -> RUN_DIR", formatter_class=fmt)
    p.add_argument("scenario", help="scenario YAML file (check it first with `torbed validate`)")
    p.add_argument("--out", default="runs", help="directory in which the run directory is created")
    p.add_argument("--variant", action="append", default=None, help="run only this variant (repeatable)")
    p.add_argument("--repetitions", type=int, default=None, help="override the scenario's repetitions")
    p.add_argument("--duration", default=None, help="override measure.duration, e.g. '60s'")
    p.add_argument("--system-tor", action="store_true",
                   help="config-only variants use the tor on PATH instead of the cached stock build")
    p.add_argument("--backend", choices=["local", "k8s"], default="local",
                   help="local: network namespaces on this machine; k8s: helm install of charts/torbed "
                        "into the current kubeconfig context, one release per variant and repetition")
    p.add_argument("--namespace", default="default", help="k8s: namespace of the releases")
    p.add_argument("--context", default=None, help="k8s: kubeconfig context (default: the current one)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="k8s: extra chart values, e.g. images.registry=reg:5000 (repeatable)")
    p.set_defaults(func=_guard_shaping(cmd_run))


def _guard_shaping(fn):
    def wrapped(args):
        from .shaping import ShapingError
        try:
            return fn(args)
        except ShapingError as e:
            console.print(f"[red]error[/red] {args.scenario}: links: {e}", highlight=False)
            return EXIT_BAD_INPUT
    return wrapped


def cmd_clean(args) -> int:
    from .backends import local
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
    t = Table(title=f"relay variants ({constants.VARIANTS_DIR})")
    for col in ("family", "description", "patches", "build key", "built"):
        t.add_column(col)
    for fam in variants_mod.list_families():
        v = variants_mod.load_variant(fam)
        t.add_row(fam + (" (-<" + next(iter(v.parameters)) + ">)" if v.parameters else ""), v.description,
                  ", ".join(p.name for p in v.patches) or "-", v.build_key,
                  "[green]yes[/green]" if builds.cached(v.build_key) else "no")
    Console().print(t)
    return EXIT_OK


def register_variants(sub, fmt) -> None:
    p = sub.add_parser("variants", help="list relay variants and their build status", formatter_class=fmt)
    p.set_defaults(func=cmd_variants)


def cmd_build(args) -> int:
    try:
        v = variants_mod.load_variant(args.variant) if args.variant != "stock" else None
    except variants_mod.VariantError as e:
        console.print(f"[red]error[/red] {e}")
        return EXIT_BAD_INPUT
    try:
        b = builds.ensure(v, console)
    except builds.BuildError as e:
        console.print(f"[red]error[/red] {e}", highlight=False)
        return EXIT_FAILED
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


REGISTER = [register_run, register_clean, register_variants, register_build, register_analysis, register_replay,
            register_nightly]
