"""report.md and report.html from a summary (summary.py) and the figures (figures.py).

Both are rendered from one list of blocks, so they say the same thing. report.html is
self-contained (figures embedded as base64 PNG); report.md links the PNGs beside it.

Public API:

- ``blocks(summary, figures) -> list[tuple]``  the document: ("h", level, text),
  ("p", text), ("ul", [text]), ("table", headers, rows), ("fig", Figure)
- ``to_markdown(blocks, base_dir) -> str``  figure links relative to ``base_dir``
- ``to_html(blocks, title) -> str``          figures read from disk and embedded
- ``fmt_value(x, unit) -> str``, ``fmt_pct(x) -> str``, ``fmt_p(x) -> str``
"""

from __future__ import annotations

import base64
import html
import os
import re
from pathlib import Path

from . import gates as gates_mod
from . import headline
from .figures import Figure
from .stats import ALPHA
from .metrics import fmt_size

FAMILIES = (
    ("ttfb_s", "Time to first byte (from the request)"),
    ("ttlb_s", "Time to last byte (from the request)"),
    ("ttfb_stream_s", "Time to first byte from stream start"),
    ("ttlb_stream_s", "Time to last byte from stream start"),
    ("circuit_build_s", "Circuit build time"),
    ("relay_throughput_Bps", "Relay throughput"),
    ("cell_wait_ms", "Circuit-queue wait per cell"),
    ("cell_delay_ms", "Per-cell delay of replayed traffic (mean = average delay per cell)"),
    ("sched_error_ms", "Replay scheduling error"),
)
DASH = "–"


def fmt_value(x, unit: str = "") -> str:
    """A statistic for a table: 4 significant digits; bytes/s shown as MiB/s."""
    if x is None:
        return DASH
    if unit == "B/s":
        return f"{x / 1048576:.4g}"
    return f"{x:.4g}"


def _unit_shown(unit: str) -> str:
    return "MiB/s" if unit == "B/s" else unit


def fmt_pct(x) -> str:
    return DASH if x is None else f"{x:+.1f}%"


def fmt_p(x) -> str:
    if x is None:
        return DASH
    return "<1e-6" if x < 1e-6 else f"{x:.3g}"


def _run_table(s: dict) -> tuple:
    r = s["run"]
    host = r.get("host") or {}
    mem = host.get("memory_bytes")
    host_s = ", ".join(str(x) for x in (
        host.get("hostname"), host.get("arch"), host.get("cpu_model"),
        host.get("kernel") and f"Linux {host.get('kernel')}",
        host.get("cpus") and f"{host.get('cpus')} CPUs", mem and f"{fmt_size(mem)} RAM") if x) or "not recorded"
    variants = ", ".join(f"{v} (baseline)" if v == s["baseline"] else v for v in r["variants"])
    rows = [("Scenario", r.get("scenario")), ("Run directory", r.get("directory")),
            ("Variants", variants), ("Repetitions", r.get("repetitions")), ("Seed", r.get("seed")),
            ("Backend / shaper", f"{r.get('backend') or '?'} / {r.get('shaper') or '?'}"),
            ("Host", host_s), ("tor version", r.get("tor_version") or "not recorded"),
            ("torbed version", r.get("torbed_version") or "not recorded"),
            ("Started / finished", f"{r.get('started') or '?'} / {r.get('finished') or 'not finished'}"),
            ("Run status (run.json)", r.get("status") or "not recorded"),
            ("Host load before the run", _host_load(r.get("host_load")))]
    if r.get("sessions"):
        ss = r["sessions"]
        disc = [d for x in ss for d in (x.get("discarded") or [])]
        rows.append(("Sessions (torbed run --resume)",
                     f"{len(ss)}: " + "; ".join(f"{x.get('started')} - {x.get('finished') or '?'} ({x.get('status')})"
                                                 for x in ss)
                     + (f"; discarded and run again: {', '.join(disc)}" if disc else "")))
    if r.get("crossover"):
        c = r["crossover"]
        rows.append(("Design", f"within-run crossover: every arm in each repetition's network (the {c.get('build_variant')} "
                               f"build), the relays switched by SETCONF in {c.get('period_s'):g} s periods, "
                               f"{c.get('cycles')} cycle(s) of one period per arm, alternating order; the first "
                               f"{c.get('washout_s'):g} s of each period not measured; block k pairs the arms' "
                               "periods of network k"))
    if r.get("sequential"):
        q = r["sequential"]
        rows.append(("Sequential design", q.get("text") or f"not finished ({len(q.get('checks') or [])} checks)"))
    return ("table", ["", ""], [[k, DASH if v is None else str(v)] for k, v in rows])


