"""Mechanism gates, the judging half (issue 36 item 1): per repetition, a verdict on where the
queueing was, whether the CPU was short, and whether the transfers ran.

Three gates, from a repetition's records (torbed/gates.py writes shaper.jsonl and cpu.jsonl;
the collectors cellstats.jsonl; the drivers transfers.jsonl), over the measured window
(workload start + warm-up .. workload start + duration):

- **queueing** (a flag, never invalidating: the scheduler cannot act on a shaper's queue or on
  data in the kernel, but the repetition measured what it measured): the most-backlogged
  rate-limited link's median and 90th percentile backlog, in bytes and in seconds at its
  rate, and likewise the relays' largest kernel TCP send queue (sockets.jsonl), beside the
  most-queued relay's circuit-queue wait (CELL_STATS: per second, sum(time_ms) / sum(removed) over both
  directions; median and 90th percentile over the seconds with cells). "flag" when the
  shaper's (or the send queue's) median is at least ``shaper_backlog_min_s`` and at least
  ``shaper_dominance_ratio`` times the circuit queues'.
- **cpu** (invalidating): a starved process (main thread runnable but waiting for a CPU for at
  least ``max_runqueue_wait_fraction`` of the window) among the tors, drivers, servers and the
  shaper that are not a CPU-bound experiment's target; the hypervisor's steal at least
  ``max_steal_fraction``. Other processes' CPU use at or over ``max_others_busy_fraction`` is
  a flag. A CPU-bound experiment (``measure.mechanism.kind: cpu-bound``) also needs its target
  relay saturated (``cpu_bound_min_busy``), else invalid.
- **completion** (invalidating): of the transfers started after the warm-up, more than
  ``max_failed_fraction`` stalled or failed (censored ones, cut off by the window's end or,
  for a replay flow, by its own deadline while still moving, are not failures: the analysis
  keeps them with Kaplan-Meier).

A gate whose records are absent says "not measured" and neither passes nor fails the
repetition. On Kubernetes every pod samples itself (shaper.jsonl and sockets.jsonl from its
shaper sidecar, cpu.jsonl from the relay pod's collector and the client pod's driver, each
record naming its ``source``): each sampler's own first and last samples in the window give
its processes' figures, and "other processes' CPU" is not judged (a pod sees only its own).

Public API:

- ``evaluate(rep_dir, meta, mechanism=None, thresholds=None) -> dict`` (meta.json ``gates``)
- ``of_rep(rep) -> dict | None``: a loaded repetition's recorded gates (meta.json)
- ``mechanism_of(run_info) -> dict``: the scenario's ``measure.mechanism`` from run.json
- ``exclude_invalid(run) -> dict``: marks gate-invalid repetitions ``invalid`` and empties
  their records (so no statistic uses them); returns {(variant, rep): gates}
- ``summary_rows(run, gates) -> dict | None``: summary.json's ``gates`` (None: no recorded gates)
- ``warning_blocks(summary)``, ``section_blocks(summary)``: the report's (analysis/render.py)
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..gates import THRESHOLDS
from ..records import read_records
from .metrics import THROUGHPUT_WINDOW_S, _group_key, transfer_outcome

VERSION = 1
# A CPU-bound target is judged on its busiest stretch of this length: the relay throughput
# metric's window (Engler & Goldberg's 30 s).
SATURATION_WINDOW_S = THROUGHPUT_WINDOW_S
INVALID = "invalid"      # a repetition's status once a gate rejected it
# Processes whose starvation invalidates a repetition, by the role the sampler recorded.
GATED_ROLES = ("relay", "client", "driver", "server", "shaper")


def _window(meta: dict) -> tuple[float, float] | None:
    t0 = meta.get("t_workload_start")
    if not isinstance(t0, (int, float)):
        return None
    start = t0 + float(meta.get("warmup_s") or 0.0)
    end = t0 + float(meta.get("duration_s") or 0.0) if meta.get("duration_s") else meta.get("t_end")
    return (start, end) if isinstance(end, (int, float)) and end > start else None


def _q(values, q: float) -> float | None:
    return float(np.quantile(np.asarray(values, float), q)) if len(values) else None


def _fmt_s(x: float | None) -> str:
    return "n/a" if x is None else (f"{x:.2f} s" if x >= 0.1 else f"{x * 1000:.0f} ms")


# ---------------------------------------------------------------------------------------
# Queueing

def _covers(sample: dict, sender: str) -> bool:
    """Does a shaper or sockets sample hold ``sender``'s links? Not when it failed to read
    them, nor when the sample is another sender's (Kubernetes: one record per pod and second;
    records without ``senders``, from before it was written, cover every sender)."""
    senders = sample.get("senders")
    return sender not in (sample.get("failed") or ()) and (senders is None or sender in senders)


def _shaper(records: list[dict], window, th: dict) -> dict | None:
    links: dict[str, dict] = {}
    shaper = None
    samples = []
    for r in records:
        if r.get("type") == "shaper_links":
            shaper = r.get("shaper")
            for ln in r.get("links") or []:
                links[ln["link"]] = ln
        elif r.get("type") == "shaper" and window[0] <= r.get("t", 0) <= window[1]:
            samples.append({"backlog": r.get("backlog") or {}, "failed": r.get("failed") or (),
                            "senders": r.get("senders")})
    if shaper is None:
        return None
    out = {"shaper": shaper, "samples": len(samples), "links": len(links),
           "failed_samples": sum(1 for s in samples if s["failed"])}
    best = None
    unmeasured: list[str] = []
    per_link: dict[str, dict] = {}
    for name, ln in links.items():
        rate = ln.get("rate_bps") or 0
        if not rate:
            continue
        # htb + netem: the class's queue also holds the frames serving the link's delay (at
        # most rate x delay of them while the link is busy); that part is not queueing.
        in_flight = rate * float(ln.get("delay_s") or 0.0) / 8
        src = name.split(">", 1)[0]
        series = np.array([max(0.0, s["backlog"].get(name, 0) - in_flight) for s in samples
                           if _covers(s, src)], float)
        if series.size < th["min_samples"]:
            unmeasured.append(name)
            continue
        med, p90 = float(np.median(series)), float(np.quantile(series, 0.9))
        if series.max() > 0:
            per_link[name] = {"median_bytes": med, "p90_bytes": p90, "max_bytes": float(series.max())}
        # The longest median wait (seconds at the link's rate, not bytes: 100 kB is 8 ms at
        # 100 Mbit/s and 0.4 s at 2 Mbit/s); ties (links idle most of the time): the larger
        # mean, then the slower link.
        key = (med / rate, p90 / rate, float(series.mean()) / rate, -rate)
        if best is None or key > best[0]:
            best = (key, {"link": name, "rate_bps": rate, "link_samples": int(series.size),
                          "median_bytes": med, "p90_bytes": p90,
                          "median_s": med * 8 / rate, "p90_s": p90 * 8 / rate, "max_bytes": float(series.max())})
    if best:
        out.update(best[1])
    out["unmeasured_links"] = unmeasured
    out["backlogged_links"] = per_link
    return out


def _circuit_queues(records: list[dict], window) -> dict | None:
    """Per relay, per second: sum(time_ms) / sum(removed) of the CELL_STATS records (both
    directions); the relay whose median over its seconds with cells is largest."""
    per: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for r in records:
        t = r.get("t")
        if r.get("type") != "cellstats" or not isinstance(t, (int, float)) or not window[0] <= t <= window[1]:
            continue
        for d in ("inbound", "outbound"):
            side = r.get(d) or {}
            acc = per[str(r.get("relay"))][int(t)]
            acc[0] += sum(v for v in (side.get("time_ms") or {}).values() if isinstance(v, (int, float)))
            acc[1] += sum(v for v in (side.get("removed") or {}).values() if isinstance(v, (int, float)))
    best = None
    relays = {}
    for relay, secs in per.items():
        waits = [ms / n / 1000.0 for ms, n in secs.values() if n > 0]
        if not waits:
            continue
        relays[relay] = {"median_s": _q(waits, 0.5), "p90_s": _q(waits, 0.9), "seconds": len(waits)}
        if best is None or (relays[relay]["median_s"], relays[relay]["p90_s"]) > best[0]:
            best = ((relays[relay]["median_s"], relays[relay]["p90_s"]), relay)
    if best is None:
        return None
    return {"relay": best[1], **relays[best[1]], "relays": relays}


def _sockets(records: list[dict], window, rates: dict[str, int], th: dict) -> dict | None:
    """The kernel send queue (sockets.jsonl) with the longest median, in bytes and in seconds
    at its link's rate (how long the link needs to carry it, at least)."""
    samples = [r for r in records if r.get("type") == "sockets" and window[0] <= r.get("t", 0) <= window[1]]
    if not records:
        return None
    out: dict = {"samples": len(samples)}
    names = {n for r in samples for n in r.get("send_q") or {}}
    best = None
    for name in names:
        rate = rates.get(name)
        if not rate:
            continue
        src = name.split(">", 1)[0]
        series = np.array([r["send_q"].get(name, 0) for r in samples if _covers(r, src)], float)
        if series.size < th["min_samples"]:
            continue
        med, p90 = float(np.median(series)), float(np.quantile(series, 0.9))
        key = (med / rate, p90 / rate, float(series.mean()) / rate, -rate)
        if best is None or key > best[0]:
            best = (key, {"link": name, "rate_bps": rate, "median_bytes": med, "p90_bytes": p90,
                          "median_s": med * 8 / rate, "p90_s": p90 * 8 / rate})
    if best:
        out.update(best[1])
    return out


