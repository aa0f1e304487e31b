"""Torchestra stress run (``make bench``, part torchestra): many circuits crossing the
light/heavy thresholds both ways for minutes; zero failed (sha256-checked) transfers
required, switches reported. The network and the checks are torbed.analysis.torchestra's
(its integration tests use them too).

``python -m torbed.bench torchestra`` or ``python -m torbed.bench.torchestra [--duration 5m] [--out runs/bench]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

from .. import resources
from ..analysis.torchestra import analyse, problems, scenario
from ..backends.local.supervise import run_torbed
from .results import bench_run, stamp

REPO = resources.ROOT


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Torchestra stress run: many circuits crossing the thresholds "
                                             "both ways; zero failed transfers required, switches reported.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--duration", default="5m", help="measurement duration")
    ap.add_argument("--bulk", type=int, default=1, help="continuous bulk clients")
    ap.add_argument("--surge", type=int, default=4, help="clients fetching 3 MB every 4 s (cross both ways)")
    ap.add_argument("--light", type=int, default=6, help="clients fetching 200 KB every 2 s")
    ap.add_argument("--out", default="runs/bench", help="results directory (torchestra-<UTC stamp>.json)")
    a = ap.parse_args(argv)
    about = bench_run("torchestra", sys.argv[1:] if argv is None else argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="torchestra-stress-") as tmp:
        data = scenario("torchestra-stress", a.duration, bulk=a.bulk, surge=a.surge, light=a.light)
        path = Path(tmp) / "torchestra-stress.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        runs = out / "torchestra-stress-runs"
        t0 = time.time()
        p = run_torbed(["run", str(path), "--out", str(runs)], capture=False, cwd=REPO)
        if p.returncode != 0:
            print(f"torchestra stress: torbed run failed (exit {p.returncode})", file=sys.stderr)
            return 1
        run_dir = max((d for d in runs.iterdir() if d.is_dir() and not d.is_symlink()), key=lambda d: d.stat().st_mtime)
        summary = analyse(run_dir, "torchestra")
        summary.update({"duration": a.duration, "wall_s": round(time.time() - t0, 1), "run_dir": str(run_dir)})
        bad = problems(summary)
        summary["problems"] = bad
        summary["bench_run"] = about
        (out / f"torchestra-{stamp(about['started'])}.json").write_text(json.dumps(summary, indent=2) + "\n")
    ex = summary["relays"].get("exit0", {})
    print(f"torchestra stress ({a.duration}): {summary['transfers_ok']} transfers ok "
          f"({summary['bytes_ok'] / 1e6:.1f} MB, sha256-checked), {summary['transfers_failed']} failed; "
          f"exit moved circuits light->heavy {ex.get('exit_moves', {}).get('to_heavy', 0)} times, "
          f"heavy->light {ex.get('exit_moves', {}).get('to_light', 0)} times; "
          f"{summary['switches_completed']} switches completed (all hops)")
    for b in bad:
        print(f"torchestra stress: PROBLEM {b}", file=sys.stderr)
    if not bad and not (ex.get("exit_moves", {}).get("to_heavy") and ex.get("exit_moves", {}).get("to_light")):
        print("torchestra stress: PROBLEM no switches in both directions", file=sys.stderr)
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
