"""Transfers the window cut off are right-censored observations (issue 36 item 3): kept by
the time metrics through Kaplan-Meier, counted in summary.json and the report, distinct
from stalls and other errors."""

import json

import numpy as np
import pytest

from torbed.analysis import inference, metrics
from torbed.analysis.load import load_run


def tr(t_req, ttlb=None, status="ok", cause=None, t_censor=None, first=None):
    rec = {"type": "transfer", "group": "bulk", "file": "big", "size": 5_000_000, "status": status,
           "warmup": False, "t_start": t_req - 0.5, "t_request": t_req, "t_first_byte": None,
           "t_last_byte": None, "error": None if cause is None else {"cause": cause, "detail": "x"}}
    if ttlb is not None:
        rec.update(t_first_byte=t_req + (first if first is not None else 0.5), t_last_byte=t_req + ttlb,
                   ttfb_s=first if first is not None else 0.5, ttlb_s=ttlb, ttfb_stream_s=None, ttlb_stream_s=ttlb + 0.5)
    elif first is not None:
        rec.update(t_first_byte=t_req + first, ttfb_s=first)
    if t_censor is not None:
        rec["t_censor"] = t_censor
    return rec


def make_run(root, per_rep):
    """per_rep: {variant: [transfers of rep 0, rep 1, ...]}."""
    variants = list(per_rep)
    reps = len(per_rep[variants[0]])
    root.mkdir(parents=True)
    (root / "run.json").write_text(json.dumps({"schema": 1, "name": "cens", "scenario": {"name": "cens"},
                                               "seed": 1, "variants": variants, "baseline": variants[0],
                                               "repetitions": reps}))
    for v, rs in per_rep.items():
        for k, transfers in enumerate(rs):
            d = root / v / f"rep-{k}"
            d.mkdir(parents=True)
            (d / "meta.json").write_text(json.dumps({"schema": 1, "variant": v, "rep": k, "status": "ok",
                                                     "error": None, "t_workload_start": 90.0, "warmup_s": 5.0,
                                                     "duration_s": 40.0}))
            (d / "transfers.jsonl").write_text("".join(json.dumps(t) + "\n" for t in transfers))
            for f in ("cellstats.jsonl", "relay_bw.jsonl"):
                (d / f).write_text("")
    return root


def fast_rep():
    return [tr(100, x) for x in (10, 11, 12, 13, 14, 15)]


def slow_rep(t_censor=130.0):
    # completed 20, 22, 24; three cut off at the window's end after 30 s (t_censor 130)
    return [tr(100, 20), tr(100, 22), tr(100, 24),
            tr(100, status="cancelled", cause="run_ended", t_censor=t_censor, first=2.0),
            tr(100, status="cancelled", cause="run_ended", t_censor=t_censor),
            tr(100, status="cancelled", cause="run_ended", t_censor=t_censor),
            tr(100, status="error", cause="stall"), tr(100, status="timeout", cause="timeout")]


def test_censored_transfers_are_kept_with_their_censoring_time(tmp_path):
    run = load_run(make_run(tmp_path / "r", {"a": [fast_rep()], "b": [slow_rep()]}))
    ex = metrics.extract(run)
    m = ex.metrics["ttlb_s/bulk:big"]
    assert sorted(m.values["b"][0].tolist()) == [20, 22, 24]
    assert m.censored["b"][0].tolist() == [30.0, 30.0, 30.0]
    # TTFB: the first byte of a transfer cut off later was observed; the other two censored
    f = ex.metrics["ttfb_s/bulk:big"]
    assert 2.0 in f.values["b"][0].tolist() and f.censored["b"][0].tolist() == [30.0, 30.0]
    # KM: 20, 22, 24, 30+ x3 -> S = 5/6, 4/6, 3/6 = 0.5 at 24 (no later event) -> 24;
    # the median of the completed transfers alone would be 22
    rs = inference.rep_summaries(m, "b")[0]
    assert rs["censored"] == 3 and rs["method"] == "kaplan-meier" and rs["median"] == 24.0
    assert rs["mean"] is None and rs["p90"] is None
    assert inference.rep_summaries(m, "a")[0] == {"n": 6, "censored": 0, "median": 12.5, "p90": pytest.approx(14.5),
                                                  "mean": 12.5}


