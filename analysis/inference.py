"""Which numbers are tested, and how: per-repetition summaries of every metric, the
inferential comparison of two arms (variants of one run, or one variant in two runs), the
multiple-comparison family and the power statement. stats.py has the formulas; this module
decides what they are applied to. docs/statistics.md explains the choices.

- The unit of replication is the repetition (a fresh network). Each metric is reduced to one
  number per repetition: its *primary statistic* (``PRIMARY``) - the median for transfer and
  build times and relay throughput (one value per repetition already), the ratio wait per
  cell (sum of waits / cells) for circuit-queue wait, the mean for per-cell delay (the
  papers' "average delay per cell"). The p90 and the mean (or median) are kept as secondary
  per-repetition summaries.
- Arms are compared on the primary statistic. Repetition k of every variant of one run is
  a block (same seed, paths, schedule: engine.run_order); where the blocks are intact
  (``block_check``) the test is ``stats.compare_paired`` (paired t on per-block log ratios),
  else ``stats.compare_reps`` (Welch on log summaries); ``test`` / ``test_reason`` record it.
  Every result carries a TOST equivalence test and a ``plan`` (blocks needed, CI width). The multiple-comparison family is every tested (metric, variant) pair of an
  outcome metric (``FAMILY_METRICS``); Holm's adjustment controls the family-wise error rate
  at ``stats.ALPHA``; the headline lists only pairs whose adjusted p is below it.
  Time-from-stream-start variants of TTFB/TTLB and the replay scheduling error are secondary
  (the first repeat TTFB/TTLB with the SOCKS step added, the second is a fidelity check): they
  are tested and shown, never in the family or the headline.
- Pooled per-sample KS / Mann-Whitney stay in the tables as *descriptive* only.

Public API:

- ``PRIMARY``, ``SECONDARY``, ``FAMILY_METRICS``, ``primary_stat(metric)``, ``in_family(metric)``
- ``rep_summaries(m, variant) -> {rep: {"n", "median", "p90", "mean", ["wait_per_cell"]}}``
- ``rep_values(m, variant, stat) -> list[float]``  one value per repetition with data
- ``rep_values_by_rep(m, variant, stat) -> {rep: float}``
- ``block_check(new, base, same_run, invalid=None) -> (intact, reason)``
- ``test_arms(new, base, paired, scale, rng, margin_pct) -> dict``
- ``comparison_plan(new, base, paired, scale, observed_pct) -> dict``,
  ``descriptive_change(new, base) -> float | None``
- ``compare_arms(m_a, var_a, m_b, var_b, rng, same_run=False, invalid=None) -> dict``
  inference of B (or the variant) vs A
- ``design_text(inf)``, ``descriptive_line(title, variant, baseline, inf)``
- ``apply_holm(items) -> list[dict]``  sets ``pvalue_holm`` and ``significant`` in place
- ``headline_line(item) -> str``
- ``METHOD_TEXT``: the sentences the reports print about the methods
"""

from __future__ import annotations

import numpy as np

from . import stats, survival
from .metrics import MetricSamples

PRIMARY = {"cell_wait_ms": "wait_per_cell", "cell_delay_ms": "mean"}
SECONDARY = ("median", "p90", "mean")
FAMILY_METRICS = ("ttfb_s", "ttlb_s", "circuit_build_s", "relay_throughput_Bps", "cell_wait_ms", "cell_delay_ms")

STAT_NAMES = {"median": "median", "p90": "90th percentile", "mean": "mean",
              "wait_per_cell": "wait per cell (sum of waits / cells)"}

