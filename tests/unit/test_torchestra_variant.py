"""The torchestra variant's selection and torrc, and the log lines torbed parses from it."""

from __future__ import annotations

import re

import pytest
import yaml

from torbed.analysis import torchestra
from torbed import constants
from torbed.backends.k8s.chart import CHART_DIR
from torbed.variants import VariantError, load_variant
from tests.unit.patchtext import c_format

PATCH = constants.VARIANTS_DIR / "torchestra" / "0001-torchestra-light-heavy-channel-pairs.patch"


def test_defaults_are_the_papers_exp2_parameters():
    v = load_variant("torchestra")
    assert v.patches == (PATCH,)
    lines = v.torrc.splitlines()
    for want in ("Torchestra 1", "TorchestraHeavyThreshold 1.7", "TorchestraLightThreshold 0.3",
                 "TorchestraIdleMultiplier 0.36", "TorchestraEWMAWindow 10", "TorchestraPeriod 200 msec",
                 "Schedulers Vanilla"):
        assert want in lines


def test_name_sets_the_heavy_threshold():
    v = load_variant("torchestra-1.4")
    assert "TorchestraHeavyThreshold 1.4" in v.torrc.splitlines()
    assert v.build_key == load_variant("torchestra").build_key
    with pytest.raises(VariantError, match="outside"):
        load_variant("torchestra-0.5")


def test_every_torrc_option_exists_in_the_patch():
    text = PATCH.read_text()
    for line in load_variant("torchestra").torrc.splitlines():
        option = line.split()[0]
        if option.startswith("Torchestra"):
            assert f"V({option}," in text, option


def test_chart_renders_the_same_parameters():
    chart = yaml.safe_load((CHART_DIR / "files" / "variants.yaml").read_text())
    fam = chart["families"]["torchestra"]
    assert fam["patched"] is True
    assert [p["name"] for p in fam["parameters"]][0] == "heavy_threshold"


def _c_format(pattern: str) -> str:
    return c_format(PATCH, pattern)


def _fill(fmt: str) -> str:
    out = re.sub(r"%\.2f", "1.25", fmt)
    out = re.sub(r"%u", "7", out)
    out = out.replace("%s->%s", "light->heavy").replace("%s channel", "heavy channel")
    out = out.replace("%d held", "0 held").replace("(%s", "(initiator")
    return re.sub(r"%[sd]", "x", out)


def test_parser_matches_the_patchs_notice_lines():
    move = _fill(_c_format('Torchestra: exit moves circuit'))
    assert torchestra.EXIT_MOVE.search(move), move
    done = _fill(_c_format("Torchestra: switched circuit"))
    m = torchestra.SWITCHED.search(done)
    assert m and m.group(1) == "heavy", done
    assert torchestra.ABANDONED in PATCH.read_text()


def _summary(**relay):
    base = {"status": "ok", "transfers_ok": 10, "transfers_failed": 0, "failures": []}
    return {**base, "relays": {"middle0": {"proto_violations": 0.0, "tiny_network_closes": 0, "abandoned": 0,
                                           "warnings": [], "metrics": {}, **relay}}}


def test_problems_flags_lost_cells_not_stock_tiny_network_closes():
    assert torchestra.problems(_summary()) == []
    # tor's own close for a path through the hop it came from (3-relay networks) is not ours
    assert torchestra.problems(_summary(proto_violations=3.0, tiny_network_closes=3)) == []
    assert torchestra.problems(_summary(proto_violations=4.0, tiny_network_closes=3))
    assert torchestra.problems(_summary(warnings=["[warn] Didn't recognize a cell, but circ stops here!"]))
    assert torchestra.problems(_summary(metrics={"aborted": 1.0}))
    failed = _summary()
    failed["transfers_failed"] = 1
    assert torchestra.problems(failed)
