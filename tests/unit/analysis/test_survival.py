"""Kaplan-Meier (analysis/survival.py) against small cases computed by hand."""

import numpy as np
import pytest

from torbed.analysis import survival


def test_no_censoring_is_the_empirical_distribution_and_the_sample_median():
    t, s = survival.km([3, 1, 2, 4])
    assert t.tolist() == [1, 2, 3, 4]
    assert s.tolist() == pytest.approx([0.75, 0.5, 0.25, 0.0])
    # S = 0.5 exactly on [2, 3): midpoint, as np.median
    assert survival.km_quantile([3, 1, 2, 4], None, 0.5) == 2.5 == np.median([1, 2, 3, 4])
    assert survival.km_quantile([5, 1, 3], [False] * 3, 0.5) == 3.0
    for n in range(1, 12):
        x = np.random.default_rng(n).exponential(size=n)
        assert survival.km_quantile(x, None, 0.5) == pytest.approx(float(np.median(x)))


def test_censored_times_by_hand():
    # times 1, 2+, 3, 4+, 5 (+ censored)
    # t=1: at risk 5, 1 event -> S = 4/5 = 0.8
    # t=3: at risk 3 (3, 4+, 5), 1 event -> S = 0.8 * 2/3 = 0.5333
    # t=5: at risk 1, 1 event -> S = 0
    times, cens = [1, 2, 3, 4, 5], [False, True, False, True, False]
    t, s = survival.km(times, cens)
    assert t.tolist() == [1, 3, 5]
    assert s.tolist() == pytest.approx([0.8, 0.8 * 2 / 3, 0.0])
    assert survival.km_quantile(times, cens, 0.5) == 5.0      # first S <= 0.5 is at t = 5
    assert survival.km_quantile(times, cens, 0.4) == 3.0      # first S <= 0.6 is at t = 3
    # Dropping the censored ones gives the median 3: biased down.
    assert np.median([1, 3, 5]) == 3.0


def test_midpoint_on_exact_level():
    times, cens = [1, 2, 3, 4, 5], [False, True, False, True, False]
    assert survival.km_quantile(times, cens, 0.2) == pytest.approx(2.0)   # (1 + 3) / 2


def test_censoring_tied_with_an_event_stays_at_risk():
    # 2, 2+, 3: at t=2 all three at risk (the censored 2+ too), 1 event -> S = 2/3;
    # at t=3 only 3 is at risk -> S = 0
    t, s = survival.km([2, 2, 3], [False, True, False])
    assert t.tolist() == [2, 3]
    assert s.tolist() == pytest.approx([2 / 3, 0.0])


def test_all_censored_has_no_estimate():
    t, s = survival.km([4, 5, 6], [True, True, True])
    assert t.size == 0 and s.size == 0
    assert survival.km_quantile([4, 5, 6], [True] * 3, 0.5) is None
    x, f = survival.km_cdf([4, 5, 6], [True] * 3)
    assert x.tolist() == [4.0] and f.tolist() == [0.0]


def test_median_not_reached_when_half_or_more_censored_late():
    # 1, 10+, 10+, 10+ : S(1) = 0.75 and nothing after -> no median, a 0.25 quantile
    times, cens = [1, 10, 10, 10], [False, True, True, True]
    assert survival.km_quantile(times, cens, 0.5) is None
    assert survival.km_quantile(times, cens, 0.25) == 1.0


def test_empty_and_bad_input():
    assert survival.km_quantile([], [], 0.5) is None
    assert survival.km_cdf([], [])[0].size == 0
    with pytest.raises(ValueError):
        survival.km([1, 2], [True])
    with pytest.raises(ValueError):
        survival.km_quantile([1], None, 1.0)


def test_cdf_steps_and_counts():
    x, f = survival.km_cdf([1, 2, 3, 4, 5], [False, True, False, True, False])
    assert x.tolist() == [1, 1, 3, 5]
    assert f.tolist() == pytest.approx([0.0, 0.2, 1 - 0.8 * 2 / 3, 1.0])
    assert survival.counts([False, True, True]) == {"completed": 1, "censored": 2}
