"""summary.json: the machine-readable result of ``torbed report`` (stable for golden tests).

Keys are sorted and floats rounded to ``SIGNIFICANT_DIGITS`` significant digits when
written, so the file is byte-identical for the same run directory and library versions.

Layout (every metric id maps to one entry; ``variants`` has every variant of the run):

    {"schema": 3, "run": {...run.json facts, ["host_load"]...}, "baseline": "<variant>",
     "settings": {...statistical settings...}, "definitions": {"<metric>": "<text>"},
     "repetitions": [{"variant", "rep", "status", "error", "transfers", "measured_transfers",
                      "files", "notes", ["circuits": analysis.circuits.coverage: workload circuits
                      found at every hop, data-carrying relay-side hops left unlabelled]}],
     "missing": ["variant X rep 1: failed (...); 6 transfers (4 after warm-up); ..."],
     "metrics": {"<id>": {"metric", "title", "label", "unit", <params>, "variants": {
         "<variant>": {"n", "mean", "median", "min", "max", "p25", "p75", "p90", "p99",
                       "median_ci95": [lo, hi] | null (cluster bootstrap), "median_ci_method",
                       "per_rep": {"<k>": {"n", "median", "p90", "mean", ["wait_per_cell"]}},
                       "rep_summary": {"statistic", "n", "estimate", "ci95", "scale"},
                       ["wait_per_cell_ms"], ["clock_bound_ms"] (per-cell delays),
                       "vs_baseline": {"baseline", "median_change_pct", "mean_change_pct",
                                       "ks_statistic", "ks_pvalue", "mwu_statistic",
                                       "mwu_pvalue", "pooled_tests": "descriptive",
                                       "inference": {stats.compare_paired or compare_reps
                                                     keys ("test": "paired" | "welch",
                                                     "equivalence": TOST), "test_reason",
                                                     "statistic", "in_family", "pvalue_holm",
                                                     "significant", "change_pct_descriptive",
                                                     "plan": stats.plan, "secondary"},
                                       ["mean_diff_ms", "mean_diff_clock_bound_ms",
                                        "mean_diff_within_clock"] (per-cell delays)}
                                       (not for the baseline itself)},
         "power": {stats.power_analysis keys}}},
     "inference": {"alpha", "correction", "family_size", "tests", "not_enough_repetitions",
                   "min_reps_per_arm", "headline": [text], "significant": [{"metric", "variant"}],
                   "paired_tests", "welch_tests", "equivalence_margin_pct",
                   "descriptive": [text: untested outcome comparisons' descriptive change],
                   ["primary": add_primary: the one comparison declared before the run, tested
                               alone at alpha: {"metric", "variant", "baseline", "title", "alpha",
                               "declared", "status", "test", "n", "change_pct", "change_ci95",
                               "pvalue", "significant", "change_pct_descriptive"}]},
     "errors": {"<variant>": {"transfers", "errors", "rate", "causes", "by_group", "per_rep"}},
     "transfer_outcomes": {"<variant>": {"completed", "censored", "stalled", "failed",
                                         "by_group": {"group:file": {...}}, "per_rep": {...}}},
     (censorable time metrics: per variant also "completed", "censored", ["km_median", "km_p90"],
      per_rep "censored", ["method": "kaplan-meier", "median_not_reached"]; inference "censoring")
     ["clock": [{"variant", "rep", "client", "offset_s", "drift_ppm", "uncertainty_s", ...}]],
     ["by_hardware": {"hardware", "client_groups", "comparisons", "relay_throughput_Bps", "note"}]}
                  (replay runs with clock.jsonl: analysis/clock.py; relays on several kinds of
                  hardware: analysis/hardware.py)
     ["gates": {"thresholds", "mechanism", "rows": [one per judged repetition], "excluded",
                "unjudged", "warnings"}] (runs whose meta.json recorded the mechanism gates:
                analysis/gates.py; added by report.analyse, which excludes the invalid ones first)

Public API:

- ``summarize(run, extracted, errors, baseline, resamples=2000) -> dict``  (unrounded)
- ``add_primary(summary, metric, variant=None, declared=...)``  the declared primary comparison
- ``round_floats(obj, digits=SIGNIFICANT_DIGITS) -> obj``
- ``dumps(summary) -> str``   rounded, sorted, indented JSON with a final newline
- ``missing_lines(run, extracted) -> list[str]``
"""