def _host_load(h) -> str:
    """run.json's host_load (torbed/hostload.py) in a sentence."""
    if not isinstance(h, dict):
        return "not recorded"
    la = h.get("loadavg") or [None]
    text = (f"load average {la[0]} on {h.get('cpus')} CPU(s); {100 * (h.get('busy_fraction') or 0):.0f}% of "
            f"the CPU busy with other processes over {h.get('interval_s')} s")
    if h.get("busy"):
        top = ", ".join(f"{p['name']} ({100 * p['cpu_cores']:.0f}% of a CPU)" for p in h.get("top") or [])
        text = "BUSY: " + text + (f"; top: {top}" if top else "")
    return text


def _family_table(s: dict, metric: str) -> tuple | None:
    entries = [e for e in s["metrics"].values() if e["metric"] == metric]
    if not entries:
        return None
    unit = entries[0]["unit"]
    cell = metric == "cell_wait_ms"
    delay = metric == "cell_delay_ms"
    headers = ["subject", "variant", "n", "median [95% CI]", "mean", "p25", "p75", "p90", "p99",
               "Δ median", "Δ mean", "KS p (descr.)", "MWU p (descr.)"]
    if cell:
        headers.insert(3, "wait/cell")
    if delay:
        headers.insert(5, "± clock")
    rows = []
    for e in entries:
        subject = e["title"].split(", ", 1)[1] if ", " in e["title"] else e["title"]
        for v, d in e["variants"].items():
            name = f"{v} (baseline)" if v == s["baseline"] else v
            if not d.get("n"):
                row = [subject, name, "0"] + [DASH] * (len(headers) - 3)
                rows.append(row)
                continue
            lo, hi = d.get("median_ci95") or (None, None)
            vb = d.get("vs_baseline") or {}
            row = [subject, name, str(d["n"]),
                   f"{fmt_value(d['median'], unit)} [{fmt_value(lo, unit)}, {fmt_value(hi, unit)}]",
                   fmt_value(d["mean"], unit), fmt_value(d["p25"], unit), fmt_value(d["p75"], unit),
                   fmt_value(d["p90"], unit), fmt_value(d["p99"], unit),
                   fmt_pct(vb.get("median_change_pct")) if vb else "baseline",
                   fmt_pct(vb.get("mean_change_pct")) if vb else DASH,
                   fmt_p(vb.get("ks_pvalue")) if vb else DASH, fmt_p(vb.get("mwu_pvalue")) if vb else DASH]
            if cell:
                row.insert(3, fmt_value(d.get("wait_per_cell_ms")))
            if delay:
                row.insert(5, _clock_cell(d))
                if vb.get("mean_diff_within_clock"):
                    # The difference could be the clock correction's error: no number.
                    row[11] = f"within clock ±{fmt_value(vb['mean_diff_clock_bound_ms'])}"
            rows.append(row)
    return ("table", headers, rows)


VERDICT = {"not enough repetitions": "not enough repetitions", "no variance": "no variance"}


def _verdict(inf: dict) -> str:
    """The row's verdict. A non-significant difference is "no change" only where the
    equivalence test (TOST) shows the change inside the margin; otherwise it is inconclusive:
    a verdict that low power alone could win is no verdict."""
    if inf.get("status") != "tested":
        return VERDICT.get(inf.get("status"), str(inf.get("status")))
    eq = inf.get("equivalence") or {}
    margin = f"±{eq.get('margin_pct', 0):.0f}%"
    if eq.get("equivalent"):
        within = f"equivalent within {margin} (TOST p = {fmt_p(eq.get('pvalue'))})"
    else:
        within = f"inconclusive: not shown within {margin}"
    if not inf.get("in_family"):
        p = inf.get("pvalue")
        return "secondary (not in the family); " + (f"unadjusted p < {ALPHA}" if p is not None and p < ALPHA
                                                     else within)
    if inf.get("significant"):
        return "significant" + ("; a small change, within " + margin if eq.get("equivalent") else "")
    return "not significant; " + within


def _test_cell(inf: dict) -> str:
    """Which test the row used, and why (the block check's reason, shortened)."""
    why = inf.get("test_reason") or ""
    if inf.get("test") == "paired":
        return f"paired, {inf.get('n')} blocks"
    short = why.split(", so ")[0]
    return f"Welch: {short}" if short else "Welch"


def _plan_cells(inf: dict) -> tuple[str, str]:
    """(n needed for 80% power: observed / stated minimum, the 95% CI's ± at this n)."""
    pl = inf.get("plan") or {}
    if pl.get("sd") is None or pl.get("note"):
        return DASH, DASH

    def n(x):
        return str(x) if x else "> 1000"
    obs = n(pl.get("n_for_observed")) if pl.get("observed_change_pct") is not None else DASH
    hw = pl.get("ci95_halfwidth_pct_now")
    unit = "blocks" if pl.get("basis") == "paired" else "reps/arm"
    return f"{obs} / {n(pl.get('n_for_target'))} {unit}", DASH if hw is None else f"±{hw:.1f}%"


