"""``make reproduce``: the seed papers' pre-registered comparisons (analysis/preregistration.yaml,
checked by analysis/prereg.py), run as a campaign that ends across sessions and machines
(analysis/campaign.py), and docs/reproduction.md rendered from its committed records.

    python -m torbed.analysis.reproduce [--estimate | --render-only | --smoke]
                                        [--only EXP] [--records DIR] [--runs DIR] [--doc FILE]

- default: the campaign. For each experiment of the pre-registration (the primaries' first):
  skip it when its records say it has concluded; else resume its last run directory (`torbed
  run --resume`) when that is on this machine and unfinished, or start a new one; write a
  record per finished repetition (docs/reproduction/records/<experiment>/<variant>-rep-N.json);
  stop when the blocks planned from the pilot are recorded or the maximum is reached. Then
  the document is rendered. Interrupt at any time: the next session continues.
- ``--estimate``: print the machine time the campaign still needs (the code's own estimate,
  the one the document quotes) and exit.
- ``--render-only`` (``make reproduce RENDER_ONLY=1``): re-render the document from the
  records; runs nothing.
- ``--smoke``: a pipeline check, not a result: one experiment (``--only``, default
  tang-goldberg-2010-exp1), one block of ``--duration`` (default 45s: 30 s warm-up + 15 s),
  records and document in a temporary directory (printed), never the committed ones.

Public API: ``main(argv)``, ``render(prereg, records, ...) -> str``.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import resources
from . import campaign, prereg as prereg_mod

REPO = resources.ROOT
# Metrics a censored transfer bears on (its time is a lower bound; a cut replay flow's
# undelivered cells have no delay): the gates column prints each arm's censored share for them.
CENSORED_METRICS = ("ttlb_s", "ttfb_s", "cell_delay_ms")
OUT_ROOT = resources.CHECKOUT or Path(".")
RECORDS = OUT_ROOT / "docs" / "reproduction" / "records"
SMOKE_EXPERIMENT = "tang-goldberg-2010-exp1"


METHOD = [
    "Each paper has one **pre-registered primary comparison** (analysis/preregistration.yaml: metric, arms, "
    "sign, the paper's number and the line of the paper it comes from), committed before the campaign runs. "
    "Secondary comparisons follow the same rules outside the primaries' Holm family.",
    "",
    "## Verdict rules",
    "",
    "- **Unit and test**: a block is repetition k of every arm of an experiment, run together (one seed, "
    "paths and schedule; run.json `order`). The test is the paired t-test on the per-block log ratios "
    "(variant / baseline) of the repetition's statistic (median for times, wait per cell for queue wait, "
    "mean delay per cell for replays, maximum 30 s moving average for throughput); only complete blocks "
    "count, and a repetition that failed or that a mechanism gate rejected drops its pairs.",
    "- **Direction**: \"agrees\" needs the paper's sign with p < 0.05, for a primary Holm-adjusted over all "
    "five primaries (one not yet testable counts as p = 1, so an interim page never adjusts over fewer); "
    "a significant change of the other sign disagrees.",
    "- **Rough size**: agrees when the 90% interval of log(ours / paper's) lies within ±log 2 (two one-sided "
    "tests at 5%), ours and the paper's being the effects as log ratios, so ours is between half and twice "
    "the paper's (for -32.7%: -18% to -55%; for 3.1x: 1.8x to 9.6x; never no change at all, which as a "
    "ratio of ratios would lie within a factor 2 of any change from -50% to +100%); it differs when the "
    "interval lies wholly outside, and is inconclusive otherwise. Not Holm-adjusted (it is a statement "
    "about size, read beside the direction).",
    "- **No change** is claimed only by the equivalence test (TOST at 5%, margin ±10%: the ratio within a "
    "factor 1.1), never from a wide interval; for a paper claiming a change, a change shown to be within "
    "the margin disagrees.",
    "- Anything else is **inconclusive**: a verdict that low power could have won is not given. The overall "
    "verdict agrees only when direction and size (where the paper gives a number) both agree.",
    "",
    "## How the campaign runs",
    "",
    "`make reproduce` runs one campaign session (`python -m torbed.analysis.reproduce`). Per experiment, "
    "primaries' first: a pilot of 3 blocks, then blocks until the 90% interval of its driving comparisons' "
    "log ratio is at most ±0.35 (log 2 / 2) and the paper's change has 80% power at alpha / 5, or the "
    "stated maximum. The rule reads the blocks' spread only, never the estimate, so stopping does not "
    "inflate the false-positive rate. An experiment *halts* when its last 3 complete blocks gave its driving "
    "comparisons not one valid pair (every repetition failed or was rejected by a mechanism gate): the setup "
    "does not give the mechanism its conditions on this machine, and more blocks would only repeat that; "
    "the status table says why, and `--retry EXP` runs another pilot's worth on another machine (a changed "
    "scenario is a new pre-registered experiment). Every finished repetition is committed as a small record (written "
    "when its block completes, by a child process at the lowest priority, as the next block measures) "
    "(`docs/reproduction/records/<experiment>/<variant>-rep-N.json`: per-repetition values, gate results, "
    "provenance: scenario hash, tor build and version, torbed version and commit, host; its time); the next "
    "session, on this machine or another, continues from the records (an unfinished run directory on the "
    "same machine with `torbed run --resume`; a missing one never blocks). "
    "`make reproduce RENDER_ONLY=1` re-renders this page from the records without running anything.",
    "",
    "Known limit: a run directory's repetition k uses the workload seed `seed + k`, so a run started "
    "afresh (another machine, the raw directory gone) repeats the workload schedules of the first run's "
    "blocks; tor's own randomness (keys, circuit timing) still differs. The records say which run and "
    "repetition each block came from (`run`).",
    "",
    "Run it on a quiet machine (`torbed run` warns when the machine is busy and records the load): "
    "`make reproduce`, as often as needed until the status table says every experiment has concluded; "
    "Ctrl-C at any time. `python -m torbed.analysis.reproduce --smoke` checks the pipeline in a few "
    "minutes (one 45 s block of one experiment, written to a temporary directory, not a result).",
]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="reproduce", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--estimate", action="store_true", help="print the machine time still needed; run nothing")
    mode.add_argument("--render-only", action="store_true", help="re-render the document from the records")
    mode.add_argument("--smoke", action="store_true",
                      help="pipeline check (not a result): 1 block, records and document in a temporary directory")
    ap.add_argument("--only", action="append", default=None, metavar="EXP", help="this experiment only (repeatable)")
    ap.add_argument("--retry", action="append", default=[], metavar="EXP",
                    help="a halted experiment (its last pilot's worth of blocks had no valid pair) runs another "
                         "pilot's worth of blocks, e.g. on a larger machine; a changed scenario is a new "
                         "pre-registered experiment instead (repeatable)")
    ap.add_argument("--duration", default=None, help="--smoke only: measured duration per repetition (default 45s)")
    ap.add_argument("--prereg", default=str(prereg_mod.PATH), help="the pre-registration file")
    ap.add_argument("--records", default=str(RECORDS), help="where the committed records live")
    ap.add_argument("--runs", default=str(OUT_ROOT / "runs" / "reproduce"), help="where raw run directories go")
    ap.add_argument("--doc", default=str(OUT_ROOT / "docs" / "reproduction.md"), help="the document written")
    args = ap.parse_args(argv)
    if args.duration and not args.smoke:
        ap.error("--duration: only with --smoke (the campaign uses each scenario's own duration)")
    return args


def smoke_setup(prereg, args) -> tuple[prereg_mod.Prereg, list[str]]:
    """The pre-registration cut to one block of one experiment, and records, runs and the
    document moved to a temporary directory."""
    only = args.only or [SMOKE_EXPERIMENT]
    tmp = Path(tempfile.mkdtemp(prefix="reproduce-smoke-"))
    args.records, args.runs, args.doc = str(tmp / "records"), str(tmp / "runs"), str(tmp / "reproduction.md")
    args.duration = args.duration or "45s"
    exps = {n: dataclasses.replace(e, pilot_blocks=1, max_blocks=1, precheck=None) for n, e in prereg.experiments.items()}
    print(f"reproduce: SMOKE TEST (not a result): {', '.join(only)}, 1 block of {args.duration}, in {tmp}",
          flush=True)
    return dataclasses.replace(prereg, experiments=exps), only


def print_estimate(prereg, records, only=None, duration: str | None = None) -> dict:
    from ..units import parse_duration
    est = campaign.estimate(prereg, records, REPO, only, parse_duration(duration) if duration else None)
    for name, r in est["experiments"].items():
        print(f"  {name}: {r['done']} block(s) recorded; block {r['block_s'] / 60:.1f} min ({r['basis']}); "
              f"pilot {r['pilot_s'] / 3600:.2f} h, planned {r['planned_s'] / 3600:.2f} h, "
              f"maximum {r['max_s'] / 3600:.2f} h")
    t = est["total"]
    print(f"reproduce: machine time still needed: pilots {t['pilot_s'] / 3600:.1f} h; planned "
          f"{t['planned_s'] / 3600:.1f} h (the maximum where no pilot has run); at most {t['max_s'] / 3600:.1f} h",
          flush=True)
    return est


def order(prereg, only=None) -> list[str]:
    """Experiments in campaign order: the primaries' first, then the rest as listed."""
    first = list(dict.fromkeys(c.experiment for c in prereg.primaries))
    names = first + [n for n in prereg.experiments if n not in first]
    return [n for n in names if not only or n in only]