def queueing_gate(rep_dir: Path, window, th: dict) -> dict:
    shaper_records = read_records(rep_dir / "shaper.jsonl")
    shaper = _shaper(shaper_records, window, th)
    circuits = _circuit_queues(read_records(rep_dir / "cellstats.jsonl"), window)
    rates = {ln["link"]: ln.get("rate_bps") for r in shaper_records if r.get("type") == "shaper_links"
             for ln in r.get("links") or []}
    sockets = _sockets(read_records(rep_dir / "sockets.jsonl"), window, rates, th)
    out = {"shaper": shaper, "circuit_queues": circuits, "sockets": sockets}
    if shaper is None:
        return {**out, "status": "not measured", "text": "shaper backlog not measured (no shaper.jsonl)"}
    if shaper["shaper"] == "none":
        return {**out, "status": "ok", "text": "no link has a rate: no shaper queue"}
    failed = f", {shaper['failed_samples']} of them incomplete" if shaper["failed_samples"] else ""
    not_enough = {**out, "status": "not measured",
                  "text": f"shaper backlog: {shaper['samples']} samples in the window{failed} "
                          f"(fewer than {th['min_samples']} usable for "
                          f"{len(shaper['unmeasured_links']) or 'every'} rate-limited link(s))"}
    if shaper["samples"] < th["min_samples"]:
        return not_enough
    if "link" not in shaper:
        return not_enough if shaper["unmeasured_links"] else \
            {**out, "status": "ok", "text": "no rate-limited link: no shaper queue"}
    sq = shaper["median_s"]
    cq = circuits["median_s"] if circuits else 0.0
    kq = sockets.get("median_s") if sockets else None
    where = (f"{shaper['link']} at {shaper['rate_bps'] / 1e6:g} Mbit/s, median {shaper['median_bytes'] / 1e3:.0f} kB, "
             f"p90 {_fmt_s(shaper['p90_s'])}")
    cwhere = f"{circuits['relay']}, p90 {_fmt_s(circuits['p90_s'])}" if circuits else "no CELL_STATS"
    kwhere = ("" if kq is None else
              f", in kernel send queues {_fmt_s(kq)} ({sockets['link']}, median "
              f"{sockets['median_bytes'] / 1e3:.0f} kB, p90 {_fmt_s(sockets['p90_s'])})")
    figures = (f"median queueing in the shaper {_fmt_s(sq)} ({where}){kwhere} vs {_fmt_s(cq)} in circuit queues "
               f"({cwhere})")
    found = []
    if sq >= th["shaper_backlog_min_s"] and sq >= th["shaper_dominance_ratio"] * cq:
        found.append("shaper backlog dominates")
    if kq is not None and kq >= th["shaper_backlog_min_s"] and kq >= th["shaper_dominance_ratio"] * cq:
        found.append("kernel send-queue backlog dominates")
    if found:
        return {**out, "status": "flag", "text": f"{' and '.join(found)}: {figures}"}
    if shaper["unmeasured_links"]:
        # A link that could not be read may have held the backlog: no verdict.
        return {**not_enough, "text": f"{not_enough['text']}; measured: {figures}"}
    return {**out, "status": "ok", "text": figures}


