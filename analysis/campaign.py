"""The reproduction campaign across sessions and machines (issue 37 items 3 and 5).

Each finished repetition becomes a small committed record,
``<records>/<experiment>/<variant>-rep-<block>.json``: its per-repetition value of every
metric the pre-registration (analysis/prereg.py) uses, its gate results and provenance
(scenario hash, tor build and version, torbed version and commit, host), and its timing; a
repetition a gate rejected keeps its values apart, as ``values_invalid`` (no test reads them:
they let a later reader re-analyse under other gates without the raw run). The
campaign and the document are computed from those records only: a raw run directory is used
while it exists (``torbed run --resume`` continues it) and its absence never blocks.

``<records>/<experiment>/runs.json`` maps each run directory the campaign started to the
global block number of its repetition 0 (a run started on another machine continues the
numbering). ``<records>/sessions.jsonl``: one line per campaign session (start, end, host, the
estimate made at its start, blocks run), so the estimate can be checked against the time taken.

Public API: ``Records(root)``, ``harvest(run_dir, exp, comps, records, offset) -> int``,
``plan(prereg, records, since=None) -> dict``, ``estimate(prereg, records, repo) -> dict``,
``finished_blocks(run_dir) -> int``, ``block_seed(scenario, offset) -> int``, ``run_experiment(...)``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from .. import resources
from . import precheck, prereg as prereg_mod

SCHEMA = 1
FINISHED = ("ok", "failed")
REPO = resources.ROOT
# Measured here: the --smoke session (2 repetitions of 45 s, relay keys cached) took 161 s,
# its records 2 x 61 s from bring-up to the workload's end: ~20 s per repetition to come up
# and tear down besides its duration, ~30 s per run besides (process start, tor builds
# checked, files generated). A machine without cached keys pays about a minute more once.
# The per-repetition overhead is replaced by the records' own once an experiment has some.
FIRST_BRINGUP_S, PER_REP_OVERHEAD_S = 30.0, 20.0
POLL_S = 10.0


class Records:
    """The committed records under ``root`` (one folder per experiment)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, exp: str, variant: str, block: int) -> Path:
        return self.root / exp / f"{variant}-rep-{block}.json"

    def write(self, rec: dict) -> Path:
        p = self.path(rec["experiment"], rec["variant"], rec["block"])
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        return p

    def all(self, exp: str) -> list[dict]:
        out = []
        for p in sorted((self.root / exp).glob("*-rep-*.json")):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError) as e:
                raise ValueError(f"{p}: not a readable record ({e})") from None
        return out

    def complete_blocks(self, exp: str, variants) -> list[int]:
        """Blocks in which every variant has a finished record (valid or not)."""
        have: dict[int, set] = {}
        for r in self.all(exp):
            have.setdefault(r["block"], set()).add(r["variant"])
        return sorted(k for k, vs in have.items() if set(variants) <= vs)

    def blocks(self, exp: str, variants) -> dict[int, dict[str, dict[str, float]]]:
        """{block: {variant: {metric: value}}} over complete blocks; a repetition that failed
        or that a gate rejected has no values (its pairs drop out of the tests)."""
        done = set(self.complete_blocks(exp, variants))
        out: dict[int, dict] = {k: {} for k in done}
        for r in self.all(exp):
            if r["block"] in done and r["status"] == "ok" and r["gates"].get("valid", True):
                out[r["block"]][r["variant"]] = r["values"]
        return out

    def runs(self, exp: str) -> list[dict]:
        p = self.root / exp / "runs.json"
        return json.loads(p.read_text()) if p.is_file() else []

    def add_run(self, exp: str, entry: dict) -> None:
        p = self.root / exp / "runs.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.runs(exp) + [entry], indent=1) + "\n")

    def next_block(self, exp: str) -> int:
        ks = [r["block"] for r in self.all(exp)] + [e["offset"] + e["repetitions"] - 1 for e in self.runs(exp)]
        return max(ks, default=-1) + 1

    def sessions(self) -> list[dict]:
        p = self.root / "sessions.jsonl"
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.is_file() else []

    def log_session(self, entry: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / "sessions.jsonl").open("a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")


