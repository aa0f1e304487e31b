"""What observing a run costs, and that it changes nothing measured (part of `make bench`).

Runs quickstart (variant vanilla, same seed) with measure.prometheus on and off, alternating
the order, ``--runs`` pairs, and reports:

- CPU of Prometheus, of the measurement drivers and of the collector process (whole
  processes, exporters included; from the run's own TSDB: process_cpu_seconds_total), as a
  share of one core over the repetition;
- bring-up time (meta.json ready_s) on vs off;
- TTLB per client group on vs off: medians and a two-sample Kolmogorov-Smirnov test
  (pooled over the pairs); relays' CPU from resources.jsonl on vs off.

Results are printed and written to <out>/prometheus-<stamp>.json. Exit 1 when a run fails.
Usage: python -m torbed.bench.prometheus [--runs 2] [--duration 90s] [--out runs/bench]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table
from scipy import stats as sstats

from .. import constants
from ..backends.local import prometheus
from ..backends.local.supervise import run_torbed
from .results import bench_run, stamp as file_stamp

console = Console(width=None if sys.stdout.isatty() else 160)


def _run(scenario: Path, out: Path, duration: str) -> Path:
    p = run_torbed(["run", str(scenario), "--variant", "vanilla", "--duration", duration, "--out", str(out)])
    if p.returncode != 0:
        raise RuntimeError(f"torbed run {scenario.name} failed:\n{p.stderr[-2000:]}")
    return Path(p.stdout.strip()) / "vanilla" / "rep-0"


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _cpu_from_tsdb(rep: Path, meta: dict) -> dict:
    span = int(meta["t_end"] - meta["t_ready"])
    out = {}
    with prometheus.serve(rep / "prometheus") as s:
        for job in ("prometheus", "driver", "collector"):
            q = {"query": f'sum(increase(process_cpu_seconds_total{{job="{job}"}}[{span}s]))', "time": meta["t_end"]}
            with urllib.request.urlopen(f"{s.url}/api/v1/query?" + urllib.parse.urlencode(q), timeout=30) as r:
                res = json.load(r)["data"]["result"]
            out[job] = float(res[0]["value"][1]) / span if res else None
    return out


def _tor_cpu(rep: Path, role: str) -> float:
    by: dict = {}
    for r in _records(rep / "resources.jsonl"):
        if r["role"] == role:
            by.setdefault(r["node"], []).append(r)
    total = wall = 0.0
    for recs in by.values():
        recs.sort(key=lambda x: x["t"])
        total += recs[-1]["cpu_s"] - recs[0]["cpu_s"]
        wall = max(wall, recs[-1]["t"] - recs[0]["t"])
    return total / wall if wall else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2, help="pairs of runs (on, off)")
    ap.add_argument("--duration", default="90s", help="measure.duration of each run")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    about = bench_run("prometheus", sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scen = _scenarios(out)
    reps: dict[str, list[Path]] = {"on": [], "off": []}
    try:
        for i in range(args.runs):
            for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
                console.print(f"pair {i + 1}/{args.runs}: prometheus {mode}")
                reps[mode].append(_run(scen[mode], out / "prometheus-ab-runs", args.duration))
    except RuntimeError as e:
        console.print(f"[red]{e}[/red]")
        return 1
    result = {**_result(reps, args.runs, args.duration), "bench_run": about}
    console.print(_table(result))
    path = out / f"prometheus-{file_stamp(about['started'])}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {path}")
    return 0


def _scenarios(out: Path) -> dict[str, Path]:
    """quickstart with Prometheus on and off, written under ``out``: mode -> scenario file."""
    base = yaml.safe_load((constants.SCENARIOS_DIR / "quickstart.yaml").read_text())
    scen = {}
    for mode in ("on", "off"):
        d = json.loads(json.dumps(base))
        d.setdefault("measure", {})["prometheus"] = {"enabled": mode == "on"}
        scen[mode] = out / f"prometheus-ab-{mode}.yaml"
        scen[mode].write_text(yaml.safe_dump(d, sort_keys=False))
    return scen


def _result(reps: dict[str, list[Path]], runs: int, duration: str) -> dict:
    """Per mode: readiness, relays' and observers' CPU; per client group: TTLB on vs off (KS test)."""
    result: dict = {"runs": runs, "duration": duration, "modes": {}}
    ttlb: dict = {"on": {}, "off": {}}
    for mode, paths in reps.items():
        ready, cpu, relay_cpu = [], [], []
        for rep in paths:
            meta = json.loads((rep / "meta.json").read_text())
            ready.append(meta["ready_s"])
            relay_cpu.append(_tor_cpu(rep, "relay"))
            if mode == "on":
                cpu.append(_cpu_from_tsdb(rep, meta))
            for r in _records(rep / "transfers.jsonl"):
                if r["status"] == "ok" and not r.get("warmup") and r.get("ttlb_s") is not None:
                    ttlb[mode].setdefault(r["group"], []).append(r["ttlb_s"])
        result["modes"][mode] = {"ready_s": ready, "relay_cpu_cores": relay_cpu, "observer_cpu_cores": cpu,
                                 "run_dirs": [str(p.parent.parent) for p in paths]}
    result["ttlb"] = {}
    for g in sorted(set(ttlb["on"]) | set(ttlb["off"])):
        a, b = ttlb["on"].get(g, []), ttlb["off"].get(g, [])
        ks = sstats.ks_2samp(a, b) if a and b else None
        result["ttlb"][g] = {"n_on": len(a), "n_off": len(b),
                             "median_on": statistics.median(a) if a else None,
                             "median_off": statistics.median(b) if b else None,
                             "ks_statistic": ks.statistic if ks else None, "ks_p": ks.pvalue if ks else None}
    return result


def _table(result: dict) -> Table:
    t = Table(title="Prometheus on vs off (quickstart, vanilla)")
    for c in ("what", "on", "off"):
        t.add_column(c)
    m = result["modes"]
    t.add_row("ready_s (median)", f"{statistics.median(m['on']['ready_s']):.1f}", f"{statistics.median(m['off']['ready_s']):.1f}")
    t.add_row("relays' CPU (cores, median)", f"{statistics.median(m['on']['relay_cpu_cores']):.3f}",
              f"{statistics.median(m['off']['relay_cpu_cores']):.3f}")
    for job in ("prometheus", "driver", "collector"):
        vals = [c[job] for c in m["on"]["observer_cpu_cores"] if c.get(job) is not None]
        t.add_row(f"{job} CPU (cores, median)", f"{statistics.median(vals):.4f}" if vals else "-", "not running"
                  if job == "prometheus" else "(not measured)")
    for g, r in result["ttlb"].items():
        t.add_row(f"TTLB {g} median s (n)", f"{r['median_on']:.2f} ({r['n_on']})" if r["median_on"] else "-",
                  f"{r['median_off']:.2f} ({r['n_off']})" if r["median_off"] else "-")
        if r["ks_p"] is not None:
            t.add_row(f"TTLB {g} KS", f"D={r['ks_statistic']:.3f}", f"p={r['ks_p']:.3f}")
    return t

if __name__ == "__main__":
    sys.exit(main())