# ---------------------------------------------------------------------------------------
# CPU

def _busy(a: dict, b: dict, name: str, hz: int, cap: float | None = None) -> float | None:
    """How busy ``name`` was between two samples: its busiest thread's share of the time, or
    the whole process' share of every core, whichever is larger. With a per-thread CPU cap
    (``cap``, cores: ``cpu_per_thread``) a thread is saturated at its cap, so the busiest
    thread's share of its cap."""
    pa, pb = a["procs"].get(name), b["procs"].get(name)
    dt = b["t"] - a["t"]
    if not pa or not pb or dt <= 0 or not _same_process(pa, pb):
        return None
    ta, tb = (a.get("threads") or {}).get(name) or {}, (b.get("threads") or {}).get(name) or {}
    thread = max(((tb[t] - ta.get(t, 0)) / hz / dt for t in tb), default=0.0)
    if cap:
        return thread / cap
    whole = (pb["ticks"] - pa["ticks"]) / hz / dt / max(1, b["host"]["cpus"])
    return max(whole, thread)


def _best_window_busy(inside: list[dict], name: str, hz: int, span_s: float, cap: float | None = None) -> float | None:
    """The largest busy share over any ``span_s`` stretch of the samples (the whole window
    when shorter): the CPU-bound target is judged on the stretch the throughput metric uses."""
    best = None
    i = 0
    for j, b in enumerate(inside):
        while i < j and b["t"] - inside[i + 1]["t"] >= span_s:
            i += 1
        if b["t"] - inside[i]["t"] >= min(span_s, inside[-1]["t"] - inside[0]["t"]) > 0:
            x = _busy(inside[i], b, name, hz, cap)
            if x is not None and (best is None or x > best):
                best = x
    return best


