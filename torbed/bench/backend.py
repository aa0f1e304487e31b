"""Bring-up speed and per-node cost of the local backend (part of `make bench`).

For each benchmark network (quickstart; 3 authorities + 100 relays + 4 clients) it runs
`torbed run` several times in a row (quickstart 10, the 100-relay network 3; only the first
run soaks) and reports, with median and min/max over the runs (and every run's ready time):
quickstart's runs alternate with 5 of the same network without the fast bring-up
(``quickstart-classic``: TORBED_FAST_BRINGUP=0), and the ratio of the two medians is printed,
both measured on the same machine in the same bench run.

- seconds from `torbed run` start to network ready, and to the first successful transfer
- seconds from network setup (keys, namespaces) to ready, as recorded in meta.json
- per-node RSS (MiB) and CPU (% of one core) of the tor processes once ready and after the
  soak time (default 5 minutes), by role, and each tor's peak RSS (VmHWM) at the end

Each figure is printed beside its target and the previous result (the newest earlier
<out>/backend-*.json), so a regression in bring-up shows. Results are written to
<out>/backend-<stamp>.json. A network that never becomes ready fails the benchmark (exit 1).
Usage: python -m torbed.bench.backend [--runs N] [--soak 300]
       [--only quickstart|quickstart-classic|bench-100-relays|bench-300-tors|bench-750-tors]
       (the last two: density, only when named)
[--out runs/bench]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .. import constants, resources
from ..scenario import load
from ..backends.local.supervise import run_torbed
from .results import bench_run, stamp as file_stamp

NETWORKS = {"quickstart": "quickstart.yaml", "bench-100-relays": "bench-100-relays.yaml",
            # The same network without the fast bring-up (backends.local), its runs alternating
            # with quickstart's, so both see the same machine: what the fast path saves.
            "quickstart-classic": "quickstart.yaml",
            # Density (issue 26): only with --only; 300 and 750 tor processes on one machine.
            "bench-300-tors": "bench-300-tors.yaml", "bench-750-tors": "bench-750-tors.yaml"}
ENV = {"quickstart-classic": {"TORBED_FAST_BRINGUP": "0"}}
# Networks whose runs alternate (the first is the one compared against the others).
INTERLEAVED = ("quickstart", "quickstart-classic")
DEFAULT_NETWORKS = ("quickstart", "quickstart-classic", "bench-100-relays")
# quickstart: issue 26's target, ready <= 8 s median and <= 10 s in every run.
TARGETS = {"quickstart": {"ready_s": 8.0, "ready_max_s": 10.0},
           "bench-100-relays": {"ready_s": 60.0, "rss_mib": 60.0}}
RUNS = {"quickstart": 10, "quickstart-classic": 5, "bench-100-relays": 3, "bench-300-tors": 1, "bench-750-tors": 1}
# Runs after the first only need the network ready and a transfer done.
SHORT_S = 20.0

console = Console(width=None if sys.stdout.isatty() else 160)


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def one_run(scenario: Path, out: Path, soak: float, env: dict | None = None) -> dict:
    variant = load(scenario).variants[0]
    t_cmd = time.time()
    p = run_torbed(["run", str(scenario), "--variant", variant, "--duration", f"{int(soak)}s",
                    "--out", str(out)], cwd=resources.ROOT, env=env)
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
        # Where the setup -> ready time went (local backend bring_up), seconds from setup.
        "phases_s": {**((meta.get("bootstrap") or {}).get("phases_s") or {}), "ready": meta["ready_s"]},
        "rss_ready_mib": {n: r["rss_bytes"] / 2**20 for n, r in out_res["ready"].items()},
        "rss_end_mib": {n: r["rss_bytes"] / 2**20 for n, r in out_res["end"].items()},
        "rss_peak_mib": {n: r["rss_peak_bytes"] / 2**20 for n, r in out_res["end"].items() if "rss_peak_bytes" in r},
        "cpu_pct_ready_to_end": cpu,
        "roles": {n: r["role"] for n, r in out_res["ready"].items()},
        "shaper": meta.get("shaper"),
        # Bytes each role sent and received until ready (the directory protocol) and the size
        # of an authority's directory files then (local backend, meta.json bootstrap).
        "traffic_to_ready": (meta.get("bootstrap") or {}).get("traffic_to_ready") or {},
        "soak_s": soak, "variant": variant,
    }


# The bring-up's phases (meta.json bootstrap.phases_s), in order: what the floor is made of.
PHASES = {"network_ready": "namespaces, shaping, torrcs", "tors_started": "every tor started",
          "authorities_listening": "authorities answer (first round scheduled)",
          "periodic_events_started": "every relay's timers started (descriptor upload)",
          "descriptors_in": "every descriptor at every authority",
          "first_valid_after": "first consensus valid-after",
          "consensus_seen": "consensus with every relay seen", "clients_online": "caches ready, clients online",
          "ready": "clients bootstrapped (ready)"}


def _stats(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def previous_results(out: Path, before: str) -> tuple[str | None, dict]:
    """Each network's newest earlier result in ``out``'s backend-*.json (names sort by time;
    a run of one network does not hide another's last result). Returns (a label naming the
    files used, {network: its entry})."""
    prev: dict = {}
    used: dict[str, str] = {}
    for path in sorted((p for p in out.glob("backend-*.json") if p.name < before), reverse=True):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for name, entry in (data.items() if isinstance(data, dict) else ()):
            if name not in prev and isinstance(entry, dict) and entry.get("summary"):
                prev[name] = entry
                used[name] = path.name
    if not prev:
        return None, {}
    files = sorted(set(used.values()))
    label = files[0] if len(files) == 1 else ", ".join(f"{n}: {f}" for n, f in sorted(used.items()))
    return label, prev


def summarize(name: str, runs: list[dict]) -> dict:
    out = {"runs": len(runs)}
    for key in ("cmd_to_ready_s", "setup_to_ready_s", "cmd_to_first_transfer_s"):
        out[key] = _stats([r[key] for r in runs])
    out["phases_s"] = {ph: _stats([r.get("phases_s", {}).get(ph) for r in runs]) for ph in PHASES}
    # "After soak" figures come from the soaked run(s) only; ready figures from every run.
    longest = max((r["soak_s"] for r in runs), default=0)
    for role in ("authority", "relay", "client"):
        for metric in ("rss_ready_mib", "rss_end_mib", "rss_peak_mib", "cpu_pct_ready_to_end"):
            use = runs if metric == "rss_ready_mib" else [r for r in runs if r["soak_s"] == longest]
            vals = [v for r in use for n, v in r[metric].items() if r["roles"].get(n) == role]
            out[f"{role}_{metric}"] = _stats(vals)
    for role in ("authority", "relay", "client"):
        for way in ("sent", "received"):
            per_node = []
            for r in runs:
                t = ((r.get("traffic_to_ready") or {}).get("by_role") or {}).get(role)
                if t and t["nodes"]:
                    per_node.append(t[f"{way}_bytes"] / t["nodes"] / 2**10)
            out[f"{role}_{way}_kib_to_ready"] = _stats(per_node)
    files = [(r.get("traffic_to_ready") or {}).get("authority_files_bytes") or {} for r in runs]
    out["directory_files_kib"] = {f: _stats([x[f] / 2**10 for x in files if f in x])
                                  for f in ("cached-microdesc-consensus", "cached-microdescs")}
    out["shaper"] = sorted({r.get("shaper") for r in runs if r.get("shaper")})
    return out


def _fmt(s: dict | None, unit: str = "") -> str:
    if not s or s.get("median") is None:
        return "-"
    return f"{s['median']:.1f}{unit} [{s['min']:.1f}-{s['max']:.1f}]"


def _vs(s: dict | None, p: dict | None, unit: str = "") -> str:
    """The previous median, and this one's ratio to it."""
    if not p or p.get("median") is None:
        return "-"
    ratio = f" (x{s['median'] / p['median']:.2f})" if s and s.get("median") is not None and p["median"] else ""
    return f"{p['median']:.1f}{unit}{ratio}"


