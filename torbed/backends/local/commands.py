"""Subcommands only the local backend has (registered through torbed.backends.local):

    clean                  remove what killed runs left behind (processes, namespaces); live runs stay
    prometheus RUN_DIR     serve a run's Prometheus TSDB read-only and print its URL
    variants               list relay variants and whether their tor build is cached
    build VARIANT          build (or reuse) the tor binary of a variant
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ... import builds, constants, variants as variants_mod
from ...errors import EXIT_FAILED, EXIT_OK, InputError

console = Console(stderr=True)


def cmd_prometheus(args) -> int:
    import signal
    import threading
    from . import prometheus
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


def cmd_clean(args) -> int:
    from . import lifetime
    from ..k8s import leftovers
    k8s = leftovers.clean(console, force=args.force)
    if k8s["runs"] or k8s["failed"] or k8s["live"]:
        console.print(f"Kubernetes: cleaned {k8s['runs']} run(s) whose torbed was gone (uninstalled "
                      f"{k8s['releases']} release(s), removed {k8s['configmaps']} dashboard ConfigMap(s)); left "
                      f"{k8s['live']} live run(s) alone"
                      + (f"; {len(k8s['failed'])} cluster(s) not reachable, try again" if k8s["failed"] else ""),
                      highlight=False)
    # A cluster not reached: its dashboards may still be there (the claim is kept): exit 1.
    code = EXIT_FAILED if k8s["failed"] else EXIT_OK
    if os.geteuid() != 0:
        console.print("nothing to clean: unprivileged runs live in a user namespace that dies with them")
        return code
    out = lifetime.clean(console, force=args.force)
    console.print(f"cleaned {out['runs']} run(s) whose torbed was gone, removed {out['namespaces']} namespace(s); "
                  f"left {out['live']} live run(s) alone", highlight=False)
    if out["unclaimed"]:
        console.print(f"[yellow]left alone[/yellow]: {len(out['unclaimed'])} namespace(s) no run claims, which may "
                      f"still be in use ({', '.join(out['unclaimed'][:5])}{', ...' if len(out['unclaimed']) > 5 else ''});"
                      " --force removes them", highlight=False)
    return code


def register_clean(sub, fmt) -> None:
    p = sub.add_parser("clean", help="remove what runs killed with SIGKILL left behind", formatter_class=fmt,
                       description="Stop and remove the processes, namespaces, scratch directories and fault "
                                   "cgroups of every run whose torbed is gone (its lock is free), and mark its "
                                   "meta.json and run.json 'killed'; for a `--backend k8s` run, the helm release of "
                                   "the repetition it was running and the Grafana dashboard ConfigMaps it made "
                                   "for the run (its records marked 'killed' too). Runs still going are left alone, so it is "
                                   "safe beside other runs. A killed run normally does this itself (its watchdog); "
                                   "this covers a watchdog killed too. Exit 1 when a cluster holding what a killed "
                                   "run left cannot be reached, or a release does not go (tried again next time).")
    p.add_argument("--force", action="store_true",
                   help="also remove runs that look alive and namespaces no run claims")
    p.set_defaults(func=cmd_clean)


def cmd_variants(args) -> int:
    rows = []
    for fam in variants_mod.list_families():
        v = variants_mod.load_variant(fam)
        rows.append({"family": fam, "parameters": list(v.parameters), "presets": variants_mod.presets(fam),
                     "description": v.description,
                     "patches": [p.name for p in v.patches], "build_key": v.build_key,
                     "built": builds.cached(v.build_key) is not None})
    if args.json:
        print(json.dumps({"variants_dir": str(constants.VARIANTS_DIR), "variants": rows}, indent=2))
        return EXIT_OK
    t = Table(title=f"relay variants ({constants.VARIANTS_DIR})")
    for col in ("family", "description", "patches", "build key", "built"):
        t.add_column(col)
    for r in rows:
        names = ([f"-<{r['parameters'][0]}>"] if r["parameters"] else []) + [f"-{p}" for p in r["presets"]]
        t.add_row(r["family"] + (f" ({' | '.join(names)})" if names else ""), r["description"],
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


REGISTER = [register_prometheus, register_clean, register_variants, register_build]
