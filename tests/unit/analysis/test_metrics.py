"""Metric extraction on tiny hand-made runs: warm-up and error rules, cell wait, classes."""

import json

import numpy as np
import pytest

from torbed.analysis import metrics
from torbed.analysis.load import load_run
from torbed.analysis.report import analyse


def jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def side(queue, removed, time_ms, conn=9):
    return {"queue": queue, "conn": conn, "added": dict(removed), "removed": removed, "time_ms": time_ms}


def cell(t, queue, removed, time_ms, circuit=None):
    return {"type": "cellstats", "relay": "m0", "group": "middle", "t": t, "circuit": circuit,
            "inbound": side(queue, {"relay": removed}, {"relay": time_ms}), "outbound": None}


def tr(status="ok", warmup=False, ttlb=1.0, circuit_id="5", build=0.5, cause=None, group="web"):
    return {"type": "transfer", "client": "web0", "group": group, "file": "small", "size": 51200,
            "status": status, "warmup": warmup, "t_start": 120.0, "ttfb_s": ttlb / 2, "ttlb_s": ttlb if status == "ok" else None,
            "ttfb_stream_s": ttlb, "ttlb_stream_s": ttlb + 0.5 if status == "ok" else None,
            "circuit": {"id": circuit_id, "path": [], "build_s": build},
            "error": {"cause": cause, "detail": "x"} if cause else None}


@pytest.fixture
def tiny(tmp_path):
    run = tmp_path / "tiny"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"name": "tiny", "variants": ["a", "b"], "repetitions": 1, "seed": 3}))
    for v in ("a", "b"):
        d = run / v / "rep-0"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"status": "ok", "t_workload_start": 100.0, "warmup_s": 5.0}))
    da = run / "a" / "rep-0"
    jsonl(da / "transfers.jsonl", [
        tr(ttlb=1.0), tr(ttlb=2.0), tr(ttlb=3.0, circuit_id="6", build=0.7),
        tr(ttlb=100.0, warmup=True, circuit_id="4", build=9.0),
        tr(status="timeout", cause="timeout", circuit_id="7", build=0.9),
        tr(status="error", cause=None, circuit_id="8", build=0.9),
        tr(status="error", cause="stall", circuit_id="9", build=0.9),   # the driver's stallout
    ])
    jsonl(da / "cellstats.jsonl", [
        cell(106.0, 1, 100, 1000), cell(107.0, 1, 300, 6000),   # circuit A: 400 cells, waits 10 and 20 ms
        cell(106.5, 2, 100, 5000),                              # circuit B: 100 cells, beyond 70% of 500: light
        cell(101.0, 3, 900, 200),                               # circuit C, in the warm-up: neither counted nor classed
    ])
    db = run / "b" / "rep-0"
    jsonl(db / "transfers.jsonl", [tr(ttlb=0.5), tr(ttlb=1.5)])
    return run


def test_transfer_metrics_exclude_warmup_and_errors(tiny):
    ex = metrics.extract(load_run(tiny))
    m = ex.metrics["ttlb_s/web:small"]
    assert m.params == {"group": "web", "file": "small", "size": 51200}
    assert list(m.pooled("a")) == [1.0, 2.0, 3.0]
    assert list(m.pooled("b")) == [0.5, 1.5]
    assert m.title == "Time to last byte, web: small (50 KiB)"
    cb = ex.metrics["circuit_build_s"]
    assert sorted(cb.pooled("a")) == [0.5, 0.7]          # circuit 5 counted once; 4 warm-up; 7, 8, 9 failed


def test_error_rate(tiny):
    e = metrics.error_rates(load_run(tiny))
    assert e["a"]["transfers"] == 6 and e["a"]["errors"] == 3
    assert e["a"]["rate"] == pytest.approx(0.5)
    assert e["a"]["causes"] == {"error": 1, "stall": 1, "timeout": 1}
    assert e["a"]["by_group"]["web:small"] == {"transfers": 6, "errors": 3, "rate": 0.5}
    assert e["b"]["rate"] == 0.0
    # The report's error table names the stall among the causes.
    _, _, s = analyse(tiny)
    from torbed.analysis.render import blocks
    table = next(b for b in blocks(s, []) if b[0] == "table" and "by cause" in b[1])
    assert [row for row in table[2] if row[0] == "a"] == [["a", "6", "3", "50.00%", "error: 1, stall: 1, timeout: 1"]]