def _sources(inside: list[dict]) -> dict:
    """The window's cpu samples by sampler (``source``: a Kubernetes pod's node; None: the
    local backend's one sampler of every process)."""
    by: dict = defaultdict(list)
    for r in inside:
        by[r.get("source")].append(r)
    return by


def cpu_gate(rep_dir: Path, window, th: dict, mechanism: dict) -> dict:
    records = read_records(rep_dir / "cpu.jsonl")
    if not records:
        return {"status": "not measured", "text": "CPU not measured (no cpu.jsonl)", "reasons": [], "flags": []}
    inside = [r for r in records if r.get("type") == "cpu" and window[0] <= r.get("t", 0) <= window[1]]
    by_source = {k: v for k, v in _sources(inside).items() if len(v) >= th["min_samples"]}
    if not by_source:
        return {"status": "not measured", "reasons": [], "flags": [],
                "text": f"CPU: {len(inside)} samples in the window (fewer than {th['min_samples']}"
                        + (" from any one pod)" if any(r.get("source") for r in inside) else ")")}
    target = mechanism.get("target") if mechanism.get("kind") == "cpu-bound" else None
    procs: dict = {}
    series_of: dict = {}
    hosts = []
    for source, rs in sorted(by_source.items(), key=lambda kv: str(kv[0])):
        a, b = rs[0], rs[-1]
        hz = b.get("hz") or 100
        got, ours = _cpu_processes(rs, hz)
        procs.update(got)
        series_of.update({n: (rs, hz) for n in got})
        ha, hb = a["host"], b["host"]
        d_total = max(1, hb["total"] - ha["total"])
        hosts.append({"cpus": hb["cpus"], "steal_fraction": (hb["steal"] - ha["steal"]) / d_total,
                      "busy_fraction": (hb["busy"] - ha["busy"]) / d_total,
                      "others_busy_fraction": max(0.0, (hb["busy"] - ha["busy"] - ours) / d_total),
                      "load1_end": hb.get("load1"), "window_s": b["t"] - a["t"], "samples": len(rs)})
    # One sampler sees every process of the run (local); per-pod samplers (Kubernetes) see
    # their pod's only, so "the others' CPU" would count the rest of the run: not judged.
    pods = len(by_source) > 1 or None not in by_source
    host = max(hosts, key=lambda h: h["steal_fraction"])
    if pods:
        host = {**host, "others_busy_fraction": None, "busy_fraction": max(h["busy_fraction"] for h in hosts),
                "samplers": len(by_source), "samples": len(inside)}
    reasons, flags = [], []
    starved = sorted((n for n, p in procs.items() if p["role"] in GATED_ROLES
                      and not (target and p["role"] == "relay" and p.get("group") == target)
                      and p["wait_fraction"] >= th["max_runqueue_wait_fraction"]),
                     key=lambda n: -procs[n]["wait_fraction"])
    if starved:
        worst = ", ".join(f"{n} {100 * procs[n]['wait_fraction']:.0f}%" for n in starved[:4])
        reasons.append(f"CPU-starved: {len(starved)} process(es) waited for a CPU at least "
                       f"{100 * th['max_runqueue_wait_fraction']:.0f}% of the window ({worst})")
    if host["steal_fraction"] >= th["max_steal_fraction"]:
        reasons.append(f"steal {100 * host['steal_fraction']:.1f}% of the machine's CPU time "
                       f"(limit {100 * th['max_steal_fraction']:.0f}%)")
    others = host["others_busy_fraction"]
    if others is not None and others >= th["max_others_busy_fraction"]:
        flags.append(f"other processes used {100 * others:.0f}% of the machine's CPU "
                     f"(flag at {100 * th['max_others_busy_fraction']:.0f}%)")
    out = {"host": host, "processes": procs, "starved": starved}
    if target:
        out["target"] = _cpu_target(series_of, procs, target, th, reasons, mechanism.get("thread_cap"))
    top = sorted(procs.items(), key=lambda kv: -kv[1]["wait_fraction"])[:1]
    summary = (f"busiest wait: {top[0][0]} {100 * top[0][1]['wait_fraction']:.1f}% of the window; " if top else "") + \
        f"steal {100 * host['steal_fraction']:.1f}%" + \
        (f", others {100 * others:.0f}%" if others is not None else
         f"; {len(by_source)} pods sampled their own processes (other processes not judged)")
    return {**out, "status": INVALID if reasons else ("flag" if flags else "ok"), "reasons": reasons,
            "flags": flags, "text": "; ".join(reasons + flags) or summary}