def table(results: dict, prev: dict, prev_name: str | None) -> Table:
    t = Table(title="local backend: bring-up and per-node cost (median [min-max] over runs); previous: "
                    f"{prev_name or 'none'}")
    for col in ("network", "metric", "value", "target", "previous"):
        t.add_column(col)
    for name, r in results.items():
        s = r["summary"]
        if not s:
            continue
        p = ((prev.get(name) or {}).get("summary")) or {}
        tg = TARGETS.get(name, {})
        ready = s["cmd_to_ready_s"]
        verdict = ""
        if "ready_s" in tg and ready["median"] is not None:
            ok = ready["median"] <= tg["ready_s"] and ready["max"] <= tg.get("ready_max_s", float("inf"))
            verdict = ("met" if ok else "MISSED") + f": <= {tg['ready_s']:.0f} s median" + (
                f", <= {tg['ready_max_s']:.0f} s every run" if "ready_max_s" in tg else "")
        t.add_row(name, "run start -> ready", _fmt(ready, " s"), verdict, _vs(ready, p.get("cmd_to_ready_s"), " s"))
        t.add_row("", "  every run (s)", " ".join(f"{v:.1f}" for v in ready.get("values", [])), "", "")
        if name == INTERLEAVED[0]:
            for other in INTERLEAVED[1:]:
                o = ((results.get(other) or {}).get("summary") or {}).get("cmd_to_ready_s") or {}
                if o.get("median") and ready["median"] is not None:
                    t.add_row("", f"  vs {other} (this bench run)", f"x{ready['median'] / o['median']:.2f}",
                              "", f"{other}: {o['median']:.1f} s")
        t.add_row("", "setup -> ready", _fmt(s["setup_to_ready_s"], " s"), "", _vs(s["setup_to_ready_s"], p.get("setup_to_ready_s"), " s"))
        for ph, what in PHASES.items():
            if (s.get("phases_s") or {}).get(ph, {}).get("median") is not None:
                t.add_row("", f"  setup -> {what}", _fmt(s["phases_s"][ph], " s"), "",
                          _vs(s["phases_s"][ph], ((p.get("phases_s") or {}).get(ph)), " s"))
        t.add_row("", "run start -> first transfer", _fmt(s["cmd_to_first_transfer_s"], " s"), "",
                  _vs(s["cmd_to_first_transfer_s"], p.get("cmd_to_first_transfer_s"), " s"))
        for role in ("authority", "relay", "client"):
            t.add_row("", f"{role} RSS ready / after soak",
                      f"{_fmt(s[f'{role}_rss_ready_mib'], ' MiB')} / {_fmt(s[f'{role}_rss_end_mib'], ' MiB')}",
                      f"<= {tg['rss_mib']:.0f} MiB" if role == "relay" and "rss_mib" in tg else "",
                      _vs(s[f"{role}_rss_end_mib"], p.get(f"{role}_rss_end_mib"), " MiB"))
            t.add_row("", f"{role} peak RSS (VmHWM at end)", _fmt(s[f"{role}_rss_peak_mib"], " MiB"), "",
                      _vs(s[f"{role}_rss_peak_mib"], p.get(f"{role}_rss_peak_mib"), " MiB"))
            t.add_row("", f"{role} CPU ready->end", _fmt(s[f"{role}_cpu_pct_ready_to_end"], " %"), "",
                      _vs(s[f"{role}_cpu_pct_ready_to_end"], p.get(f"{role}_cpu_pct_ready_to_end"), " %"))
            sent, recv = s.get(f"{role}_sent_kib_to_ready"), s.get(f"{role}_received_kib_to_ready")
            if sent and sent["median"] is not None:
                t.add_row("", f"{role} sent / received per node until ready",
                          f"{_fmt(sent, ' KiB')} / {_fmt(recv, ' KiB')}", "",
                          _vs(recv, p.get(f"{role}_received_kib_to_ready"), " KiB"))
        for f, st in (s.get("directory_files_kib") or {}).items():
            if st["median"] is not None:
                t.add_row("", f"authority's {f} at ready", _fmt(st, " KiB"), "",
                          _vs(st, (p.get("directory_files_kib") or {}).get(f), " KiB"))
        if s.get("shaper"):
            t.add_row("", "shaper", ", ".join(s["shaper"]), "", "")
    return t