def _ci_pct(ci) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return DASH
    return f"[{ci[0]:+.1f}%, {ci[1]:+.1f}%]"


def _inference_table(s: dict, metric: str) -> tuple | None:
    entries = [e for e in s["metrics"].values() if e["metric"] == metric]
    if not entries:
        return None
    unit = entries[0]["unit"]
    headers = ["subject", "variant", "reps", "per-rep statistic", "estimate [95% CI]", "Δ [95% CI]",
               "test (why)", "p", "Holm p", "verdict",
               f"n for {s['settings'].get('power', 0.8):.0%} power: observed / ±"
               f"{s['settings'].get('target_change_pct', 10):.0f}%", "95% CI ± at this n"]
    rows = []
    for e in entries:
        subject = e["title"].split(", ", 1)[1] if ", " in e["title"] else e["title"]
        for v, d in e["variants"].items():
            rs = d.get("rep_summary") or {}
            est = rs.get("estimate")
            ci = rs.get("ci95") or (None, None)
            est_s = DASH if est is None else (f"{fmt_value(est, unit)} [{fmt_value(ci[0], unit)}, "
                                              f"{fmt_value(ci[1], unit)}]" if rs.get("ci95") else fmt_value(est, unit))
            stat = rs.get("statistic", "")
            stat_s = ("geo. mean of " if rs.get("scale") == "log" else "mean of ") + stat.replace("_", " ") + "s"
            vb = d.get("vs_baseline")
            if not vb:
                rows.append([subject, f"{v} (baseline)", str(rs.get("n", 0)), stat_s, est_s, "baseline",
                             DASH, DASH, DASH, DASH, DASH, DASH])
                continue
            inf = vb["inference"]
            tested = inf.get("status") == "tested"
            descr = inf.get("change_pct_descriptive")
            delta = ((fmt_pct(inf.get("change_pct")) + " " + _ci_pct(inf.get("change_ci95"))) if tested else
                     f"{fmt_pct(descr)} (descriptive)" if descr is not None else DASH)
            rows.append([subject, v, str(rs.get("n", 0)), stat_s, est_s, delta,
                         _test_cell(inf) if tested else DASH,
                         fmt_p(inf.get("pvalue")) if tested else DASH,
                         fmt_p(inf.get("pvalue_holm")) if inf.get("pvalue_holm") is not None else DASH,
                         _verdict(inf), *_plan_cells(inf)])
    return ("table", headers, rows)


def _fmt_mde(up, down) -> str:
    if up is None:
        return DASH
    return f"{up:+.1f}% / {down:+.1f}%" if down is not None else f"±{abs(up):.1f}%"


def _power_table(s: dict) -> tuple:
    rows = []
    for e in s["metrics"].values():
        pw = e.get("power") or {}
        if e["metric"] not in s["settings"].get("family_metrics", []):
            continue
        subject = e["title"]
        if pw.get("sd") is None:
            continue                        # no variant has 2 repetitions with data
        if pw.get("note"):
            rows.append([subject, f"{pw['sd']:.3g}", str(pw["df"]), pw["note"], DASH, DASH, DASH])
            continue
        nt, ntf = pw.get("reps_for_target"), pw.get("reps_for_target_family")
        rows.append([subject, f"{pw['sd']:.3g}" + (" (log)" if pw["scale"] == "log" else ""), str(pw["df"]),
                     _fmt_mde(pw.get("mde_pct"), pw.get("mde_pct_decrease")),
                     _fmt_mde(pw.get("mde_pct_family"), pw.get("mde_pct_family_decrease")),
                     str(nt) if nt else f"> {1000}", str(ntf) if ntf else f"> {1000}"])
    n = s["run"]["repetitions"]
    fam = s["inference"]["family_size"]
    if not rows:
        return ("p", "No outcome metric has 2 repetitions with data in any variant: no variance to plan from.")
    return ("table", ["metric", "between-rep SD", "df", f"detectable at {n} reps, α",
                      f"at {n} reps, α/{max(fam, 1)}", f"reps for {s['settings']['target_change_pct']:.0f}%, α",
                      f"reps for {s['settings']['target_change_pct']:.0f}%, α/{max(fam, 1)}"], rows)


def _clock_cell(d: dict) -> str:
    b = d.get("clock_bound_ms")
    return "not measured" if b is None else f"±{fmt_value(b)}"


