"""Relay throughput vs connection threads (part of `make bench`; issue 17, Engler & Goldberg 2021).

Runs scenarios/engler-goldberg-2021-throughput.yaml (stock tor and mtrelay-1/2/3 as the target
middle relay, repetitions interleaved in blocks by the engine) and prints per arm: the relay
throughput of the target (the report's relay_throughput_Bps: maximum 30 s moving average of its
500 ms written-bytes samples after a 30 s warm-up) as median and range over repetitions, and
its ratio to the single-threaded relays measured in the same run (per repetition block: this
arm / stock, this arm / mtrelay-1; median and range of those ratios). Beside it the CPU the
target's threads used during the measured part (% of one core per thread, from
/proc/<pid>/task, sampled every second) and the machine's physical limit: the cores it has,
shared with every other process of the network.

Public API:

- ``summarise(values, baseline="kist", single="mtrelay-1") -> list[dict]``: per arm n, median,
  min, max and the per-block ratios to ``baseline`` and ``single``
- ``table_rows(rows) -> list[list[str]]``: the printed table's cells
- ``cpu_per_thread(samples, start) -> dict[int, float]``: % of a core per thread id
- ``main()``: ``python -m torbed.bench.mtrelay [--quick] [--repetitions N] [--duration 90s]
  [--out runs/bench]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from .. import constants, resources
from ..backends.local.supervise import run_torbed
from .results import bench_run, stamp as file_stamp

console = Console(width=None if sys.stdout.isatty() else 160)
SCENARIO = constants.SCENARIOS_DIR / "engler-goldberg-2021-throughput.yaml"
TARGET = "target0"
PAPER = "paper (3 threads vs vanilla): 4.3x on the Intel server, 3.1x on the Raspberry Pi"
# .../<run>/<variant>/rep-<k>/torrc/target0.torrc on a tor command line.
TORRC_RE = re.compile(r"/([^/]+)/rep-(\d+)/torrc/" + re.escape(TARGET) + r"\.torrc$")


def _median_range(xs: list[float]) -> tuple[float | None, float | None, float | None]:
    if not xs:
        return None, None, None
    return statistics.median(xs), min(xs), max(xs)


def summarise(values: dict[str, list[float | None]], baseline: str = "kist",
              single: str = "mtrelay-1") -> list[dict]:
    """``values``: arm -> throughput (B/s) per repetition index (None: no value for that
    repetition). Ratios are taken within a repetition block (the same k), where both arms ran
    back to back on the same machine state, and only where both have a value."""
    rows = []
    for arm, vs in values.items():
        got = [v for v in vs if v is not None]
        med, lo, hi = _median_range(got)
        row = {"arm": arm, "n": len(got), "median": med, "min": lo, "max": hi}
        for name, ref in (("vs_baseline", baseline), ("vs_single", single)):
            refs = values.get(ref, [])
            ratios = [v / r for v, r in zip(vs, refs) if v is not None and r]
            row[name] = dict(zip(("median", "min", "max"), _median_range(ratios)), n=len(ratios))
        rows.append(row)
    return rows


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}"


def _ratio(r: dict) -> str:
    if not r["n"]:
        return "-"
    if r["n"] == 1:
        return f"{r['median']:.2f}x"
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


def table_rows(rows: list[dict]) -> list[list[str]]:
    """Cells of the printed table: arm, n, median MB/s, range MB/s, ratio to stock, ratio
    to mtrelay-1 (median of the per-block ratios, their range when n > 1)."""
    out = []
    for r in rows:
        rng = "-" if r["min"] is None else f"{_mb(r['min'])}-{_mb(r['max'])}"
        out.append([r["arm"], str(r["n"]), _mb(r["median"]), rng, _ratio(r["vs_baseline"]), _ratio(r["vs_single"])])
    return out


def cpu_per_thread(samples: list[tuple[float, dict[int, float]]], start: float) -> dict[int, float]:
    """% of one core each thread used from the first sample at or after ``start`` to the
    last sample. ``samples``: (time, {thread id: cumulative CPU seconds}) in time order."""
    after = [s for s in samples if s[0] >= start]
    if len(after) < 2:
        return {}
    (t0, c0), (t1, c1) = after[0], after[-1]
    if t1 <= t0:
        return {}
    return {tid: 100.0 * (c1[tid] - c0.get(tid, 0.0)) / (t1 - t0) for tid in sorted(c1)}


class ThreadSampler:
    """Every second: the cumulative CPU time of each thread of the target relay's tor of
    any arm of the run under ``out`` (found by its torrc path on the command line)."""

    def __init__(self, out: Path):
        self.out = str(out)
        self.samples: dict[tuple[str, int], dict] = {}
        self.stop = threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _scan(self) -> None:
        now = time.time()
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            m = None
            for a in argv:
                s = a.decode(errors="replace")
                if s.startswith(self.out):
                    m = TORRC_RE.search(s)
                    if m:
                        break
            if not m:
                continue
            cpu = {}
            for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
                try:
                    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                except OSError:
                    continue
                f = stat.rsplit(")", 1)[1].split()
                cpu[int(tid)] = (int(f[11]) + int(f[12])) / self.tick   # utime, stime
            key = (m.group(1), int(m.group(2)))
            rec = self.samples.setdefault(key, {"pid": int(pid), "series": []})
            if rec["pid"] == int(pid) and cpu:
                rec["series"].append((now, cpu))

    def _run(self) -> None:
        while not self.stop.is_set():
            self._scan()
            self.stop.wait(1.0)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _cpu_text(pct: dict[int, float], pid: int) -> str:
    """'main 95 | 60, 58' : the main thread's %, then the other busy threads' (>= 1%)."""
    if not pct:
        return "-"
    others = sorted((v for k, v in pct.items() if k != pid and v >= 1.0), reverse=True)
    return f"main {pct.get(pid, 0.0):.0f}" + (" | " + ", ".join(f"{v:.0f}" for v in others) if others else "")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    about = bench_run("mtrelay", sys.argv[1:] if argv is None else argv, args.quick)
    from ..analysis.load import load_run
    from ..analysis.metrics import throughput_series

    data = _scenario(args)
    out = (args.out / "mtrelay-runs").resolve()
    out.mkdir(parents=True, exist_ok=True)
    console.log(f"mtrelay: {data['name']}, arms {', '.join(data['variants'])}, {data['repetitions']} repetition(s) "
                f"of {data['measure']['duration']}")
    with tempfile.TemporaryDirectory() as tmp, ThreadSampler(out) as sampler:
        path = Path(tmp) / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        p = run_torbed(["run", str(path), "--out", str(out)], cwd=resources.ROOT)
    run_dir = (out / f"{data['name']}-latest").resolve()
    if not run_dir.is_dir():
        console.print(f"[red]mtrelay: the run failed[/red] (exit {p.returncode}): {p.stderr[-1500:]}")
        return 1
    run = load_run(run_dir)
    # A repetition that failed (e.g. bring-up timed out) has no value; the others are shown.
    broken = {f"{r.variant} rep {r.index}": str(r.error)[:200] for r in run.reps if r.status != "ok"}
    for k, why in broken.items():
        console.print(f"[yellow]mtrelay: {k} did not complete: {why}[/yellow]")
    series = throughput_series(run).get(TARGET, {})
    arms = list(data["variants"])
    values = {a: [series.get(a, {}).get(k, {}).get("rate_max") for k in range(run.repetitions)] for a in arms}
    rows = summarise(values)
    failed, cpu = _failed_and_cpu(run, sampler)
    _print_results(run, data, rows, failed, cpu)
    (args.out / f"mtrelay-{file_stamp(about['started'])}.json").write_text(json.dumps(
        {"host_cpus": os.cpu_count(), "t": time.time(), "run_dir": str(run_dir), "scenario": data, "rows": rows,
         "values": values, "failed_transfers": failed, "cpu_per_thread": cpu,
         "incomplete": broken, "load_average": os.getloadavg(), "bench_run": about}, indent=2))
    ok = p.returncode == 0 and all(r["n"] > 0 for r in rows) and not any(failed.values())
    return 0 if ok else 1


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repetitions", type=int, help="repetitions per arm (scenario: 3)")
    ap.add_argument("--duration", help="measurement per repetition, incl. the 30 s warm-up (scenario: 150s)")
    ap.add_argument("--quick", action="store_true", help="1 repetition of 75 s: a pipeline check (the emulated target saturates only after about 70 s)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    return ap


def _scenario(args: argparse.Namespace) -> dict:
    """The benchmark's scenario with the command line's repetitions and duration."""
    data = yaml.safe_load(SCENARIO.read_text())
    if args.quick:
        data["repetitions"], data["measure"]["duration"] = 1, "75s"
    if args.repetitions:
        data["repetitions"] = args.repetitions
    if args.duration:
        data["measure"]["duration"] = args.duration
    return data


def _failed_and_cpu(run, sampler: ThreadSampler) -> tuple[dict, dict]:
    """Failed transfers per arm, and the target's CPU per thread per repetition after the warm-up."""
    failed, cpu = {}, {}
    for r in run.reps:
        failed[r.variant] = failed.get(r.variant, 0) + sum(
            1 for t in r.transfers if t.get("status") not in ("ok", "cancelled"))
        s = sampler.samples.get((r.variant, r.index))
        if s and r.t0 is not None:
            pct = cpu_per_thread(s["series"], r.t0 + max(30.0, r.warmup_s))
            cpu.setdefault(r.variant, []).append({"rep": r.index, "pid": s["pid"], "pct": pct,
                                                  "text": _cpu_text(pct, s["pid"])})
    return failed, cpu


