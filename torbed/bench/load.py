"""Cost of background load on this machine (part of `make bench`).

Runs a small private network (3 authorities, guard/middle/exit, one foreground fetch
client) with the default traffic mix (McCoy et al. 2008 shares, docs/load.md) at rising
user counts, one `torbed run` per level, and reports per level:

- users reached, Locust requests, failures, requests/s (load.jsonl)
- CPU (% of one core) of the Locust worker(s), the master and the load nodes' tors, from
  resources.jsonl ("ready" to "load-end"); CPU per user = their sum / users
- web-page response time p50 / p90 (Locust's whole-run percentiles)

A level is *carried* when every user started, at most 1% of requests fail, no Locust worker
exceeds 90% of a core (Locust's own warning threshold: beyond it its timings are no longer
trustworthy), and each user still makes at least 75% of the requests per second a user
makes at the smallest level (the users' think time, not the testbed, sets the pace).
Results are printed and written to <out>/load-<stamp>.json; exit 1 if the smallest level
is not carried. Usage: python -m torbed.bench.load [--users 10,50,100,200] [--workers 1]
[--duration 60] [--out runs/bench]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from .. import resources
from ..backends.local.supervise import run_torbed
from .results import bench_run, stamp as file_stamp

console = Console(width=None if sys.stdout.isatty() else 160)
CPU_LIMIT = 0.90          # of one core, per Locust worker
FAILURE_LIMIT = 0.01
RATE_LIMIT = 0.75         # of the smallest level's requests/s per user


def scenario(users: int, workers: int, duration_s: int) -> dict:
    return {
        "apiVersion": "torbed/v1", "name": f"bench-load-{users}", "variants": ["kist"],
        "network": {"authorities": 3, "relays": {"guard": {"guard": True}, "middle": {}, "exit": {"exit": True}}},
        "servers": {"www": {"files": {"small": "50KiB"}}},
        "clients": {"web": {"path": ["guard", "middle", "exit"],
                            "workload": {"kind": "fetch", "file": "small", "repeat": 100000, "pause": "1s"}}},
        "measure": {"warmup": "0s", "duration": f"{duration_s}s", "collect": ["transfers"], "ready_timeout": "180s"},
        # Every user started within the first 10 s (or at 1 user/s).
        "load": {"users": users, "workers": workers, "spawn_rate": max(1.0, users / 10)},
    }


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def one_level(users: int, workers: int, duration_s: int, out: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "load.yaml"
        path.write_text(yaml.safe_dump(scenario(users, workers, duration_s)))
        p = run_torbed(["run", str(path), "--out", str(out)], cwd=resources.ROOT)
    run = out / f"bench-load-{users}-latest"
    rep = run.resolve() / "kist" / "rep-0"
    meta = json.loads((rep / "meta.json").read_text()) if (rep / "meta.json").exists() else {}
    if p.returncode != 0 or meta.get("status") != "ok":
        return {"users": users, "error": meta.get("error") or p.stderr[-1500:]}
    loads = _records(rep / "load.jsonl")
    total = loads[-1]["total"]
    web = loads[-1]["by_name"].get("web", {})
    busy = [r for r in loads if r["users"] > 0]
    span = busy[-1]["t"] - busy[0]["t"] if len(busy) > 1 else float("nan")
    res = _records(rep / "resources.jsonl")

    def cpu(role: str) -> list[float]:
        """% of one core per process of ``role`` between its first sample and load-end."""
        out = []
        for node in sorted({r["node"] for r in res if r["role"] == role}):
            s = [r for r in res if r["node"] == node]
            end = [r for r in s if r["label"] == "load-end"]
            if end and len(s) > 1 and end[0]["t"] > s[0]["t"]:
                out.append(100 * (end[0]["cpu_s"] - s[0]["cpu_s"]) / (end[0]["t"] - s[0]["t"]))
        return out

    w, m, t = cpu("locust-worker"), cpu("locust-master"), cpu("loadworker")
    total_cpu = sum(w) + sum(m) + sum(t)
    failure_ratio = total["failures"] / total["requests"] if total["requests"] else 1.0
    return {"users": users, "workers": workers, "users_reached": max(r["users"] for r in loads),
            "requests": total["requests"], "failures": total["failures"], "failure_ratio": failure_ratio,
            "requests_per_s": (busy[-1]["total"]["requests"] - busy[0]["total"]["requests"]) / span if busy else 0,
            "cpu_pct_workers": w, "cpu_pct_master": m, "cpu_pct_load_tors": t,
            "cpu_pct_per_user": total_cpu / users, "web_p50_ms": web.get("p50_ms_all"),
            "web_p90_ms": web.get("p90_ms_all"),
            "carried": failure_ratio <= FAILURE_LIMIT and all(x < 100 * CPU_LIMIT for x in w)
            and max(r["users"] for r in loads) == users,   # and the rate, judged in main()
            "run_dir": str(run.resolve())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", default="10,100,200,400,800", help="comma-separated user counts, smallest first")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--duration", type=int, default=60, help="seconds of load per level")
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    args = ap.parse_args(argv)
    about = bench_run("load", sys.argv[1:] if argv is None else argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    levels = []
    for u in [int(x) for x in args.users.split(",")]:
        console.log(f"load: {u} users on {args.workers} worker(s) for {args.duration} s")
        levels.append(one_level(u, args.workers, args.duration, out / "load-runs"))
    ok = [lv for lv in levels if "error" not in lv]
    if ok:
        pace = ok[0]["requests_per_s"] / ok[0]["users"]
        for lv in ok:
            lv["rate_per_user_vs_smallest"] = lv["requests_per_s"] / lv["users"] / pace if pace else 0.0
            lv["carried"] = lv["carried"] and lv["rate_per_user_vs_smallest"] >= RATE_LIMIT
    t = Table(title=f"background load cost ({args.workers} Locust worker(s); default mix)")
    for col in ("users", "reached", "requests", "fail %", "req/s", "req/s per user vs smallest", "worker CPU %", "master CPU %",
                "load tor CPU %", "CPU %/user", "web p50/p90 ms", "carried"):
        t.add_column(col)
    f1 = lambda xs: ", ".join(f"{x:.1f}" for x in xs) or "-"  # noqa: E731
    for lv in levels:
        if "error" in lv:
            t.add_row(str(lv["users"]), *["-"] * 10, f"failed: {lv['error'][:60]}")
            continue
        t.add_row(str(lv["users"]), str(lv["users_reached"]), str(lv["requests"]), f"{100 * lv['failure_ratio']:.2f}",
                  f"{lv['requests_per_s']:.2f}", f"{lv['rate_per_user_vs_smallest']:.0%}", f1(lv["cpu_pct_workers"]), f1(lv["cpu_pct_master"]),
                  f1(lv["cpu_pct_load_tors"]), f"{lv['cpu_pct_per_user']:.2f}",
                  f"{lv['web_p50_ms']}/{lv['web_p90_ms']}", "yes" if lv["carried"] else "no")
    console.print(t)
    carried = [lv["users"] for lv in levels if lv.get("carried")]
    console.print(f"largest level carried: {max(carried) if carried else 'none'} users "
                  f"(failures <= {FAILURE_LIMIT:.0%}, every worker < {CPU_LIMIT:.0%} of a core, requests/s per "
                  f"user >= {RATE_LIMIT:.0%} of the smallest level's)")
    (out / f"load-{file_stamp(about['started'])}.json").write_text(json.dumps(
        {"host_cpus": __import__("os").cpu_count(), "t": time.time(), "levels": levels, "bench_run": about}, indent=2))
    return 0 if levels and levels[0].get("carried") else 1


if __name__ == "__main__":
    sys.exit(main())
