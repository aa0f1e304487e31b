"""The `report` and `compare` subcommands: help, outputs and the exit-code contract
(0 ok, 1 failure, 2 bad input naming the file and line)."""

import argparse
import json

import pytest

from torbed.analysis import cli
from torbed.analysis.compare import compare_runs

from .conftest import copy_golden


def parser():
    p = argparse.ArgumentParser(prog="torbed")
    sub = p.add_subparsers(dest="command", required=True)
    cli.register(sub, argparse.ArgumentDefaultsHelpFormatter)
    return p


def run(argv):
    args = parser().parse_args([str(a) for a in argv])
    return args.func(args)


def test_help_names_the_stage_before(capsys):
    for cmd in ("report", "compare"):
        with pytest.raises(SystemExit) as e:
            parser().parse_args([cmd, "--help"])
        assert e.value.code == 0
        assert "RUN_DIR made by `torbed run`" in " ".join(capsys.readouterr().out.split())
    sub_help = parser().format_help()
    assert "RUN_DIR made by `torbed run`" in " ".join(sub_help.split())


def test_report_ok(golden_copy, capsys):
    assert run(["report", golden_copy]) == cli.EXIT_OK
    out = capsys.readouterr()
    assert "TTLB web:small (s)" in out.out
    assert "variant ewma-66 rep 1: failed" in " ".join(out.err.split())
    assert (golden_copy / "report" / "report.html").is_file()


def test_report_json_prints_summary(golden_copy, capsys):
    assert run(["report", golden_copy, "--json"]) == cli.EXIT_OK
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((golden_copy / "report" / "summary.json").read_text())
    assert printed["inference"]["correction"] == "holm" and printed["inference"]["headline"]


def test_report_out_and_baseline(golden_copy, tmp_path):
    out = tmp_path / "elsewhere"
    assert run(["report", golden_copy, "--baseline", "ewma-66", "--out", out]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["baseline"] == "ewma-66"
    assert "vs_baseline" in s["metrics"]["ttlb_s/web:small"]["variants"]["vanilla"]
    assert not (golden_copy / "report").exists()


def test_missing_run_json_is_bad_input(tmp_path, capsys):
    assert run(["report", tmp_path]) == cli.EXIT_BAD_INPUT
    err = " ".join(capsys.readouterr().err.split())
    assert "run.json: missing" in err


def test_malformed_record_is_bad_input_naming_file_and_line(golden_copy, capsys):
    p = golden_copy / "vanilla" / "rep-0" / "cellstats.jsonl"
    lines = p.read_text().splitlines(keepends=True)
    lines[4] = lines[4][:40] + "\n"                       # a broken record in the middle
    p.write_text("".join(lines))
    assert run(["report", golden_copy]) == cli.EXIT_BAD_INPUT
    err = "".join(capsys.readouterr().err.split())
    assert "vanilla/rep-0/cellstats.jsonl:5:notvalidJSON" in err


def test_unknown_baseline_is_bad_input(golden_copy, capsys):
    assert run(["report", golden_copy, "--baseline", "nope"]) == cli.EXIT_BAD_INPUT
    assert "--baseline 'nope' is not a variant" in " ".join(capsys.readouterr().err.split())


def test_unwritable_output_is_a_failure(golden_copy, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert run(["report", golden_copy, "--out", blocker]) == cli.EXIT_FAILED
    assert "error" in capsys.readouterr().err


def test_compare_same_scenario(tmp_path, capsys):
    a = copy_golden(tmp_path / "a")
    b = copy_golden(tmp_path / "b")
    assert run(["compare", a, b]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "golden-run (A) vs golden-run (B)" in out
    c = json.loads((b / "report" / "compare-golden-run.json").read_text())
    assert (b / "report" / "compare-golden-run.md").is_file()
    for mid, e in c["metrics"].items():
        for v, d in e["variants"].items():
            if d["n_a"]:
                assert d["median_a"] == d["median_b"] and d["median_change_pct"] == 0.0, (mid, v)
                assert d["ks_pvalue"] == 1.0 and d["mwu_pvalue"] == 1.0
            if d["inference"]["status"] == "tested":
                assert d["inference"]["pvalue"] == 1.0 and d["inference"]["change_pct"] == 0.0
    assert c["inference"]["family_size"] > 0 and c["inference"]["headline"] == []
    md = (b / "report" / "compare-golden-run.md").read_text()
    assert "A: variant ewma-66 rep 1: failed" in md


def test_compare_detects_a_change(tmp_path):
    a = copy_golden(tmp_path / "a")
    b = copy_golden(tmp_path / "b")
    # Make every web transfer of B's vanilla twice as slow.
    for k in (0, 1, 2):
        p = b / "vanilla" / f"rep-{k}" / "transfers.jsonl"
        recs = [json.loads(line) for line in p.read_text().splitlines()]
        for r in recs:
            if r["group"] == "web" and r["ttlb_s"] is not None:
                r["ttlb_s"] *= 2
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    c = compare_runs(a, b)
    d = c["metrics"]["ttlb_s/web:small"]["variants"]["vanilla"]
    assert d["median_change_pct"] == pytest.approx(100.0)
    assert d["mwu_pvalue"] < 0.001
    # Per repetition every median doubled: the inferential change is +100% and survives Holm.
    inf = d["inference"]
    assert inf["status"] == "tested" and inf["change_pct"] == pytest.approx(100.0)
    assert inf["change_ci95"][0] < 100.0 < inf["change_ci95"][1]
    assert inf["significant"] and c["inference"]["significant"] == [{"metric": "ttlb_s/web:small", "variant": "vanilla"}]
    assert c["metrics"]["ttlb_s/web:small"]["variants"]["ewma-66"]["median_change_pct"] == 0.0


def test_compare_different_scenarios(tmp_path, capsys):
    a = copy_golden(tmp_path / "a")
    b = copy_golden(tmp_path / "b")
    info = json.loads((b / "run.json").read_text())
    info["scenario"]["name"] = "other"
    (b / "run.json").write_text(json.dumps(info))
    assert run(["compare", a, b]) == cli.EXIT_BAD_INPUT
    assert "--force" in capsys.readouterr().err
    assert run(["compare", a, b, "--force"]) == cli.EXIT_OK
    c = json.loads((b / "report" / "compare-golden-run.json").read_text())
    assert c["forced"] is True
    capsys.readouterr()
    assert run(["compare", a, b, "--force", "--json"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out) == json.loads((b / "report" / "compare-golden-run.json").read_text())


def test_compare_missing_run_json(tmp_path, golden_copy):
    assert run(["compare", tmp_path, golden_copy]) == cli.EXIT_BAD_INPUT