def _same_process(pa: dict, pb: dict) -> bool:
    """Two samples of one name are of one process (records before pids were kept: assumed)."""
    return pa.get("pid") is None or pb.get("pid") is None or pa["pid"] == pb["pid"]


def _deltas(rs: list[dict], name: str) -> dict | None:
    """A name's counters summed over consecutive samples of the same process: a process
    restarted within the window (a fault, a crash) counts both lives and not the step
    between them. None when no two consecutive samples have it."""
    out, seen = {"ticks": 0, "wait_ns": 0, "slices": 0, "threads": {}}, False
    for a, b in zip(rs, rs[1:]):
        pa, pb = a["procs"].get(name), b["procs"].get(name)
        if not pa or not pb or not _same_process(pa, pb):
            continue
        seen = True
        for k in ("ticks", "wait_ns", "slices"):
            out[k] += pb[k] - pa[k]
        ta, tb = (a.get("threads") or {}).get(name), (b.get("threads") or {}).get(name)
        if ta and tb:
            for t, v in tb.items():
                out["threads"][t] = out["threads"].get(t, 0) + v - ta.get(t, 0)
    return out if seen else None


def _cpu_processes(rs: list[dict], hz: float) -> tuple[dict, int]:
    """Each process sampled in the window: its CPU (cores), run-queue wait (fraction of the
    window, and per time slice) and busiest thread; and the ticks of all of them. A process
    that restarted is counted over its lives (``lives``: how many pids it had)."""
    dt = rs[-1]["t"] - rs[0]["t"]
    names = sorted({n for r in rs for n in r["procs"]})
    procs, ours = {}, 0
    for name in names:
        d = _deltas(rs, name)
        if d is None:
            continue
        last = next(r["procs"][name] for r in reversed(rs) if name in r["procs"])
        ours += d["ticks"]
        p = {"role": last.get("role"), "group": last.get("group"), "cpu_cores": d["ticks"] / hz / dt,
             "wait_fraction": d["wait_ns"] / 1e9 / dt}
        p["wait_per_slice_ms"] = d["wait_ns"] / 1e6 / d["slices"] if d["slices"] > 0 else 0.0
        if d["threads"]:
            p["busiest_thread_cores"] = max(d["threads"].values()) / hz / dt
        pids = {r["procs"][name].get("pid") for r in rs if name in r["procs"]} - {None}
        if len(pids) > 1:
            p["lives"] = len(pids)
        procs[name] = p
    return procs, ours


def _cpu_target(series_of: dict, procs: dict, target: str, th: dict, reasons: list,
                cap: float | None = None) -> dict:
    """The reverse check of a CPU-bound experiment: the target group's relays must have been
    saturated (appends to ``reasons`` when not). ``series_of``: {name: (its sampler's
    samples in the window, hz)}; ``cap``: the target's per-thread CPU cap in cores (a
    thread at its cap is saturated), None without one."""
    tgt = {n: p for n, p in procs.items() if p["role"] == "relay" and p.get("group") == target}
    sat = {n: _best_window_busy(series_of[n][0], n, series_of[n][1], SATURATION_WINDOW_S, cap) or 0.0 for n in tgt}
    low = sorted(n for n, x in sat.items() if x < th["cpu_bound_min_busy"])
    what = f"busiest thread at {{:.0f}}% of its {100 * cap:g}% cap" if cap else "busiest thread/cores at {:.0f}%"
    if not tgt:
        reasons.append(f"CPU-bound target group {target!r}: no process sampled")
    elif low:
        reasons.append("CPU-bound target not saturated: " + ", ".join(
            f"{n} " + what.format(100 * sat[n]) for n in low) + f" (needs {100 * th['cpu_bound_min_busy']:.0f}%)")
    return {"group": target, "saturation": sat, "saturation_window_s": SATURATION_WINDOW_S,
            **({"thread_cap": cap} if cap else {})}


