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
- Tests: two-sample Kolmogorov-Smirnov (scipy.stats.ks_2samp, two-sided, method "auto") and
  Mann-Whitney U (scipy.stats.mannwhitneyu, two-sided, method "auto", continuity correction);
  the U statistic reported is the one of the variant's sample (the first argument).

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