def _clock_blocks(s: dict) -> list[tuple]:
    """The replay clients' clock offsets to their replay servers (summary.json ``clock``)."""
    rows = s.get("clock")
    if not rows:
        return []
    ms = lambda x: DASH if x is None else f"{x * 1e3:.3f}"  # noqa: E731
    return [("h", 3, "Replay clock offsets (client → replay server)"),
            ("p", "Server clock - client clock, from NTP-style exchanges outside Tor before, during "
                  "and after the replay (clock.jsonl); per-cell delays are corrected by it. The bound "
                  "is half the round trip of the best exchanges plus the drift fit's residual: an "
                  "asymmetric path biases the offset by an amount the exchanges cannot see, at most "
                  "that much."),
            ("table", ["variant", "rep", "client", "offset (ms)", "± bound (ms)", "drift (ppm)",
                       "bursts", "exchanges", "lost", "min round trip (ms)"],
             [[r["variant"], str(r["rep"]), r["client"], ms(r.get("offset_s")), ms(r.get("uncertainty_s")),
               DASH if r.get("drift_ppm") is None else f"{r['drift_ppm']:.2f}", str(r.get("bursts")),
               str(r.get("exchanges")), str(r.get("lost")), ms(r.get("min_delay_s"))] for r in rows])]


def _load_blocks(s: dict) -> list[tuple]:
    """Background load per repetition (summary.json ``load``) beside the foreground's numbers."""
    rows = s.get("load")
    if not rows:
        return []
    num = lambda x, f="{:.1f}": DASH if x is None else f.format(x)  # noqa: E731
    return [("h", 2, "Background load (Locust)"),
            ("p", "What the background users carried in each repetition (load.jsonl: the Locust master's "
                  "statistics), beside the foreground clients' measured transfers. Requests/s and MB/s are "
                  "means while users ran; response times are Locust's (from the request's start, including "
                  "the SOCKS connection and the circuit, to its last byte) over every request of the repetition."),
            ("table", ["variant", "rep", "users", "requests", "failures", "requests/s", "MB", "MB/s",
                       "p50 / p90 / p99 (ms)", "foreground transfers", "foreground median TTLB (s)"],
             [[r["variant"], str(r["rep"]), str(r["users"]), str(r["requests"]), str(r["failures"]),
               num(r.get("requests_per_s"), "{:.2f}"), num(r["bytes"] / 1e6), num(
                   None if r.get("bytes_per_s") is None else r["bytes_per_s"] / 1e6, "{:.2f}"),
               " / ".join(num(r.get(k), "{:.0f}") for k in ("p50_ms", "p90_ms", "p99_ms")),
               str(r["foreground_transfers"]), num(r.get("foreground_ttlb_median_s"), "{:.3f}")] for r in rows])]


def _hardware_blocks(s: dict) -> list[tuple]:
    """Client experience and relay throughput by the hardware the relays ran on (summary.json
    ``by_hardware``)."""
    h = s.get("by_hardware")
    if not h:
        return []
    num = lambda x, f="{:.3f}": DASH if x is None else f.format(x)  # noqa: E731
    b = [("h", 2, "By hardware"),
         ("p", "Relays ran on " + "; ".join(
             f"{k}: {', '.join(e['relays'])} (node {', '.join(e['nodes'])})" for k, e in h["hardware"].items())
          + ". Client groups are compared by the hardware their path ran on: " + "; ".join(
             f"{g}: {k}" for g, k in h["client_groups"].items()) + ". Per-repetition medians on the log scale against the arm whose path ran on the fewest "
          "kinds of hardware: a paired test on the blocks where they are intact, else Welch's t (the "
          "last column says which and why); descriptive (not in the Holm family). Emulated hardware runs the arm64 code under qemu-user on another machine: its "
          "timings are the emulator's, not the hardware's.")]
    rows = []
    for c in h["comparisons"]:
        for label, a in c["arms"].items():
            vs = a.get("vs_baseline")
            if vs is None:
                cmp_ = "baseline"
            elif vs.get("status") == "tested" and vs.get("change_pct") is None:
                cmp_ = f"from 0 in the baseline (no % change), p={vs['pvalue']:.3g}"
            elif vs.get("status") == "tested":
                lo, hi = vs["change_ci95"]
                cmp_ = f"{vs['change_pct']:+.1f}% [{lo:+.1f}, {hi:+.1f}], p={vs['pvalue']:.3g}"
                if vs.get("test_reason"):
                    cmp_ += f" ({vs['test_reason']})"
            else:
                cmp_ = vs.get("reason") or vs.get("status")
            rows.append([c["metric"], c["file"], c["variant"], label, ", ".join(a["groups"]), str(a["n"]),
                         num(a["median"]), ", ".join(num(x) for x in a["per_rep_medians"]) or DASH, cmp_])
    if rows:
        b.append(("table", ["metric", "file", "variant", "path's hardware", "client groups", "n", "median (s)",
                            "per-rep medians (s)", "vs baseline"], rows))
    if h["relay_throughput_Bps"]:
        b.append(("table", ["hardware", "median relay throughput (Mbit/s)", "relays"],
                  [[k, num(t["median"] * 8 / 1e6, "{:.2f}"),
                    ", ".join(f"{r} {v * 8 / 1e6:.2f}" for r, v in t["relays"].items())]
                   for k, t in h["relay_throughput_Bps"].items()]))
    return b


