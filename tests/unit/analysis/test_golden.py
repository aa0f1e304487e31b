"""`torbed report` on the golden run (tests/data/golden-run, made by tests/data/make_golden_run.py):
summary.json byte-identical to the checked-in golden, numbers re-derived independently from
the records, the crashed repetition reported as missing, figures, html/md and the onionperf
export present and consistent.

If the golden changes on purpose: `python tests/data/make_golden_run.py --summary` and
review the diff of tests/data/golden-run.summary.json.
"""

import json
import statistics
from pathlib import Path

import pytest

from torbed.analysis import figures, metrics
from torbed.analysis.load import load_run
from torbed.analysis.summary import round_floats

from .conftest import GOLDEN_SUMMARY

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def records(run_dir: Path, variant: str, rep: int, name: str):
    out = []
    for line in (run_dir / variant / f"rep-{rep}" / name).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass                                  # the crashed rep's truncated last line
    return out


def test_summary_matches_golden_exactly(golden_report):
    run_dir, _ = golden_report
    assert (run_dir / "report" / "summary.json").read_text() == GOLDEN_SUMMARY.read_text()


def test_report_is_reproducible(golden_report, tmp_path):
    from torbed.analysis.report import report
    run_dir, summary = golden_report
    again = report(run_dir, out_dir=tmp_path / "again")
    assert again == summary
    assert (tmp_path / "again" / "summary.json").read_bytes() == (run_dir / "report" / "summary.json").read_bytes()


def test_returned_summary_equals_file(golden_report):
    run_dir, summary = golden_report
    assert json.loads((run_dir / "report" / "summary.json").read_text()) == summary


def test_ttlb_median_rederived_from_records(golden_report):
    """The web TTLB median of each variant, computed here with the statistics module straight
    from transfers.jsonl (warm-up and non-ok excluded), equals the summary's."""
    run_dir, summary = golden_report
    for v in ("vanilla", "ewma-66"):
        vals = [t["ttlb_s"] for k in (0, 1, 2) for t in records(run_dir, v, k, "transfers.jsonl")
                if t["group"] == "web" and not t["warmup"] and t["status"] == "ok"]
        entry = summary["metrics"]["ttlb_s/web:small"]["variants"][v]
        assert entry["n"] == len(vals)
        assert entry["median"] == round_floats(statistics.median(vals))
        assert entry["mean"] == round_floats(statistics.fmean(vals))
    vb = summary["metrics"]["ttlb_s/web:small"]["variants"]["ewma-66"]["vs_baseline"]
    base = summary["metrics"]["ttlb_s/web:small"]["variants"]["vanilla"]["median"]
    new = summary["metrics"]["ttlb_s/web:small"]["variants"]["ewma-66"]["median"]
    assert vb["median_change_pct"] == pytest.approx(100 * (new - base) / base, rel=1e-5)
    assert vb["median_change_pct"] < -30              # EWMA helps the light web client


def test_cell_wait_rederived_from_records(golden_report):
    """sum(time_ms) / sum(removed) of the inbound side after the warm-up, pooled over reps."""
    run_dir, summary = golden_report
    for v in ("vanilla", "ewma-66"):
        t_sum = n_sum = 0
        for k in (0, 1, 2):
            t0 = json.loads((run_dir / v / f"rep-{k}" / "meta.json").read_text())["t_workload_start"]
            for c in records(run_dir, v, k, "cellstats.jsonl"):
                if c["relay"] == "middle0" and c["t"] >= t0 + 10.0:
                    t_sum += sum(c["inbound"]["time_ms"].values())
                    n_sum += sum(c["inbound"]["removed"].values())
        got = summary["metrics"]["cell_wait_ms/middle0/inbound/all"]["variants"][v]["wait_per_cell_ms"]
        assert got == round_floats(t_sum / n_sum)
    # The web client's circuit, known by its client (circuits.jsonl chained through guard0):
    # the generator's web circuit waits ~22 ms under EWMA and ~140 ms under round robin.
    web = summary["metrics"]["cell_wait_ms/client:web/middle/inbound"]["variants"]
    bulk = summary["metrics"]["cell_wait_ms/client:bulk/middle/inbound"]["variants"]
    assert 15 < web["ewma-66"]["median"] < 30 < 120 < web["vanilla"]["median"] < 160
    assert bulk["vanilla"]["n"] > web["vanilla"]["n"] > 0
    # Gopal & Heninger's 70% rule puts the two bulk circuits in heavy and the web one in light.
    light = summary["metrics"]["cell_wait_ms/middle0/inbound/gh70-light"]["variants"]
    heavy = summary["metrics"]["cell_wait_ms/middle0/inbound/gh70-heavy"]["variants"]
    for v in ("vanilla", "ewma-66"):
        assert (light[v]["n"], light[v]["median"]) == (web[v]["n"], web[v]["median"])
        assert heavy[v]["n"] == bulk[v]["n"]


