"""Per-cell delays corrected by the replay clients' clock offsets (clock.jsonl), and the clock
uncertainty in the report: a server clock 300 ms ahead must not show up in the delays, and a
difference of means smaller than the uncertainty must not be printed as a number."""

from __future__ import annotations

import json

import pytest

from torbed.analysis.report import report

from .conftest import copy_golden

SKEW = 0.3          # the replay server's clock, ahead of the client's
T0 = 1700000020.0


def _cells(variant: str, rep: int, delay_ms: float) -> list[dict]:
    """Chunks with a true one-way delay of delay_ms (+0..2 ms), stamped as two clocks would:
    downstream sent on the server's (skewed) clock, upstream received on it."""
    out = []
    for i in range(50):
        t = T0 + i * 0.5
        d = (delay_ms + i % 3) / 1e3
        base = {"type": "cell", "variant": variant, "rep": rep, "client": "web0", "group": "web", "trace": "tr",
                "flow": "f", "iteration": 0, "circuit": "5", "seq": i, "bytes": 498, "warmup": False}
        out.append({**base, "direction": "d", "t_sched": t + SKEW, "t_sent": t + SKEW, "t_recv": t + d})
        out.append({**base, "direction": "u", "t_sched": t, "t_sent": t, "t_recv": t + d + SKEW})
    return out


def _clock(variant: str, rep: int, rtt: float) -> list[dict]:
    """Bursts before, during and after, symmetric paths of rtt / 2 each way."""
    out = []
    for b, t0 in enumerate((T0 - 5, T0 + 12, T0 + 30)):
        for k in range(4):
            t1 = t0 + k * 0.02
            t2 = t1 + rtt / 2 + SKEW
            out.append({"type": "clock_exchange", "variant": variant, "rep": rep, "client": "web0", "group": "web",
                        "server": "replay0", "phase": ("before", "during", "after")[b], "burst": b, "seq": 4 * b + k,
                        "status": "ok", "t1": t1, "t2": t2, "t3": t2 + 1e-4, "t4": t1 + rtt + 1e-4,
                        "offset_s": SKEW, "delay_s": rtt})
    out.append({"type": "clock_exchange", "variant": variant, "rep": rep, "client": "web0", "phase": "during",
                "burst": 1, "seq": 99, "status": "lost", "t1": None, "t2": None, "t3": None, "t4": None})
    return out


def _write(run, delays: dict, rtt: float | None) -> None:
    for variant, ms in delays.items():
        for rep in (0, 1):
            d = run / variant / f"rep-{rep}"
            (d / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in _cells(variant, rep, ms)))
            if rtt is not None:
                (d / "clock.jsonl").write_text("".join(json.dumps(c) + "\n" for c in _clock(variant, rep, rtt)))


def test_skewed_server_clock_is_corrected(tmp_path):
    run = copy_golden(tmp_path)
    _write(run, {"vanilla": 100.0, "ewma-66": 50.0}, rtt=1e-3)
    summary = report(run, out_dir=tmp_path / "out")
    for d in ("down", "up"):
        m = summary["metrics"][f"cell_delay_ms/web/{d}"]["variants"]
        for v, true_mean in (("vanilla", 101.0), ("ewma-66", 51.0)):
            # Uncorrected, these would be 300 ms off (downstream even negative).
            assert m[v]["mean"] == pytest.approx(true_mean, abs=m[v]["clock_bound_ms"])
            assert m[v]["clock_bound_ms"] == pytest.approx(0.5, abs=0.01)
        vb = m["ewma-66"]["vs_baseline"]
        assert vb["mean_diff_ms"] == pytest.approx(-50.0, abs=1.0)
        assert vb["mean_diff_within_clock"] is False
    rows = summary["clock"]
    assert len(rows) == 4 and {r["client"] for r in rows} == {"web0"}
    for r in rows:
        assert r["offset_s"] == pytest.approx(SKEW, abs=r["uncertainty_s"])
        assert r["lost"] == 1 and r["bursts"] == 3
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Replay clock offsets" in md and "± clock" in md
    assert "within clock" not in md


def test_difference_below_the_clock_uncertainty_is_not_a_number(tmp_path):
    """Means 0.4 ms apart measured with ±5 ms clocks (10 ms round trips)."""
    run = copy_golden(tmp_path)
    _write(run, {"vanilla": 50.0, "ewma-66": 50.4}, rtt=10e-3)
    summary = report(run, out_dir=tmp_path / "out")
    vb = summary["metrics"]["cell_delay_ms/web/down"]["variants"]["ewma-66"]["vs_baseline"]
    assert vb["mean_diff_within_clock"] is True
    assert vb["mean_diff_clock_bound_ms"] == pytest.approx(10.0, abs=0.1)
    md = (tmp_path / "out" / "report.md").read_text()
    # The descriptive distribution table (the inference table has a row for the same subject).
    rows = [line for line in md.splitlines() if line.startswith("| web, downstream | ewma-66 ")]
    assert any("within clock ±10" in row for row in rows), rows


def test_without_clock_records_the_bound_is_not_measured(tmp_path):
    run = copy_golden(tmp_path)
    _write(run, {"vanilla": 50.0, "ewma-66": 40.0}, rtt=None)
    summary = report(run, out_dir=tmp_path / "out")
    m = summary["metrics"]["cell_delay_ms/web/down"]["variants"]
    assert m["vanilla"]["clock_bound_ms"] is None
    assert "clock" not in summary
    assert "not measured" in (tmp_path / "out" / "report.md").read_text()


def test_malformed_clock_record_names_file_and_line(tmp_path):
    from torbed.analysis.errors import RecordError
    run = copy_golden(tmp_path)
    _write(run, {"vanilla": 50.0, "ewma-66": 40.0}, rtt=1e-3)
    p = run / "vanilla" / "rep-1" / "clock.jsonl"
    p.write_text(p.read_text() + json.dumps({"type": "clock_exchange", "client": "web0", "status": "ok",
                                             "t1": 1.0, "t2": "x", "t3": 1.0, "t4": 1.0}) + "\n")
    with pytest.raises(RecordError, match=r"clock\.jsonl.*14"):
        report(run, out_dir=tmp_path / "out")