def test_older_records_without_t_censor_use_the_window_end(tmp_path):
    rep = slow_rep()
    for t in rep:
        t.pop("t_censor", None)
    run = load_run(make_run(tmp_path / "r", {"a": [fast_rep()], "b": [rep]}))
    m = metrics.extract(run).metrics["ttlb_s/bulk:big"]
    assert m.censored["b"][0].tolist() == [30.0] * 3     # window end 90 + 40 = 130, request at 100


def test_outcomes_count_completed_censored_stalled_failed(tmp_path):
    run = load_run(make_run(tmp_path / "r", {"a": [fast_rep()], "b": [slow_rep()]}))
    out = metrics.transfer_outcomes(run)
    assert {k: out["b"][k] for k in ("completed", "censored", "stalled", "failed")} == \
        {"completed": 3, "censored": 3, "stalled": 1, "failed": 1}
    assert out["b"]["by_group"]["bulk:big"]["censored"] == 3 and out["a"]["censored"] == 0
    # the error rate counts the stall and the timeout, not the censored transfers
    err = metrics.error_rates(run)["b"]
    assert err["errors"] == 2 and err["transfers"] == 5


def test_report_shows_censoring_and_pairs_on_km_medians(tmp_path):
    from torbed.analysis.report import report
    blocks = {"a": [fast_rep() for _ in range(3)], "b": [slow_rep(), slow_rep(), slow_rep()]}
    run_dir = make_run(tmp_path / "r", blocks)
    report(run_dir)
    s = json.loads((run_dir / "report" / "summary.json").read_text())
    d = s["metrics"]["ttlb_s/bulk:big"]["variants"]["b"]
    assert d["censored"] == 9 and d["completed"] == 9 and d["km_median"] == 24.0 and d["median"] == 22.0
    assert s["transfer_outcomes"]["b"]["censored"] == 9
    inf = d["vs_baseline"]["inference"]
    assert inf["test"] == "paired" and inf["censoring"]["censored"] == {"a": 0, "b": 9}
    assert inf["change_pct"] == pytest.approx(100 * (24 / 12.5 - 1))
    md = (run_dir / "report" / "report.md").read_text()
    assert "Transfer outcomes" in md and "9 censored in all" in md and "Kaplan-Meier median" in md


def test_median_not_reached_is_said(tmp_path):
    mostly_cut = [tr(100, 20)] + [tr(100, status="cancelled", cause="run_ended", t_censor=130.0)] * 3
    run = load_run(make_run(tmp_path / "r", {"a": [fast_rep()] * 3, "b": [slow_rep(), slow_rep(), mostly_cut]}))
    m = metrics.extract(run).metrics["ttlb_s/bulk:big"]
    rs = inference.rep_summaries(m, "b")
    assert rs[2]["median"] is None and rs[2]["median_not_reached"]
    res = inference.compare_arms(m, "a", m, "b", same_run=True, rng=np.random.default_rng(0))
    assert "not reached in repetition(s) 2" in res["test_reason"] and res["test"] == "welch"


def test_replay_flows_and_fetches_cut_off_are_censored_like_bulk(tmp_path):
    # Records as the driver writes them now for fetch and replay (issue 36 item 3): each
    # kind's cut-off transfer is a censored time at its own t_censor, per (group, file).
    def kind(rec, group, file, workload):
        return {**rec, "group": group, "file": file, "workload": workload}

    rep = ([kind(tr(100, x), "web", "big", "fetch") for x in (5, 6, 7)]
           + [kind(tr(100, status="cancelled", cause="run_ended", t_censor=133.0), "web", "big", "fetch")]
           + [kind(tr(100, x), "ssh", "trace", "replay") for x in (1, 2)]
           + [kind(tr(100, status="cancelled", cause="run_ended", t_censor=131.5), "ssh", "trace", "replay")])
    run = load_run(make_run(tmp_path / "r", {"a": [rep]}))
    ex = metrics.extract(run)
    assert ex.metrics["ttlb_s/web:big"].censored["a"][0].tolist() == [33.0]
    assert ex.metrics["ttlb_s/ssh:trace"].censored["a"][0].tolist() == [31.5]
    assert sorted(ex.metrics["ttlb_s/ssh:trace"].values["a"][0].tolist()) == [1, 2]
    outcomes = metrics.transfer_outcomes(run)["a"]
    assert outcomes["censored"] == 2 and outcomes["by_group"]["ssh:trace"]["censored"] == 1, outcomes