def test_error_counts(golden_report):
    _, summary = golden_report
    e = summary["errors"]
    assert e["vanilla"]["causes"] == {"timeout": 1} and e["vanilla"]["errors"] == 1
    assert e["ewma-66"]["causes"] == {"circuit_failed": 1}
    assert e["vanilla"]["transfers"] == sum(e["vanilla"]["per_rep"][k]["transfers"] for k in ("0", "1", "2"))


def test_crashed_repetition_reported_missing(golden_report):
    run_dir, summary = golden_report
    reps = {(r["variant"], r["rep"]): r for r in summary["repetitions"]}
    crashed = reps[("ewma-66", 1)]
    assert crashed["status"] == "failed"
    assert "relay middle0 exited unexpectedly" in crashed["error"]
    assert any("truncated record" in n for n in crashed["notes"])
    assert all(r["status"] == "ok" for k, r in reps.items() if k != ("ewma-66", 1))
    missing = "\n".join(summary["missing"])
    assert "variant ewma-66 rep 1: failed (relay middle0 exited unexpectedly" in missing
    assert "variant ewma-66 rep 1: relay middle0: no complete 30 s window" in missing
    assert "vanilla" not in missing
    # The crashed rep still contributes what it measured before the crash ...
    per_rep = summary["metrics"]["ttlb_s/web:small"]["variants"]["ewma-66"]["per_rep"]
    assert per_rep["1"]["n"] > 0
    # ... but no throughput (its records stop before a window after the warm-up completes).
    assert summary["metrics"]["relay_throughput_Bps/middle0"]["variants"]["ewma-66"]["per_rep"]["1"]["n"] == 0
    for name in ("report.md", "report.html"):
        text = (run_dir / "report" / name).read_text()
        assert "Missing or incomplete data" in text
        assert "variant ewma-66 rep 1: failed (relay middle0 exited unexpectedly" in text


def test_figures_exist_and_are_pngs(golden_report):
    run_dir, _ = golden_report
    figs = sorted((run_dir / "report" / "figures").glob("*.png"))
    names = {f.name for f in figs}
    assert {"cdf-transfer-web-small.png", "cdf-transfer-bulk-bulk.png", "quantiles-web-small.png",
            "cdf-circuit_build_s.png", "cdf-cell_wait-middle0.png", "timeseries-relay-throughput.png",
            "timeseries-cell-wait.png"} <= names
    for f in figs:
        data = f.read_bytes()
        assert data[:8] == PNG_MAGIC, f.name
        assert len(data) > 5 * 1024, f.name


def test_cdf_data_matches_summary(golden_report):
    """The arrays the CDF figures plot have the medians and counts summary.json reports."""
    run_dir, summary = golden_report
    run = load_run(run_dir)
    ex = metrics.extract(run)
    checked = 0
    for mid in ("ttlb_s/web:small", "ttfb_s/web:small", "ttlb_s/bulk:bulk", "circuit_build_s",
                "cell_wait_ms/middle0/inbound/all"):
        series = figures.cdf_data(ex.metrics[mid], run.variants)
        for v, s in series.items():
            entry = summary["metrics"][mid]["variants"][v]
            assert s.n == entry["n"]
            assert round_floats(statistics.median(s.x.tolist())) == entry["median"]
            assert s.y[-1] == 1.0
            reps_with_data = sum(1 for n in entry["per_rep"].values() if n["n"])
            assert s.reps == reps_with_data
            if s.reps >= 2:
                grid, lo, hi = s.band
                assert (lo <= hi).all() and lo[0] <= s.x[0] and hi[-1] >= s.x[-1] - 1e-12
            else:
                assert s.band is None
            checked += 1
    assert checked == 10