# ---------------------------------------------------------------------------------------
# Completion

def completion_gate(rep_dir: Path, th: dict) -> dict:
    """Outcomes of the transfers started after the warm-up; where every transfer started in
    the warm-up (a long bulk download running through the whole window), of those instead."""
    counts = {"completed": 0, "censored": 0, "stalled": 0, "failed": 0}
    groups: dict[str, dict] = {}
    transfers = [t for t in read_records(rep_dir / "transfers.jsonl") if t.get("type", "transfer") == "transfer"]
    measured = [t for t in transfers if t.get("warmup") is not True]
    for t in measured or transfers:
        o = transfer_outcome(t)
        counts[o] += 1
        groups.setdefault(":".join(_group_key(t)), dict.fromkeys(counts, 0))[o] += 1
    started = sum(counts.values())
    out = {"counts": counts, "by_group": dict(sorted(groups.items())), "started": started,
           "counted": "after warm-up" if measured else "all (none started after the warm-up)"}
    if not started:
        return {**out, "status": INVALID, "failed_fraction": None,
                "text": "no transfer started", "reasons": ["no transfer started"]}
    bad = (counts["stalled"] + counts["failed"]) / started
    out["failed_fraction"] = bad
    out["censored_fraction"] = counts["censored"] / started
    text = (f"{started} started{'' if measured else ' (all in the warm-up)'}: {counts['completed']} completed, {counts['censored']} censored, "
            f"{counts['stalled']} stalled, {counts['failed']} failed")
    if bad > th["max_failed_fraction"]:
        why = (f"{100 * bad:.0f}% of {started} transfers stalled or failed "
               f"(limit {100 * th['max_failed_fraction']:.0f}%)")
        return {**out, "status": INVALID, "text": f"{why}; {text}", "reasons": [why]}
    return {**out, "status": "ok", "text": text, "reasons": []}


# ---------------------------------------------------------------------------------------

def evaluate(rep_dir: str | Path, meta: dict, mechanism: dict | None = None, thresholds: dict | None = None,
             not_measured: str | dict | None = None) -> dict:
    """The gates of one repetition (meta.json ``gates``). ``not_measured``: why the samples
    are absent (e.g. "not measured on k8s"), said instead of "not measured": one reason for
    both the queueing and the CPU gate, or {"queueing"|"cpu": reason} for some of them."""
    rep_dir = Path(rep_dir)
    th = {**THRESHOLDS, **(thresholds or {})}
    mechanism = dict(mechanism or {"kind": "queueing"})
    window = _window(meta)
    out = {"version": VERSION, "mechanism": mechanism, "thresholds": th,
           "window": list(window) if window else None}
    if window is None:
        return {**out, "valid": True, "invalid_reasons": [], "flags": [],
                "queueing": {"status": "not measured", "text": "no measurement window in meta.json"},
                "cpu": {"status": "not measured", "text": "no measurement window in meta.json"},
                "completion": completion_gate(rep_dir, th)}
    q = queueing_gate(rep_dir, window, th)
    c = cpu_gate(rep_dir, window, th, mechanism)
    done = completion_gate(rep_dir, th)
    if not_measured:
        why = not_measured if isinstance(not_measured, dict) else {"queueing": not_measured, "cpu": not_measured}
        for name, g, what in (("queueing", q, "shaper backlog and kernel send queues"), ("cpu", c, "CPU")):
            if g["status"] == "not measured" and why.get(name):
                g["text"] = f"{what}: {why[name]}"
    reasons = list(c.get("reasons") or []) + list(done.get("reasons") or [])
    flags = ([q["text"]] if q["status"] == "flag" else []) + list(c.get("flags") or [])
    return {**out, "valid": not reasons, "invalid_reasons": reasons, "flags": flags,
            "queueing": q, "cpu": c, "completion": done}


def mechanism_of(run_info: dict) -> dict:
    """``measure.mechanism`` of the resolved scenario in run.json (queueing when absent)."""
    sc = run_info.get("scenario") if isinstance(run_info.get("scenario"), dict) else {}
    m = (sc.get("measure") or {}).get("mechanism")
    return dict(m) if isinstance(m, dict) else {"kind": "queueing", "target": None}