def _gates(meta: dict) -> dict:
    g = meta.get("gates") if isinstance(meta.get("gates"), dict) else None
    if g is None:
        return {"recorded": False, "valid": True}
    return {"recorded": True, "valid": bool(g.get("valid", True)), "invalid_reasons": g.get("invalid_reasons") or [],
            "flags": g.get("flags") or [],
            **{k: (g.get(k) or {}).get("status") for k in ("queueing", "cpu", "completion")},
            # Transfers cut off while still moving (the window's end, a replay flow behind its
            # schedule): kept as censored times, but a reader should see how many.
            "censored_fraction": (g.get("completion") or {}).get("censored_fraction")}


def _provenance(info: dict, meta: dict, variant: str) -> dict:
    build = (meta.get("builds") or {}).get(variant) or {}
    sess = (info.get("sessions") or [{}])[-1]
    host = info.get("host") or {}
    return {"scenario_sha256": (info.get("fingerprint") or {}).get("scenario_sha256"),
            "tor_version": build.get("tor_version") or info.get("tor_version"), "tor_sha256": build.get("tor_sha256"),
            "torbed_version": info.get("torbed_version"), "torbed_commit": sess.get("torbed_commit") or info.get("torbed_commit"),
            "host": host.get("hostname"), "cpus": host.get("cpus"), "arch": host.get("arch")}


def _values(run, variant: str, k: int, metrics: set[str], extracted) -> dict[str, float]:
    from . import inference
    out = {}
    for mid in sorted(metrics):
        m = extracted.metrics.get(mid)
        if m is None:
            continue
        v = inference.rep_values_by_rep(m, variant, inference.primary_stat(mid)).get(k)
        if v is not None and math.isfinite(v):
            out[mid] = float(v)
    return out


def harvest(run_dir: Path, exp: str, comps, records: Records, offset: int, smoke: bool = False) -> int:
    """Write a record for every finished repetition of ``run_dir`` that has none yet
    (repetition k is block offset + k). Returns how many were written."""
    from . import gates, metrics
    from .load import load_run
    info = json.loads((run_dir / "run.json").read_text())
    todo = []
    for v in info["variants"]:
        for k in range(int(info.get("repetitions") or 0)):
            meta_p = run_dir / v / f"rep-{k}" / "meta.json"
            if records.path(exp, v, offset + k).exists() or not meta_p.is_file():
                continue
            meta = json.loads(meta_p.read_text())
            if meta.get("status") in FINISHED:
                todo.append((v, k, meta))
    if not todo:
        return 0
    run = load_run(run_dir)
    rejected = gates.exclude_invalid(run)
    ex = metrics.extract(run)
    wanted = {m for c in comps for m in c.metrics}
    rejected = {key for key, g in rejected.items() if not g["valid"]} & {(v, k) for v, k, _ in todo}
    raw = ex_all = None
    if rejected:   # their values apart, from the run as measured (``values_invalid``)
        raw = load_run(run_dir)
        ex_all = metrics.extract(raw)
    for v, k, meta in todo:
        invalid = (v, k) in rejected and meta.get("status") == "ok"
        t0, t1 = meta.get("t_start"), meta.get("t_end")
        records.write({
            "schema": SCHEMA, "experiment": exp, "variant": v, "block": offset + k, "smoke": smoke,
            "run": {"id": run_dir.name, "rep": k, "seed": info.get("seed"), "path": str(run_dir)},
            "status": meta.get("status"), "error": meta.get("error"),
            "values": _values(run, v, k, wanted, ex) if meta.get("status") == "ok" else {},
            **({"values_invalid": _values(raw, v, k, wanted, ex_all)} if invalid else {}),
            "gates": _gates(meta), "provenance": _provenance(info, meta, v),
            "timing": {"t_start": t0, "t_end": t1, "seconds": (t1 - t0) if t0 and t1 else None,
                       "duration_s": meta.get("duration_s")}})
    return len(todo)


def _log_ratios(blocks: dict, c) -> dict[int, float]:
    """{block: log(variant / baseline)} of comparison ``c`` where both arms have a value."""
    out = {}
    for k, arms in blocks.items():
        x, y = (prereg_mod.per_block(arms.get(a) or {}, c, a) for a in (c.variant, c.baseline))
        if math.isfinite(x) and math.isfinite(y):
            out[k] = math.log(x) - math.log(y)
    return out


