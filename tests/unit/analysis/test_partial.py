"""Partial runs never crash the report: what is missing is said, not raised."""

import json
import shutil

from torbed.analysis.report import report


def test_run_with_nothing_but_run_json(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"variants": ["a", "b"], "repetitions": 2}))
    s = report(run)
    assert len(s["missing"]) == 4
    assert s["missing"][0].startswith("variant a rep 0: not run; 0 transfers")
    assert list((run / "report" / "figures").glob("*.png")) == []
    assert list((run / "report" / "onionperf").glob("*.json")) == []
    html = (run / "report" / "report.html").read_text()
    assert "No figures" in html and "variant b rep 1: not run" in html
    assert s["errors"]["a"] == {"transfers": 0, "errors": 0, "rate": None, "causes": {}, "by_group": {},
                                "per_rep": {"0": {"transfers": 0, "errors": 0, "rate": None},
                                            "1": {"transfers": 0, "errors": 0, "rate": None}}}


def test_variant_never_run(golden_copy):
    shutil.rmtree(golden_copy / "ewma-66")
    s = report(golden_copy)
    e = s["metrics"]["ttlb_s/web:small"]["variants"]["ewma-66"]
    assert e["n"] == 0
    assert e["vs_baseline"]["median_change_pct"] is None and e["vs_baseline"]["mwu_pvalue"] is None
    assert "variant ewma-66 rep 0: not run" in "\n".join(s["missing"])
    assert (golden_copy / "report" / "figures" / "cdf-transfer-web-small.png").is_file()


def test_baseline_without_data_and_killed_rep(golden_copy):
    for k in (0, 1, 2):
        d = golden_copy / "vanilla" / f"rep-{k}"
        for f in ("transfers.jsonl", "cellstats.jsonl", "relay_bw.jsonl"):
            (d / f).unlink()
        meta = json.loads((d / "meta.json").read_text())
        meta["status"] = "running"
        (d / "meta.json").write_text(json.dumps(meta))
    s = report(golden_copy)
    vb = s["metrics"]["ttlb_s/web:small"]["variants"]["ewma-66"]["vs_baseline"]
    assert vb["baseline"] == "vanilla" and vb["median_change_pct"] is None
    assert vb["inference"]["status"] == "not enough repetitions" and vb["inference"]["n_baseline"] == 0
    assert "not enough repetitions" in (golden_copy / "report" / "report.md").read_text()
    missing = "\n".join(s["missing"])
    assert "variant vanilla rep 0: running; 0 transfers" in missing
    assert "the run was killed before it finished" in missing
    assert "no transfers.jsonl" in missing
