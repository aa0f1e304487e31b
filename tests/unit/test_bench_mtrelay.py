"""The arithmetic and printing of the mtrelay throughput bench (torbed.bench.mtrelay)."""

from __future__ import annotations

import pytest

from torbed.bench import mtrelay as b


def test_medians_ranges_and_ratios_within_repetition_blocks():
    values = {"kist": [10e6, 12e6, 8e6], "mtrelay-1": [10e6, 11e6, 9e6],
              "mtrelay-2": [15e6, 18e6, 16e6], "mtrelay-3": [20e6, None, 12e6]}
    rows = {r["arm"]: r for r in b.summarise(values)}
    assert rows["kist"]["median"] == 10e6 and (rows["kist"]["min"], rows["kist"]["max"]) == (8e6, 12e6)
    # Per block: 15/10, 18/12, 16/8 -> 1.5, 1.5, 2.0 (not the ratio of the medians, 16/10).
    r2 = rows["mtrelay-2"]["vs_baseline"]
    assert r2["n"] == 3 and r2["median"] == pytest.approx(1.5) and r2["max"] == pytest.approx(2.0)
    # vs mtrelay-1 per block: 15/10, 18/11, 16/9 -> median 18/11.
    assert rows["mtrelay-2"]["vs_single"]["median"] == pytest.approx(18 / 11)
    # A missing repetition drops out of that arm's statistics and of its ratios only.
    r3 = rows["mtrelay-3"]
    assert r3["n"] == 2 and r3["median"] == 16e6
    assert r3["vs_baseline"]["n"] == 2 and r3["vs_baseline"]["min"] == pytest.approx(1.5)
    assert rows["kist"]["vs_baseline"]["median"] == pytest.approx(1.0)


def test_table_cells():
    rows = b.summarise({"kist": [4e6, 6e6], "mtrelay-1": [5e6, None], "mtrelay-2": [None, None]})
    cells = {c[0]: c for c in b.table_rows(rows)}
    assert cells["kist"] == ["kist", "2", "5.00", "4.00-6.00", "1.00x (1.00-1.00)", "0.80x"]
    assert cells["mtrelay-1"][1:4] == ["1", "5.00", "5.00-5.00"]
    assert cells["mtrelay-1"][4] == "1.25x"
    assert cells["mtrelay-2"] == ["mtrelay-2", "0", "-", "-", "-", "-"]


def test_cpu_per_thread_counts_only_the_measured_part():
    samples = [(100.0, {1: 1.0, 2: 0.0}), (130.0, {1: 20.0, 2: 5.0}),
               (140.0, {1: 28.0, 2: 10.0, 3: 1.0}), (150.0, {1: 36.0, 2: 15.0, 3: 2.0})]
    pct = b.cpu_per_thread(samples, start=130.0)
    assert pct == pytest.approx({1: 80.0, 2: 50.0, 3: 10.0})
    assert b._cpu_text(pct, pid=1) == "main 80 | 50, 10"
    assert b.cpu_per_thread(samples, start=145.0) == {}


def test_torrc_path_names_arm_and_repetition():
    m = b.TORRC_RE.search("/x/runs/engler-goldberg-2021-throughput-20261124/mtrelay-3/rep-2/torrc/target0.torrc")
    assert m and m.groups() == ("mtrelay-3", "2")
    assert not b.TORRC_RE.search("/x/r/kist/rep-0/torrc/target01.torrc")