def _sd_diff(blocks: dict, comps) -> float | None:
    """The largest sd of the block log ratios over ``comps`` (None with fewer than 2 pairs)."""
    sds = [float(np.std(list(d.values()), ddof=1)) for d in (_log_ratios(blocks, c) for c in comps) if len(d) >= 2]
    return max(sds) if sds else None


def _halt(records: Records, name: str, e, drivers, done: int, since: int) -> str | None:
    """Why an experiment stops without concluding, or None. It halts when the last pilot's
    worth of complete blocks (and at least that many since ``since``, where a --retry
    started) gave its driving comparisons no pair at all: the gates rejected the
    repetitions (or they failed), so this setup does not give the mechanism its conditions
    here, and more blocks would only repeat that. The rule never looks at an estimate."""
    if done - since < e.pilot_blocks:
        return None
    last = records.complete_blocks(name, e.variants)[-e.pilot_blocks:]
    recent = {k: v for k, v in records.blocks(name, e.variants).items() if k in last}
    if any(_log_ratios(recent, c) for c in drivers):
        return None
    why: Counter = Counter()
    for r in records.all(name):
        if r["block"] not in last:
            continue
        if r.get("status") != "ok":
            why[f"repetition {r.get('status')}"] += 1
            continue
        for reason in (r.get("gates") or {}).get("invalid_reasons") or []:
            why[reason.split(":", 1)[0]] += 1
    reasons = ", ".join(f"{k} in {n}" for k, n in why.most_common())
    return (f"halted: no valid pair in the last {len(last)} blocks ({reasons or 'no values'}); change the "
            f"scenario or the machine, then `--retry {name}`")


def plan(prereg, records: Records, since: dict[str, int] | None = None) -> dict[str, dict]:
    """Per experiment: complete blocks, blocks planned (the pilot until it is done, then from
    its spread: prereg.blocks_planned), the maximum, whether it has concluded, and whether it
    has halted (``_halt``; ``since``: {experiment: complete blocks when a --retry started})."""
    out = {}
    for name, e in prereg.experiments.items():
        done = len(records.complete_blocks(name, e.variants))
        comps = prereg.of_experiment(name)
        drivers = [c for c in comps if c.primary] or [c for c in comps if c.expect != "none"] or comps
        sd = _sd_diff(records.blocks(name, e.variants), drivers) if done >= e.pilot_blocks else None
        planned = e.pilot_blocks if done < e.pilot_blocks else prereg_mod.blocks_planned(sd, drivers, prereg,
                                                                                           e.max_blocks)
        halted = _halt(records, name, e, drivers, done, (since or {}).get(name, 0))
        check = precheck.status(records.root, name, e.precheck, REPO / e.scenario) if e.precheck else None
        if check is not None and not check.get("ok"):
            halted = halted or f"halted: its precheck ({e.precheck}) failed: {check.get('why')}"
        if halted:
            planned = done
        pending = e.precheck and check is None
        out[name] = {"done": done, "pilot": e.pilot_blocks, "planned": planned, "max": e.max_blocks, "sd_diff": sd,
                     "concluded": not halted and not pending and done >= e.pilot_blocks and done >= planned,
                     "halted": halted, "precheck": pending and e.precheck,
                     "reason": halted or (f"precheck {e.precheck} first, then a pilot" if pending else None)
                     or (("maximum" if planned >= e.max_blocks else "interval and power")
                         if done >= e.pilot_blocks else "pilot")}
    return out


def scenario_duration_s(repo: Path, scenario: str) -> float:
    from ..units import parse_duration
    raw = yaml.safe_load((repo / scenario).read_text())
    return float(parse_duration(str((raw.get("measure") or {}).get("duration", "60s"))))


def _rep_seconds(records: Records, exp: str, duration_s: float) -> tuple[float, str]:
    """One repetition's machine time: ``duration_s`` plus its overhead - measured from the
    records of repetitions that ran to their end (bring-up to the end of the workload, minus
    the workload's duration; tear-down, about half of PER_REP_OVERHEAD_S, comes after) where
    there are some, so records of another duration (--smoke) still calibrate it; else the
    model's PER_REP_OVERHEAD_S."""
    over = [r["timing"]["seconds"] - r["timing"]["duration_s"] for r in records.all(exp)
            if r.get("status") == "ok" and (r.get("timing") or {}).get("seconds") and r["timing"].get("duration_s")]
    if over:
        return duration_s + float(np.mean(over)) + PER_REP_OVERHEAD_S / 2, f"measured overhead ({len(over)} repetitions)"
    return duration_s + PER_REP_OVERHEAD_S, "model"


