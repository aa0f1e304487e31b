"""Statistics on samples: pure functions of numbers (no run directory, no files).

Conventions (the report states them too):

- Quantiles use numpy's default method, "linear" (Hyndman & Fan type 7): for sorted
  x[0..n-1] the q-quantile is x[h] interpolated linearly at h = (n - 1) q. So the median of
  an even number of values is the mean of the two middle ones.
- The bootstrap CI of the median is the percentile bootstrap: ``resamples`` samples of size n
  drawn with replacement, the median of each, and the (1-level)/2 and (1+level)/2 quantiles
  of those medians. The generator is numpy's PCG64 seeded with (run seed, CRC-32 of a key),
  so every number in a report is reproducible.
- % change = 100 (value - baseline) / baseline; None when the baseline is 0 or missing.
- Pooled tests (descriptive only: they treat dependent samples as independent): two-sample
  Kolmogorov-Smirnov (scipy.stats.ks_2samp, two-sided, method "auto") and Mann-Whitney U
  (scipy.stats.mannwhitneyu, two-sided, method "auto", continuity correction); the U
  statistic reported is the one of the variant's sample (the first argument).

Public API:

- ``QUANTILES``: {"p25": 0.25, ...} the quantiles every summary has
- ``quantile(values, q) -> float``
- ``rng_for(seed, *keys) -> numpy.random.Generator``
- ``bootstrap_median_ci(values, rng, resamples=2000, level=0.95) -> (lo, hi)``
- ``order_statistic_median_ci(values, level=0.95) -> (lo, hi)`` (describe uses it above
  ``BOOTSTRAP_MAX_N`` values and says so in ``median_ci_method``)
- ``describe(values, rng, resamples=2000) -> dict``
- ``pct_change(value, baseline) -> float | None``
- ``two_sample_tests(sample, baseline) -> dict``
- ``moving_average_max(t, nbytes, window_s=30, start=None) -> float | None``
- ``ecdf(values) -> (x, y)``

Inference across repetitions (docs/statistics.md; the KS / MWU above are descriptive only):

- ``ALPHA``, ``POWER``, ``MIN_REPS``, ``TARGET_EFFECT_PCT``, ``EQUIVALENCE_MARGIN_PCT``,
  ``SIZE_AGREEMENT_FACTOR``
- ``compare_paired(values, baseline, scale=None, margin_pct=None) -> dict``  paired t on
  per-block (log) differences, where repetition k of both arms is one block
- ``compare_reps(values, baseline, scale=None, margin_pct=None) -> dict``  Welch on (log)
  per-repetition summaries (blocks broken, or two runs)
- ``signflip_pvalue(d, rng=None) -> (p, smallest attainable p)``
- ``equivalence(d, se, df, scale, ref_mean=None, margin_pct=None) -> dict | None``  TOST
- ``ratio_within_factor(ci_log, target_pct, factor=2) -> "inside" | "outside" | "overlaps"``
- ``power_paired(delta, sd_diff, n)``, ``blocks_needed(delta, sd, paired=True)``,
  ``ci_halfwidth(sd, n, paired=True)``, ``plan(sd, df, n_now, scale, observed_pct, ...) -> dict``
- ``permutation_pvalue(x, y, rng=None) -> (p, smallest attainable p)``
- ``holm(pvalues) -> adjusted``
- ``arm_estimate(values, scale) -> {"n", "estimate", "ci95"}``, ``choose_scale(*arms)``
- ``pooled_sd(arms)``, ``min_detectable(sd, n)``, ``reps_needed(delta, sd)``,
  ``power_analysis(arms, scale, n_design, family_size) -> dict``
- ``cluster_bootstrap_median_ci(per_rep, rng) -> (lo, hi) | None``
"""

from __future__ import annotations

import math
import zlib

import numpy as np
from scipy import stats as sps

QUANTILES = {"p25": 0.25, "p75": 0.75, "p90": 0.90, "p99": 0.99}
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_MAX_N = 200_000   # above: order-statistic CI of the median (the bootstrap would take minutes)
CI_LEVEL = 0.95
# Bootstrap medians are computed this many resamples at a time (bounds memory for big n).
_CHUNK_CELLS = 4_000_000
_CLUSTER_MAX_POINTS = 50_000
_CLUSTER_GRID = 1000


def _arr(values) -> np.ndarray:
    a = np.asarray(values, dtype=float).ravel()
    return a[np.isfinite(a)]


def quantile(values, q: float) -> float:
    """The q-quantile (0 <= q <= 1) of ``values`` by numpy's "linear" method.

    Raises ValueError on an empty sample.
    """
    a = _arr(values)
    if a.size == 0:
        raise ValueError("quantile of an empty sample")
    return float(np.quantile(a, q, method="linear"))


