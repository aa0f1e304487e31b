"""The reproduction's verdict rules (analysis/prereg.py) on constructed data, and the
pre-registration file itself. The campaign's records and rendering: test_reproduce_campaign.py."""

import math

import numpy as np
import pytest
import yaml

from torbed.analysis import prereg as P

PREREG = P.load()


def comp(expect="decrease", pct=-32.7, primary=False):
    return P.Comparison("c", "paper", "result", "value", "x.txt:1", "tang-goldberg-2010-exp1", ("m",),
                        "vanilla", "ewma-66", expect, pct, primary)


def blocks(ratio, sd, n, seed=0, base=2.0):
    """n blocks: baseline lognormal around ``base``, variant = baseline x ratio x noise(sd)."""
    rng = np.random.default_rng(seed)
    y = base * np.exp(rng.normal(0, 0.3, n))
    return list(y * ratio * np.exp(rng.normal(0, sd, n))), list(y)


def test_the_committed_preregistration_has_one_primary_per_paper_with_its_number_and_source():
    papers = [c.paper.split(" 20")[0] for c in PREREG.primaries]
    assert sorted(set(papers)) == ["Engler & Goldberg", "Gopal & Heninger", "IPSJ", "Tang & Goldberg"]
    want = {"tg-exp1": -32.7, "gh-exp2-vs-ewma": -23.4, "gh-exp2-vs-vanilla": -28.5, "ipsj-ttfb": -90.0,
            "eg-3-threads": 210.0}
    assert {c.id: c.paper_change_pct for c in PREREG.primaries} == want
    for c in PREREG.comparisons:
        name, line = c.source.rsplit(":", 1)
        assert name.endswith(".txt") and int(line) > 0, c.id
    assert not set(c.id for c in PREREG.primaries) & set(c.id for c in PREREG.secondaries)


@pytest.mark.parametrize("field,value,msg", [
    ("variant", "ewma-3", "not a variant"),
    ("paper_change_pct", 32.7, "does not match expect"),
    ("expect", "smaller", "is not one of"),
])
def test_a_malformed_preregistration_is_refused_naming_the_field(tmp_path, field, value, msg):
    raw = yaml.safe_load(P.PATH.read_text())
    raw["primaries"][0][field] = value
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(P.PreregError, match=msg) as e:
        P.load(f)
    assert "primaries[0]" in str(e.value)


def test_a_vs_a_exactly_balanced_gives_no_changed_verdict():
    y = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    x = [y[0] * 1.2, y[1] / 1.2, y[2] * 1.1, y[3] / 1.1, y[4] * 1.3, y[5] / 1.3]   # log ratios sum to 0
    for c in (comp(), comp("increase", 210.0), comp("none", None)):
        v = P.judge(x, y, c, PREREG)
        assert v["test"]["pvalue"] == pytest.approx(1.0)
        assert v["verdict"] != "agrees" or c.expect == "none"
        assert "changed" not in v["direction_text"]


def test_a_vs_a_changed_verdicts_stay_at_or_below_alpha():
    """2000 A/A data sets of 6 blocks: the share judged "changed" (either sign) is the test's
    false-positive rate; it must not exceed 5% beyond Monte Carlo error (3 SE = 1.5 points)."""
    changed = 0
    for s in range(2000):
        x, y = blocks(1.0, 0.2, 6, seed=s)
        v = P.judge(x, y, comp(), PREREG)
        changed += "changed" in v["direction_text"]
    assert changed / 2000 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 2000)


def test_holm_over_the_primaries_keeps_the_family_wise_rate():
    """A/A in all five primaries: at most 5% of families have any "changed" primary."""
    any_changed = 0
    for s in range(400):
        data = {name: {} for name in PREREG.experiments}
        for k in range(6):
            for name, e in PREREG.experiments.items():
                rng = np.random.default_rng([s, k, hash(name) % 1000])
                base = float(np.exp(rng.normal()))
                data[name][k] = {v: {m: base * float(np.exp(rng.normal(0, 0.2))) for c in PREREG.comparisons
                                     for m in c.metrics} for v in e.variants}
        res = P.judge_all(PREREG, lambda exp: data[exp])
        any_changed += any("changed" in res[c.id]["direction_text"] for c in PREREG.primaries)
    assert any_changed / 400 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 400)


def test_a_clear_effect_of_the_papers_size_agrees_in_direction_and_size():
    x, y = blocks(1 - 0.327, 0.05, 8)
    v = P.judge(x, y, comp(), PREREG)
    assert (v["direction"], v["size"], v["verdict"]) == ("agrees", "agrees", "agrees")


def test_a_clear_effect_far_from_the_papers_size_differs():
    x, y = blocks(0.1, 0.05, 8)                       # -90% against the paper's -32.7%
    v = P.judge(x, y, comp(), PREREG)
    assert v["direction"] == "agrees" and v["size"] == "differs" and v["verdict"] == "disagrees"


def test_a_clear_effect_of_the_other_sign_disagrees():
    x, y = blocks(1.5, 0.05, 8)
    v = P.judge(x, y, comp(), PREREG)
    assert v["direction"] == "disagrees" and v["verdict"] == "disagrees"


