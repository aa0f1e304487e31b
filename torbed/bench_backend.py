"""Bring-up speed and per-node cost of the local backend (part of `make bench`).

For each benchmark network (quickstart; 3 authorities + 100 relays + 4 clients) it runs
`torbed run` several times and reports, with median and min/max over the runs:

- seconds from `torbed run` start to network ready, and to the first successful transfer
- seconds from network setup (keys, namespaces) to ready, as recorded in meta.json
- per-node RSS (MiB) and CPU (% of one core) of the tor processes once ready and after the
  soak time (default 5 minutes), by role, and each tor's peak RSS (VmHWM) at the end

Results are printed and written to <out>/backend-<stamp>.json. A network that never becomes
ready fails the benchmark (exit 1). Usage: python -m torbed.bench_backend [--runs 3]
[--soak 300] [--only quickstart|bench-100-relays] [--out runs/bench]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import constants
from .scenario import load

NETWORKS = {"quickstart": "quickstart.yaml", "bench-100-relays": "bench-100-relays.yaml"}
TARGETS = {"quickstart": {"ready_s": 10.0}, "bench-100-relays": {"ready_s": 60.0, "rss_mib": 60.0}}

console = Console()


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def one_run(scenario: Path, out: Path, soak: float) -> dict:
    variant = load(scenario).variants[0]
    t_cmd = time.time()
    p = subprocess.run([sys.executable, "-m", "torbed.cli", "run", str(scenario), "--variant", variant,
                        "--duration", f"{int(soak)}s", "--out", str(out)],
                       capture_output=True, text=True, cwd=constants.REPO_ROOT)
    name = load(scenario).name
    runs = sorted(d for d in out.glob(f"{name}-2*") if d.is_dir() and not d.is_symlink()
                  and (d / "run.json").exists() and d.stat().st_ctime >= t_cmd - 1)
    if not runs:
        raise RuntimeError(f"no run directory: {p.stderr[-2000:]}")
    rep = runs[-1] / variant / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    if not meta.get("t_ready"):
        raise RuntimeError(f"network never became ready: {meta.get('error')}\n{p.stderr[-2000:]}")
    ok = [t for t in _records(rep / "transfers.jsonl") if t["status"] == "ok"]
    res = _records(rep / "resources.jsonl")
    out_res = {}
    for label in ("ready", "end"):
        rows = [r for r in res if r["label"] == label]
        out_res[label] = {r["node"]: r for r in rows}
    cpu = {}
    for node, end in out_res["end"].items():
        start = out_res["ready"].get(node)
        if start and end["t"] > start["t"]:
            cpu[node] = 100.0 * (end["cpu_s"] - start["cpu_s"]) / (end["t"] - start["t"])
    return {
        "run_dir": str(runs[-1]), "exit_code": p.returncode,
        "cmd_to_ready_s": meta["t_ready"] - t_cmd,
        "setup_to_ready_s": meta["ready_s"],
        "cmd_to_first_transfer_s": (min(t["t_last_byte"] for t in ok) - t_cmd) if ok else None,
        "keys": meta.get("keys"),
        "rss_ready_mib": {n: r["rss_bytes"] / 2**20 for n, r in out_res["ready"].items()},
        "rss_end_mib": {n: r["rss_bytes"] / 2**20 for n, r in out_res["end"].items()},
        "rss_peak_mib": {n: r["rss_peak_bytes"] / 2**20 for n, r in out_res["end"].items() if "rss_peak_bytes" in r},
        "cpu_pct_ready_to_end": cpu,
        "roles": {n: r["role"] for n, r in out_res["ready"].items()},
        "soak_s": soak, "variant": variant,
    }


def _stats(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(name: str, runs: list[dict]) -> dict:
    out = {"runs": len(runs)}
    for key in ("cmd_to_ready_s", "setup_to_ready_s", "cmd_to_first_transfer_s"):
        out[key] = _stats([r[key] for r in runs])
    for role in ("authority", "relay", "client"):
        for metric in ("rss_ready_mib", "rss_end_mib", "rss_peak_mib", "cpu_pct_ready_to_end"):
            vals = [v for r in runs for n, v in r[metric].items() if r["roles"].get(n) == role]
            out[f"{role}_{metric}"] = _stats(vals)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--soak", type=float, default=300.0, help="seconds to run after ready (RSS/CPU 'after')")
    ap.add_argument("--only", choices=list(NETWORKS), action="append")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    out = Path(args.out)
    work = out / "backend-runs"
    work.mkdir(parents=True, exist_ok=True)
    results, failed = {}, False
    for name in args.only or list(NETWORKS):
        runs = []
        for i in range(args.runs):
            console.log(f"{name}: run {i + 1}/{args.runs} (soak {args.soak:.0f} s)")
            try:
                r = one_run(constants.SCENARIOS_DIR / NETWORKS[name], work, args.soak)
            except RuntimeError as e:
                console.print(f"[red]{name}: {e}[/red]")
                failed = True
                break
            console.log(f"  ready {r['cmd_to_ready_s']:.1f} s after `torbed run` "
                        f"({r['setup_to_ready_s']:.1f} s after setup), keys {r['keys']}")
            runs.append(r)
        results[name] = {"summary": summarize(name, runs) if runs else None, "runs": runs,
                         "targets": TARGETS.get(name)}
    t = Table(title="local backend: bring-up and per-node cost (median [min-max] over runs)")
    for col in ("network", "metric", "value", "target"):
        t.add_column(col)
    fmt = lambda s, u="": "-" if not s or s["median"] is None else f"{s['median']:.1f}{u} [{s['min']:.1f}-{s['max']:.1f}]"  # noqa: E731
    for name, r in results.items():
        s = r["summary"]
        if not s:
            continue
        tg = TARGETS.get(name, {})
        t.add_row(name, "run start -> ready", fmt(s["cmd_to_ready_s"], " s"), f"<= {tg['ready_s']:.0f} s" if "ready_s" in tg else "")
        t.add_row("", "setup -> ready", fmt(s["setup_to_ready_s"], " s"), "")
        t.add_row("", "run start -> first transfer", fmt(s["cmd_to_first_transfer_s"], " s"), "")
        for role in ("authority", "relay", "client"):
            t.add_row("", f"{role} RSS ready / after soak",
                      f"{fmt(s[f'{role}_rss_ready_mib'], ' MiB')} / {fmt(s[f'{role}_rss_end_mib'], ' MiB')}",
                      f"<= {tg['rss_mib']:.0f} MiB" if role == "relay" and "rss_mib" in tg else "")
            t.add_row("", f"{role} peak RSS (VmHWM at end)", fmt(s[f"{role}_rss_peak_mib"], " MiB"), "")
            t.add_row("", f"{role} CPU ready->end", fmt(s[f"{role}_cpu_pct_ready_to_end"], " %"), "")
    console.print(t)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"backend-{stamp}.json"
    path.write_text(json.dumps(results, indent=1, sort_keys=True))
    console.print(f"results: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
