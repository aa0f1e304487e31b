"""torbed.analysis.stats against values computed by hand (and scipy called directly)."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from torbed.analysis import stats


# Quantiles: numpy "linear" (Hyndman & Fan type 7): h = (n - 1) q, interpolate x[floor h]..x[ceil h].
@pytest.mark.parametrize("values,q,expected", [
    ([1, 2, 3, 4], 0.5, 2.5),             # h = 1.5 -> 2 + 0.5 * (3 - 2)
    ([1, 2, 3, 4], 0.25, 1.75),           # h = 0.75 -> 1 + 0.75 * (2 - 1)
    ([10, 20, 30, 40, 50], 0.9, 46.0),    # h = 3.6 -> 40 + 0.6 * 10
    ([10, 20, 30, 40, 50], 0.99, 49.6),   # h = 3.96 -> 40 + 0.96 * 10
    ([5, 1, 3], 0.5, 3.0),                # unsorted input; odd n: the middle value
    ([7], 0.99, 7.0),
])
def test_quantile_linear(values, q, expected):
    assert stats.quantile(values, q) == pytest.approx(expected)


def test_quantile_empty_raises():
    with pytest.raises(ValueError):
        stats.quantile([], 0.5)


def test_describe_by_hand():
    d = stats.describe([1, 2, 3, 4, 100])
    assert d["n"] == 5
    assert d["mean"] == pytest.approx(22.0)        # 110 / 5
    assert d["median"] == 3.0
    assert (d["min"], d["max"]) == (1.0, 100.0)
    assert d["p25"] == 2.0                          # h = 1
    assert d["p75"] == 4.0                          # h = 3
    assert d["p90"] == pytest.approx(61.6)          # h = 3.6 -> 4 + 0.6 * 96
    assert d["p99"] == pytest.approx(96.16)         # h = 3.96 -> 4 + 0.96 * 96
    assert "median_ci95" not in d


def test_describe_ignores_non_finite_and_empty():
    assert stats.describe([]) == {"n": 0}
    assert stats.describe([float("nan"), 2.0, float("inf")])["n"] == 1


@pytest.mark.parametrize("value,base,expected", [
    (2.0, 4.0, -50.0), (6.0, 4.0, 50.0), (4.0, 4.0, 0.0), (1.75, 2.6, -32.6923076923),
    (1.0, 0.0, None), (None, 1.0, None), (1.0, None, None),
])
def test_pct_change(value, base, expected):
    got = stats.pct_change(value, base)
    assert got == (None if expected is None else pytest.approx(expected))


def test_bootstrap_reproducible_and_bracketing():
    x = np.random.default_rng(0).lognormal(0.0, 0.5, 41)
    med = float(np.median(x))
    a = stats.bootstrap_median_ci(x, stats.rng_for(7, "m", "v"), 2000)
    b = stats.bootstrap_median_ci(x, stats.rng_for(7, "m", "v"), 2000)
    assert a == b
    assert a[0] < med < a[1]
    assert x.min() <= a[0] and a[1] <= x.max()


def test_bootstrap_matches_a_plain_loop():
    """The chunked vectorized bootstrap equals the textbook loop with the same draws."""
    x = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])
    got = stats.bootstrap_median_ci(x, stats.rng_for(1, "k"), 500)
    rng = stats.rng_for(1, "k")
    idx = rng.integers(0, x.size, size=(500, x.size))      # same draws, one block
    meds = [np.median(x[row]) for row in idx]
    lo, hi = np.quantile(meds, [0.025, 0.975])
    assert got == (pytest.approx(lo), pytest.approx(hi))


def test_bootstrap_degenerate():
    assert stats.bootstrap_median_ci([2.5], stats.rng_for(0)) == (2.5, 2.5)
    assert stats.bootstrap_median_ci([4.0] * 10, stats.rng_for(0)) == (4.0, 4.0)
    with pytest.raises(ValueError):
        stats.bootstrap_median_ci([], stats.rng_for(0))


def test_two_sample_tests_by_hand_and_against_scipy():
    a = [1.0, 2.0, 3.0, 4.0, 5.0]
    b = [6.0, 7.0, 8.0, 9.0, 10.0]
    t = stats.two_sample_tests(a, b)
    # Complete separation, n = m = 5, no ties: KS D = 1, U = 0, and both exact two-sided
    # p-values are 2 / C(10, 5) = 2 / 252.
    assert t["ks_statistic"] == 1.0
    assert t["mwu_statistic"] == 0.0
    assert t["ks_pvalue"] == pytest.approx(2 / 252)
    assert t["mwu_pvalue"] == pytest.approx(2 / 252)

    rng = np.random.default_rng(3)
    x, y = rng.normal(0, 1, 40), rng.normal(0.5, 1, 55)
    t = stats.two_sample_tests(x, y)
    ks = sps.ks_2samp(x, y)
    mw = sps.mannwhitneyu(x, y, alternative="two-sided")
    assert (t["ks_statistic"], t["ks_pvalue"]) == (ks.statistic, ks.pvalue)
    assert (t["mwu_statistic"], t["mwu_pvalue"]) == (mw.statistic, mw.pvalue)
    assert stats.two_sample_tests([], y) is None


def _series(n, value, dt=0.5):
    t = np.arange(1, n + 1) * dt
    return t, np.full(n, float(value))


def test_moving_average_constant_rate():
    t, b = _series(120, 1000)                        # 1000 B every 0.5 s for 60 s = 2000 B/s
    assert stats.moving_average_max(t, b, 30.0, start=10.0) == pytest.approx(2000.0)
    assert stats.moving_average_max(t, b, 30.0) == pytest.approx(2000.0)


def test_moving_average_burst_by_hand():
    # 1000 B per 0.5 s sample for 60 s, except the 20 samples in (40, 50] with 3000 B.
    t, b = _series(120, 1000)
    b[(t > 40) & (t <= 50)] = 3000
    # Best windows (t_i - 30, t_i] contain the whole burst: 20 x 3000 + 40 x 1000 = 100000 B.
    assert stats.moving_average_max(t, b, 30.0, start=10.0) == pytest.approx(100000 / 30)
    # A warm-up ending at 25 s leaves only windows ending at >= 55 s: the window (25, 55]
    # or later still holds the whole burst.
    assert stats.moving_average_max(t, b, 30.0, start=25.0) == pytest.approx(100000 / 30)
    # Warm-up until 41 s: complete windows end at >= 71 s > 60 s: none.
    assert stats.moving_average_max(t, b, 30.0, start=41.0) is None


def test_moving_average_excludes_warmup_samples_and_counts_gaps_as_zero():
    t, b = _series(120, 1000)
    b[t <= 20] = 50_000                              # huge warm-up traffic must not count
    assert stats.moving_average_max(t, b, 30.0, start=20.0) == pytest.approx(2000.0)
    t, b = _series(120, 1000)
    keep = ~((t > 30) & (t <= 45))                   # 15 s of missing samples
    t2, b2 = t[keep], b[keep]
    # Best window after warm-up 0: (0, 30] (60 samples) -> 2000 B/s; a window across the
    # gap has fewer bytes, not a higher average.
    assert stats.moving_average_max(t2, b2, 30.0, start=0.0) == pytest.approx(2000.0)
    assert stats.moving_average_max(t2, b2, 30.0, start=14.0) == pytest.approx(30 * 1000 / 30)


def test_ecdf():
    x, y = stats.ecdf([3.0, 1.0, 2.0, float("nan")])
    assert list(x) == [1.0, 2.0, 3.0]
    assert list(y) == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_rng_for_is_stable_across_processes():
    # CRC-32 keys, not hash(): the first draw is a fixed number.
    v = stats.rng_for(7, "ttlb_s/web:small", "vanilla").random()
    assert math.isclose(v, stats.rng_for(7, "ttlb_s/web:small", "vanilla").random())
    assert v != stats.rng_for(7, "ttlb_s/web:small", "ewma-66").random()


def test_large_samples_use_the_order_statistic_median_ci():
    import numpy as np
    from torbed.analysis import stats as st
    a = np.random.default_rng(5).exponential(size=st.BOOTSTRAP_MAX_N + 1)
    d = st.describe(a, st.rng_for(1, "big"))
    lo, hi = d["median_ci95"]
    assert "order statistics" in d["median_ci_method"]
    assert lo < np.log(2) < hi and hi - lo < 0.02
    assert "median_ci_method" not in st.describe(a[:1000], st.rng_for(1, "small"))
