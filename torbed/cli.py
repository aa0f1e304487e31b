"""The ``torbed`` command: one subcommand per stage, the run directory between stages.

    validate SCENARIO      check a scenario (nothing starts)
    plan SCENARIO          print the concrete network: nodes, addresses, paths, links, and
                           what each backend cannot run
    schema                 print the scenario's JSON Schema
    chart-files            regenerate the chart's generated files (values schema, torrc, variants, dashboards)
    images load --to T     get the built images onto a cluster: kind, k3s, minikube, local, registry
    docs-ref               regenerate the docs' reference pages (scenario fields, this command line)
    variants               list relay variants and whether their tor build is cached
    build VARIANT          build (or reuse) the tor binary of a variant
    run SCENARIO           bring the network up, measure, tear down -> RUN_DIR (on stdout)
    run --resume RUN_DIR   continue an interrupted run at its next unfinished repetition
    clean                  remove what a killed run left behind (namespaces, processes)
    prometheus RUN_DIR     serve a run's Prometheus TSDB read-only and print its URL
    report RUN_DIR         statistics, figures and a report of a run
    compare RUN_A RUN_B    compare two runs of one scenario
    capture OUT            capture TCP flows (headers only) into a replay trace
    trace ...              inspect, slice, merge and convert replay traces
    aa SCENARIO|RUN_DIR    A/A calibration: the report's false-positive rate on one variant
    nightly NIGHTLY        a night of a benchmark matrix: run, keep the history, flag changes
    generate CONSENSUS DESCRIPTORS...  a scenario sampled from the real Tor network (CollecTor)
    calibrate RUN_DIR      measure generate's budget figures on this machine from a finished run

Exit codes: 0 success, 1 the run or build failed, 2 bad input (scenario, arguments, files),
130 interrupted (see torbed.errors).
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from . import __version__, network, scenario as scenario_mod
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, InputError, Interrupted, TorbedError
from .workloads import WORKLOADS

console = Console(stderr=True)
out = Console()


def _load(path: str) -> scenario_mod.Scenario:
    s = scenario_mod.load(path)
    for w in s.warnings:
        console.print(f"[yellow]warning[/yellow] {path}: {w}")
    return s


def cmd_validate(args) -> int:
    s = _load(args.scenario)
    nodes = network.plan(s, s.variants[0]).nodes
    out.print(f"[green]ok[/green] {args.scenario}: scenario '{s.name}', {len(nodes)} nodes, "
              f"variants {', '.join(s.variants)}, {s.repetitions} repetition(s)")
    return EXIT_OK


def cmd_plan(args) -> int:
    s = _load(args.scenario)
    variant = args.variant or s.variants[0]
    if variant not in s.variants:
        raise InputError(f"--variant {variant!r} is not one of the scenario's variants ({', '.join(s.variants)})")
    p = network.plan(s, variant)
    gaps = _backend_gaps(s)
    if args.json:
        print(json.dumps({"scenario": s.name, "variant": variant, "subnet": p.subnet,
                          "nodes": [n.to_dict() for n in p.nodes],
                          "unsupported": {b: dict(g) for b, g in gaps.items()}}, indent=2))
        return EXIT_OK
    t = Table(title=f"{s.name}: variant {variant} ({p.subnet}, control plane {p.control_address})")
    for col in ("node", "role", "group", "variant", "address", "ports", "flags"):
        t.add_column(col)
    for n in p.nodes:
        flags = " ".join(f for f, on in (("Guard", n.guard), ("Exit", n.exit)) if on)
        t.add_row(n.name, n.role, n.group, n.variant or "stock", n.address,
                  " ".join(f"{k}={v}" for k, v in n.ports.items()), flags)
    out.print(t)
    t = Table(title="client paths and workloads")
    for col in ("client group", "count", "path", "workload"):
        t.add_column(col)
    for g, cg in s.clients.items():
        desc = WORKLOADS[cg.workload.kind].describe(cg.workload)
        t.add_row(g, str(cg.count), " -> ".join(cg.path) if cg.path else "(tor chooses)", desc)
    out.print(t)
    t = Table(title="links (symmetric; per group pair)")
    t.add_column("between")
    t.add_column("properties")
    t.add_row("default", p.default_link.describe())
    for pair, spec in p.group_links.items():
        t.add_row(" <-> ".join(sorted(pair)), spec.describe())
    out.print(t)
    from .engine import BACKENDS, backend_module
    for name in BACKENDS:
        for line in backend_module(name).plan_lines(p):
            out.print(line)
    for backend, missing in gaps.items():
        for feature, why in missing:
            out.print(f"[yellow]not on the {backend} backend[/yellow]: {feature}: {why}", highlight=False)
    return EXIT_OK


def _backend_gaps(s) -> dict[str, list[tuple[str, str]]]:
    """{backend: [(feature, why)]} for the scenario's features a backend lacks."""
    from .engine import BACKENDS, backend_class, unsupported
    gaps = {}
    for name in BACKENDS:
        try:
            cls = backend_class(name)
        except ImportError as e:   # e.g. the kubernetes client missing: say so, plan the rest
            gaps[name] = [("backend", f"cannot be loaded: {e}")]
            continue
        if unsupported(s, cls):
            gaps[name] = unsupported(s, cls)
    return gaps