def _fault_blocks(s: dict) -> list[tuple]:
    """Each fault's effect (summary.json ``faults``): transfers before / during / after it."""
    rows = s.get("faults")
    if not rows:
        return []
    num = lambda x, f="{:.1f}": DASH if x is None else f.format(x)  # noqa: E731

    def phase(p):
        if p is None:
            return DASH
        causes = ", ".join(f"{c} {n}" for c, n in p["causes"].items())
        return f"{p['ok']} ok / {p['errors']} err" + (f" ({causes})" if causes else "")
    return [("h", 2, "Faults"),
            ("p", "Each fault as applied (faults.jsonl), times in seconds after the workload started. "
                  "Transfers are split by their start: before the fault was applied, during it, after it "
                  "was undone, up to the next fault (warm-up transfers included, cancelled ones not). Recovery: from the undo to "
                  "the last byte of the first successful transfer completing after it. A fault without a "
                  "duration lasts to the end of the workload (no 'after'); a kill is never undone. "
                  "Mechanism: how this backend carried the fault out (a kind means the same on every backend)."),
            ("table", ["variant", "rep", "fault", "mechanism", "applied (s)", "undone (s)", "before", "during",
                       "after", "recovery (s)"],
             [[r["variant"], str(r["rep"]), f"{r['fault']}: {r['what']}", r.get("mechanism") or DASH,
               num(r["apply_s"]),
               num(r["undo_s"]) if r["undo_s"] is not None else ("end" if r["undone_at_end"] else "never"),
               phase(r["before"]), phase(r["during"]), phase(r["after"]), num(r["recover_s"], "{:.2f}")]
              for r in rows])]


def _outcome_blocks(s: dict) -> list[tuple]:
    """Transfers after the warm-up by outcome, per variant and group, and the Kaplan-Meier
    medians of the time metrics that have censored transfers."""
    out = s.get("transfer_outcomes") or {}
    rows = [[v, g, str(c["completed"]), str(c["censored"]), str(c["stalled"]), str(c["failed"])]
            for v, o in out.items() for g, c in o["by_group"].items()]
    if not rows:
        return []
    n_cens = sum(o["censored"] for o in out.values())
    b: list[tuple] = [("h", 3, "Transfer outcomes (after warm-up)"),
                      ("p", f"{n_cens} censored in all: transfers still running when the measurement window "
                            "ended are kept as right-censored times (more than the time observed), not dropped, "
                            "and the time metrics' medians are Kaplan-Meier estimates where any are censored. "
                            "Stalled (the stream stopped moving for the stallout) and failed transfers are "
                            "errors, excluded from the time metrics."),
                      ("table", ["variant", "client group:file", "completed", "censored", "stalled", "failed"], rows)]
    km_rows = []
    for e in s["metrics"].values():
        for v, d in e["variants"].items():
            if d.get("censored"):
                km_rows.append([e["title"], v, str(d["completed"]), str(d["censored"]),
                                fmt_value(d.get("median"), e["unit"]),
                                fmt_value(d["km_median"], e["unit"]) if d.get("km_median") is not None
                                else "not reached", fmt_value(d["km_p90"], e["unit"]) if d.get("km_p90")
                                is not None else "not reached"])
    if km_rows:
        b.append(("p", "Time metrics with censored transfers (repetitions pooled; descriptive): the median of "
                       "the completed transfers alone is biased down, the Kaplan-Meier estimate is not."))
        b.append(("table", ["metric", "variant", "completed", "censored", "median of completed",
                            "Kaplan-Meier median", "Kaplan-Meier p90"], km_rows))
    return b


def _circuit_blocks(s: dict) -> list[tuple]:
    """How completely each repetition's relay-side circuits are known by their client
    (summary repetitions[].circuits; analysis/circuits.py)."""
    reps = [r for r in s["repetitions"] if r.get("circuits")]
    if not reps:
        return []
    cells = reps[0]["circuits"].get("data_cells", 20)
    return [("p", "Circuits known by their client (the client tor's circuit ids chained through the relays' "
                  "CELL_STATS; no volume rule): the workload's circuits found at every relay of their path that "
                  f"records CELL_STATS, and the relay-side circuits that carried data (at least {cells} relay "
                  "cells) but are attributed to no client and to no relay's own circuits."),
            ("table", ["variant", "rep", "workload circuits", "found at every hop", "data-carrying relay circuits",
                       "unattributed", "ambiguous channel ends"],
             [[r["variant"], str(r["rep"]), str(r["circuits"]["workload_circuits"]),
               str(r["circuits"]["workload_complete"]), str(r["circuits"]["data_hops"]),
               str(r["circuits"]["data_hops_unlabelled"]), str(r["circuits"]["ambiguous_channel_ends"])]
              for r in reps])]