@pytest.mark.parametrize("center", [-0.5, math.log(1 - 0.327), 0.0, 0.3])
@pytest.mark.parametrize("spread,n", [(0.8, 3), (1.0, 4), (1.5, 6)])
def test_a_wide_interval_never_gives_rough_size_or_no_change(center, spread, n):
    """Block log ratios spread symmetrically around a centre (the paper's own -32.7% among
    them): the interval is wide (checked), so neither size agreement nor "no change" may come
    out, however close the point estimate is to the paper's or to 0."""
    d = center + spread * np.linspace(-1, 1, n)
    y = [2.0] * n
    x = list(2.0 * np.exp(d))
    for c in (comp(), comp("none", None)):
        v = P.judge(x, y, c, PREREG)
        lo, hi = v["test"]["equivalence"]["ci90"]
        assert math.log1p(hi / 100) - math.log1p(lo / 100) > 2 * math.log(2)       # wide, by construction
        assert v["size"] != "agrees"
        assert "no change" not in v["direction_text"]
        assert v["verdict"] != "agrees" or c.expect != "none"


def test_no_change_needs_the_equivalence_test():
    y = list(np.linspace(1.0, 3.0, 8))
    x = [b * math.exp(e) for b, e in zip(y, 0.02 * np.array([1, -1, 1, -1, 1, -1, 1, -1]))]
    v = P.judge(x, y, comp("none", None), PREREG)
    assert v["direction"] == "agrees" and "TOST" in v["direction_text"] and v["verdict"] == "agrees"
    # A paper claiming a decrease, ours shown equivalent to no change: disagrees.
    v = P.judge(x, y, comp(), PREREG)
    assert v["direction"] == "disagrees" and "no change" in v["direction_text"]


@pytest.mark.parametrize("pct,expect", [(-32.7, "decrease"), (-23.4, "decrease"), (210.0, "increase")])
def test_no_change_at_all_is_never_the_papers_rough_size(pct, expect):
    """A tight interval around 0 is not "within a factor 2" of a -23% or a 3.1x change (as a
    ratio of ratios it would be: 1.0 / 0.766 = 1.3)."""
    y = list(np.linspace(1.0, 3.0, 8))
    x = [b * math.exp(e) for b, e in zip(y, 0.02 * np.array([1, -1, 1, -1, 1, -1, 1, -1]))]
    assert P.judge(x, y, comp(expect, pct), PREREG)["size"] == "differs"


def test_rough_size_is_a_factor_on_the_effect():
    p = math.log(1 - 0.327)
    assert P.effect_within_factor((p * 1.9, p * 0.6), -32.7, 2.0) == "inside"
    assert P.effect_within_factor((p * 2.5, p * 2.1), -32.7, 2.0) == "outside"
    assert P.effect_within_factor((p * 0.45, p * 0.3), -32.7, 2.0) == "outside"
    assert P.effect_within_factor((p * 1.5, p * 0.3), -32.7, 2.0) == "overlaps"
    q = math.log(3.1)
    assert P.effect_within_factor((q * 0.6, q * 1.8), 210.0, 2.0) == "inside"
    assert P.effect_within_factor((-0.1, 0.1), 210.0, 2.0) == "outside"


def test_too_few_blocks_is_inconclusive_not_a_verdict():
    x, y = blocks(0.5, 0.01, 2)
    v = P.judge(x, y, comp(), PREREG)
    assert v["verdict"] == "inconclusive" and "not enough" in v["direction_text"]


def test_a_primary_uses_the_holm_adjusted_p_value():
    x, y = blocks(0.9, 0.1, 6, seed=3)
    raw = P.judge(x, y, comp(), PREREG)
    adj = P.judge(x, y, comp(primary=True), PREREG, holm_p=min(1.0, 5 * raw["test"]["pvalue"]))
    assert adj["p"] == pytest.approx(min(1.0, 5 * raw["p"]))
    if raw["direction"] == "agrees" and adj["p"] >= 0.05:
        assert adj["direction"] == "inconclusive"


def test_blocks_planned_grows_with_the_spread_and_stops_at_the_maximum():
    c = [comp()]
    n_small, n_large = P.blocks_planned(0.05, c, PREREG, 40), P.blocks_planned(0.4, c, PREREG, 40)
    assert 3 <= n_small < n_large <= 40
    assert P.blocks_planned(5.0, c, PREREG, 12) == 12
    assert P.blocks_planned(None, c, PREREG, 12) == 12


def test_every_preregistered_experiment_names_its_scenarios_variants():
    """The pre-registration and the scenarios cannot drift: each experiment's variants are
    the ones its scenario file runs, and every comparison's arms are among them."""
    import yaml

    from torbed.analysis import prereg
    from torbed.resources import ROOT
    p = prereg.load()
    for e in p.experiments.values():
        scenario_variants = yaml.safe_load((ROOT / e.scenario).read_text())["variants"]
        assert set(e.variants) <= set(scenario_variants), (e.name, e.variants, scenario_variants)
    for c in p.comparisons:
        arms = set(p.experiments[c.experiment].variants)
        assert {c.baseline, c.variant} <= arms, (c.id, c.baseline, c.variant, arms)
