"""The ``torbed generate`` subcommand: arguments, the summary table, writing the file; and
``torbed calibrate``, which measures the generator's budget figures from a finished run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import EXIT_OK, InputError
from . import budget as budget_mod, build

console = Console(stderr=True)


def _whole(text: str, least: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {v}" if least else f"must be 0 or more, got {v}")
    return v


def _positive_int(text: str) -> int:
    return _whole(text, 1)


def _nonneg_int(text: str) -> int:
    return _whole(text, 0)


def _in_range(text: str, zero_ok: bool) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (0 <= v if zero_ok else 0 < v) or v > 1:
        raise argparse.ArgumentTypeError(f"must be in {'[' if zero_ok else '('}0, 1], got {v}")
    return v


def _fraction(text: str) -> float:
    return _in_range(text, zero_ok=False)


def _share(text: str) -> float:
    """A share in [0, 1] (0: no lower bound)."""
    return _in_range(text, zero_ok=True)


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {v}")
    return v


def _ratio(text: str) -> float:
    v = _positive(text)
    if v <= 1:
        raise argparse.ArgumentTypeError(f"must be larger than 1, got {v}")
    return v


def _rate(text: str) -> int:
    from .. import units
    try:
        return units.parse_rate(text) // 8
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _mix(text: str) -> dict[str, float]:
    out = {}
    for part in text.split(","):
        name, _, share = part.partition("=")
        name = name.strip()
        if name not in build.WORKLOADS:
            raise argparse.ArgumentTypeError(f"unknown workload {name!r} (known: {', '.join(build.WORKLOADS)})")
        try:
            out[name] = float(share)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: write NAME=SHARE, e.g. web=0.9,bulk=0.1") from None
        if out[name] < 0:
            raise argparse.ArgumentTypeError(f"{part!r}: a share cannot be negative")
    if not any(out.values()):
        raise argparse.ArgumentTypeError("every share is 0")
    return out


def _latency_model(text: str):
    """--latency: 'model' (torbed's region model), 'none', or a matrix file (read when the
    command runs, so a bad file is an InputError naming it: exit 2)."""
    from . import latency
    if text == "none":
        return None
    return latency.DEFAULT if text == "model" else latency.load(text)


def cmd_generate(args) -> int:
    from . import generate
    if args.relays is None and args.scale is None:
        raise InputError("give the network's size: --relays N or --scale FRACTION")
    budget = budget_mod.machine(
        cores=args.cores, memory_mib=args.memory_mib,
        bench_dir=Path(args.bench_dir) if args.bench_dir else None,
        mem_per_tor_mib=args.mem_per_tor, cpu_per_relayed_mbps=args.cpu_per_mbps, cpu_share=args.cpu_share,
        min_utilization=args.min_utilization)
    res = generate(args.consensus, args.descriptors, relays=args.relays, scale=args.scale, seed=args.seed,
                   clients=args.clients, mix=args.mix, perf=not args.no_perf, name=args.name,
                   variants=args.variants.split(",") if args.variants else None, duration=args.duration,
                   warmup=args.warmup, authorities=args.authorities, bin_ratio=args.bin_ratio,
                   total_rate=args.total_rate, budget=budget, networks=args.networks,
                   latency=_latency_model(args.latency), capacity_from_consensus=args.capacity_from_consensus)
    t = Table(title=f"{res.data['name']}: {len(res.sample.relays)} relays in {len(res.groups)} groups "
                    f"(rate scale {res.fit.scale:.4g}, {res.fit.floored} at tor's minimum)")
    for col in ("class", "in consensus", "sampled", "groups", "group rates"):
        t.add_column(col)
    for p in ("guard", "exit", "guardexit", "middle"):
        gs = [g for g in res.groups if g.position == p]
        rates = ", ".join(f"{g.name} {len(g.relays)}x{g.rate // 1024} KiB/s" for g in gs)
        t.add_row(p, str(res.sample.available[p]), str(res.sample.per_class[p]), str(len(gs)), rates)
    console.print(t)
    f = res.fit
    console.print(f"budget: {f.relayed_budget / 1e6:.2f} MB/s relayed at most; expected {f.expected_load / 1e6:.2f} MB/s "
                  f"({f.expected_load / max(sum(f.rates), 1):.0%} of the rates' {sum(f.rates) / 1e6:.2f} MB/s) and "
                  f"{f.cpu_expected:.2f} of {budget.cores:g} cores ({f.cpu_idle:.2f} before relaying); rate scale set by "
                  f"{f.binding}; {f.memory_mib:.0f} MiB for tors ({budget.source})", highlight=False)
    if f.expected_load >= 0.9 * sum(f.rates):
        console.print("note: the clients ask for about as much as the relays can carry, or more: queues will grow "
                      "through the window (fewer clients, or more cores, keep the relays below saturation)",
                      highlight=False)
    if args.output in (None, "-"):
        sys.stdout.write(res.yaml)
    else:
        out = Path(args.output)
        if out.exists() and not args.force:
            raise InputError(f"{out}: exists; pass --force to replace it")
        try:
            out.write_text(res.yaml)
        except OSError as e:
            raise InputError(f"{out}: cannot write the scenario: {e.strerror or e}") from None
        console.print(f"wrote {out}; next: torbed validate {out} && torbed run {out}", highlight=False)
    return EXIT_OK


def register(sub, fmt) -> None:
    p = sub.add_parser(
        "generate", formatter_class=fmt,
        help="a scenario sampled from a real Tor consensus and server descriptors (from CollecTor)",
        description="Sample a network from a consensus and server descriptors downloaded from CollecTor "
                    "(docs/generate.md): relays drawn by consensus weight within position classes, rates "
                    "scaled into this machine's budget. Next stage: torbed validate / torbed run.")
    p.add_argument("consensus", help="a network-status consensus file (CollecTor consensuses-YYYY-MM/...)")
    p.add_argument("descriptors", nargs="*",
                   help="server descriptors: files, directories (recursive) or .tar/.tar.xz archives")
    p.add_argument("--capacity-from-consensus", action="store_true",
                   help="no descriptors: each relay's capacity is its consensus weight x 1000 B/s (a fallback, "
                        "recorded in generated.parameters.capacity_source; docs/generate.md)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--relays", type=_positive_int, default=None, help="relays in the sample")
    size.add_argument("--scale", type=_fraction, default=None,
                      help="the sample as a fraction of the usable relays (tornettools' network scale)")
    p.add_argument("--seed", type=_nonneg_int, default=1, help="seed of the sampling (recorded)")
    p.add_argument("--clients", type=_nonneg_int, default=None,
                   help="measurement clients besides the OnionPerf probes (default: one per relay)")
    p.add_argument("--mix", type=_mix, default=dict(build.DEFAULT_MIX),
                   help="clients' workloads as shares, NAME=SHARE,... (web: 50 KiB pages with 5 s think time; "
                        "bulk: 5 MiB back to back; http, ssh: a captured browsing or SSH session replayed with "
                        "its timing, looped)")
    p.add_argument("--no-perf", action="store_true", help="no OnionPerf-style probes (50 KiB, 1 MiB, 5 MiB)")
    p.add_argument("--networks", type=_positive_int, default=1,
                   help="independently sampled networks, one per block (seeds SEED, SEED+1, ...; repetitions = "
                        "this): the report's intervals then include network-sampling error (Jansen, Tracey & "
                        "Goldberg 2021). 1: one network for every repetition")
    p.add_argument("--latency", default="model", metavar="model|none|FILE",
                   help="one-way delays on the links: 'model' (regions with the real network's shares, delays "
                        "between continents: docs/generate.md), 'none', or a YAML matrix file (regions: shares; "
                        "delay_ms: region to region milliseconds)")
    p.add_argument("--name", default=None, help="scenario name (default: tor-sample-N)")
    p.add_argument("--variants", default=None, help="comma-separated variants (default: kist)")
    p.add_argument("--duration", default="5m", help="measure.duration")
    p.add_argument("--warmup", default="30s", help="measure.warmup")
    p.add_argument("--authorities", type=_positive_int, default=3, help="directory authorities")
    p.add_argument("--bin-ratio", type=_ratio, default=build.DEFAULT_BIN_RATIO,
                   help="width of a capacity bin (ratio of its edges; smaller: more groups, rates closer to each "
                        "relay's own)")
    p.add_argument("--total-rate", type=_rate, default=None,
                   help="the relays' summed rate, e.g. 20MB/s (default: the machine's budget; refused above it)")
    p.add_argument("--cores", type=_positive, default=None, help="cores of the budget (default: this machine's)")
    p.add_argument("--memory-mib", type=_positive, default=None,
                   help="memory of the budget in MiB (default: this machine's MemAvailable)")
    p.add_argument("--mem-per-tor", type=_positive, default=None,
                   help=f"MiB per tor (default: {budget_mod.MEM_PER_TOR_MIB:g}, or the bench results' relay peak)")
    p.add_argument("--cpu-per-mbps", type=_positive, default=None,
                   help=f"cores tor spends per relayed MB/s (default: {budget_mod.CPU_PER_RELAYED_MBPS:g}; the shaper's "
                        f"{budget_mod.CPU_SHAPER_PER_MBPS:g} comes on top; docs/generate.md)")
    p.add_argument("--cpu-share", type=_fraction, default=None,
                   help=f"share of the cores the testbed may use while it measures (default: {budget_mod.CPU_SHARE:g})")
    p.add_argument("--min-utilization", type=_share, default=None,
                   help=f"smallest expected load as a share of the rates' sum (default: {budget_mod.MIN_UTILIZATION:g}): "
                        "caps the rates so relays queue; 0: no cap")
    p.add_argument("--bench-dir", default="runs/bench", help="where bench results and calibrations are ('': none)")
    p.add_argument("-o", "--output", default=None, help="scenario file to write (default: stdout)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.set_defaults(func=cmd_generate)


def register_calibrate(sub, fmt) -> None:
    p = sub.add_parser(
        "calibrate", formatter_class=fmt,
        help="measure the generator's budget figures (CPU per relayed MB/s, per client, ...) from a finished run",
        description="Read a finished run's CPU-gate readings per process and its relays' written bytes, derive the "
                    "budget's CPU figures per repetition (docs/generate.md, \"The budget\"), and write their medians "
                    "to BENCH_DIR/calibration-<time>.json, which torbed generate then uses on this machine.")
    p.add_argument("run_dir", help="a RUN_DIR of the local backend (CPU sampled per process), e.g. of a generated scenario")
    p.add_argument("--bench-dir", default="runs/bench", help="where to write the calibration (default: runs/bench)")
    p.add_argument("--dry-run", action="store_true", help="print the figures; write nothing")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    from . import calibrate
    cal = calibrate.calibrate(args.run_dir)
    b = budget_mod.Budget(cores=1, memory_mib=1)
    t = Table(title=f"calibration from {cal['run_id']} ({len(cal['repetitions'])} repetitions used, "
                    f"{len(cal['not_used'])} not)")
    for col in ("figure", "median", "range", "documented default"):
        t.add_column(col)
    for f in calibrate.FIGURES:
        if f in cal["figures"]:
            lo, hi = cal["ranges"][f]
            t.add_row(f, f"{cal['figures'][f]:.4g}", f"{lo:.4g}-{hi:.4g}", f"{getattr(b, f):.4g}")
        else:
            t.add_row(f, "–", "", f"{getattr(b, f):.4g}")
    out = Console(soft_wrap=True)
    out.print(t)
    for s in cal["not_used"]:
        out.print(f"not used: {s['rep']}: {s['reason']}", highlight=False)
    for n in cal["notes"]:
        out.print(f"note: {n}", highlight=False)
    if args.dry_run:
        return EXIT_OK
    path = calibrate.write(cal, args.bench_dir)
    out.print(f"wrote {path}; torbed generate --bench-dir {args.bench_dir} uses it on a machine with "
              f"{cal['machine']['cpus']} cores", highlight=False)
    return EXIT_OK