def test_cell_wait_by_hand(tiny):
    ex = metrics.extract(load_run(tiny))
    allc = ex.metrics["cell_wait_ms/m0/inbound/all"]
    assert sorted(allc.pooled("a")) == [10.0, 20.0, 50.0]
    assert allc.totals["a"][0] == (12000.0, 500.0)             # wait per cell 12000 / 500 ms
    heavy = ex.metrics["cell_wait_ms/m0/inbound/gh70-heavy"]
    assert sorted(heavy.pooled("a")) == [10.0, 20.0] and heavy.totals["a"][0] == (7000.0, 400.0)
    light = ex.metrics["cell_wait_ms/m0/inbound/gh70-light"]
    assert list(light.pooled("a")) == [50.0]
    assert ex.metrics["cell_wait_ms/m0/outbound/all"].pooled("a").size == 0
    _, _, s = analyse(tiny)
    entry = s["metrics"]["cell_wait_ms/m0/inbound/all"]["variants"]["a"]
    assert entry["wait_per_cell_ms"] == pytest.approx(12000 / 500)
    assert entry["median"] == 20.0


def test_summary_vs_baseline(tiny):
    _, _, s = analyse(tiny)
    b = s["metrics"]["ttlb_s/web:small"]["variants"]["b"]
    assert b["median"] == 1.0 and b["mean"] == 1.0
    vs = b["vs_baseline"]
    assert vs["baseline"] == "a"
    assert vs["median_change_pct"] == pytest.approx(-50.0)      # 1.0 vs 2.0
    assert vs["mean_change_pct"] == pytest.approx(-50.0)
    assert "vs_baseline" not in s["metrics"]["ttlb_s/web:small"]["variants"]["a"]
    _, _, s2 = analyse(tiny, baseline="b")
    assert s2["metrics"]["ttlb_s/web:small"]["variants"]["a"]["vs_baseline"]["median_change_pct"] == pytest.approx(100.0)


def test_circuit_key_and_gh70_classes():
    assert metrics.circuit_key({"circuit": "12", "inbound": side(1, {}, {})}) == "id:12"
    assert metrics.circuit_key({"circuit": None, "inbound": side(4, {}, {}, conn=2)}) == "inbound:4@2"
    assert metrics.circuit_key({"circuit": None, "inbound": None,
                                "outbound": side(7, {}, {}, conn=3)}) == "outbound:7@3"
    assert metrics.circuit_key({"circuit": "12", "session": 7.5}) == "id:12#7.5"
    # Gopal & Heninger's 70% rule, per inbound connection (conn 9 here: 20,247 cells, 70% = 14,173)
    recs = [cell(1, 1, 10000, 0), cell(1, 2, 4999, 0), cell(1, 3, 5000, 0), cell(2, 2, 0, 0),
            cell(1, 4, 99, 0), cell(1, 5, 100, 0), cell(1, 6, 49, 0)]
    other = cell(1, 7, 10, 0)
    other["inbound"]["conn"] = 4            # alone on its connection: heavy there
    early = cell(0.5, 8, 10 ** 6, 0)        # in the warm-up: not counted, not classed
    assert metrics.gh70_classes(recs + [other, early], t_min=1.0) == {
        "inbound:1@9": "gh70-heavy",        # nothing before it
        "inbound:3@9": "gh70-heavy",        # 10,000 before it: < 70%
        "inbound:2@9": "gh70-light",        # 15,000 before it: >= 70%
        "inbound:5@9": "gh70-light", "inbound:4@9": "gh70-light", "inbound:6@9": "gh70-light",
        "inbound:7@4": "gh70-heavy"}


def test_fmt_size():
    assert metrics.fmt_size(51200) == "50 KiB"
    assert metrics.fmt_size(5242880) == "5 MiB"
    assert metrics.fmt_size(300000) == "300 KB"
    assert metrics.fmt_size(1234) == "1234 B"


def test_throughput_series_max_equals_metric(golden_copy):
    run = load_run(golden_copy)
    ex = metrics.extract(run)
    series = metrics.throughput_series(run)
    for relay, per_v in series.items():
        for v, per_r in per_v.items():
            for k, s in per_r.items():
                vals = ex.metrics[f"relay_throughput_Bps/{relay}"].values[v][k]
                if s["rate_max"] is None:
                    assert vals.size == 0
                else:
                    assert vals.size == 1 and s["rate_max"] == pytest.approx(float(vals[0]))
                    assert s["t_max"] >= 2 * 30.0 - 1e-6           # window starts after the warm-up
    assert np.all(np.diff(series["middle0"]["vanilla"][0]["t"]) > 0)
