"""Per-cell delay of replayed traffic (cells.jsonl) in the report: the mean is the paper's
average delay per cell; flows split by Gopal & Heninger's 70% rule; warm-up excluded."""

from __future__ import annotations

import json

import numpy as np
import pytest

from torbed.analysis.report import report

from .conftest import copy_golden


def _cells(variant: str, rep: int, base_ms: float) -> list[dict]:
    out = []
    # flow "big": 40 chunks, flow "small": 4 chunks per repetition; small waits 3x longer.
    for flow, n, factor in (("big", 40, 1.0), ("small", 4, 3.0)):
        for i in range(n):
            t = 1700000020.0 + i * 0.1
            delay = (base_ms * factor + i % 3) / 1e3
            out.append({"type": "cell", "variant": variant, "rep": rep, "client": "web0", "group": "web",
                        "trace": "tr", "flow": flow, "iteration": 0, "circuit": "5", "direction": "d",
                        "seq": i, "bytes": 498, "t_sched": t, "t_sent": t + 0.0002, "t_recv": t + 0.0002 + delay,
                        "delay_s": delay, "sched_error_s": 0.0002, "warmup": False})
    out.append({**out[0], "t_recv": out[0]["t_sent"] + 9.0, "warmup": True})   # excluded
    return out


def test_cell_delay_metric_and_figure(tmp_path):
    run = copy_golden(tmp_path)
    expected = {}
    for variant, base in (("vanilla", 100.0), ("ewma-66", 50.0)):
        allv = []
        for rep in (0, 1):
            cells = _cells(variant, rep, base)
            (run / variant / f"rep-{rep}" / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
            allv += [c["t_recv"] - c["t_sent"] for c in cells if not c["warmup"]]
        expected[variant] = np.mean(allv) * 1e3
    summary = report(run, out_dir=tmp_path / "out")
    m = summary["metrics"]["cell_delay_ms/web/down"]
    for v in ("vanilla", "ewma-66"):
        assert m["variants"][v]["n"] == 2 * 44
        assert m["variants"][v]["mean"] == pytest.approx(expected[v], rel=1e-5)
    assert m["variants"]["ewma-66"]["vs_baseline"]["mean_change_pct"] == pytest.approx(
        100 * (expected["ewma-66"] - expected["vanilla"]) / expected["vanilla"], rel=1e-4)
    # Gopal & Heninger's 70% rule: "big" holds 40 of 44 chunks (heavy), "small" is light
    light = summary["metrics"]["cell_delay_ms/web/down/gh70-light"]["variants"]["vanilla"]
    heavy = summary["metrics"]["cell_delay_ms/web/down/gh70-heavy"]["variants"]["vanilla"]
    assert light["n"] == 8 and heavy["n"] == 80
    assert light["mean"] > 2.5 * heavy["mean"]
    assert summary["metrics"]["sched_error_ms/web/down"]["variants"]["vanilla"]["median"] == pytest.approx(0.2, rel=1e-3)
    assert (tmp_path / "out" / "figures" / "cdf-cell-delay.png").stat().st_size > 1000
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Per-cell delay of replayed traffic" in md and "Average delay per cell" in md