def run_campaign(prereg, records, args, only) -> None:
    """One campaign session; logged in records/sessions.jsonl with the estimate made at its
    start and the blocks it added, so the estimate can be checked against the time taken."""
    est = print_estimate(prereg, records, only, args.duration if args.smoke else None)
    before = {n: p["done"] for n, p in campaign.plan(prereg, records).items()}
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.monotonic()
    status = "interrupted"
    try:
        for name in order(prereg, only):
            res = campaign.run_experiment(prereg, name, records, Path(args.runs), REPO,
                                          duration=args.duration if args.smoke else None, smoke=args.smoke,
                                          retry=name in args.retry)
            print(f"reproduce: {name}: {res['done']} complete block(s); "
                  f"{'concluded' if res['concluded'] else 'not concluded'} ({res['reason']})", flush=True)
        status = "finished"
    finally:
        after = {n: p["done"] for n, p in campaign.plan(prereg, records).items()}
        records.log_session({"started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "status": status, "host": socket.gethostname(), "smoke": args.smoke,
                             "elapsed_s": round(time.monotonic() - t0, 1),
                             "estimate_planned_s": round(est["total"]["planned_s"], 1),
                             "blocks_added": {n: after[n] - before[n] for n in after if after[n] != before[n]}})



def _cell(x) -> str:
    return str(x).replace("|", "\\|")


