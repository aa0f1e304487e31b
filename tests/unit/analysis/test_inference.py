"""The inferential statistics (stats.compare_reps, holm, power, cluster bootstrap) against
independent computations, and inference.py's choice of what is tested."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from torbed.analysis import inference, stats


def test_not_enough_repetitions_gives_no_pvalue():
    r = stats.compare_reps([1.0, 1.1], [2.0, 2.1, 1.9])
    assert r["status"] == "not enough repetitions" and "pvalue" not in r
    assert "not enough repetitions" in r["reason"] and f"at least {stats.MIN_REPS}" in r["reason"]


def test_welch_on_logs_matches_scipy_and_reports_a_ratio():
    x, y = [1.0, 1.2, 0.9, 1.05], [2.0, 2.3, 1.8]
    r = stats.compare_reps(x, y)
    ref = sps.ttest_ind(np.log(x), np.log(y), equal_var=False)
    assert r["status"] == "tested" and r["scale"] == "log"
    assert r["pvalue"] == pytest.approx(ref.pvalue, rel=1e-9)
    ratio = math.exp(np.mean(np.log(x)) - np.mean(np.log(y)))
    assert r["change_pct"] == pytest.approx(100 * (ratio - 1))
    lo, hi = r["change_ci95"]
    assert lo < r["change_pct"] < hi < 0


def test_linear_scale_when_a_summary_is_not_positive():
    r = stats.compare_reps([-1.0, 0.5, 0.2], [3.0, 2.5, 3.5])
    assert r["scale"] == "linear"
    assert r["change_pct"] == pytest.approx(100 * (np.mean([-1.0, 0.5, 0.2]) - 3.0) / 3.0)


def test_exact_permutation_pvalue():
    p, pmin = stats.permutation_pvalue([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert (p, pmin) == (pytest.approx(0.1), pytest.approx(0.1))   # 2 of C(6,3) = 20 splits
    p, _ = stats.permutation_pvalue([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    assert p == 1.0


def test_holm_step_down():
    adj = stats.holm([0.01, 0.04, None, 0.03, 0.2])
    # sorted 0.01, 0.03, 0.04, 0.2 -> x4, x3, x2, x1 with running maximum
    assert adj == [pytest.approx(0.04), pytest.approx(0.09), None, pytest.approx(0.09), pytest.approx(0.2)]


def test_min_detectable_has_the_stated_power_and_reps_needed_agrees():
    sd = 0.1
    d = stats.min_detectable(sd, 5)
    assert stats._power(d, sd, 5, 0.05) == pytest.approx(0.8, abs=1e-6)
    assert stats.min_detectable(sd, 10) < d                       # more repetitions, smaller
    assert stats.reps_needed(d, sd) == 5
    assert stats.min_detectable(sd, 2) is None                    # below MIN_REPS: no design


def test_power_simulated():
    """The power the formula promises is what Welch on simulated repetitions achieves."""
    rng = np.random.default_rng(5)
    sd, n = 0.2, 6
    d = stats.min_detectable(sd, n)
    hits = sum(stats.compare_reps(np.exp(rng.normal(d, sd, n)), np.exp(rng.normal(0, sd, n)))["pvalue"] < 0.05
               for _ in range(600))
    assert 0.70 < hits / 600 < 0.88          # Welch loses a little power against the pooled t


def test_power_analysis_percentages():
    arms = [[1.0, 1.1, 0.9], [2.0, 2.2, 1.8]]
    p = stats.power_analysis(arms, "log", n_design=3, family_size=4)
    sd, df = stats.pooled_sd([np.log(a) for a in arms])
    assert p["sd"] == pytest.approx(sd) and p["df"] == df == 4
    assert p["mde_pct"] == pytest.approx(100 * math.expm1(stats.min_detectable(sd, 3)))
    assert p["mde_pct_family"] > p["mde_pct"] > 0 > p["mde_pct_decrease"]
    assert p["reps_for_target_family"] >= p["reps_for_target"] >= stats.MIN_REPS


def test_cluster_bootstrap_median_ci():
    rng = np.random.default_rng(1)
    assert stats.cluster_bootstrap_median_ci([np.arange(10.0)], rng) is None
    same = [np.arange(101.0)] * 3
    assert stats.cluster_bootstrap_median_ci(same, rng) == (50.0, 50.0)
    # Two repetitions far apart: the exact bootstrap puts 1/4 on each rep alone, so the 95%
    # interval spans both repetitions' medians.
    lo, hi = stats.cluster_bootstrap_median_ci([np.full(11, 1.0), np.full(11, 9.0)], rng)
    assert (lo, hi) == (1.0, 9.0)
    # Large repetitions (quantile-grid path) agree with the plain computation.
    big = [rng.normal(i, 1.0, 30_000) for i in range(3)]
    small = [np.sort(b)[::30] for b in big]
    a, b = stats.cluster_bootstrap_median_ci(big, rng), stats.cluster_bootstrap_median_ci(small, rng)
    assert a == pytest.approx(b, abs=0.02)


def test_primary_statistics_and_family():
    assert inference.primary_stat("ttlb_s") == "median"
    assert inference.primary_stat("cell_wait_ms") == "wait_per_cell"
    assert inference.primary_stat("cell_delay_ms") == "mean"
    assert inference.in_family("ttlb_s") and not inference.in_family("ttlb_stream_s")
    assert not inference.in_family("sched_error_ms")


def test_apply_holm_sets_headline_only_for_family():
    items = [{"inference": {"status": "tested", "in_family": True, "pvalue": 0.001}},
             {"inference": {"status": "tested", "in_family": True, "pvalue": 0.06}},
             {"inference": {"status": "tested", "in_family": False, "pvalue": 1e-9}},
             {"inference": {"status": "not enough repetitions", "in_family": True}}]
    sig = inference.apply_holm(items)
    assert sig == [items[0]]
    assert items[1]["inference"]["pvalue_holm"] == pytest.approx(0.06)    # 2nd of 2: x1, max with 0.002
    assert items[0]["inference"]["pvalue_holm"] == pytest.approx(0.002)   # 1st of 2: x2
    assert items[2]["inference"]["pvalue_holm"] is None and not items[2]["inference"]["significant"]


def test_monte_carlo_permutation_pvalue_agrees_with_full_enumeration():
    import itertools
    x, y = np.arange(10.0), np.arange(10.0) + 3.0
    p_mc, pmin = stats.permutation_pvalue(x, y, np.random.default_rng(3))    # 184756 splits: Monte Carlo
    pool = np.concatenate([x, y])
    idx = np.array(list(itertools.combinations(range(20), 10)))
    sx = pool[idx].sum(axis=1)
    exact = np.mean(np.abs(sx / 10 - (pool.sum() - sx) / 10) >= 3.0 - 1e-9)
    assert p_mc == pytest.approx(exact, abs=0.01) and pmin == pytest.approx(2 / 184756)