METHOD_TEXT = [
    "Unit of replication: the repetition (a fresh private network). Samples within one repetition "
    "are not independent (queue waits seconds apart share one queue, transfers share one network), "
    "so each metric is first reduced to one number per repetition, its primary statistic: the "
    "median (transfer times, circuit build time, relay throughput: one value per relay and "
    "repetition), the ratio wait per cell (circuit-queue wait) or the mean (per-cell delay). "
    "Time series (queue wait, throughput) are summarised per repetition, so their autocorrelation "
    "stays inside the one number it produces.",
    f"Inferential test, paired where the design is: the engine runs repetition k of every variant "
    f"as one block (same seed, paths and schedule, run back to back in a seeded random order). "
    f"Where both arms have a value for the same repetitions of one run and no repetition failed in "
    f"either (intact blocks), the test is the paired t-test on the per-block log ratios "
    f"d_k = log(variant_k / baseline_k): a one-sample t-test of mean(d) = 0 with n - 1 degrees of "
    f"freedom, its {stats.CI_LEVEL:.0%} interval exp(mean(d) +- t sd(d) / sqrt(n)) - 1 reported as a % "
    f"change; what a block shares (network state, the machine's load then) cancels in d_k. The exact "
    f"sign-flip permutation p-value of the same mean is in summary.json as a distribution-free check "
    f"(with 3 blocks it cannot go below 0.25). Where blocks are broken (a repetition missing or "
    f"failed in one arm) or the arms come from two runs (`torbed compare`), Welch's two-sample t-test "
    f"on the log of the per-repetition summaries, with its Welch interval and the exact permutation "
    f"p-value as the check. The 'test' column and summary.json (`test`, `test_reason`) say which test "
    f"each row used and why. Linear scale instead of log when a summary is <= 0.",
    f"No change: a difference that is not significant is not evidence of no difference. A row is "
    f"called equivalent only when the two one-sided tests (TOST, alpha {stats.ALPHA} each) reject a "
    f"change beyond the margin of +-{stats.EQUIVALENCE_MARGIN_PCT:.0f}% on the ratio scale (variant / "
    f"baseline within [{1 / (1 + stats.EQUIVALENCE_MARGIN_PCT / 100):.3f}, "
    f"{1 + stats.EQUIVALENCE_MARGIN_PCT / 100:.2f}]), "
    f"i.e. when the {1 - 2 * stats.ALPHA:.0%} interval lies inside the margin; otherwise it is "
    f"inconclusive.",
    f"Not enough repetitions: fewer than {stats.MIN_REPS} repetitions with data in either arm -> no "
    f"p-value, the table says 'not enough repetitions'.",
    f"Multiple comparisons: Holm's step-down adjustment over the family of every tested (outcome "
    f"metric, variant) pair of the report, family-wise error rate {stats.ALPHA}. Holm rather than "
    f"Benjamini-Hochberg because the metrics are strongly and not always positively dependent "
    f"(the same transfers, the same queues), where Holm's guarantee holds and BH's needs "
    f"assumptions; the price in power is stated in the power section. Outcome metrics: "
    f"{', '.join(FAMILY_METRICS)}; TTFB/TTLB from stream start and the replay scheduling error are "
    f"tested but secondary (not in the family, not in the headline). The headline lists only "
    f"pairs whose Holm-adjusted p < {stats.ALPHA}.",
    "Descriptive only: the pooled per-sample KS and Mann-Whitney p-values (all repetitions' samples "
    "pooled as if independent) and the pooled quantiles. They describe the distributions; they are "
    "not tests of the variants, and an A/A run shows them crying wolf.",
    f"Power: from the run's own between-repetition variance of the primary statistic (pooled over "
    f"variants, each around its own mean), the smallest % change a two-sided t-test with this "
    f"design's repetitions detects with {stats.POWER:.0%} power at alpha {stats.ALPHA} and at "
    f"alpha / family size (what the most significant test must beat under Holm), and the "
    f"repetitions per arm a {stats.TARGET_EFFECT_PCT:.0f}% change needs (noncentral t). Per "
    f"comparison, from its own spread (the sd of the block log ratios when paired, else the two "
    f"arms' pooled between-repetition sd): the blocks (repetitions per arm) a two-sided test at "
    f"alpha {stats.ALPHA} needs for {stats.POWER:.0%} power against the observed change and against "
    f"+-{stats.TARGET_EFFECT_PCT:.0f}%, and the +- half-width of the {stats.CI_LEVEL:.0%} interval at "
    f"this run's n (summary.json `plan`). The spread of 3 blocks rests on 2 degrees of freedom: "
    f"these numbers are rough.",
    "Censoring: a transfer still running when the window ended is kept as a right-censored time "
    "(more than the time observed). Where a repetition has any, its median and 90th percentile are "
    "Kaplan-Meier estimates (the sample median otherwise: they agree when nothing is censored), so "
    "the per-block statistic the paired test uses is the per-block Kaplan-Meier median; a "
    "repetition more than half censored has no median ('not reached') and the row says so.",
    "Median CI: cluster bootstrap over whole repetitions (resample repetitions with replacement, "
    "pool their samples, take the median; exact over all resamples up to 6 repetitions).",
]


