"""The circswitch variant's selection, patch stack and torrc, and the log lines torbed parses."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from torbed.analysis import circswitch
from torbed import constants
from torbed.backends.k8s.chart import CHART_DIR
from torbed.variants import VariantError, load_variant
from tests.unit.patchtext import c_format

DIR = constants.VARIANTS_DIR / "circswitch"
OURS = DIR / "0001-circswitch-guard-side-active-switching.patch"
TORCHESTRA = constants.VARIANTS_DIR / "torchestra" / "0001-torchestra-light-heavy-channel-pairs.patch"


def test_stacks_on_torchestras_patch_unchanged():
    v = load_variant("circswitch")
    assert [p.resolve() for p in v.patches] == [TORCHESTRA.resolve(), OURS.resolve()]
    assert v.build_key != load_variant("torchestra").build_key
    # The image build stage reads the list with build-tor.sh (no Python there): same order.
    out = subprocess.run(["bash", str(constants.BUILD_SCRIPT), "--list-patches", str(DIR)],
                         capture_output=True, text=True, check=True).stdout.split()
    assert [Path(p).resolve() for p in out] == [p.resolve() for p in v.patches]


def test_defaults_are_the_papers_thresholds():
    lines = load_variant("circswitch").torrc.splitlines()
    for want in ("Schedulers Vanilla", "CircSwitch 1", "CircSwitchAlpha 0.1", "CircSwitchBeta 0.5",
                 "CircSwitchBufferSize 32 KB", "CircSwitchGamma 0.8", "CircSwitchInterval 100 msec"):
        assert want in lines, want


def test_name_sets_beta():
    assert "CircSwitchBeta 0.3" in load_variant("circswitch-0.3").torrc.splitlines()
    with pytest.raises(VariantError, match="outside"):
        load_variant("circswitch-20")


def test_every_torrc_option_exists_in_the_patch():
    text = OURS.read_text()
    for line in load_variant("circswitch").torrc.splitlines():
        option = line.split()[0]
        if option.startswith("CircSwitch"):
            assert f"V({option}," in text, option


def test_chart_renders_the_family():
    chart = yaml.safe_load((CHART_DIR / "files" / "variants.yaml").read_text())
    fam = chart["families"]["circswitch"]
    assert fam["patched"] is True
    assert [p["name"] for p in fam["parameters"]][0] == "beta"


def _c_format(pattern: str) -> str:
    return c_format(OURS, pattern)


def test_parser_matches_the_patchs_notice_lines():
    for pattern, kind in (("to the second \"", "to the second connection"), ("back: channel", "back")):
        fmt = _c_format(pattern)
        line = re.sub(r"%\.\df", "0.5", fmt).replace("%u", "7").replace("%d", "3").replace("%s", "guard")
        m = circswitch.MOVE.search(line)
        assert m and m.group(2) == kind, line
    assert circswitch.ONSET in OURS.read_text()