def test_html_is_self_contained_and_md_links_exist(golden_report):
    run_dir, summary = golden_report
    out = run_dir / "report"
    html = (out / "report.html").read_text()
    assert 'src="figures/' not in html
    assert html.count("data:image/png;base64,") == len(list((out / "figures").glob("*.png")))
    md = (out / "report.md").read_text()
    for needle in ("Metric definitions", "Scenario | golden", "vanilla (baseline), ewma-66", "tor version | 0.4.9.11",
                   "testhost", "Time to last byte (from the request) (s)", "Error rate"):
        assert needle in md, needle
    import re
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert links and all((out / link).is_file() for link in links)


def test_onionperf_export(golden_report):
    run_dir, summary = golden_report
    out = run_dir / "report" / "onionperf"
    files = sorted(p.name for p in out.glob("*.json"))
    assert files == [f"{v}-rep{k}.onionperf.analysis.json" for v in ("ewma-66", "vanilla") for k in (0, 1, 2)]
    doc = json.loads((out / "vanilla-rep0.onionperf.analysis.json").read_text())
    assert doc["type"] == "onionperf" and doc["version"] == "3.1"
    assert set(doc["data"]) == {"web0", "bulk0", "bulk1"}
    web = doc["data"]["web0"]
    assert web["measurement_ip"] == "10.77.0.32"
    assert set(web["tor"]) == {"circuits", "streams"}
    streams = web["tgen"]["streams"]
    required = {"byte_info", "is_complete", "is_error", "is_success", "stream_id", "stream_info", "time_info",
                "transport_info", "unix_ts_end", "unix_ts_start"}
    n_ok = 0
    for sid, s in streams.items():
        assert required <= set(s) and s["stream_id"] == sid
        assert s["stream_info"]["recvsize"] == "51200"
        if s["is_success"]:
            n_ok += 1
            es = s["elapsed_seconds"]
            ti = s["time_info"]
            # TTLB as onionperf/tornettools compute it: (last byte - command) in usecs.
            ttlb = (int(ti["usecs-to-last-byte-recv"]) - int(ti["usecs-to-command"])) / 1e6
            assert es["payload_bytes_recv"]["51200"] == pytest.approx(int(ti["usecs-to-last-byte-recv"]) / 1e6, abs=2e-6)
            assert es["payload_progress_recv"]["1.0"] == es["payload_bytes_recv"]["51200"]
            assert ttlb > 0
    summary_ttlb = web["tgen"]["stream_summary"]["time_to_last_byte_recv"]["51200"]
    assert sum(len(v) for v in summary_ttlb.values()) == n_ok
    assert summary["metrics"]["ttlb_s/web:small"]["variants"]["vanilla"]["per_rep"]["0"]["n"] == n_ok
    assert all(c["buildtime_seconds"] > 0 for c in web["tor"]["circuits"].values())


def test_circuit_attribution_per_repetition_is_reported(golden_report):
    run_dir, summary = golden_report
    cov = {(r["variant"], r["rep"]): r["circuits"] for r in summary["repetitions"]}
    assert all(c["data_hops_unlabelled"] == 0 and c["ambiguous_channel_ends"] == 0 for c in cov.values())
    # web0's second circuit (after its failed build) has no relay records in the generator
    assert (cov[("ewma-66", 0)]["workload_circuits"], cov[("ewma-66", 0)]["workload_complete"]) == (4, 3)
    md = (run_dir / "report" / "report.md").read_text()
    assert "Circuits known by their client" in md and "| ewma-66 | 0 | 4 | 3 | 6 | 0 | 0 |" in md
