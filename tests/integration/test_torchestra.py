"""The torchestra variant with real tor: tor's own unit tests under -Werror, then a mixed
network (stock guard, Torchestra middle and exit) and an all-Torchestra network carrying
sha256-checked transfers while the exit moves circuits between light and heavy connections.

The several-minute stress run is `make bench` (torbed.analysis.torchestra); these runs are
one minute each.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import require_root
from tests.integration.helpers import checked_build, only_run_dir, run_torbed, write_scenario
from torbed.analysis import torchestra as bench_torchestra
from torbed.variants import load_variant

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _root():
    require_root()


def test_tor_unit_tests_with_our_patch_pass_under_werror(tmp_path):
    """build-tor.sh --check: tor and its unit tests (ours: torchestra/..) built with
    --enable-fatal-warnings, the torchestra and circuitmux groups run. Slow (a full build
    with tests), so the result is cached by the variant's content key: once per patch."""
    v = load_variant("torchestra")
    info, log = checked_build("torchestra", tmp_path)
    ours = re.findall(r"^torchestra/(\S+): \[forking\] OK", log, re.M)
    assert len(ours) == 8 and re.search(r"^\d+ tests ok", log, re.M), log[-3000:]
    assert info["check"] is True
    assert "--enable-fatal-warnings" in info["configure_flags"]
    assert "torchestra/.." in info["check_test_groups"]
    assert [x["file"] for x in info["patches"]] == [p.name for p in v.patches]
    assert "torchestra/receiver_holds_early_cells: [forking] OK" in log


def _run(tmp_path, name: str, guard_variant: str | None) -> dict:
    data = bench_torchestra.scenario(name, "30s", guard_variant=guard_variant)
    out = tmp_path / "runs"
    p = run_torbed(["run", str(write_scenario(tmp_path, data)), "--out", str(out)], timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = bench_torchestra.analyse(only_run_dir(out), "torchestra")
    print(json.dumps({k: v for k, v in summary.items() if k != "relays"}),
          {n: (r.get("exit_moves"), r.get("switched"), r.get("metrics")) for n, r in summary["relays"].items()})
    assert bench_torchestra.problems(summary) == []
    return summary


def test_mixed_network_stock_guard(tmp_path):
    """The guard runs the unpatched build (variant kist): it gets only our HELLO, which it
    drops like any unknown cell, and never a SWITCH; the exit and middle switch between
    themselves and the middle's extension toward the guard falls back."""
    s = _run(tmp_path, "it-torchestra-mixed", guard_variant="kist")
    ex, mid, guard = s["relays"]["exit0"], s["relays"]["middle0"], s["relays"]["guard0"]
    assert ex["exit_moves"]["to_heavy"] >= 1
    assert ex["switched"]["initiator"] >= 1 and mid["switched"]["receiver"] >= 1
    assert mid["metrics"]["fallback"] >= 1        # would have extended toward the guard
    assert mid["metrics"]["extended"] == 0
    assert guard["switched"] == {"initiator": 0, "receiver": 0, "to_heavy": 0, "to_light": 0}
    assert "metrics" not in guard or guard["metrics"] == {}  # stock tor: no such counters


def test_all_torchestra_network(tmp_path):
    s = _run(tmp_path, "it-torchestra-all", guard_variant=None)
    ex, mid, guard = s["relays"]["exit0"], s["relays"]["middle0"], s["relays"]["guard0"]
    assert ex["exit_moves"]["to_heavy"] >= 1
    # The switch goes all the way to the entry: middle extends, guard receives.
    assert mid["metrics"]["extended"] >= 1
    assert guard["switched"]["receiver"] >= 1