def _print_results(run, data: dict, rows: list[dict], failed: dict, cpu: dict) -> None:
    """The table per arm, the machine's physical limit, and the paper's figures to compare with."""
    t = Table(title=f"relay throughput of the target middle vs connection threads ({run.repetitions} repetition(s))")
    for col in ("arm", "n", "median MB/s", "range MB/s", "vs stock (kist)", "vs mtrelay-1",
                "target CPU % per thread (rep 0)", "failed transfers"):
        t.add_column(col)
    for row, cells in zip(rows, table_rows(rows)):
        c = cpu.get(row["arm"], [])
        t.add_row(*cells, c[0]["text"] if c else "-", str(failed.get(row["arm"], 0)))
    console.print(t)
    ncpu = os.cpu_count()
    console.print(f"physical limit: {ncpu} cores on this machine, shared by the target relay with "
                  f"{data['network']['authorities']} authorities, "
                  f"{sum(g.get('count', 1) for k, g in data['network']['relays'].items() if k != 'target')} "
                  f"other relays, {sum(c.get('count', 1) for c in data['clients'].values())} client tors with their "
                  f"drivers and the server: no arm can exceed {ncpu}x the single-threaded relay's CPU, and less "
                  f"than that is free for it")
    console.print(PAPER)

if __name__ == "__main__":
    sys.exit(main())