def rng_for(seed: int, *keys: str) -> np.random.Generator:
    """A generator seeded by ``seed`` and the CRC-32 of each key (stable across processes,
    unlike ``hash``), so each (metric, variant) gets its own reproducible stream."""
    entropy = [int(seed) & 0xFFFFFFFF] + [zlib.crc32(k.encode()) for k in keys]
    return np.random.default_rng(np.random.SeedSequence(entropy))


def bootstrap_median_ci(values, rng: np.random.Generator, resamples: int = BOOTSTRAP_RESAMPLES,
                        level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median.

    Takes the sample, a numpy Generator, the number of resamples and the confidence level;
    returns (low, high). Raises ValueError on an empty sample.
    """
    a = _arr(values)
    n = a.size
    if n == 0:
        raise ValueError("bootstrap of an empty sample")
    if n == 1:
        return float(a[0]), float(a[0])
    medians = np.empty(resamples)
    step = max(1, _CHUNK_CELLS // n)
    for i in range(0, resamples, step):
        m = min(step, resamples - i)
        idx = rng.integers(0, n, size=(m, n))
        medians[i:i + m] = np.median(a[idx], axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(medians, [tail, 1.0 - tail], method="linear")
    return float(lo), float(hi)


def describe(values, rng: np.random.Generator | None = None,
             resamples: int = BOOTSTRAP_RESAMPLES) -> dict:
    """Summary of a sample: n, mean, median, min, max, p25/p75/p90/p99 and, when ``rng``
    is given, ``median_ci95`` [lo, hi]. An empty sample gives {"n": 0}."""
    a = _arr(values)
    if a.size == 0:
        return {"n": 0}
    out = {"n": int(a.size), "mean": float(a.mean()), "median": float(np.median(a)),
           "min": float(a.min()), "max": float(a.max())}
    for name, q in QUANTILES.items():
        out[name] = float(np.quantile(a, q, method="linear"))
    if rng is not None:
        if a.size > BOOTSTRAP_MAX_N:
            out["median_ci95"] = list(order_statistic_median_ci(a))
            out["median_ci_method"] = "order statistics (n too large for the bootstrap)"
        else:
            out["median_ci95"] = list(bootstrap_median_ci(a, rng, resamples))
    return out


def order_statistic_median_ci(values, level: float = CI_LEVEL) -> tuple[float, float]:
    """Distribution-free CI of the median from order statistics (normal approximation of
    the binomial): the sorted values at ranks n/2 -+ z sqrt(n)/2. Used instead of the
    bootstrap above BOOTSTRAP_MAX_N values (per-cell delays: millions of chunks)."""
    a = np.sort(_arr(values))
    n = a.size
    if n == 0:
        raise ValueError("CI of an empty sample")
    z = float(sps.norm.ppf(0.5 + level / 2.0))
    lo = max(0, int(math.floor(n / 2.0 - z * math.sqrt(n) / 2.0)))
    hi = min(n - 1, int(math.ceil(n / 2.0 + z * math.sqrt(n) / 2.0)))
    return float(a[lo]), float(a[hi])


def pct_change(value: float | None, baseline: float | None) -> float | None:
    """100 (value - baseline) / baseline, or None if either is missing or baseline is 0."""
    if value is None or baseline is None or baseline == 0:
        return None
    if not (math.isfinite(value) and math.isfinite(baseline)):
        return None
    return 100.0 * (value - baseline) / baseline


def two_sample_tests(sample, baseline) -> dict | None:
    """KS and Mann-Whitney U of ``sample`` against ``baseline`` (both two-sided).

    Returns {"ks_statistic", "ks_pvalue", "mwu_statistic", "mwu_pvalue"}, or None when either
    sample is empty.
    """
    a, b = _arr(sample), _arr(baseline)
    if a.size == 0 or b.size == 0:
        return None
    ks = sps.ks_2samp(a, b, alternative="two-sided", method="auto")
    mw = sps.mannwhitneyu(a, b, alternative="two-sided", method="auto")
    return {"ks_statistic": float(ks.statistic), "ks_pvalue": float(ks.pvalue),
            "mwu_statistic": float(mw.statistic), "mwu_pvalue": float(mw.pvalue)}


def moving_average_max(t, nbytes, window_s: float = 30.0, start: float | None = None) -> float | None:
    """Maximum moving average rate (bytes per second) over windows of ``window_s`` seconds.

    ``t`` are the sample times (the end of each sampling interval), ``nbytes`` the bytes of
    each interval. A window ending at sample time t_i holds the samples with t in
    (t_i - window_s, t_i]; its average is their sum / window_s. Only complete windows count:
    those starting at or after ``start`` (the end of the warm-up; samples at or before it are
    dropped). Without ``start`` a window may begin where the first sample's interval began
    (its time minus the median sampling interval). Missing samples count as zero bytes.
    Returns None when no complete window fits; raises ValueError on arrays of unequal length.
    """
    t = np.asarray(t, dtype=float)
    b = np.asarray(nbytes, dtype=float)
    if t.size != b.size:
        raise ValueError("t and nbytes differ in length")
    order = np.argsort(t, kind="stable")
    t, b = t[order], b[order]
    if start is not None:
        keep = t > start
        t, b = t[keep], b[keep]
    if t.size == 0:
        return None
    if start is None:
        # The first sample covers an interval ending at t[0]; treat its start as that minus
        # the typical sampling interval, so a window may begin there.
        step = float(np.median(np.diff(t))) if t.size > 1 else 0.0
        start = t[0] - step
    eps = 1e-6
    csum = np.concatenate([[0.0], np.cumsum(b)])
    first = np.searchsorted(t, t - window_s + eps, side="left")
    rates = (csum[1:] - csum[first]) / window_s
    complete = t - window_s >= start - eps
    if not complete.any():
        return None
    return float(rates[complete].max())


def ecdf(values) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF: sorted values x and y[i] = (i + 1) / n."""
    x = np.sort(_arr(values))
    y = np.arange(1, x.size + 1) / x.size if x.size else np.array([])
    return x, y


# -- inference with the repetition as the unit of replication --------------------------------
#
# Samples inside one repetition are not independent (queue waits seconds apart share one
# queue; transfers share one network's state), so every test and interval below treats one
# repetition as one observation: a per-repetition summary (median, p90, mean or the ratio
# wait per cell), compared across repetitions. See docs/statistics.md for the reasoning.

ALPHA = 0.05
POWER = 0.80
MIN_REPS = 3            # per arm: below this, no test (see not_enough_reason)
TARGET_EFFECT_PCT = 10.0
PERMUTATION_EXACT_MAX = 20_000
PERMUTATION_RESAMPLES = 10_000
MAX_REPS_SEARCHED = 1000
# Equivalence ("no change") margin, symmetric on the log (ratio) scale: two arms count as
# equivalent when the TOST shows the ratio variant / baseline inside [1 / 1.1, 1.1] (on the
# linear scale: the difference inside +-10% of the baseline's mean). Overridable per call.
EQUIVALENCE_MARGIN_PCT = 10.0
# "Rough size agrees" with a published change: the ratio ours / paper's (both as ratios
# variant / baseline) shown inside [1 / 2, 2] by the same two one-sided tests.
SIZE_AGREEMENT_FACTOR = 2.0
SIGNFLIP_EXACT_MAX_BLOCKS = 16       # 2^16 sign patterns; above, Monte Carlo


def not_enough_reason(n: int, n_baseline: int) -> str:
    """The report's sentence for a comparison with fewer than MIN_REPS repetitions in an arm."""
    return (f"not enough repetitions ({n} vs {n_baseline} with data; the test needs at least "
            f"{MIN_REPS} per arm, so that each arm's between-repetition variance has 2 degrees "
            f"of freedom; with 2 per arm no exact test can reach p < {ALPHA} either)")


def choose_scale(*arms) -> str:
    """'log' when every per-repetition summary of every arm is > 0 (times, rates: effects are
    multiplicative and the log evens out the variance), else 'linear'."""
    vals = np.concatenate([_arr(a) for a in arms]) if arms else np.array([])
    return "log" if vals.size and (vals > 0).all() else "linear"


def _transform(a, scale: str) -> np.ndarray:
    a = _arr(a)
    return np.log(a) if scale == "log" else a


def arm_estimate(values, scale: str, level: float = CI_LEVEL) -> dict:
    """Centre of one arm's per-repetition summaries with a t interval across repetitions:
    the geometric mean on the log scale, the mean on the linear scale. {"n", "estimate",
    "ci95" ([lo, hi] or None below 2 repetitions)}."""
    x = _transform(values, scale)
    n = int(x.size)
    if n == 0:
        return {"n": 0, "estimate": None, "ci95": None}
    m = float(x.mean())
    back = (lambda v: float(math.exp(v))) if scale == "log" else float
    ci = None
    if n >= 2:
        h = float(sps.t.ppf(0.5 + level / 2, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
        ci = [back(m - h), back(m + h)]
    return {"n": n, "estimate": back(m), "ci95": ci}


def permutation_pvalue(x, y, rng: np.random.Generator | None = None) -> tuple[float, float]:
    """Two-sided permutation test of the difference in means of x and y (already on the test
    scale). Exact over all C(n+m, n) relabellings up to PERMUTATION_EXACT_MAX, else Monte
    Carlo (PERMUTATION_RESAMPLES, p = (1 + hits) / (1 + resamples)). Returns (p, the smallest
    p this design can give at all)."""
    x, y = _arr(x), _arr(y)
    n, m = x.size, y.size
    pool = np.concatenate([x, y])
    obs = abs(x.mean() - y.mean())
    total = math.comb(n + m, n)
    tol = 1e-12 * max(1.0, float(np.abs(pool).max()))
    if total <= PERMUTATION_EXACT_MAX:
        import itertools
        idx = np.array(list(itertools.combinations(range(n + m), n)))
        mask = np.zeros((len(idx), n + m), dtype=bool)
        mask[np.arange(len(idx))[:, None], idx] = True
        sx = (mask * pool).sum(axis=1)
        diffs = np.abs(sx / n - (pool.sum() - sx) / m)
        p = float((diffs >= obs - tol).sum() / total)
    else:
        rng = rng or np.random.default_rng(0)
        perms = rng.permuted(np.tile(pool, (PERMUTATION_RESAMPLES, 1)), axis=1)
        hits = int((np.abs(perms[:, :n].mean(axis=1) - perms[:, n:].mean(axis=1)) >= obs - tol).sum())
        p = float((1 + hits) / (1 + PERMUTATION_RESAMPLES))
    return p, (2.0 if n == m else 1.0) / total


def compare_reps(values, baseline, scale: str | None = None, level: float = CI_LEVEL,
                 rng: np.random.Generator | None = None, margin_pct: float | None = None) -> dict:
    """The inferential comparison of one arm's per-repetition summaries with the baseline's.

    Welch's t-test on the (log-)summaries: each summary is a median or mean of many samples,
    so close to normal, and Welch does not assume equal variances. On the log scale the
    difference of means is the log of a ratio of geometric means, so ``change_pct`` and its
    interval are a % change; on the linear scale they are the difference over the baseline's
    mean (its own uncertainty ignored). Also the exact permutation p-value as a
    distribution-free check (not used for decisions), and the equivalence test (TOST, see
    ``equivalence``) against ``margin_pct`` (default EQUIVALENCE_MARGIN_PCT).

    The report uses it where the repetitions of the two arms are not paired blocks
    (``compare_paired`` is the test where they are).

    Returns {"status": "tested", "test": "welch", "n", "n_baseline", "scale", "change_pct",
    "change_ci95", "welch_t", "df", "pvalue", "permutation_pvalue", "permutation_min_pvalue",
    "equivalence"} or
    {"status": "not enough repetitions", "n", "n_baseline", "reason"} or
    {"status": "no variance", ...} when both arms are constant.
    """
    x0, y0 = _arr(values), _arr(baseline)
    scale = scale or choose_scale(x0, y0)
    x, y = _transform(x0, scale), _transform(y0, scale)
    n, m = int(x.size), int(y.size)
    base = {"test": "welch", "n": n, "n_baseline": m, "scale": scale}
    if n < MIN_REPS or m < MIN_REPS:
        return {"status": "not enough repetitions", **base, "reason": not_enough_reason(n, m)}
    vx, vy = float(x.var(ddof=1)), float(y.var(ddof=1))
    d = float(x.mean() - y.mean())
    se2 = vx / n + vy / m
    if se2 <= 0:
        return {"status": "no variance", **base, "reason": "every repetition gave the same value in both arms",
                "change_pct": _pct_from(d, scale, y), "change_ci95": None, "welch_t": None, "df": None,
                "pvalue": None, "permutation_pvalue": None, "permutation_min_pvalue": None, "equivalence": None}
    se = math.sqrt(se2)
    df = se2 ** 2 / ((vx / n) ** 2 / (n - 1) + (vy / m) ** 2 / (m - 1))
    t = d / se
    p = float(2 * sps.t.sf(abs(t), df))
    h = float(sps.t.ppf(0.5 + level / 2, df)) * se
    perm_p, perm_min = permutation_pvalue(x, y, rng)
    return {"status": "tested", **base, "change_pct": _pct_from(d, scale, y),
            "change_ci95": [_pct_from(d - h, scale, y), _pct_from(d + h, scale, y)],
            "welch_t": float(t), "df": float(df), "pvalue": p,
            "permutation_pvalue": perm_p, "permutation_min_pvalue": perm_min,
            "equivalence": equivalence(d, se, df, scale, float(y.mean()), margin_pct)}


def _pct_from(d: float, scale: str, y: np.ndarray) -> float | None:
    """A difference on the test scale as a % change: e^d - 1 (log), d / mean(baseline) (linear)."""
    if scale == "log":
        return 100.0 * math.expm1(d)
    mean = float(y.mean())
    return 100.0 * d / mean if mean else None


def equivalence(d: float, se: float, df: float, scale: str, ref_mean: float | None = None,
                margin_pct: float | None = None, alpha: float = ALPHA) -> dict | None:
    """Two one-sided tests (TOST, Schuirmann 1987) of "no change larger than the margin".

    ``d`` is the estimated difference on the test scale with standard error ``se`` and
    ``df`` degrees of freedom. The margin is +-log(1 + margin_pct/100) on the log scale (a
    ratio within [1/(1+m), 1+m]) or +-margin_pct% of ``ref_mean`` on the linear scale. Both
    one-sided nulls (difference <= -margin, difference >= +margin) are rejected at ``alpha``
    exactly when the (1 - 2 alpha) interval lies inside the margin, so that interval is given.

    Returns {"margin_pct", "alpha", "pvalue" (the larger one-sided p), "equivalent",
    "ci90" ([lo %, hi %], the 1 - 2 alpha interval as a % change)}, or None when the margin
    is undefined (linear scale, reference mean 0) or se is not positive."""
    m = EQUIVALENCE_MARGIN_PCT if margin_pct is None else float(margin_pct)
    if se is None or not se > 0 or not math.isfinite(se):
        return None
    if scale == "log":
        bound = math.log1p(m / 100.0)
    else:
        if not ref_mean:
            return None
        bound = abs(ref_mean) * m / 100.0
    p_low = float(sps.t.sf((d + bound) / se, df))       # H0: d <= -bound
    p_high = float(sps.t.cdf((d - bound) / se, df))     # H0: d >= +bound
    p = max(p_low, p_high)
    h = float(sps.t.ppf(1 - alpha, df)) * se

    def pct(v):
        return 100.0 * math.expm1(v) if scale == "log" else 100.0 * v / ref_mean
    return {"margin_pct": m, "alpha": alpha, "pvalue": p, "equivalent": bool(p < alpha),
            "ci90": [pct(d - h), pct(d + h)]}


def ratio_within_factor(ci_log: tuple[float, float], target_pct: float,
                        factor: float = SIZE_AGREEMENT_FACTOR) -> str:
    """Whether an interval of log(variant / baseline) (``ci_log``) puts our ratio within a
    factor ``factor`` of a published change ``target_pct``: the interval of
    log(ours / paper's) = ci_log - log(1 + target/100) compared with +-log(factor).
    "inside" (the whole interval within: size agrees), "outside" (none of it within: size
    differs) or "overlaps" (the interval is too wide to tell: inconclusive)."""
    if target_pct <= -100:
        return "overlaps"
    shift = math.log1p(target_pct / 100.0)
    lo, hi = ci_log[0] - shift, ci_log[1] - shift
    b = math.log(factor)
    if -b <= lo and hi <= b:
        return "inside"
    if hi < -b or lo > b:
        return "outside"
    return "overlaps"


def signflip_pvalue(d, rng: np.random.Generator | None = None) -> tuple[float, float]:
    """Two-sided sign-flip permutation test of the mean of paired differences ``d`` (test
    scale): under "no effect" each block's difference is as likely +d_k as -d_k, so the
    observed |mean| is ranked among all 2^n sign patterns (exact up to
    SIGNFLIP_EXACT_MAX_BLOCKS blocks, else PERMUTATION_RESAMPLES random patterns, p = (1 +
    hits) / (1 + resamples)). Returns (p, the smallest p this design can give: 2 / 2^n)."""
    d = _arr(d)
    n = d.size
    if n == 0:
        return 1.0, 1.0
    obs = abs(float(d.mean()))
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    if n <= SIGNFLIP_EXACT_MAX_BLOCKS:
        signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
        means = np.abs(signs @ d) / n
        p = float((means >= obs - tol).mean())
    else:
        rng = rng or np.random.default_rng(0)
        signs = rng.choice([-1.0, 1.0], size=(PERMUTATION_RESAMPLES, n))
        hits = int((np.abs(signs @ d) / n >= obs - tol).sum())
        p = float((1 + hits) / (1 + PERMUTATION_RESAMPLES))
    return p, min(1.0, 2.0 / 2 ** n)


def compare_paired(values, baseline, scale: str | None = None, level: float = CI_LEVEL,
                   rng: np.random.Generator | None = None, margin_pct: float | None = None) -> dict:
    """The comparison of two arms whose repetitions are paired blocks: ``values[k]`` and
    ``baseline[k]`` are repetition k of the variant and of the baseline, run together with
    the same seed, paths and schedule. Pairs with a missing (non-finite) value are dropped.

    The per-block difference on the test scale, d_k = log(values[k]) - log(baseline[k])
    (linear: values[k] - baseline[k]), removes what the block shares (network state, the
    machine's load at that time); a one-sample t-test of mean(d) = 0 with n - 1 degrees of
    freedom is the test, its interval exp(mean(d) +- t sd(d)/sqrt(n)) - 1 the % change (linear:
    over the baseline's mean). The exact sign-flip permutation p-value is a distribution-free
    check (not used for decisions); ``equivalence`` is the TOST against ``margin_pct``.

    Returns {"status": "tested", "test": "paired", "n", "n_baseline" (both = the blocks),
    "scale", "change_pct", "change_ci95", "paired_t", "df", "pvalue", "sd_diff",
    "permutation_pvalue", "permutation_min_pvalue", "equivalence"}, or "not enough
    repetitions" (fewer than MIN_REPS blocks) / "no variance" (every block gave the same
    difference)."""
    x0, y0 = np.asarray(values, dtype=float).ravel(), np.asarray(baseline, dtype=float).ravel()
    if x0.size != y0.size:
        raise ValueError("paired arms differ in length")
    keep = np.isfinite(x0) & np.isfinite(y0)
    x0, y0 = x0[keep], y0[keep]
    scale = scale or choose_scale(x0, y0)
    y = _transform(y0, scale)
    d = _transform(x0, scale) - y
    n = int(d.size)
    base = {"test": "paired", "n": n, "n_baseline": n, "scale": scale}
    if n < MIN_REPS:
        return {"status": "not enough repetitions", **base, "reason": not_enough_reason(n, n)}
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if not sd > 1e-12 * max(1.0, abs(mean)):     # rounding of equal log ratios is not variance
        return {"status": "no variance", **base, "reason": "every block gave the same difference",
                "change_pct": _pct_from(mean, scale, y), "change_ci95": None, "paired_t": None, "df": None,
                "pvalue": None, "sd_diff": sd, "permutation_pvalue": None, "permutation_min_pvalue": None,
                "equivalence": None}
    se, df = sd / math.sqrt(n), n - 1
    t = mean / se
    p = float(2 * sps.t.sf(abs(t), df))
    h = float(sps.t.ppf(0.5 + level / 2, df)) * se
    perm_p, perm_min = signflip_pvalue(d, rng)
    return {"status": "tested", **base, "change_pct": _pct_from(mean, scale, y),
            "change_ci95": [_pct_from(mean - h, scale, y), _pct_from(mean + h, scale, y)],
            "paired_t": float(t), "df": float(df), "pvalue": p, "sd_diff": sd,
            "permutation_pvalue": perm_p, "permutation_min_pvalue": perm_min,
            "equivalence": equivalence(mean, se, df, scale, float(y.mean()), margin_pct)}


def power_paired(delta: float, sd_diff: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test (one-sample t on n block differences with sd
    ``sd_diff``) against a true mean difference ``delta``: noncentral t with n - 1 degrees
    of freedom and noncentrality delta / (sd_diff / sqrt(n))."""
    df = n - 1
    nc = abs(delta) / (sd_diff / math.sqrt(n))
    crit = float(sps.t.ppf(1 - alpha / 2, df))
    if nc > crit + 40:
        return 1.0
    pw = float(sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc))
    return 1.0 if math.isnan(pw) else pw


def blocks_needed(delta: float, sd_diff: float | None, alpha: float = ALPHA, power: float = POWER,
                  paired: bool = True) -> int | None:
    """Blocks (paired) or repetitions per arm (``paired=False``: two-sample t with
    ``sd_diff`` the between-repetition sd) for a two-sided test to detect ``delta`` (test
    scale) with ``power``; at least MIN_REPS; None above MAX_REPS_SEARCHED or without sd."""
    if sd_diff is None or delta is None:
        return None
    if sd_diff <= 0:
        return MIN_REPS
    if delta == 0:
        return None
    pw = power_paired if paired else _power
    for n in range(MIN_REPS, MAX_REPS_SEARCHED + 1):
        if pw(abs(delta), sd_diff, n, alpha) >= power:
            return n
    return None


def ci_halfwidth(sd: float, n: int, paired: bool = True, level: float = CI_LEVEL) -> float | None:
    """Half-width (test scale) of the ``level`` interval of the difference with n blocks
    (paired: t_{n-1} sd / sqrt(n)) or n repetitions per arm (two-sample: t_{2n-2} sd
    sqrt(2/n)), if the sd stayed what it is; None below 2."""
    if sd is None or n < 2:
        return None
    if paired:
        return float(sps.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return float(sps.t.ppf(0.5 + level / 2, 2 * n - 2)) * sd * math.sqrt(2.0 / n)


def plan(sd: float | None, df: int, n_now: int, scale: str, observed_pct: float | None,
         ref_mean: float | None = None, paired: bool = True, target_pct: float = TARGET_EFFECT_PCT,
         alpha: float = ALPHA, power: float = POWER) -> dict:
    """Repetitions needed and interval width for one comparison, from its own spread.

    ``sd``: the sd of the block differences (paired) or the pooled between-repetition sd of
    the two arms (unpaired), on the test scale, with ``df`` degrees of freedom; ``n_now`` the
    blocks (repetitions per arm) this run has. For the ``observed_pct`` change and for a
    stated minimum effect ``target_pct`` (+- on the log scale the same blocks: a decrease of
    1 - 1/(1+m) is the same log distance), the blocks needed for ``power`` at two-sided
    ``alpha``; and the +- half-width of the 95% interval at n_now and at the blocks the target
    needs (as % on the log scale: 100 (e^h - 1), the upper side; the lower is 100 (1 - e^-h)).

    Returns {"basis": "paired" | "unpaired", "unit": "blocks" | "repetitions per arm", "sd",
    "df", "n_now", "alpha", "power", "target_change_pct", "observed_change_pct",
    "n_for_observed", "n_for_target", "ci95_halfwidth_pct_now", "ci95_halfwidth_pct_at_target",
    ["note"]}."""
    out = {"basis": "paired" if paired else "unpaired", "unit": "blocks" if paired else "repetitions per arm",
           "sd": sd, "df": df, "n_now": n_now, "alpha": alpha, "power": power, "target_change_pct": target_pct,
           "observed_change_pct": observed_pct, "n_for_observed": None, "n_for_target": None,
           "ci95_halfwidth_pct_now": None, "ci95_halfwidth_pct_at_target": None}
    if sd is None:
        out["note"] = "no spread estimate: fewer than 2 " + ("blocks" if paired else "repetitions in each arm")
        return out
    if scale == "linear" and not ref_mean:
        out["note"] = "baseline mean 0: a % change is undefined"
        return out

    def to_test(pct):
        if pct is None:
            return None
        return math.log1p(pct / 100.0) if scale == "log" else pct / 100.0 * ref_mean

    def to_pct(h):
        if h is None:
            return None
        return 100.0 * math.expm1(h) if scale == "log" else 100.0 * h / abs(ref_mean)
    if observed_pct is not None and observed_pct > -100:
        out["n_for_observed"] = blocks_needed(to_test(observed_pct), sd, alpha, power, paired)
    out["n_for_target"] = blocks_needed(to_test(target_pct), sd, alpha, power, paired)
    out["ci95_halfwidth_pct_now"] = to_pct(ci_halfwidth(sd, n_now, paired))
    if out["n_for_target"]:
        out["ci95_halfwidth_pct_at_target"] = to_pct(ci_halfwidth(sd, out["n_for_target"], paired))
    return out


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None): the k-th smallest of K p-values
    is multiplied by K - k + 1, running maximum taken, capped at 1. Rejecting adjusted
    p < alpha keeps the family-wise error rate at alpha under any dependence between tests."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    k = len(idx)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda j: pvalues[j])):
        running = max(running, min(1.0, (k - rank) * pvalues[i]))
        out[i] = running
    return out


def pooled_sd(arms: list) -> tuple[float | None, int]:
    """Pooled within-arm standard deviation of per-repetition summaries (each arm around its
    own mean) and its degrees of freedom sum(n_i - 1); (None, 0) without any."""
    ss, df = 0.0, 0
    for a in arms:
        a = _arr(a)
        if a.size >= 2:
            ss += float(((a - a.mean()) ** 2).sum())
            df += a.size - 1
    return (math.sqrt(ss / df), df) if df else (None, 0)


def _power(delta: float, sd: float, n: int, alpha: float) -> float:
    """Power of a two-sided two-sample t-test, n per arm, true difference delta (noncentral t)."""
    df = 2 * n - 2
    nc = delta / (sd * math.sqrt(2.0 / n))
    crit = float(sps.t.ppf(1 - alpha / 2, df))
    if abs(nc) > crit + 40:          # scipy's nct is NaN out there; the power is 1 anyway
        return 1.0
    pw = float(sps.nct.sf(crit, df, abs(nc)) + sps.nct.cdf(-crit, df, abs(nc)))
    return 1.0 if math.isnan(pw) else pw


def min_detectable(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """Smallest true difference (on the test scale) a two-sided t-test with n repetitions per
    arm detects with the given power; None when n < MIN_REPS."""
    if n < MIN_REPS or not sd or sd <= 0:
        return None if n < MIN_REPS else 0.0
    from scipy.optimize import brentq
    hi = sd
    while _power(hi, sd, n, alpha) < power:
        hi *= 2
    return float(brentq(lambda d: _power(d, sd, n, alpha) - power, 0.0, hi, xtol=1e-9 * sd))


def reps_needed(delta: float, sd: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Repetitions per arm for a two-sided t-test to detect ``delta`` (test scale) with the
    given power (at least MIN_REPS); None if more than MAX_REPS_SEARCHED."""
    if sd is None:
        return None
    if sd <= 0:
        return MIN_REPS
    for n in range(MIN_REPS, MAX_REPS_SEARCHED + 1):
        if _power(abs(delta), sd, n, alpha) >= power:
            return n
    return None


def power_analysis(arms: list, scale: str, n_design: int, family_size: int,
                   target_pct: float = TARGET_EFFECT_PCT, alpha: float = ALPHA, power: float = POWER) -> dict:
    """From the run's own between-repetition variance (pooled over its variants): the smallest
    % change this design (``n_design`` repetitions per arm) detects with ``power`` at ``alpha``
    and at alpha / family_size (what the most significant test of a Holm family must beat),
    and the repetitions per arm a ``target_pct`` change needs at each level."""
    arms_t = [_transform(a, scale) for a in arms]
    sd, df = pooled_sd(arms_t)
    out = {"scale": scale, "sd": sd, "df": df, "n_design": n_design, "alpha": alpha, "power": power,
           "family_size": family_size, "target_change_pct": target_pct}
    if sd is None:
        out["note"] = "no variance estimate: no variant has 2 repetitions with data"
        return out
    ref = float(np.mean(np.concatenate(arms_t))) if scale == "linear" else None
    if sd == 0:
        out["note"] = "no variation: every repetition gave the same value"
        return out
    if scale == "linear" and not ref:
        out["note"] = "mean 0: a % change is undefined"
        return out

    def to_pct(d):
        if d is None:
            return None
        return 100.0 * math.expm1(d) if scale == "log" else (100.0 * d / ref if ref else None)

    def from_pct(p):
        return math.log1p(p / 100.0) if scale == "log" else (p / 100.0 * ref if ref else None)

    fam_alpha = alpha / max(1, family_size)
    # On the log scale a detectable difference d is an increase of e^d - 1 or a decrease of
    # 1 - e^-d; both are given (mde_pct is the increase).
    d1, d2 = min_detectable(sd, n_design, alpha, power), min_detectable(sd, n_design, fam_alpha, power)
    out["mde_pct"], out["mde_pct_family"] = to_pct(d1), to_pct(d2)
    if scale == "log":
        out["mde_pct_decrease"] = to_pct(-d1) if d1 is not None else None
        out["mde_pct_family_decrease"] = to_pct(-d2) if d2 is not None else None
    delta = from_pct(target_pct)
    out["reps_for_target"] = reps_needed(delta, sd, alpha, power) if delta is not None else None
    out["reps_for_target_family"] = reps_needed(delta, sd, fam_alpha, power) if delta is not None else None
    return out


def cluster_bootstrap_median_ci(per_rep: list, rng: np.random.Generator, resamples: int = 500,
                                level: float = CI_LEVEL) -> tuple[float, float] | None:
    """CI of the pooled median that resamples whole repetitions (with replacement), pools the
    chosen repetitions' samples and takes the median: the within-repetition dependence stays
    inside each resampled block. Exact over all multisets of repetitions when there are at
    most 6 (weighted by their multinomial probability), else ``resamples`` Monte Carlo draws.
    None with fewer than 2 repetitions holding data."""
    reps = [np.sort(_arr(a)) for a in per_rep]
    reps = [a for a in reps if a.size]
    k = len(reps)
    if k < 2:
        return None
    if sum(a.size for a in reps) > _CLUSTER_MAX_POINTS:
        # Large repetitions enter as 1000 quantiles each, weighted by their sample count: the
        # median of the pooled mixture moves by less than a 1/1000 quantile step.
        grid = (np.arange(_CLUSTER_GRID) + 0.5) / _CLUSTER_GRID
        pts = [np.quantile(a, grid) if a.size > _CLUSTER_GRID else a for a in reps]
        pw = np.concatenate([np.full(p.size, a.size / p.size) for a, p in zip(reps, pts)])
        reps = pts
    else:
        pw = np.ones(sum(a.size for a in reps))
    vals = np.concatenate(reps)
    labels = np.concatenate([np.full(a.size, i) for i, a in enumerate(reps)])
    order = np.argsort(vals, kind="stable")
    vals, labels, pw = vals[order], labels[order], pw[order]
    if k <= 6:
        import itertools
        counts, probs = [], []
        for combo in itertools.combinations_with_replacement(range(k), k):
            c = np.bincount(combo, minlength=k)
            counts.append(c)
            probs.append(math.factorial(k) / np.prod([math.factorial(int(j)) for j in c]) / k ** k)
        counts, probs = np.array(counts, dtype=float), np.array(probs)
    else:
        counts = np.array([np.bincount(rng.integers(0, k, k), minlength=k) for _ in range(resamples)], dtype=float)
        probs = np.full(resamples, 1.0 / resamples)
    meds = np.empty(len(counts))
    for j, c in enumerate(counts):
        w = np.cumsum(c[labels] * pw)
        half = w[-1] / 2.0
        lo = int(np.searchsorted(w, half, side="left"))
        # An even total weight splits between two values, as np.median does.
        hi = int(np.searchsorted(w, half, side="right")) if abs(w[lo] - half) < 1e-9 * w[-1] else lo
        meds[j] = 0.5 * (vals[lo] + vals[min(hi, vals.size - 1)])
    srt = np.argsort(meds)
    cdf = np.cumsum(probs[srt])
    tail = (1.0 - level) / 2.0
    lo = meds[srt][min(int(np.searchsorted(cdf, tail - 1e-12)), len(srt) - 1)]
    hi = meds[srt][min(int(np.searchsorted(cdf, 1.0 - tail - 1e-12)), len(srt) - 1)]
    return float(lo), float(hi)
