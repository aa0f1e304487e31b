"""``torbed compare RUN_A RUN_B``: the same scenario run twice (e.g. before and after a tor
update, or on two hosts), compared per variant and metric.

For every metric id present in both runs and every variant of both: the inferential
comparison of B's repetitions against A's (inference.py: per-repetition summaries, Welch,
Holm over the outcome metrics x variants, a headline of what survives), and, descriptive
only, the pooled medians and means, their % change and the pooled KS / Mann-Whitney U
p-values (warm-up excluded, as in ``torbed report``).

Writes ``compare-<RUN_A directory name>.json`` and ``.md`` into RUN_B/report/ (or ``out_dir``).

Public API:

- ``compare(run_a, run_b, force=False, out_dir=None) -> dict``  the comparison as written
  (floats rounded); raises RunDirError, RecordError, ScenarioMismatchError (InputError) and
  OSError.
- ``compare_runs(run_a, run_b, force=False) -> dict``  the same, nothing written (unrounded)
- ``rows(comparison) -> list[list[str]]``  table rows (for the markdown and the CLI's table)
- ``HEADERS``
"""

from __future__ import annotations

import re
from pathlib import Path

from . import gates, inference, metrics, render, stats
from . import summary as summary_mod
from .errors import ScenarioMismatchError
from .load import Run, load_run
from .render import DASH, fmt_p, fmt_pct, fmt_value, to_markdown

HEADERS = ["metric", "variant", "reps A", "reps B", "median A", "median B", "Δ per-rep [95% CI]", "p (Welch)",
           "Holm p", "verdict", "KS p (descr.)", "MWU p (descr.)"]


def _facts(run: Run) -> dict:
    return {"directory": run.name, "path": str(run.path), "scenario": run.scenario_name,
            "variants": run.variants, "repetitions": run.repetitions,
            "tor_version": run.info.get("tor_version"), "started": run.info.get("started"),
            "missing": summary_mod.missing_lines(run, metrics.Extracted({}, []))}


def compare_runs(run_a: str | Path, run_b: str | Path, force: bool = False) -> dict:
    """Compare two run directories (nothing written). Returns the unrounded comparison.

    Raises ScenarioMismatchError when the scenario names differ and ``force`` is false.
    """
    a, b = load_run(run_a), load_run(run_b)
    if a.scenario_name != b.scenario_name and not force:
        raise ScenarioMismatchError(
            f"{a.path} is scenario {a.scenario_name!r} but {b.path} is {b.scenario_name!r}; "
            f"compare runs of one scenario, or pass --force")
    gates.exclude_invalid(a)        # as the report: repetitions a mechanism gate rejected do not count
    gates.exclude_invalid(b)
    ea, eb = metrics.extract(a), metrics.extract(b)
    variants = [v for v in a.variants if v in b.variants]
    out_metrics = _compare_metrics(ea, eb, variants)
    summary = _inference_summary(out_metrics)
    err_a, err_b = metrics.error_rates(a), metrics.error_rates(b)
    return {
        "schema": 1,
        "run_a": _facts(a), "run_b": _facts(b), "forced": bool(force and a.scenario_name != b.scenario_name),
        "variants": variants,
        "variants_only_in_a": [v for v in a.variants if v not in b.variants],
        "variants_only_in_b": [v for v in b.variants if v not in a.variants],
        "metrics_only_in_a": sorted(set(ea.metrics) - set(eb.metrics)),
        "metrics_only_in_b": sorted(set(eb.metrics) - set(ea.metrics)),
        "metrics": out_metrics,
        "inference": summary,
        "errors": {v: {"rate_a": err_a[v]["rate"], "rate_b": err_b[v]["rate"],
                       "errors_a": err_a[v]["errors"], "errors_b": err_b[v]["errors"],
                       "transfers_a": err_a[v]["transfers"], "transfers_b": err_b[v]["transfers"]}
                   for v in variants},
    }