def estimate(prereg, records: Records, repo: Path, only=None, duration_s: float | None = None) -> dict:
    """Machine time still needed, per experiment and in total (seconds): to the end of the
    pilots, to the planned blocks (the maximum where no pilot has run) and to every maximum.
    A repetition's time is the records' mean where there are records, else the scenario's
    duration (``duration_s`` overrides it) + PER_REP_OVERHEAD_S; each experiment with blocks
    left pays FIRST_BRINGUP_S."""
    p = plan(prereg, records)
    rows, tot = {}, {"pilot_s": 0.0, "planned_s": 0.0, "max_s": 0.0}
    for name, e in prereg.experiments.items():
        if only and name not in only:
            continue
        per_rep, basis = _rep_seconds(records, name, duration_s or scenario_duration_s(repo, e.scenario))
        block = per_rep * len(e.variants)
        done = p[name]["done"]
        planned = p[name]["planned"] if done >= e.pilot_blocks else e.max_blocks

        check_s = precheck.seconds(e.precheck, repo, e) if p[name]["precheck"] else 0.0

        def cost(n):
            left = max(0, n - done)
            return left * block + (FIRST_BRINGUP_S if left else 0.0) + check_s
        model = len(e.variants) * (PER_REP_OVERHEAD_S + (duration_s or scenario_duration_s(repo, e.scenario)))
        rows[name] = {"block_s": block, "model_block_s": model, "basis": basis, "done": done,
                      "pilot_s": cost(e.pilot_blocks),
                      "planned_s": cost(planned), "max_s": cost(e.max_blocks)}
        for k in tot:
            tot[k] += rows[name][k]
    return {"experiments": rows, "total": tot}


def _torbed(*args: str) -> list[str]:
    return [sys.executable, "-m", "torbed.cli", "run", *args]


def _launch(prereg, exp: str, records: Records, runs_root: Path, repo: Path, duration: str | None,
            blocks: int, fresh: bool = False) -> tuple[subprocess.Popen, dict]:
    """Resume this experiment's last run directory if it is on this machine and unfinished
    (unless ``fresh``: a retry), else start a new one for ``blocks`` blocks (its repetition 0
    = the next free block)."""
    e = prereg.experiments[exp]
    last = (records.runs(exp) or [None])[-1]
    if not fresh and last and last.get("path") and Path(last["path"]).is_dir() \
            and last["host"] == socket.gethostname() and _resumable(exp, Path(last["path"])):
        cmd = _torbed("--resume", last["path"])
        print(f"campaign: {exp}: {' '.join(cmd[1:])}", flush=True)
        return subprocess.Popen(cmd, start_new_session=True), last
    out = runs_root / exp / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    offset = records.next_block(exp)
    cmd = _torbed(str(repo / e.scenario), "--repetitions", str(blocks), "--out", str(out),
                  "--seed", str(block_seed(repo / e.scenario, offset)),
                  *[a for v in e.variants for a in ("--variant", v)], *(["--duration", duration] if duration else []))
    print(f"campaign: {exp}: {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.Popen(cmd, start_new_session=True)
    entry = {"offset": offset, "repetitions": blocks, "out": str(out), "path": None,
             "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return proc, entry


def _resumable(exp: str, run_dir: Path) -> bool:
    """Whether the experiment's last run directory can go on (``torbed run --resume``'s own
    checks). One that cannot - it finished, or torbed, a variant's build inputs or the scenario
    changed since it began - is left as it is: its finished blocks are recorded already, and
    the next blocks start as a new run (said here, and each block's record carries its own
    provenance: torbed commit, tor binaries)."""
    from torbed import resume
    from torbed.errors import InputError
    try:
        info = json.loads((run_dir / "run.json").read_text())
        if info.get("status") in ("ok", "partial", "failed"):
            return False
        resume.resumable(run_dir)
    except (OSError, ValueError, InputError) as err:
        print(f"campaign: {exp}: {run_dir} cannot be resumed ({err}); the next blocks start as a new run", flush=True)
        return False
    return True


def block_seed(scenario: Path, offset: int) -> int:
    """The seed a run whose repetition 0 is global block ``offset`` starts from: the
    scenario's seed plus the offset, so block b's workload always uses seed + b (as one long
    run would) and a run started in a later session never repeats an earlier block's draws."""
    from torbed import scenario as scenario_mod
    return scenario_mod.load(str(scenario)).seed + offset


def _run_dir_of(entry: dict) -> Path | None:
    if entry.get("path"):
        return Path(entry["path"])
    dirs = [d for d in Path(entry["out"]).iterdir() if d.is_dir() and not d.is_symlink() and (d / "run.json").is_file()]
    return dirs[0] if len(dirs) == 1 else None


def finished_blocks(run_dir: Path) -> int:
    """Leading blocks of ``run_dir`` whose repetitions all finished (cheap: meta.json only)."""
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return 0
    n = 0
    for k in range(int(info.get("repetitions") or 0)):
        for v in info.get("variants") or []:
            try:
                if json.loads((run_dir / v / f"rep-{k}" / "meta.json").read_text()).get("status") not in FINISHED:
                    return n
            except (OSError, ValueError):
                return n
        n += 1
    return n


def _harvest_niced(run_dir: Path, exp: str, comps, records: Records, offset: int, smoke: bool) -> None:
    """``harvest`` in a child process at the lowest priority: it runs while the next
    repetition measures, and on a small machine its CPU would be load the run did not ask
    for (the run itself is never niced; its CPU gate records what others used)."""
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_niced, args=(run_dir, exp, comps, records.root, offset, smoke))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"campaign: recording {run_dir} failed (exit {child.exitcode}); see above")