from __future__ import annotations

import json
import math

import numpy as np

from . import background, inference, stats, survival
from . import clock as clock_mod
from . import faults as faults_mod
from . import generated as generated_mod
from . import hardware as hardware_mod
from . import metrics as metrics_mod
from .load import Run
from .metrics import Extracted

SCHEMA = 3     # 2: per-repetition inference, Holm, power; pooled tests descriptive
               # 3: paired test on intact blocks, TOST equivalence, per-comparison plan
SIGNIFICANT_DIGITS = 6


def round_floats(obj, digits: int = SIGNIFICANT_DIGITS):
    """A copy of ``obj`` (dicts, lists, tuples, numbers) with every float rounded to
    ``digits`` significant digits; NaN and infinities become None, -0.0 becomes 0.0."""
    if isinstance(obj, dict):
        return {str(k): round_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [round_floats(v, digits) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if not math.isfinite(x):
            return None
        r = float(f"{x:.{digits}g}")
        return 0.0 if r == 0 else r
    return obj


def dumps(summary: dict) -> str:
    """summary.json text: rounded floats, sorted keys, 2-space indent, trailing newline."""
    return json.dumps(round_floats(summary), sort_keys=True, indent=2) + "\n"


def missing_lines(run: Run, extracted: Extracted) -> list[str]:
    """Plain sentences for everything missing or incomplete in the run, one per line."""
    lines = []
    for r in run.reps:
        if r.status == "ok" and not r.notes:
            continue
        line = r.describe()
        if r.notes:
            line += "; " + "; ".join(r.notes)
        lines.append(line)
    return lines + list(extracted.notes)


def _run_facts(run: Run) -> dict:
    i = run.info
    host = i.get("host") if isinstance(i.get("host"), dict) else {}
    return {"name": i.get("name"), "directory": run.name, "scenario": run.scenario_name,
            "seed": i.get("seed"), "variants": run.variants, "baseline": run.baseline,
            "repetitions": run.repetitions, "backend": i.get("backend"), "shaper": i.get("shaper"),
            "torbed_version": i.get("torbed_version"), "tor_version": i.get("tor_version"),
            "host": host, "started": i.get("started"), "finished": i.get("finished"),
            "status": i.get("status"), "hardware": _hardware(run),
            # torbed run's reading of the machine's load before it started (torbed/hostload.py).
            **({"host_load": i["host_load"]} if isinstance(i.get("host_load"), dict) else {}),
            # torbed run --resume: one entry per session (torbed/resume.py); a sequential
            # design's checks and outcome (torbed/sequential.py). Only when present.
            **({"sessions": [{k: x.get(k) for k in ("started", "finished", "status", "resumed", "discarded",
                                                    "torbed_commit")} for x in i["sessions"] if isinstance(x, dict)]}
               if isinstance(i.get("sessions"), list) and len(i["sessions"]) > 1 else {}),
            **({"sequential": i["sequential"]} if isinstance(i.get("sequential"), dict) else {}),
            # A within-run crossover (torbed/crossover.py): how the arms shared each network.
            **({"crossover": i["crossover"]} if isinstance(i.get("crossover"), dict) else {})}


def _hardware(run: Run) -> dict:
    """The Kubernetes nodes the run's repetitions ran on (meta.json ``hardware``), each with
    the torbed nodes placed there in any repetition; {} for a run on one host (run.json's
    ``host`` says which)."""
    out: dict = {}
    for r in run.reps:
        hw = (r.meta or {}).get("hardware")
        if not isinstance(hw, dict):
            continue
        for name, h in hw.items():
            if not isinstance(h, dict):
                continue
            entry = out.setdefault(name, {**h, "ran": []})
            entry["ran"] = sorted(set(entry["ran"]) | set(h.get("ran") or []))
    return out


def invalid_reps(run: Run, variants) -> dict[int, str]:
    """{rep: why} for the repetitions whose status is not ok in any of ``variants``: such a
    block is not paired (what it recorded still counts in the unpaired test)."""
    out: dict[int, str] = {}
    for r in run.reps:
        if r.variant in variants and r.status != "ok":
            out.setdefault(r.index, f"{r.status} in {r.variant}")
    return out


def _metric_entry(run: Run, m, baseline: str, resamples: int) -> dict:
    entry = {"metric": m.metric, "title": m.title, "label": m.label, "unit": m.unit, **m.params,
             "variants": {}}
    base = m.pooled(baseline)
    base_desc = stats.describe(base)
    scale = inference.metric_scale(m, run.variants)
    for v in run.variants:
        pooled = m.pooled(v)
        d = stats.describe(pooled)
        if d["n"]:
            ci = stats.cluster_bootstrap_median_ci([m.values[v][k] for k in sorted(m.values.get(v, {}))],
                                                   stats.rng_for(run.seed, m.id, v), min(resamples, 500))
            d["median_ci95"] = list(ci) if ci else None
            d["median_ci_method"] = ("cluster bootstrap over repetitions" if ci else
                                     "none: fewer than 2 repetitions with data")
        d["per_rep"] = {str(k): rs for k, rs in inference.rep_summaries(m, v).items()}
        if m.censored is not None:
            d.update(_km_pooled(m, v))
        prim = inference.primary_stat(m.metric)
        d["rep_summary"] = {"statistic": prim, **stats.arm_estimate(inference.rep_values(m, v, prim), scale),
                            "scale": scale}
        if m.totals is not None:
            tot = m.totals.get(v, {})
            t_sum = sum(t for t, _ in tot.values())
            n_sum = sum(n for _, n in tot.values())
            d["wait_per_cell_ms"] = t_sum / n_sum if n_sum else None
            for k, (t, n) in tot.items():
                d["per_rep"].setdefault(str(k), {})["wait_per_cell_ms"] = t / n if n else None
        if m.clock_bounds is not None:
            d["clock_bound_ms"] = m.clock_bound(v)
        if v != baseline:
            tests = stats.two_sample_tests(pooled, base) or {
                "ks_statistic": None, "ks_pvalue": None, "mwu_statistic": None, "mwu_pvalue": None}
            d["vs_baseline"] = {
                "baseline": baseline,
                "median_change_pct": stats.pct_change(d.get("median"), base_desc.get("median")),
                "mean_change_pct": stats.pct_change(d.get("mean"), base_desc.get("mean")),
                # Pooled per-sample tests: descriptive only (samples within a repetition are
                # dependent); the decision is "inference".
                **tests, "pooled_tests": "descriptive",
                "inference": inference.compare_arms(m, baseline, m, v, scale=scale,
                                                    rng=stats.rng_for(run.seed, "perm", m.id, v), same_run=True,
                                                    invalid=invalid_reps(run, (baseline, v)))}
            if m.clock_bounds is not None:
                d["vs_baseline"].update(_clock_comparison(m, v, baseline, d.get("mean"), base_desc.get("mean")))
        entry["variants"][v] = d
    return entry


def _km_pooled(m, v: str) -> dict:
    """Censorable time metrics: the pooled counts and, when any time is censored, the pooled
    Kaplan-Meier median and 90th percentile (None: not reached). The pooled ``median`` etc.
    beside them are of the completed transfers only."""
    obs, cens = m.pooled(v), m.pooled_censored(v)
    out = {"completed": int(obs.size), "censored": int(cens.size)}
    if cens.size:
        times = np.concatenate([obs, cens])
        flags = np.concatenate([np.zeros(obs.size, bool), np.ones(cens.size, bool)])
        out["km_median"] = survival.km_quantile(times, flags, 0.5)
        out["km_p90"] = survival.km_quantile(times, flags, 0.9)
    return out


def _inference_summary(run: Run, extracted: Extracted, entries: dict, baseline: str) -> dict:
    """Holm over the family, the headline, and a power statement per metric."""
    items = [{"id": mid, "variant": v, "inference": d["vs_baseline"]["inference"]}
             for mid, e in entries.items() for v, d in e["variants"].items() if "vs_baseline" in d]
    sig = inference.apply_holm(items)
    fam_size = sum(1 for it in items if it["inference"]["in_family"] and it["inference"]["status"] == "tested")
    not_enough = sum(1 for it in items if it["inference"]["status"] == "not enough repetitions")
    for mid, e in entries.items():
        m = extracted.metrics[mid]
        prim = inference.primary_stat(m.metric)
        arms = [inference.rep_values(m, v, prim) for v in run.variants]
        e["power"] = stats.power_analysis(arms, inference.metric_scale(m, run.variants), run.repetitions,
                                          max(1, fam_size))
    return {
        "alpha": stats.ALPHA, "correction": "holm", "family_size": fam_size,
        "tests": len(items), "not_enough_repetitions": not_enough, "min_reps_per_arm": stats.MIN_REPS,
        "headline": [inference.headline_line(entries[it["id"]]["title"], it["variant"], baseline, it["inference"])
                     for it in sig],
        "significant": [{"metric": it["id"], "variant": it["variant"]} for it in sig],
        "paired_tests": sum(1 for it in items if it["inference"]["status"] == "tested"
                            and it["inference"].get("test") == "paired"),
        "welch_tests": sum(1 for it in items if it["inference"]["status"] == "tested"
                           and it["inference"].get("test") == "welch"),
        "equivalence_margin_pct": stats.EQUIVALENCE_MARGIN_PCT,
        # Outcome comparisons that could not be tested: their descriptive change, labelled.
        "descriptive": [line for it in items
                        if it["inference"]["in_family"] and it["inference"]["status"] == "not enough repetitions"
                        and (line := inference.descriptive_line(entries[it["id"]]["title"], it["variant"], baseline,
                                                                it["inference"]))],
    }


def _clock_comparison(m, v: str, baseline: str, mean, base_mean) -> dict:
    """Difference of means against the clock uncertainty of the two (analysis/clock.py)."""
    bv, bb = m.clock_bound(v), m.clock_bound(baseline)
    diff = mean - base_mean if mean is not None and base_mean is not None else None
    bound = bv + bb if bv is not None and bb is not None else None
    return {"mean_diff_ms": diff, "mean_diff_clock_bound_ms": bound,
            "mean_diff_within_clock": clock_mod.within(diff, bound)}


def summarize(run: Run, extracted: Extracted, errors: dict, baseline: str,
              resamples: int = stats.BOOTSTRAP_RESAMPLES) -> dict:
    """The summary dict (floats unrounded; ``dumps`` rounds them).

    Takes the run, its extracted samples, ``metrics.error_rates(run)`` and the baseline
    variant (must be one of ``run.variants``; not checked here).
    """
    entries = {mid: _metric_entry(run, m, baseline, resamples) for mid, m in extracted.metrics.items()}
    reps = [{"variant": r.variant, "rep": r.index, "status": r.status, "error": r.error,
             "transfers": len(r.transfers), "measured_transfers": len(r.measured_transfers),
             "files": sorted(r.files), "notes": list(r.notes),
             **({"circuits": _circuit_coverage(r)} if r.circuits and r.cellstats else {})} for r in run.reps]
    return {
        "schema": SCHEMA,
        "run": _run_facts(run),
        "baseline": baseline,
        "settings": {
            "bootstrap_resamples": resamples, "ci_level": stats.CI_LEVEL,
            "bootstrap_seed": run.seed,
            "quantile_method": "linear (numpy default; Hyndman & Fan type 7)",
            "tests": "inferential: paired t on per-block log ratios where the repetitions form intact "
                     "blocks, else Welch t on per-repetition summaries (log scale); Holm over the "
                     "family of outcome metrics x variants; TOST equivalence within the margin; descriptive "
                     "only: two-sided two-sample Kolmogorov-Smirnov and Mann-Whitney U (scipy.stats) on "
                     "pooled samples",
            "equivalence_margin_pct": stats.EQUIVALENCE_MARGIN_PCT,
            "alpha": stats.ALPHA, "min_reps_per_arm": stats.MIN_REPS, "power": stats.POWER,
            "target_change_pct": stats.TARGET_EFFECT_PCT, "correction": "holm",
            "family_metrics": list(inference.FAMILY_METRICS),
            "primary_statistics": {k: inference.primary_stat(k) for k in metrics_mod.METRICS},
            "methods": list(inference.METHOD_TEXT),
            "throughput_window_s": metrics_mod.THROUGHPUT_WINDOW_S,
            "throughput_min_warmup_s": metrics_mod.THROUGHPUT_MIN_WARMUP_S,
            "gh70_heavy_share": metrics_mod.GH70_SHARE,
        },
        "definitions": {title: text for title, text in metrics_mod.DEFINITIONS},
        "repetitions": reps,
        "missing": missing_lines(run, extracted),
        "metrics": entries,
        "inference": _inference_summary(run, extracted, entries, baseline),
        "errors": errors,
        "transfer_outcomes": metrics_mod.transfer_outcomes(run),
        # Only for runs with replay clock records (keeps older summaries unchanged).
        **({"clock": rows} if (rows := clock_mod.clock_rows(run)) else {}),
        # Only for runs with background load (load.jsonl).
        **({"load": rows} if (rows := background.load_rows(run)) else {}),
        # Only for runs with faults (faults.jsonl).
        **({"faults": rows} if (rows := faults_mod.fault_rows(run)) else {}),
        # Only for Kubernetes runs whose relays ran on more than one kind of hardware.
        **({"by_hardware": hw} if (hw := hardware_mod.by_hardware(run, extracted)) else {}),
        # Only for scenarios made by torbed generate: the sampled network, design and traffic model.
        **({"generated_section": sec} if (sec := generated_mod.blocks(run.info)) else {}),
    }


def add_primary(summary: dict, metric: str, variant: str | None = None,
                declared: str = "torbed report --primary") -> dict:
    """Record ``metric`` (a metric id of the summary) for ``variant`` (default: the only
    variant besides the baseline) as the primary comparison, declared before the run (by
    ``declared``): its own test, read at alpha without multiplicity adjustment, beside the
    exploratory Holm family (which it stays in). Sets and returns summary["inference"]["primary"].
    Raises InputError (unknown metric, variant or baseline as the variant)."""
    from .errors import InputError
    entry = summary["metrics"].get(metric)
    kind = metric.split("/")[0]
    if entry is None and any(m.split("/")[0] == kind for m in summary["metrics"]):
        some = ", ".join(m for m in summary["metrics"] if m.split("/")[0] == kind)
        raise InputError(f"--primary {metric!r}: not a metric of this run (of its kind: {some})")
    others = [v for v in summary["run"]["variants"] if v != summary["baseline"]]
    if variant is None:
        if len(others) != 1:
            raise InputError(f"--primary {metric}: say which variant (METRIC@VARIANT; one of {', '.join(others)})")
        variant = others[0]
    if variant not in others:
        raise InputError(f"--primary {metric}@{variant}: not a variant compared with the baseline "
                         f"{summary['baseline']} (variants: {', '.join(others) or 'none'})")
    # No metric of its kind at all: no repetition recorded one (e.g. a gate excluded them all).
    inf = entry["variants"][variant]["vs_baseline"]["inference"] if entry else {"status": "no data", "n": 0,
                                                                                 "n_baseline": 0}
    p = inf.get("pvalue") if inf.get("status") == "tested" else None
    out = {"metric": metric, "variant": variant, "baseline": summary["baseline"],
           "title": entry["title"] if entry else metric,
           "alpha": stats.ALPHA, "declared": declared, "significant": p is not None and p < stats.ALPHA,
           **{k: inf.get(k) for k in ("status", "test", "n", "n_baseline", "statistic", "change_pct", "change_ci95",
                                      "pvalue", "change_pct_descriptive")}}
    summary["inference"]["primary"] = out
    return out


def _circuit_coverage(r) -> dict:
    from . import circuits
    return circuits.coverage(metrics_mod.rep_attribution(r), r.cellstats)