def _lead_blocks(s: dict, figures: list[Figure]) -> tuple[list[tuple], Figure | None]:
    """The report's first lines: one sentence with the finding (its interval and p), then the
    figure that shows it (headline.py). Returns the blocks and that figure."""
    ld = headline.lead(s)
    fig = headline.lead_figure(figures, ld.metric)
    return [("p", ld.text)] + ([("fig", fig)] if fig is not None else []), fig


def _headline_blocks(s: dict) -> list[tuple]:
    """The Headline section: the Holm family's verdict, the descriptive changes where nothing
    could be tested, the primary comparison's reading and the design."""
    inf = s["inference"]
    b: list[tuple] = [("h", 2, "Headline")]
    if inf["headline"]:
        b.append(("p", f"Differences that survive Holm's correction over {inf['family_size']} tests "
                       f"(family-wise error rate {inf['alpha']}; repetition = unit of replication):"))
        b.append(("ul", list(inf["headline"])))
    elif inf["tests"] == 0:
        b.append(("p", "No comparison: the run has one variant (`torbed aa` splits one variant's "
                       "repetitions into two arms)."))
    elif inf["family_size"] == 0:
        b.append(("p", f"No inferential comparison: not enough repetitions (at least {inf['min_reps_per_arm']} "
                       f"per variant with data are needed). Differences below are descriptive only."))
        if inf.get("descriptive"):
            b.append(("p", "Descriptive changes (the arms' per-repetition statistic; not tests, no p-value):"))
            b.append(("ul", list(inf["descriptive"])))
    else:
        b.append(("p", f"No difference survives Holm's correction over {inf['family_size']} tests "
                       f"(family-wise error rate {inf['alpha']}). See the power section for what this "
                       f"design could have detected."))
    if inf["family_size"] and inf["not_enough_repetitions"]:
        b.append(("p", f"{inf['not_enough_repetitions']} comparison(s) had not enough repetitions "
                       f"(fewer than {inf['min_reps_per_arm']} per arm with data) and were not tested."))
    if inf.get("primary"):
        pr = inf["primary"]
        b.append(("p", f"Primary comparison: {pr['title']}, {pr['variant']} vs {pr['baseline']}, declared before "
                       f"the run ({pr['declared']}) and read alone at α = {pr['alpha']}; every other comparison is "
                       f"exploratory, under Holm's correction (the primary one stays in that family too)."))
    b += gates_mod.warning_blocks(s)
    seq = s["run"].get("sequential")
    if seq:
        rule = seq.get("rule") or {}
        b.append(("p", f"Sequential design: {seq.get('text') or 'the run did not reach its end'} (pilot "
                       f"{rule.get('pilot')} blocks, at most {rule.get('max_repetitions')}; the stopping rule looks at "
                       f"the interval's width only, so it is an estimation rule: see *Statistical methods*)."))
    return b


def _setup_blocks(s: dict) -> list[tuple]:
    """Run facts, the Kubernetes nodes and hardware, the repetitions and what went missing."""
    b: list[tuple] = [("h", 2, "Run"), _run_table(s)]
    hw = s["run"].get("hardware") or {}
    if hw:
        b.append(("p", "Kubernetes nodes the network ran on (the API server's node status; CPU model as the "
                       "release's pods read it from /proc/cpuinfo):"))
        b.append(("table", ["node", "arch", "CPU model", "CPUs", "memory", "labels", "ran"],
                  [[name, h.get("arch") or DASH, h.get("cpu_model") or DASH, str(h.get("cpus") or DASH),
                    str(h.get("memory") or DASH),
                    ", ".join(f"{k}={v}" for k, v in sorted((h.get("labels") or {}).items())) or DASH,
                    ", ".join(h.get("ran") or []) or DASH] for name, h in sorted(hw.items())]))
    b += _hardware_blocks(s)
    b += [tuple(x) for x in s.get("generated_section") or []]   # summary.json turns tuples into lists
    b.append(("h", 2, "Repetitions"))
    b.append(("table", ["variant", "rep", "status", "transfers", "after warm-up", "error"],
              [[r["variant"], str(r["rep"]), r["status"], str(r["transfers"]), str(r["measured_transfers"]),
                r["error"] or ""] for r in s["repetitions"]]))
    b += _circuit_blocks(s)
    b += _outcome_blocks(s)
    b += gates_mod.section_blocks(s)
    b += _load_blocks(s)
    b += _fault_blocks(s)
    b.append(("h", 2, "Missing or incomplete data"))
    if s["missing"]:
        b.append(("p", "Statistics below use whatever these repetitions recorded; nothing else was imputed."))
        b.append(("ul", list(s["missing"])))
    else:
        b.append(("p", "Nothing is missing: every repetition finished with status ok and wrote all record files."))
    return b


