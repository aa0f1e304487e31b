"""Variants with more than one parameter: named presets (``<family>-<preset>``) in variant.yaml."""

from __future__ import annotations

import shutil

import pytest
import yaml

from torbed import constants
from torbed.variants import VariantError, describe, load_variant


def test_torchestra_exp1_sets_both_of_the_papers_parameters():
    v = load_variant("torchestra-exp1")
    lines = v.torrc.splitlines()
    # Gopal & Heninger sec. 5.2: alpha = 0.18, B = 0.18, T_h = 1.4, T_l = 0.3.
    for want in ("TorchestraHeavyThreshold 1.4", "TorchestraIdleMultiplier 0.18",
                 "TorchestraLightThreshold 0.3", "TorchestraEWMAWindow 10"):
        assert want in lines
    assert v.name == "torchestra-exp1" and v.preset == "exp1"
    assert v.build_key == load_variant("torchestra").build_key


def test_describe_records_every_parameter_and_the_preset():
    d = describe("torchestra-exp1")
    assert d["family"] == "torchestra" and d["preset"] == "exp1"
    assert d["parameters"]["idle_multiplier"] == 0.18 and d["parameters"]["heavy_threshold"] == 1.4
    assert d["parameters"]["period_ms"] == 200          # the untouched ones too
    assert describe("ewma-66") == {"name": "ewma-66", "family": "ewma", "preset": None,
                                   "parameters": {"halflife": 66}}


def test_unknown_word_names_the_presets():
    with pytest.raises(VariantError, match="not a number.*presets: exp1"):
        load_variant("torchestra-exp9")


@pytest.fixture
def family(tmp_path):
    """A copy of the ewma family whose presets a test rewrites."""
    shutil.copytree(constants.VARIANTS_DIR / "ewma", tmp_path / "ewma")
    path = tmp_path / "ewma" / "variant.yaml"

    def write(presets):
        data = yaml.safe_load(path.read_text())
        data["presets"] = presets
        path.write_text(yaml.safe_dump(data))
        return tmp_path
    return write


def test_a_preset_in_a_test_family_resolves(family):
    d = family({"paper": {"halflife": 66}})
    assert load_variant("ewma-paper", d).parameters == {"halflife": 66}
    assert load_variant("ewma-12", d).parameters == {"halflife": 12}


@pytest.mark.parametrize("presets, message", [
    ({"slow": {"halflife": 99999}}, r"presets\.slow: halflife=99999 outside \[1, 3600\]"),
    ({"slow": {"half_life": 10}}, r"presets\.slow\.half_life: not a parameter of 'ewma'"),
    ({"slow": {"halflife": "66"}}, r"presets\.slow\.halflife: '66' is not a number"),
    ({"slow": {}}, r"presets\.slow: expected a non-empty mapping"),
    ({"Slow-1": {"halflife": 10}}, r"presets\.Slow-1: a preset name"),
    (["slow"], "presets must map"),
])
def test_bad_presets_are_refused_with_file_and_field(family, presets, message):
    d = family(presets)
    with pytest.raises(VariantError, match=message) as e:
        load_variant("ewma-30", d)
    assert str(d / "ewma" / "variant.yaml") in str(e.value)



def test_a_repetitions_meta_records_the_run_and_group_variants():
    from pathlib import Path

    from torbed import engine, scenario
    s = scenario.load(Path(__file__).parents[2] / "scenarios" / "gopal-heninger-2012-exp1.yaml")
    s.network.relays["guard"].variant = "ewma-66"
    specs = engine._variant_specs(s, "torchestra-exp1")
    assert list(specs) == ["torchestra-exp1", "ewma-66"]
    assert specs["torchestra-exp1"]["parameters"]["idle_multiplier"] == 0.18