def primary_stat(metric: str) -> str:
    return PRIMARY.get(metric, "median")


def in_family(metric: str) -> bool:
    return metric in FAMILY_METRICS


def rep_summaries(m: MetricSamples, variant: str) -> dict[int, dict]:
    """Per repetition with data: n, median, p90, mean and (cell wait) wait_per_cell.

    Time metrics that can be censored (``m.censored``) also get ``censored`` (how many of the
    repetition's transfers the window cut off); where that is not 0, median and p90 are
    Kaplan-Meier quantiles of observed and censored times together (``method``:
    "kaplan-meier"), None with ``median_not_reached`` when more than half is censored, and
    the mean is None (a mean of censored times has no estimate without a model)."""
    out = {}
    tot = (m.totals or {}).get(variant, {})
    cens_of = (m.censored or {}).get(variant, {})
    for k, vals in sorted(m.values.get(variant, {}).items()):
        a = np.asarray(vals, dtype=float)
        a = a[np.isfinite(a)]
        c = np.asarray(cens_of.get(k, []), dtype=float)
        c = c[np.isfinite(c)]
        d = {"n": int(a.size)}
        if m.censored is not None:
            d["censored"] = int(c.size)
        if c.size:
            times = np.concatenate([a, c])
            flags = np.concatenate([np.zeros(a.size, bool), np.ones(c.size, bool)])
            med = survival.km_quantile(times, flags, 0.5)
            d.update(median=med, p90=survival.km_quantile(times, flags, 0.9), mean=None, method="kaplan-meier")
            if med is None:
                d["median_not_reached"] = True
        elif a.size:
            d.update(median=float(np.median(a)), p90=float(np.quantile(a, 0.9)), mean=float(a.mean()))
        if m.totals is not None:
            t, n = tot.get(k, (0.0, 0.0))
            d["wait_per_cell"] = t / n if n else None
        out[k] = d
    return out


def rep_values(m: MetricSamples, variant: str, stat: str) -> list[float]:
    """The per-repetition values of ``stat`` for ``variant`` (repetitions without data left out)."""
    return list(rep_values_by_rep(m, variant, stat).values())


def rep_values_by_rep(m: MetricSamples, variant: str, stat: str) -> dict[int, float]:
    """{repetition index: value of ``stat``} for ``variant``'s repetitions with data."""
    return {k: d[stat] for k, d in rep_summaries(m, variant).items()
            if d.get(stat) is not None and np.isfinite(d[stat])}


def block_check(new: dict, base: dict, same_run: bool, invalid: dict | None = None) -> tuple[bool, str]:
    """Whether two arms' per-repetition values ({rep: value}) form intact blocks: one run,
    the same repetition indices with a value in both arms, and none of them invalid
    (``invalid``: {rep: why}, e.g. a repetition that failed in either arm). Returns
    (intact, the reason in a sentence)."""
    if not same_run:
        return False, "two different runs: their repetitions share no blocks, so Welch across repetitions"
    if not new or not base:
        return False, "an arm has no repetition with data"
    only_new, only_base = sorted(set(new) - set(base)), sorted(set(base) - set(new))
    bad = sorted(k for k in set(new) | set(base) if invalid and k in invalid)
    why = []
    if only_base:
        why.append(f"repetition(s) {', '.join(map(str, only_base))} have no value in the variant")
    if only_new:
        why.append(f"repetition(s) {', '.join(map(str, only_new))} have no value in the baseline")
    for k in bad:
        why.append(f"repetition {k} {invalid[k]}")
    if why:
        return False, "blocks broken (" + "; ".join(why) + "), so Welch across repetitions"
    return True, (f"blocks intact: repetitions {', '.join(map(str, sorted(new)))} of both arms ran as blocks "
                  f"(same seed, paths and schedule), so paired on the per-block log ratios")


def test_arms(new: dict, base: dict, paired: bool, scale: str | None, rng, margin_pct) -> dict:
    if paired:
        ks = sorted(new)
        return stats.compare_paired([new[k] for k in ks], [base[k] for k in ks], scale=scale, rng=rng,
                                    margin_pct=margin_pct)
    return stats.compare_reps(list(new.values()), list(base.values()), scale=scale, rng=rng, margin_pct=margin_pct)