def _ours(v: dict) -> str:
    t = v["test"]
    if t.get("status") != "tested":
        return f"{t.get('reason') or t.get('status')} ({v['n']} block(s))"
    lo, hi = t["change_ci95"]
    p = "" if v["p"] is None else f", p = {v['p']:.2g}" + (" (Holm)" if v["primary"] else "")
    return f"{t['change_pct']:+.1f}% [{lo:+.1f}%, {hi:+.1f}%]{p}, {t['n']} blocks"


def _gates_text(records, exp: str, variants, metrics=()) -> str:
    recs = [r for r in records.all(exp) if r["block"] in set(records.complete_blocks(exp, variants))]
    if not recs:
        return "–"
    failed = sum(r["status"] != "ok" for r in recs)
    invalid = sum(r["status"] == "ok" and not r["gates"].get("valid", True) for r in recs)
    flagged = sum(bool(r["gates"].get("flags")) for r in recs)
    unrec = sum(not r["gates"].get("recorded") for r in recs)
    parts = [f"{len(recs) - failed - invalid}/{len(recs)} repetitions valid"]
    parts += [f"{n} {w}" for n, w in ((failed, "failed"), (invalid, "gate-invalid"), (flagged, "flagged"),
                                       (unrec, "without gates")) if n]
    # Censoring bears on times and delays (cut-off transfers, undelivered cells), not on a relay's throughput.
    timed = any(m.split("/")[0] in CENSORED_METRICS for m in metrics)
    return "; ".join(parts + (_censored_text(recs, variants) if timed else []))