def of_rep(rep) -> dict | None:
    """The gates meta.json recorded for a repetition that finished ok; None otherwise (runs
    from before the gates, or a run whose judging failed: ``gates_error``). The report does
    not judge a run again after the fact: what was recorded is what it shows."""
    if rep.status != "ok" or rep.meta is None:
        return None
    g = rep.meta.get("gates")
    return g if isinstance(g, dict) and g.get("version") == VERSION else None


def exclude_invalid(run, keep: bool = False) -> dict:
    """Mark every repetition a gate rejected ``invalid`` (the reason as its error) and empty its
    records, so neither the inference nor the descriptive statistics use it; its block is then
    broken (summary.invalid_reps). ``keep`` (`torbed report --keep-gate-invalid`): judge but
    exclude nothing. Returns {(variant, rep): gates} for every repetition with recorded gates."""
    out = {}
    for r in run.reps:
        g = of_rep(r)
        if g is None:
            continue
        out[(r.variant, r.index)] = g
        if not g["valid"] and not keep:
            r.status = INVALID
            r.error = "mechanism gate: " + "; ".join(g["invalid_reasons"])
            r.notes.append("excluded from every statistic by the mechanism gate (see Mechanism gates)")
            r.transfers, r.cellstats, r.relay_bw, r.metrics, r.resources, r.cells = [], [], [], [], [], None
    return out


