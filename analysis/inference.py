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
- Arms are compared with ``stats.compare_reps`` (Welch on log summaries) on the primary
  statistic. The multiple-comparison family is every tested (metric, variant) pair of an
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
- ``compare_arms(m_a, var_a, m_b, var_b, rng) -> dict``  inference of B (or the variant) vs A
- ``apply_holm(items) -> list[dict]``  sets ``pvalue_holm`` and ``significant`` in place
- ``headline_line(item) -> str``
- ``METHOD_TEXT``: the sentences the reports print about the methods
"""

from __future__ import annotations

import numpy as np

from . import stats
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
    f"Inferential test: Welch's two-sample t-test on the log of the per-repetition summaries (linear "
    f"scale when a summary is <= 0), variant vs baseline; the difference of log means is the log "
    f"ratio of geometric means, reported as a % change with its {stats.CI_LEVEL:.0%} Welch "
    f"confidence interval. The exact permutation p-value of the same difference is reported in "
    f"summary.json as a distribution-free check (with 3 vs 3 repetitions it cannot go below 0.1).",
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
    f"repetitions per arm a {stats.TARGET_EFFECT_PCT:.0f}% change needs (noncentral t).",
    "Median CI: cluster bootstrap over whole repetitions (resample repetitions with replacement, "
    "pool their samples, take the median; exact over all resamples up to 6 repetitions).",
]


def primary_stat(metric: str) -> str:
    return PRIMARY.get(metric, "median")


def in_family(metric: str) -> bool:
    return metric in FAMILY_METRICS


def rep_summaries(m: MetricSamples, variant: str) -> dict[int, dict]:
    """Per repetition with data: n, median, p90, mean and (cell wait) wait_per_cell."""
    out = {}
    tot = (m.totals or {}).get(variant, {})
    for k, vals in sorted(m.values.get(variant, {}).items()):
        a = np.asarray(vals, dtype=float)
        a = a[np.isfinite(a)]
        d = {"n": int(a.size)}
        if a.size:
            d.update(median=float(np.median(a)), p90=float(np.quantile(a, 0.9)), mean=float(a.mean()))
        if m.totals is not None:
            t, n = tot.get(k, (0.0, 0.0))
            d["wait_per_cell"] = t / n if n else None
        out[k] = d
    return out


def rep_values(m: MetricSamples, variant: str, stat: str) -> list[float]:
    """The per-repetition values of ``stat`` for ``variant`` (repetitions without data left out)."""
    return [d[stat] for d in rep_summaries(m, variant).values()
            if d.get(stat) is not None and np.isfinite(d[stat])]


def compare_arms(m_base: MetricSamples, base_variant: str, m_new: MetricSamples, new_variant: str,
                 scale: str | None = None, rng: np.random.Generator | None = None) -> dict:
    """The inference of (m_new, new_variant) against (m_base, base_variant) on the primary
    statistic, plus the secondary statistics (``secondary``: stat -> compare_reps result)."""
    prim = primary_stat(m_base.metric)
    res = stats.compare_reps(rep_values(m_new, new_variant, prim), rep_values(m_base, base_variant, prim),
                             scale=scale, rng=rng)
    res["statistic"] = prim
    res["in_family"] = in_family(m_base.metric)
    res["secondary"] = {}
    for st in SECONDARY:
        if st == prim:
            continue
        r = stats.compare_reps(rep_values(m_new, new_variant, st), rep_values(m_base, base_variant, st), rng=rng)
        res["secondary"][st] = {k: r.get(k) for k in ("status", "n", "n_baseline", "scale", "change_pct",
                                                       "change_ci95", "pvalue")}
    return res


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


def headline_line(title: str, variant: str, baseline: str, inf: dict) -> str:
    lo, hi = inf.get("change_ci95") or (None, None)
    return (f"{title}: {variant} vs {baseline}: {STAT_NAMES.get(inf['statistic'], inf['statistic'])} "
            f"{inf['change_pct']:+.1f}% (95% CI {lo:+.1f}% to {hi:+.1f}%; Holm-adjusted p = "
            f"{inf['pvalue_holm']:.3g}; {inf['n']} vs {inf['n_baseline']} repetitions)")
