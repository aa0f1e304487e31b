"""``python -m torbed.bench [PART ...] [--quick] [--out runs/bench]``: the benchmarks behind
``make bench``. Each part prints its figures and writes JSON results under ``--out``; every
part runs even when an earlier one failed, and one failing part fails the whole (exit 1).
No PART: all of them, in the table's order. ``--quick`` (BENCH_QUICK=1 in hack/bench.sh):
each part's shorter settings.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass

from .. import resources
from .results import QUICK_ENV


@dataclass(frozen=True)
class Part:
    name: str
    what: str
    command: tuple[str, ...]          # after `python -m` (a torbed.bench module), or a whole command
    quick: tuple[str, ...] = ()       # extra arguments with --quick
    module: bool = True               # False: ``command`` is not a Python module


PARTS = (
    Part("linkemu", "userspace link emulator: delay/rate/jitter/loss fidelity and forwarding speed",
         ("torbed.bench.linkemu",), ("--quick",)),
    Part("backend", "local backend: seconds to a ready network and per-node RSS/CPU (quickstart, 100 relays)",
         ("torbed.bench.backend",), ("--runs", "1", "--soak", "30")),
    Part("torchestra", "many circuits crossing the light/heavy thresholds both ways for minutes; zero failed "
                       "(sha256-checked) transfers required, switches reported",
         ("torbed.bench.torchestra",), ("--duration", "2m")),
    Part("prometheus", "its and the exporters' CPU during quickstart; bring-up time and TTLB with it on vs off "
                       "(same seed, alternating order)",
         ("torbed.bench.prometheus",), ("--runs", "1", "--duration", "60s")),
    Part("load", "background load (Locust through tor): users carried, CPU per user, at rising user counts",
         ("torbed.bench.load",), ("--users", "10,100", "--duration", "30")),
    Part("mtrelay", "mtrelay (Engler & Goldberg 2021): a middle relay's throughput vs connection threads "
                    "(stock, mtrelay-1/2/3), median and range over repetitions, ratio to single-threaded",
         ("torbed.bench.mtrelay",), ("--quick",)),
    # Experiments that used to sit in the test suite (pytest marker `experiment`): effect
    # sizes and ratios between arms, each with its expected direction and bound (docs/testing.md).
    Part("experiments", "the experiment-marked tests (make experiments)", ("make", "-s", "experiments"),
         module=False),
)


def command(part: Part, out: str, quick: bool) -> list[str]:
    if not part.module:
        return list(part.command)
    return [sys.executable, "-m", *part.command, "--out", out, *(part.quick if quick else ())]


def main(argv: list[str] | None = None) -> int:
    names = [p.name for p in PARTS]
    ap = argparse.ArgumentParser(prog="python -m torbed.bench", description=__doc__.splitlines()[0],
                                 epilog="parts: " + "; ".join(f"{p.name}: {p.what}" for p in PARTS))
    ap.add_argument("parts", nargs="*", metavar="PART", help=f"parts to run (default: all): {', '.join(names)}")
    ap.add_argument("--out", default="runs/bench", help="results directory")
    ap.add_argument("--quick", action="store_true", help="each part's shorter settings")
    a = ap.parse_args(argv)
    unknown = [n for n in a.parts if n not in names]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; parts: {', '.join(names)}")
    root = resources.checkout("benchmarks")
    rc = 0
    for part in PARTS:
        if a.parts and part.name not in a.parts:
            continue
        print(f"== bench: {part.name}", flush=True)
        cmd = command(part, a.out, a.quick)
        # The parts record whether their arguments were the quick settings (torbed.bench.results).
        env = {**os.environ, QUICK_ENV: "1" if a.quick else "0"}
        if subprocess.run(cmd, cwd=root, env=env).returncode != 0:
            print(f"bench: part failed: {' '.join(cmd)}", file=sys.stderr, flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