def _comparison_blocks(s: dict) -> list[tuple]:
    """The inferential comparisons, one table per metric family, and the power section."""
    inf = s["inference"]
    b: list[tuple] = [("h", 2, "Comparisons (inferential: repetitions as the unit)")]
    b += gates_mod.warning_blocks(s)
    margin = s["settings"].get("equivalence_margin_pct", 10.0)
    b.append(("p", "One number per repetition (the per-rep statistic), compared across repetitions: "
                   "estimate = geometric mean of the repetitions' values with a t interval; Δ = % change "
                   "vs the baseline with its 95% interval. Test: where repetition k of both arms ran as a "
                   "block (intact blocks), the paired t-test on the per-block log ratios; where a block is "
                   "broken (a repetition missing or failed in one arm), Welch's t-test on log values; the "
                   "'test' column says which and why. Holm p = adjusted over the family of outcome metrics "
                   f"x variants. A difference that is not significant is called equivalent only when the "
                   f"two one-sided tests (TOST) put it within ±{margin:.0f}%, else inconclusive. The last "
                   "two columns plan the next run from this comparison's own spread: the blocks (or "
                   "repetitions per arm, for Welch) a two-sided test at α = 0.05 needs for 80% power "
                   "against the observed change and against the stated minimum effect of ±"
                   f"{s['settings'].get('target_change_pct', 10):.0f}%, and the ± half-width of the 95% "
                   "interval with this run's n. Where no test is possible, Δ is the descriptive change. "
                   "See *Statistical methods*."))
    for metric, title in FAMILIES:
        t = _inference_table(s, metric)
        if t is None:
            continue
        unit = next(e["unit"] for e in s["metrics"].values() if e["metric"] == metric)
        b.append(("h", 3, f"{title} ({_unit_shown(unit)})"))
        b.append(t)
    b.append(("h", 2, "Power"))
    b.append(("p", "From this run's own between-repetition variance of each outcome metric's per-rep "
                   f"statistic: the smallest change a two-sided t-test detects with "
                   f"{s['settings']['power']:.0%} power at this design's repetitions, and the repetitions "
                   f"per variant a {s['settings']['target_change_pct']:.0f}% change needs; α = "
                   f"{s['settings']['alpha']} per test, α/{max(inf['family_size'], 1)} what the most "
                   f"significant test of the Holm family must beat."))
    b.append(_power_table(s))
    return b


def _distribution_blocks(s: dict) -> list[tuple]:
    """Pooled distributions per metric family (descriptive) and the error rates."""
    b: list[tuple] = [("h", 2, "Distributions (descriptive: repetitions pooled)")]
    b.append(("p", "All repetitions' samples pooled. These numbers describe the distributions; the pooled "
                   "KS / Mann-Whitney p-values treat dependent samples as independent and are **not** tests "
                   "of the variants (an A/A run makes them cry wolf): use the comparisons above. "
                   "Δ = % change of the pooled median/mean vs the baseline. Median CI = cluster bootstrap "
                   "over whole repetitions."))
    for metric, title in FAMILIES:
        t = _family_table(s, metric)
        if t is None:
            continue
        unit = next(e["unit"] for e in s["metrics"].values() if e["metric"] == metric)
        b.append(("h", 3, f"{title} ({_unit_shown(unit)})"))
        b.append(t)
        if metric == "cell_delay_ms":
            b += _clock_blocks(s)
    b.append(("h", 3, "Error rate"))
    rows = []
    for v, e in s["errors"].items():
        causes = ", ".join(f"{c}: {n}" for c, n in e["causes"].items()) or "none"
        rate = DASH if e["rate"] is None else f"{100 * e['rate']:.2f}%"
        rows.append([v, str(e["transfers"]), str(e["errors"]), rate, causes])
    b.append(("table", ["variant", "transfers (after warm-up)", "errors", "error rate", "by cause"], rows))
    rows = [[v, g, str(ge["transfers"]), str(ge["errors"]), DASH if ge["rate"] is None else f"{100 * ge['rate']:.2f}%"]
            for v, e in s["errors"].items() for g, ge in e["by_group"].items()]
    if rows:
        b.append(("table", ["variant", "client group:file", "transfers", "errors", "error rate"], rows))
    return b