def _order(names: list[str], counts: dict[str, int]) -> list[tuple[str, int]]:
    """(network, run index) in the order to run them: the INTERLEAVED networks alternate
    (each next run of one, then of the other), the rest one network after another."""
    mixed = [n for n in INTERLEAVED if n in names]
    order = []
    for i in range(max((counts[n] for n in mixed), default=0)):
        order += [(n, i) for n in mixed if i < counts[n]]
    for n in names:
        if n not in mixed:
            order += [(n, i) for i in range(counts[n])]
    return order


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=None, help="runs per network (default: quickstart 10, 100 relays 3)")
    ap.add_argument("--soak", type=float, default=300.0, help="seconds to run after ready (RSS/CPU 'after')")
    ap.add_argument("--only", choices=list(NETWORKS), action="append")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    out = Path(args.out)
    work = out / "backend-runs"
    work.mkdir(parents=True, exist_ok=True)
    results, failed = {}, False
    about = bench_run("backend", sys.argv[1:] if argv is None else argv)
    stamp = file_stamp(about["started"])
    prev_name, prev = previous_results(out, f"backend-{stamp}.json")
    names = args.only or list(DEFAULT_NETWORKS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    stopped: set[str] = set()
    for name, i in _order(names, {name: args.runs or RUNS[name] for name in names}):
        if name in stopped:
            continue
        # Only one run of a scenario soaks (the variants of it measure bring-up only).
        soak = args.soak if i == 0 and name not in ENV else min(args.soak, SHORT_S)
        console.log(f"{name}: run {i + 1}/{args.runs or RUNS[name]} (soak {soak:.0f} s)")
        try:
            r = one_run(constants.SCENARIOS_DIR / NETWORKS[name], work, soak, ENV.get(name))
        except RuntimeError as e:
            console.print(f"[red]{name}: {e}[/red]")
            failed = True
            stopped.add(name)
            continue
        console.log(f"  ready {r['cmd_to_ready_s']:.1f} s after `torbed run` "
                    f"({r['setup_to_ready_s']:.1f} s after setup), keys {r['keys']}")
        runs[name].append(r)
    for name in names:
        results[name] = {"summary": summarize(name, runs[name]) if runs[name] else None, "runs": runs[name],
                         "targets": TARGETS.get(name), "env": ENV.get(name)}
    console.print(table(results, prev, prev_name))
    path = out / f"backend-{stamp}.json"
    path.write_text(json.dumps({**results, "bench_run": about}, indent=1, sort_keys=True))
    console.print(f"results: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