def _niced(run_dir, exp, comps, root, offset, smoke) -> None:
    os.nice(19)
    harvest(run_dir, exp, comps, Records(root), offset, smoke)


def run_experiment(prereg, exp: str, records: Records, runs_root: Path, repo: Path,
                   duration: str | None = None, smoke: bool = False, retry: bool = False) -> dict:
    """Run (or resume) one experiment until its plan concludes or halts: record each block as
    it completes (niced), re-plan, and stop `torbed run` (SIGINT to the process group it was
    started in) once the planned blocks are recorded. ``retry``: a halted experiment runs
    another pilot's worth of blocks (after its scenario or the machine changed)."""
    e, comps = prereg.experiments[exp], prereg.of_experiment(exp)
    since = {exp: len(records.complete_blocks(exp, e.variants))} if retry else None

    def replan() -> dict:
        return plan(prereg, records, since)[exp]
    p = replan()
    failed_check = retry and e.precheck and not (precheck.status(records.root, exp, e.precheck, repo / e.scenario)
                                                 or {}).get("ok")
    if p["precheck"] or failed_check:     # pending, or failed and retried (e.g. on another machine)
        precheck.run(e.precheck, exp, e, records.root, runs_root, repo)
        p = replan()
    if p["concluded"] or p["halted"]:
        return p
    proc, entry = _launch(prereg, exp, records, runs_root, repo, duration, e.max_blocks - p["done"], fresh=retry)
    registered, seen = entry.get("path") is not None, -1
    try:
        while True:
            rc = proc.poll()
            run_dir = _run_dir_of(entry)
            if run_dir is not None and not registered:
                entry["path"] = str(run_dir)
                records.add_run(exp, entry)
                registered = True
            fb = finished_blocks(run_dir) if run_dir is not None else 0
            if run_dir is not None and (fb > seen or rc is not None):
                seen = fb
                _harvest_niced(run_dir, exp, comps, records, entry["offset"], smoke)
                p = replan()
                print(f"campaign: {exp}: {p['done']} complete block(s), planned {p['planned']} "
                      f"(maximum {p['max']})", flush=True)
            if rc is not None:
                return replan()
            if p["concluded"] or p["halted"]:
                os.killpg(proc.pid, signal.SIGINT)   # our own child's group: the rest of this block is not needed
                proc.wait()
                return replan()
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait()
        raise