def comparison_plan(new: dict, base: dict, paired: bool, scale: str, observed_pct: float | None,
                    target_pct: float = stats.TARGET_EFFECT_PCT) -> dict:
    """stats.plan for one comparison from its own spread: the sd of the block differences
    (paired) or the two arms' pooled between-repetition sd (unpaired)."""
    if paired:
        ks = sorted(k for k in new if k in base)
        x = np.array([new[k] for k in ks], dtype=float)
        y = np.array([base[k] for k in ks], dtype=float)
        d = (np.log(x) - np.log(y)) if scale == "log" else x - y
        sd = float(d.std(ddof=1)) if d.size >= 2 else None
        df, n_now, ref = max(0, d.size - 1), int(d.size), float(y.mean()) if y.size else None
    else:
        xs = [np.log(np.asarray(list(a.values()), dtype=float)) if scale == "log"
              else np.asarray(list(a.values()), dtype=float) for a in (new, base)]
        if min(a.size for a in xs) >= 2:
            sd, df = stats.pooled_sd(xs)
        else:
            sd, df = None, 0
        n_now = min(len(new), len(base))
        ref = float(np.mean(list(base.values()))) if base else None
    return stats.plan(sd, df, n_now, scale, observed_pct, ref_mean=ref, paired=paired, target_pct=target_pct)


def descriptive_change(new: dict, base: dict, scale: str | None = None) -> float | None:
    """% change of the arms' centres of the per-repetition statistic (geometric means on the
    log scale; with one repetition per arm simply the ratio of the two values - for most
    metrics the ratio of medians). A description, available where no test is possible."""
    if not new or not base:
        return None
    scale = scale or stats.choose_scale(list(new.values()), list(base.values()))
    a = stats.arm_estimate(list(new.values()), scale)["estimate"]
    b = stats.arm_estimate(list(base.values()), scale)["estimate"]
    return stats.pct_change(a, b)


def compare_arms(m_base: MetricSamples, base_variant: str, m_new: MetricSamples, new_variant: str,
                 scale: str | None = None, rng: np.random.Generator | None = None, same_run: bool = False,
                 invalid: dict | None = None, margin_pct: float | None = None) -> dict:
    """The inference of (m_new, new_variant) against (m_base, base_variant) on the primary
    statistic, plus the secondary statistics (``secondary``: stat -> result).

    ``same_run``: both arms are variants of one run, so repetition k of each is a block
    (engine.run_order); with intact blocks (``block_check``; ``invalid``: {rep: why} for
    repetitions that must not be paired) the test is stats.compare_paired, else
    stats.compare_reps (Welch). ``test`` and ``test_reason`` say which and why;
    ``change_pct_descriptive`` is the change of the arms' centres (given even where nothing
    can be tested); ``plan`` is stats.plan from the comparison's own spread."""
    prim = primary_stat(m_base.metric)
    new, base = rep_values_by_rep(m_new, new_variant, prim), rep_values_by_rep(m_base, base_variant, prim)
    paired, why = block_check(new, base, same_run, invalid)
    censoring = censoring_note(m_base, base_variant, m_new, new_variant, prim)
    if censoring.get("not_reached"):
        why += ("; " + censoring["not_reached"] + " (more than half of its transfers cut off by the window: "
                "that repetition has no median and is left out, which understates the slower arm)")
    res = test_arms(new, base, paired, scale, rng, margin_pct)
    res["test_reason"] = why
    if censoring:
        res["censoring"] = censoring
    res["statistic"] = prim
    res["in_family"] = in_family(m_base.metric)
    sc = res["scale"]
    res["change_pct_descriptive"] = descriptive_change(new, base, sc)
    res["plan"] = comparison_plan(new, base, paired, sc, res.get("change_pct") if res["status"] == "tested"
                                  else res["change_pct_descriptive"])
    res["secondary"] = {}
    for st in SECONDARY:
        if st == prim:
            continue
        n2, b2 = rep_values_by_rep(m_new, new_variant, st), rep_values_by_rep(m_base, base_variant, st)
        p2, _ = block_check(n2, b2, same_run, invalid)
        r = test_arms(n2, b2, p2, None, rng, margin_pct)
        res["secondary"][st] = {k: r.get(k) for k in ("status", "test", "n", "n_baseline", "scale", "change_pct",
                                                       "change_ci95", "pvalue")}
    return res