def _compare_metrics(ea, eb, variants: list[str]) -> dict:
    """Metric id -> its entry (title, unit, per-variant comparison) for metrics both runs have."""
    out_metrics = {}
    for mid, ma in ea.metrics.items():
        mb = eb.metrics.get(mid)
        if mb is None:
            continue
        out_metrics[mid] = {"metric": ma.metric, "title": ma.title, "unit": ma.unit,
                            "variants": {v: _compare_variant(mid, ma, mb, v) for v in variants}}
    return out_metrics


def _compare_variant(mid: str, ma, mb, v: str) -> dict:
    """One variant of one metric, run A against run B: the inference and the pooled descriptives."""
    xa, xb = ma.pooled(v), mb.pooled(v)
    da, db = stats.describe(xa), stats.describe(xb)
    tests = stats.two_sample_tests(xb, xa) or {
        "ks_statistic": None, "ks_pvalue": None, "mwu_statistic": None, "mwu_pvalue": None}
    return {
        "n_a": da["n"], "n_b": db["n"],
        "inference": inference.compare_arms(ma, v, mb, v, scale=inference.metric_scale_two(ma, mb, v),
                                            rng=stats.rng_for(0, "compare", mid, v)),
        "pooled_tests": "descriptive",
        "median_a": da.get("median"), "median_b": db.get("median"),
        "mean_a": da.get("mean"), "mean_b": db.get("mean"),
        "median_change_pct": stats.pct_change(db.get("median"), da.get("median")),
        "mean_change_pct": stats.pct_change(db.get("mean"), da.get("mean")),
        **tests}


def _inference_summary(out_metrics: dict) -> dict:
    """The family of tests over every (metric, variant), Holm-corrected: its size, headline and
    descriptive lines (apply_holm marks each entry's inference in place)."""
    items = [{"id": mid, "variant": v, "inference": d["inference"]}
             for mid, e in out_metrics.items() for v, d in e["variants"].items()]
    sig = inference.apply_holm(items)
    fam = sum(1 for it in items if it["inference"]["in_family"] and it["inference"]["status"] == "tested")
    return {
        "alpha": stats.ALPHA, "correction": "holm", "family_size": fam, "tests": len(items),
        "min_reps_per_arm": stats.MIN_REPS,
        "not_enough_repetitions": sum(1 for it in items if it["inference"]["status"] == "not enough repetitions"),
        "headline": [inference.headline_line(out_metrics[it["id"]]["title"], it["variant"] + " (B)", "A",
                                             it["inference"]) for it in sig],
        "significant": [{"metric": it["id"], "variant": it["variant"]} for it in sig],
        "equivalence_margin_pct": stats.EQUIVALENCE_MARGIN_PCT,
        "descriptive": [line for it in items
                        if it["inference"]["in_family"] and it["inference"]["status"] == "not enough repetitions"
                        and (line := inference.descriptive_line(out_metrics[it["id"]]["title"],
                                                                it["variant"] + " (B)", "A", it["inference"]))],
        "methods": list(inference.METHOD_TEXT)}


def rows(c: dict) -> list[list[str]]:
    """One row per (metric id, variant), in the order of HEADERS."""
    out = []
    for mid, e in c["metrics"].items():
        u = e["unit"]
        for v, d in e["variants"].items():
            inf = d["inference"]
            tested = inf["status"] == "tested"
            out.append([f"{mid} ({'MiB/s' if u == 'B/s' else u})", v, str(inf["n_baseline"]), str(inf["n"]),
                        fmt_value(d["median_a"], u), fmt_value(d["median_b"], u),
                        (fmt_pct(inf["change_pct"]) + " " + render._ci_pct(inf.get("change_ci95"))) if tested else
                        (f"{fmt_pct(inf['change_pct_descriptive'])} (descriptive)"
                         if inf.get("change_pct_descriptive") is not None else DASH),
                        fmt_p(inf.get("pvalue")) if tested else DASH,
                        fmt_p(inf.get("pvalue_holm")) if inf.get("pvalue_holm") is not None else DASH,
                        render._verdict(inf), fmt_p(d["ks_pvalue"]), fmt_p(d["mwu_pvalue"])])
    return out


