"""The sequential stopping rule of a scenario's ``design`` (issue 36 item 6).

After each complete block (repetition k of every variant) from the pilot on, the engine
asks ``should_stop``: the primary comparison (``design.stop_when.metric``, the variant
against the baseline) is analysed exactly as ``torbed report`` does (analysis/inference.py:
paired on intact blocks, else Welch) over the blocks run so far; when its 95% interval of the
% change is narrower than ``ci_width_pct`` (upper - lower, percentage points) the run stops.
Every check is recorded in run.json ``sequential.checks``; ``sequential.outcome`` says which
ended the run ("interval" or "maximum"), and ``repetitions`` becomes the blocks run.

docs/statistics.md "Sequential designs" says what this rule means for the test.

Public API: ``block_complete(run_dir, info, k)``, ``should_stop(run_dir, info, scenario, k,
console) -> bool``, ``evaluate(run_dir, n_blocks, metric, baseline, variant) -> dict``
"""

from __future__ import annotations

import json
from pathlib import Path

from .resume import FINISHED


def block_complete(run_dir: Path, info: dict, k: int) -> bool:
    """Whether repetition ``k`` of every variant has finished (ok or failed)."""
    for v in info["variants"]:
        try:
            st = json.loads((run_dir / v / f"rep-{k}" / "meta.json").read_text()).get("status")
        except (OSError, ValueError):
            return False
        if st not in FINISHED:
            return False
    return True


def evaluate(run_dir: Path, n_blocks: int, metric: str, baseline: str, variant: str) -> dict:
    """The report's inference of ``metric`` (variant vs baseline) over blocks 0..n_blocks-1."""
    from .analysis import gates, inference, metrics, stats
    from .analysis.load import Run, load_run
    from .analysis.summary import invalid_reps
    full = load_run(run_dir)
    gates.exclude_invalid(full)     # as the report: a repetition a mechanism gate rejected does not count
    run = Run(path=full.path, info={**full.info, "repetitions": n_blocks},
              reps=[r for r in full.reps if r.index < n_blocks])
    m = metrics.extract(run).metrics.get(metric)
    if m is None:
        return {"blocks": n_blocks, "status": "no data", "width_pct": None}
    res = inference.compare_arms(m, baseline, m, variant, same_run=True,
                                 rng=stats.rng_for(run.seed, "sequential", metric, variant),
                                 invalid=invalid_reps(run, (baseline, variant)))
    ci = res.get("change_ci95")
    width = (ci[1] - ci[0]) if res.get("status") == "tested" and ci and None not in ci else None
    return {"blocks": n_blocks, "status": res.get("status"), "test": res.get("test"),
            "change_pct": res.get("change_pct"), "ci95": ci, "width_pct": width}


def should_stop(run_dir: Path, info: dict, scenario, k: int, console=None) -> bool:
    """Called after block ``k`` completed; records the check in ``info`` (run.json) and
    returns True when the interval is narrow enough (``info['repetitions']`` is then set to
    the blocks run)."""
    d = getattr(scenario, "design", None)
    if d is None:
        return False
    n = k + 1
    baseline = info["baseline"]
    variant = d.stop_when.variant or next(v for v in info["variants"] if v != baseline)
    seq = info.setdefault("sequential", {
        "rule": {"pilot": d.pilot, "max_repetitions": d.max_repetitions, "metric": d.stop_when.metric,
                 "variant": variant, "baseline": baseline, "ci_width_pct": d.stop_when.ci_width_pct},
        "checks": [], "outcome": None})
    if n < d.pilot:
        return False
    check = evaluate(run_dir, n, d.stop_when.metric, baseline, variant)
    seq["checks"].append(check)
    narrow = check["width_pct"] is not None and check["width_pct"] < d.stop_when.ci_width_pct
    if narrow:
        seq["outcome"] = "interval"
        seq["text"] = (f"stopped after {n} blocks: the 95% interval of {d.stop_when.metric} ({variant} vs "
                       f"{baseline}) was {check['width_pct']:.1f} points wide, narrower than "
                       f"{d.stop_when.ci_width_pct:g}")
        info["repetitions"] = n
    elif n >= d.max_repetitions:
        w = "no interval" if check["width_pct"] is None else f"{check['width_pct']:.1f} points wide"
        seq["outcome"] = "maximum"
        seq["text"] = (f"the maximum of {d.max_repetitions} blocks was reached before the 95% interval of "
                       f"{d.stop_when.metric} was narrower than {d.stop_when.ci_width_pct:g} points ({w})")
    if console is not None:
        w = "none" if check["width_pct"] is None else f"{check['width_pct']:.1f}"
        console.print(f"sequential design: after {n} blocks the 95% interval is {w} points wide "
                      f"(stop below {d.stop_when.ci_width_pct:g})", highlight=False)
    return narrow