def censoring_note(m_base: MetricSamples, base_variant: str, m_new: MetricSamples, new_variant: str,
                   stat: str) -> dict:
    """For censorable metrics: {"censored": {variant: n}, "not_reached": text or absent}
    (empty dict for metrics that cannot be censored)."""
    if m_base.censored is None and m_new.censored is None:
        return {}
    out: dict = {"censored": {}}
    missing = []
    for m, v in ((m_base, base_variant), (m_new, new_variant)):
        reps = rep_summaries(m, v)
        out["censored"][v] = sum(d.get("censored", 0) for d in reps.values())
        nr = [k for k, d in reps.items() if d.get(f"{stat}_not_reached") or (stat == "median" and
                                                                          d.get("median_not_reached"))]
        if nr:
            missing.append(f"{v}: Kaplan-Meier {stat} not reached in repetition(s) {', '.join(map(str, nr))}")
    if missing:
        out["not_reached"] = "; ".join(missing)
    return out


def metric_scale(m: MetricSamples, variants: list[str]) -> str:
    """One scale per metric (log unless some per-repetition primary value is <= 0), so the
    power statement and every comparison of the metric agree."""
    prim = primary_stat(m.metric)
    return stats.choose_scale(*[rep_values(m, v, prim) for v in variants])


def metric_scale_two(m_a: MetricSamples, m_b: MetricSamples, variant: str) -> str:
    """metric_scale for one variant measured in two runs."""
    prim = primary_stat(m_a.metric)
    return stats.choose_scale(rep_values(m_a, variant, prim), rep_values(m_b, variant, prim))


def apply_holm(items: list[dict]) -> list[dict]:
    """Holm over the items' ``inference`` dicts that are tested and in the family; sets
    ``pvalue_holm`` and ``significant`` on every item's inference (None / False when not in
    the family or not tested). Returns the significant items sorted by adjusted p."""
    fam = [it for it in items if it["inference"].get("in_family") and it["inference"].get("status") == "tested"]
    adj = stats.holm([it["inference"]["pvalue"] for it in fam])
    for it in items:
        it["inference"]["pvalue_holm"] = None
        it["inference"]["significant"] = False
    for it, p in zip(fam, adj):
        it["inference"]["pvalue_holm"] = p
        it["inference"]["significant"] = p is not None and p < stats.ALPHA
    sig = [it for it in fam if it["inference"]["significant"]]
    return sorted(sig, key=lambda it: it["inference"]["pvalue_holm"])


def design_text(inf: dict) -> str:
    """"paired, 5 blocks" or "Welch, 3 vs 2 repetitions"."""
    if inf.get("test") == "paired":
        return f"paired, {inf['n']} blocks"
    return f"Welch, {inf['n']} vs {inf['n_baseline']} repetitions"


def headline_line(title: str, variant: str, baseline: str, inf: dict) -> str:
    lo, hi = inf.get("change_ci95") or (None, None)
    stat = STAT_NAMES.get(inf['statistic'], inf['statistic'])
    if inf.get("change_pct") is None or lo is None or hi is None:   # linear scale, baseline mean 0
        return (f"{title}: {variant} vs {baseline}: {stat} changed from 0 in the baseline (no % change; "
                f"Holm-adjusted p = {inf['pvalue_holm']:.3g}; {design_text(inf)})")
    return (f"{title}: {variant} vs {baseline}: {stat} "
            f"{inf['change_pct']:+.1f}% (95% CI {lo:+.1f}% to {hi:+.1f}%; Holm-adjusted p = "
            f"{inf['pvalue_holm']:.3g}; {design_text(inf)})")


def descriptive_line(title: str, variant: str, baseline: str, inf: dict) -> str | None:
    """A headline-like line for a comparison that could not be tested: the descriptive change
    of the arms' per-repetition statistic, labelled as such; None without one."""
    ch = inf.get("change_pct_descriptive")
    if ch is None:
        return None
    return (f"{title}: {variant} vs {baseline}: {STAT_NAMES.get(inf['statistic'], inf['statistic'])} "
            f"{ch:+.1f}% (descriptive, not tested: {inf['n']} vs {inf['n_baseline']} repetitions with data)")