def _markdown(c: dict, out: Path) -> str:
    a, b = c["run_a"], c["run_b"]
    bl: list[tuple] = [("h", 1, f"torbed compare: {a['directory']} (A) vs {b['directory']} (B)")]
    bl.append(("p", f"Scenario A: {a['scenario']}; scenario B: {b['scenario']}"
                    + (" (different scenarios, compared with --force)" if c["forced"] else "") + ". "
                    "Inferential: one number per repetition (the metric's per-rep statistic), B's repetitions "
                    "against A's: Δ = % change from A to B with its 95% Welch interval, p = Welch t-test on log "
                    "values (two runs share no blocks, so nothing is paired), Holm p adjusted over the outcome "
                    "metrics x variants; a difference that is not significant is 'equivalent' only when TOST puts "
                    "it within the margin, else inconclusive. Descriptive only: medians of "
                    "the pooled samples and pooled KS / Mann-Whitney U p-values (dependent samples treated as "
                    "independent: not tests). Warm-up excluded."))
    inf = c["inference"]
    bl.append(("h", 2, "Headline"))
    if inf["headline"]:
        bl.append(("ul", list(inf["headline"])))
    elif inf["family_size"] == 0:
        bl.append(("p", f"No inferential comparison: not enough repetitions (at least {inf['min_reps_per_arm']} "
                        f"per run with data are needed)."))
        if inf.get("descriptive"):
            bl.append(("p", "Descriptive changes (not tests, no p-value):"))
            bl.append(("ul", list(inf["descriptive"])))
    else:
        bl.append(("p", f"No difference between A and B survives Holm's correction over {inf['family_size']} "
                        f"tests (family-wise error rate {inf['alpha']})."))
    bl.append(("table", ["", "A", "B"], [
        ["directory", a["directory"], b["directory"]], ["tor version", str(a["tor_version"]), str(b["tor_version"])],
        ["started", str(a["started"]), str(b["started"])], ["repetitions", str(a["repetitions"]), str(b["repetitions"])],
        ["variants", ", ".join(a["variants"]), ", ".join(b["variants"])]]))
    notes = []
    for key, what in (("variants_only_in_a", "variants only in A"), ("variants_only_in_b", "variants only in B"),
                      ("metrics_only_in_a", "metrics only in A"), ("metrics_only_in_b", "metrics only in B")):
        if c[key]:
            notes.append(f"{what} (not compared): {', '.join(c[key])}")
    notes += [f"A: {m}" for m in a["missing"]] + [f"B: {m}" for m in b["missing"]]
    bl.append(("h", 2, "Missing or not compared"))
    bl.append(("ul", notes) if notes else ("p", "Nothing: both runs are complete and have the same variants and metrics."))
    bl.append(("h", 2, "Metrics"))
    bl.append(("table", HEADERS, rows(c)))
    bl.append(("h", 2, "Error rate"))
    bl.append(("table", ["variant", "A", "B"], [
        [v, f"{e['errors_a']}/{e['transfers_a']}", f"{e['errors_b']}/{e['transfers_b']}"] for v, e in c["errors"].items()]))
    bl.append(("h", 2, "Statistical methods"))
    bl.append(("ul", list(inf["methods"])))
    return to_markdown(bl, out)


def output_stem(run_a_name: str) -> str:
    """File name stem for a comparison against run A: ``compare-<A directory name>``."""
    return "compare-" + (re.sub(r"[^A-Za-z0-9_.+-]+", "-", run_a_name).strip("-") or "run")


def compare(run_a: str | Path, run_b: str | Path, force: bool = False,
            out_dir: str | Path | None = None) -> dict:
    """Compare two runs and write ``compare-<A name>.json``/``.md`` into ``out_dir``
    (default RUN_B/report). Returns the comparison as written (rounded floats)."""
    c = compare_runs(run_a, run_b, force)
    out = Path(out_dir) if out_dir is not None else Path(run_b) / "report"
    out.mkdir(parents=True, exist_ok=True)
    stem = output_stem(c["run_a"]["directory"])
    text = summary_mod.dumps(c)
    (out / f"{stem}.json").write_text(text)
    rounded = summary_mod.round_floats(c)
    (out / f"{stem}.md").write_text(_markdown(rounded, out))
    return rounded