def _censored_text(recs: list[dict], variants) -> list[str]:
    """The median share of censored transfers per arm (cut off while still moving: their
    times enter as lower bounds, their undelivered cells not at all), when any arm has 1% or more."""
    share = {v: [c for r in recs if r["variant"] == v and r["status"] == "ok"
                 and isinstance(c := r["gates"].get("censored_fraction"), (int, float))] for v in variants}
    med = {v: float(np.median(xs)) for v, xs in share.items() if xs}
    if not med or max(med.values()) < 0.01:
        return []
    return ["censored transfers (median per repetition): " + ", ".join(f"{v} {100 * x:.0f}%" for v, x in med.items())]


def _rows(prereg, records, comps, verdicts) -> list[str]:
    lines = ["| id | paper | result | paper's number (source) | ours: Δ [95% CI] | gates | direction | rough size "
             "| verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for c in comps:
        e = prereg.experiments[c.experiment]
        v = verdicts[c.id]
        ran = len(records.complete_blocks(c.experiment, e.variants))
        if v["n"] == 0 and not ran:
            ours, d, s, verdict = "not yet run", "–", "–", "–"
        elif v["n"] == 0:
            recs = records.all(c.experiment)
            valid = any(r.get("status") == "ok" and (r.get("gates") or {}).get("valid", True) for r in recs)
            why = "metric not measured" if valid or not recs else "no repetition passed the gates"
            ours, d, s, verdict = f"no values in {ran} block(s) ({why})", "–", "–", "inconclusive"
        else:
            ours, d, s, verdict = _ours(v), f"{v['direction']}: {v['direction_text']}", \
                f"{v['size']}: {v['size_text']}", v["verdict"]
        cells = [c.id, c.paper, c.result, f"{c.paper_value} ({c.source})", ours,
                 _gates_text(records, c.experiment, e.variants, c.metrics), d, s, verdict]
        lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return lines


def _block_text(t: dict) -> str:
    """Model vs measured time of one block: the check of issue 37 item 5 (within 20%)."""
    model = f"model {t['model_block_s'] / 60:.1f} min"
    if t["basis"] == "model":
        return model
    return f"{model}; {t['basis']}: {t['block_s'] / 60:.1f} min ({100 * (t['block_s'] / t['model_block_s'] - 1):+.0f}%)"


def _status_lines(prereg, records) -> list[str]:
    plan = campaign.plan(prereg, records)
    est = campaign.estimate(prereg, records, REPO)
    lines = ["| experiment | scenario | arms | blocks recorded | planned (basis) | maximum | one block | "
             "time still needed (planned) |", "|---|---|---|---|---|---|---|---|"]
    for name, e in prereg.experiments.items():
        p, t = plan[name], est["experiments"][name]
        planned = (f"pilot of {p['pilot']}, then sized from it" if p["reason"] == "pilot"
                   else f"{p['planned']} ({p['reason']})")
        lines.append(f"| {name} | {e.scenario} | {', '.join(e.variants)} | {p['done']} | {planned} | {p['max']} | "
                     f"{_block_text(t)} | {t['planned_s'] / 3600:.2f} h |")
    tot = est["total"]
    lines += ["", f"Machine time still needed (`python -m torbed.analysis.reproduce --estimate`, the code's own "
              f"estimate): **{tot['planned_s'] / 3600:.1f} h** to the planned blocks (the maximum where no pilot "
              f"has run yet); {tot['pilot_s'] / 3600:.1f} h for the pilots alone; at most "
              f"{tot['max_s'] / 3600:.1f} h."]
    return lines + _precheck_lines(prereg, records)


def _precheck_lines(prereg, records) -> list[str]:
    """The setup checks some experiments pass before their first block (analysis/precheck.py)."""
    from . import precheck
    exps = [(n, e) for n, e in prereg.experiments.items() if e.precheck]
    if not exps:
        return []
    lines = ["", "### Prechecks", "", "Checks a setup passes before its first block (analysis/precheck.py); a failed "
             "one halts the experiment.", "", "| experiment | check | result | when, where |", "|---|---|---|---|"]
    for name, e in exps:
        st = precheck.status(records.root, name, e.precheck, REPO / e.scenario)
        result = ("not run yet (or not on this version of the scenario)" if st is None
                  else ("passed: " if st["ok"] else "failed: ") + st["why"])
        when = "–" if st is None else f"{st['finished']}, {st['host']}"
        lines.append(f"| {name} | {e.precheck} | {_cell(result)} | {when} |")
    return lines


def _sessions_lines(records) -> list[str]:
    sess = [s for s in records.sessions() if not s.get("smoke")]
    if not sess:
        return ["No campaign session has run yet."]
    lines = ["| started | host | status | blocks added | machine time | estimate still needed at its start |",
             "|---|---|---|---|---|---|"]
    for s in sess:
        added = ", ".join(f"{k} +{n}" for k, n in s["blocks_added"].items()) or "none"
        lines.append(f"| {s['started']} | {s['host']} | {s['status']} | {added} | {s['elapsed_s'] / 3600:.2f} h | "
                     f"{s['estimate_planned_s'] / 3600:.2f} h |")
    lines += ["", "A session that ran every experiment to its conclusion took the time its start estimated "
              "(issue 37 item 5: within 20%); per experiment the status table compares the model's block time "
              "with the records' own."]
    return lines


def render(prereg, records, smoke: bool = False) -> str:
    """docs/reproduction.md from the pre-registration and the records (nothing is run)."""
    verdicts = prereg_mod.judge_all(prereg, lambda exp: records.blocks(exp, prereg.experiments[exp].variants))
    ran = any(v["n"] for v in verdicts.values())
    smoke = smoke or any(r.get("smoke") for e in prereg.experiments for r in records.all(e))
    head = ["# Reproduction of the seed papers' results", ""]
    if smoke:
        head += ["**SMOKE TEST: a pipeline check with one short block, not a result.**", ""]
    elif not ran:
        head += ["**The campaign has not run yet.** Every comparison below is pre-registered (its metric, arms, "
                 "sign and the paper's number were committed before any block ran) and says \"not yet run\". "
                 "The numbers of an earlier shortened pipeline check (3 x 90 s per arm on a loaded machine) "
                 "are withdrawn: they answered no pre-registered question.", ""]
    return "\n".join(head + METHOD + ["", "## Primary comparisons", "",
                                       f"One per paper ({len(prereg.primaries)} tests); Holm over these only.", ""]
                     + _rows(prereg, records, prereg.primaries, verdicts)
                     + ["", "## Secondary comparisons", "", "Same rules; not in the Holm family (each at its own "
                        "alpha = 0.05, so read them as a set with that in mind).", ""]
                     + _rows(prereg, records, prereg.secondaries, verdicts)
                     + ["", "## Campaign status", ""] + _status_lines(prereg, records)
                     + ["", "### Sessions", ""] + _sessions_lines(records) + [""])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        prereg = prereg_mod.load(args.prereg)
    except prereg_mod.PreregError as e:
        print(f"reproduce: {e}", file=sys.stderr)
        return 2
    bad = [o for o in (args.only or []) + args.retry if o not in prereg.experiments]
    if bad:
        print(f"reproduce: --only/--retry {', '.join(bad)}: no such experiment in {args.prereg} "
              f"({', '.join(prereg.experiments)})", file=sys.stderr)
        return 2
    only = args.only
    if args.smoke:
        prereg, only = smoke_setup(prereg, args)
    records = campaign.Records(args.records)
    if args.estimate:
        print_estimate(prereg, records, only, args.duration if args.smoke else None)
        return 0
    if not args.render_only:
        run_campaign(prereg, records, args, only)
    doc = Path(args.doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(render(prereg, records, smoke=args.smoke))
    print(f"reproduce: wrote {doc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