def _num(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def summary_rows(run, gates: dict, kept: bool = False) -> dict | None:
    """summary.json ``gates``: thresholds, one row per judged repetition, the excluded ones
    (with ``kept``, the invalid ones, ``kept_invalid``: the report used them anyway), the
    finished repetitions without gates, and the warnings the comparisons carry (queueing flags
    per variant). None for a run with no recorded gates (older runs' summaries stay as they
    were)."""
    if not gates:
        return None
    rows = []
    for (v, k), g in sorted(gates.items(), key=lambda kv: (run.variants.index(kv[0][0])
                                                          if kv[0][0] in run.variants else 99, kv[0][1])):
        q, c, d = g["queueing"], g["cpu"], g["completion"]
        sh, cq = q.get("shaper") or {}, q.get("circuit_queues") or {}
        rows.append({"variant": v, "rep": k, "valid": g["valid"], "invalid_reasons": g["invalid_reasons"],
                     "flags": g["flags"], "queueing": q["status"], "queueing_text": q.get("text"),
                     "shaper_link": sh.get("link"), "shaper_median_s": _num(sh.get("median_s")),
                     "shaper_p90_s": _num(sh.get("p90_s")), "shaper_median_bytes": _num(sh.get("median_bytes")),
                     "shaper_p90_bytes": _num(sh.get("p90_bytes")),
                     "socket_link": (q.get("sockets") or {}).get("link"),
                     "socket_median_s": _num((q.get("sockets") or {}).get("median_s")),
                     "socket_p90_s": _num((q.get("sockets") or {}).get("p90_s")),
                     "circuit_queue_relay": cq.get("relay"), "circuit_queue_median_s": _num(cq.get("median_s")),
                     "circuit_queue_p90_s": _num(cq.get("p90_s")),
                     "cpu": c["status"], "cpu_text": c.get("text"),
                     "completion": d["status"], "completion_text": d.get("text"), "outcomes": d.get("counts")})
    warnings = []
    for v in run.variants:
        flagged = [r["rep"] for r in rows if r["variant"] == v and r["queueing"] == "flag"]
        if flagged:
            n = sum(1 for r in rows if r["variant"] == v)
            texts = [r["queueing_text"] or "" for r in rows if r["variant"] == v and r["queueing"] == "flag"]
            where = [w for w, key in (("the shaper", "shaper backlog dominates"),
                                      ("the relays' kernel send queues", "send-queue backlog dominates"))
                     if any(key in t for t in texts)]
            warnings.append(f"variant {v}: the queueing was outside tor's circuit queues ({' and '.join(where)}) in "
                            f"{len(flagged)} of {n} repetition(s) (rep {', '.join(map(str, flagged))}). No circuit "
                            f"scheduler acts there: comparisons involving {v} measure that queue as much as the "
                            f"scheduler.")
    mech = mechanism_of(run.info)
    unjudged = [f"variant {r.variant} rep {r.index}: " + (f"judging failed: {r.meta['gates_error']}"
                                                         if (r.meta or {}).get("gates_error") else "no gates recorded")
                for r in run.reps if r.status == "ok" and (r.variant, r.index) not in gates]
    invalid = [f"variant {r['variant']} rep {r['rep']}: " + "; ".join(r["invalid_reasons"]) for r in rows if not r["valid"]]
    return {"thresholds": dict(THRESHOLDS), "mechanism": mech, "rows": rows, "unjudged": unjudged,
            "excluded": [] if kept else invalid, "kept_invalid": invalid if kept else [], "warnings": warnings}


# ---------------------------------------------------------------------------------------
# The report's blocks (analysis/render.py)

def warning_blocks(summary: dict) -> list[tuple]:
    """What the headline and the comparisons carry: repetitions excluded, queueing flags."""
    g = summary.get("gates") or {}
    b: list[tuple] = []
    if g.get("excluded"):
        b.append(("p", f"**Mechanism gates: {len(g['excluded'])} repetition(s) invalid, excluded from every "
                       "statistic below** (their blocks count as broken):"))
        b.append(("ul", list(g["excluded"])))
    if g.get("kept_invalid"):
        b.append(("p", f"**Mechanism gates: {len(g['kept_invalid'])} repetition(s) invalid but KEPT in every "
                       "statistic below (`torbed report --keep-gate-invalid`): what they measured is not what "
                       "the comparison needs; read them as a look at the raw run, not as a result:**"))
        b.append(("ul", list(g["kept_invalid"])))
    if g.get("warnings"):
        b.append(("p", "**Warning (mechanism gate, queueing): the delay was outside tor's circuit queues.**"))
        b.append(("ul", list(g["warnings"])))
    if g.get("unjudged"):
        b.append(("p", f"**Mechanism gates: {len(g['unjudged'])} repetition(s) not judged, used as they are:**"))
        b.append(("ul", list(g["unjudged"])))
    return b


def _cell_s(x) -> str:
    return "—" if x is None else (f"{x:.2f} s" if x >= 0.1 else f"{x * 1000:.0f} ms")


def section_blocks(summary: dict) -> list[tuple]:
    """The "Mechanism gates" section: every repetition's figures and verdicts."""
    g = summary.get("gates") or {}
    if not g.get("rows"):
        return []
    th = g["thresholds"]
    mech = g.get("mechanism") or {}
    b: list[tuple] = [("h", 2, "Mechanism gates"),
                      ("p", f"Per repetition, over the measured window (docs/statistics.md, *Mechanism gates*). "
                            f"Backlogs in seconds at the link's rate. "
                            f"Mechanism: {mech.get('kind', 'queueing')}"
                            + (f" (target {mech['target']})" if mech.get("target") else "") + ". "
                            f"Queueing is a flag (no circuit scheduler acts on a shaper's queue or on data already "
                            f"in the kernel): the most-backlogged rate-limited link's median shaper backlog, and "
                            f"the largest median kernel send queue, flagged at {th['shaper_backlog_min_s']} s and "
                            f"{th['shaper_dominance_ratio']:g}x the most-queued relay's median circuit-queue wait. "
                            f"Invalid: a tor, driver, server or the shaper "
                            f"(not a CPU-bound target) runnable but waiting for a CPU "
                            f"{100 * th['max_runqueue_wait_fraction']:.0f}% of the window or more; steal "
                            f"{100 * th['max_steal_fraction']:.0f}% or more; a CPU-bound target under "
                            f"{100 * th['cpu_bound_min_busy']:.0f}% busy; more than "
                            f"{100 * th['max_failed_fraction']:.0f}% of the started transfers stalled or failed.")]
    rows = []
    for r in g["rows"]:
        rows.append([r["variant"], str(r["rep"]), "valid" if r["valid"] else "INVALID", r["queueing"],
                     f"{_cell_s(r['shaper_median_s'])} / {_cell_s(r['shaper_p90_s'])}"
                     + (f" ({r['shaper_link']})" if r.get("shaper_link") else ""),
                     f"{_cell_s(r.get('socket_median_s'))} / {_cell_s(r.get('socket_p90_s'))}"
                     + (f" ({r['socket_link']})" if r.get("socket_link") else ""),
                     f"{_cell_s(r['circuit_queue_median_s'])} / {_cell_s(r['circuit_queue_p90_s'])}"
                     + (f" ({r['circuit_queue_relay']})" if r.get("circuit_queue_relay") else ""),
                     r["cpu"], r["completion"]])
    b.append(("table", ["variant", "rep", "verdict", "queueing", "shaper backlog median / p90",
                        "kernel send queue median / p90", "circuit-queue wait median / p90", "cpu",
                        "completion"], rows))
    details = [f"variant {r['variant']} rep {r['rep']}: queueing: {r['queueing_text']}; cpu: {r['cpu_text']}; "
               f"transfers: {r['completion_text']}" for r in g["rows"]]
    b.append(("ul", details))
    return b