def _figure_and_method_blocks(s: dict, figures: list[Figure], shown: Figure | None = None) -> list[tuple]:
    """Every figure by section (``shown``, already at the top, by reference), the metric
    definitions and the statistical methods."""
    b: list[tuple] = [("h", 2, "Figures")]
    if not figures:
        b.append(("p", "No figures: no repetition recorded data to plot."))
    section = None
    for f in figures:
        if f.section != section:
            section = f.section
            b.append(("h", 3, section))
        b.append(("p", f"*{f.title}*: at the top of the report.") if f is shown else ("fig", f))
    b.append(("h", 2, "Metric definitions"))
    b.append(("ul", [f"**{k}**: {v}" for k, v in s["definitions"].items()]))
    st = s["settings"]
    b.append(("h", 3, "Statistical methods"))
    b.append(("ul", list(st.get("methods", [])) + [
        f"Quantiles: {st['quantile_method']}.",
        f"Random streams (cluster bootstrap, permutation): numpy PCG64 seeded with the run seed "
        f"({st['bootstrap_seed']}) and the CRC-32 of metric id and variant.",
        f"Tests: {st['tests']}.",
        "% change = 100 (variant - baseline) / baseline, for the median and the mean.",
        "CDF bands: at each cumulative fraction, the range (min to max) of the repetitions' own "
        "quantiles; drawn when at least two repetitions have data.",
    ]))
    return b


def blocks(summary: dict, figures: list[Figure]) -> list[tuple]:
    """The report as a list of blocks (see the module docstring): first the finding in one
    sentence and the figure that shows it, then the headline, the run, the comparisons, the
    distributions, every figure and the methods."""
    s = summary
    b: list[tuple] = [("h", 1, f"torbed report: {s['run']['scenario']}")]
    top, shown = _lead_blocks(s, figures)
    b += top
    b.append(("p", f"Variants compared against the baseline **{s['baseline']}**; "
                   f"{s['run']['repetitions']} repetition(s) per variant. Warm-up transfers are "
                   f"excluded everywhere; see *Metric definitions* at the end for what each number means."))
    return (b + _headline_blocks(s) + _setup_blocks(s) + _comparison_blocks(s) + _distribution_blocks(s)
            + _figure_and_method_blocks(s, figures, shown))


def _md_escape_cell(x: str) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def to_markdown(bl: list[tuple], base_dir: Path) -> str:
    """Markdown text of the blocks; figures are linked relative to ``base_dir``."""
    out = []
    for blk in bl:
        kind = blk[0]
        if kind == "h":
            out.append("#" * blk[1] + " " + blk[2])
        elif kind == "p":
            out.append(blk[1])
        elif kind == "ul":
            out.append("\n".join(f"- {_md_escape_cell(i)}" for i in blk[1]))
        elif kind == "table":
            headers, rows = blk[1], blk[2]
            lines = ["| " + " | ".join(_md_escape_cell(h) for h in headers) + " |",
                     "|" + "|".join("---" for _ in headers) + "|"]
            lines += ["| " + " | ".join(_md_escape_cell(c) for c in r) + " |" for r in rows]
            out.append("\n".join(lines))
        elif kind == "fig":
            f: Figure = blk[1]
            rel = Path(os.path.relpath(f.path, base_dir)).as_posix()
            out.append(f"![{f.title}]({rel})\n\n*{f.title}.* {f.caption}")
    return "\n\n".join(out) + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{border-bottom:2px solid #ddd;padding-bottom:.3em}h2{border-bottom:1px solid #eee;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
figure{margin:1.2em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.9em;color:#444}
"""


def _inline(text: str) -> str:
    """HTML of a text with **bold** and *italic* markers (everything else escaped)."""
    t = html.escape(str(text))
    t = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", t)
    return re.sub(r"\*(.+?)\*", r"<em>\1</em>", t)


def to_html(bl: list[tuple], title: str) -> str:
    """Self-contained HTML of the blocks: figures are read and embedded as base64 PNG."""
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"]
    for blk in bl:
        kind = blk[0]
        if kind == "h":
            out.append(f"<h{blk[1]}>{html.escape(blk[2])}</h{blk[1]}>")
        elif kind == "p":
            out.append(f"<p>{_inline(blk[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in blk[1]) + "</ul>")
        elif kind == "table":
            headers, rows = blk[1], blk[2]
            head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif kind == "fig":
            f: Figure = blk[1]
            data = base64.b64encode(Path(f.path).read_bytes()).decode("ascii")
            out.append(f"<figure><img alt=\"{html.escape(f.title)}\" src=\"data:image/png;base64,{data}\">"
                       f"<figcaption><strong>{html.escape(f.title)}.</strong> {html.escape(f.caption)}"
                       f"</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