def cmd_schema(args) -> int:
    print(json.dumps(scenario_mod.json_schema(), indent=2, sort_keys=True))
    return EXIT_OK


def cmd_docs_ref(args) -> int:
    from . import docsref
    if args.check:
        stale = docsref.check()
        for rel in stale:
            console.print(f"[red]error[/red] {rel} is out of date: run `make docs-ref`")
        return EXIT_FAILED if stale else EXIT_OK
    for rel in docsref.write():
        out.print(f"wrote {rel}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(prog="torbed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"torbed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a scenario file (nothing starts)", formatter_class=fmt)
    p.add_argument("scenario", help="scenario YAML file")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="print the concrete network of a scenario", formatter_class=fmt)
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--variant", default=None, help="variant to plan (default: the scenario's first)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("schema", help="print the scenario JSON Schema", formatter_class=fmt)
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("docs-ref", help="regenerate the docs' reference pages (docs/reference/, from the scenario "
                       "model and these parsers)", formatter_class=fmt)
    p.add_argument("--check", action="store_true", help="only check they are in sync (exit 1 if not)")
    p.set_defaults(func=cmd_docs_ref)

    from . import commands
    from .engine import BACKENDS, backend_module
    from .generate import command as generate_command
    for register in [*commands.REGISTER, generate_command.register, generate_command.register_calibrate]:
        register(sub, fmt)
    for name in BACKENDS:   # clean, prometheus, variants, build (local); chart-files (k8s)
        backend_module(name).register_commands(sub, fmt)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    rest = None
    if "--" in argv:   # `torbed capture OUT ... -- COMMAND ARGS`: the command is not ours to parse
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    args.argv_after_dashdash = rest
    try:
        return args.func(args)
    except (TorbedError, KeyboardInterrupt) as e:
        return report(e)


def report(e: TorbedError | KeyboardInterrupt) -> int:
    """The one mapper from an error to what the user sees (stderr, never a traceback) and the
    exit code, which is the error class's own (torbed.errors). ``main`` calls it, and so do
    the analysis and replay commands' guards, which tests also call directly."""
    if isinstance(e, Interrupted):
        console.print(f"[yellow]interrupted[/yellow] ({e}): everything started was stopped and removed; "
                      "records measured so far are kept", highlight=False)
    elif isinstance(e, InputError):
        # One line per problem, each naming its file and field.
        for line in str(e).splitlines() or [type(e).__name__]:
            console.print(f"[red]error[/red] {line}", highlight=False, soft_wrap=True)
    elif isinstance(e, TorbedError):
        console.print(f"[red]error[/red] {e}", highlight=False)
    else:
        console.print("[yellow]interrupted[/yellow]")
        return EXIT_INTERRUPTED
    return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
