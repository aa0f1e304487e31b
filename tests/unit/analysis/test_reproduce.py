"""`make reproduce`'s runner (analysis/reproduce.py) without running tor: a finished run
directory in the runs folder is reused (resumability), reported, and turned into
docs/reproduction.md rows with the paper's number, ours with intervals and the verdicts."""

import json
import math
import shutil
from pathlib import Path

import pytest

from torbed.analysis import reproduce
from torbed.analysis.report import analyse

from .conftest import GOLDEN_RUN


def finished_copy(dest, status="ok"):
    shutil.copytree(GOLDEN_RUN, dest, ignore=shutil.ignore_patterns("report"))
    info = json.loads((dest / "run.json").read_text())
    info["status"] = status
    (dest / "run.json").write_text(json.dumps(info))
    return dest


def test_evaluate_against_the_papers_numbers():
    _, _, s = analyse(GOLDEN_RUN)
    exp1 = next(r for r in reproduce.ROWS if r.experiment == "tang-goldberg-2010-exp1")
    ev = reproduce.evaluate(exp1, s)
    inf = s["metrics"]["ttlb_s/web:small"]["variants"]["ewma-66"]["vs_baseline"]["inference"]
    assert ev["change_pct"] == inf["change_pct"] < 0
    assert ev["direction"] == "agrees"                        # golden: a clear decrease
    # Rough size: the 90% interval of log(ours / paper's) within +-log 2.
    lo90, hi90 = inf["equivalence"]["ci90"]
    inside = all(abs(math.log((1 + x / 100) / (1 - 0.327))) <= math.log(2) for x in (lo90, hi90))
    assert inside == ev["size"].startswith("agrees within a factor 2")
    assert "vanilla" in ev["ours"] and "[" in ev["ours"] and "reps" in ev["ours"]
    # A paper saying "no real change" disagrees with a clear decrease.
    small = next(r for r in reproduce.ROWS if r.variant == "ewma-3")
    ev = reproduce.evaluate(reproduce.Row(**{**small.__dict__, "experiment": "x", "variant": "ewma-66"}), s)
    assert ev["direction"].startswith("disagrees") and not ev["ok"]
    # Too few repetitions: said so, no verdict.
    thr = reproduce.Row("p", "r", "v", "x", "relay_throughput_Bps/middle0", variant="ewma-66", paper_change_pct=300)
    ev = reproduce.evaluate(thr, s)
    assert ev["direction"] == "not tested" and "not enough repetitions" in ev["ours"]


def test_quick_run_reuses_a_finished_run_and_writes_the_document(tmp_path, capsys):
    runs = tmp_path / "runs"
    finished_copy(runs / "tang-goldberg-2010-exp3" / "golden-run")
    doc = tmp_path / "reproduction.md"
    rc = reproduce.main(["--quick", "--runs", str(runs), "--doc", str(doc), "--duration", "90s"])
    assert rc == 0
    assert "reusing finished run" in capsys.readouterr().out
    text = doc.read_text()
    assert "**Shortened run**" in text
    lines = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| Tang") or
             line.startswith("| Gopal") or line.startswith("| Engler") or line.startswith("| IPSJ")}
    queue = next(v for k, v in lines.items() if k.startswith("Exp. 3"))
    assert "653 ms -> 115 ms" in queue and "Δ -8" in queue and "| agrees |" in queue
    assert "not part of this shortened run" in next(v for k, v in lines.items() if k.startswith("Exp. 1"))
    # Torchestra's and the multi-threaded relay's experiments are wired in but not part of this run.
    gopal = [v for v in lines.values() if v.startswith("| Gopal")]
    assert len(gopal) == 10 and all("not part of this shortened run" in v for v in gopal), gopal
    engler = [v for v in text.splitlines() if v.startswith("| Engler")]
    assert len(engler) == 3 and all("not part of this shortened run" in v for v in engler), engler
    # The circuit-switching experiment (Fig. 4 a-d) is wired in too, and not part of this run.
    ipsj = [v for v in text.splitlines() if v.startswith("| IPSJ")]
    assert len(ipsj) == 7 and all("not part of this shortened run" in v for v in ipsj), ipsj
    assert any("about 90% lower" in v and "vs ewma-66" in v for v in ipsj)
    assert (runs / "tang-goldberg-2010-exp3" / "golden-run" / "report" / "summary.json").is_file()
    assert json.loads((runs / "reproduction.json").read_text())["settings"]["quick"] is True


def test_an_unfinished_run_is_not_reused(tmp_path, capsys):
    runs = tmp_path / "runs"
    finished_copy(runs / "tang-goldberg-2010-exp3" / "golden-run", status="interrupted")
    assert reproduce.main(["--quick", "--runs", str(runs), "--duration", "90s", "--dry-run"]) == 0
    assert "tang-goldberg-2010-exp3: to run" in capsys.readouterr().out
    finished_copy(runs / "tang-goldberg-2010-exp3" / "golden-run-2")
    assert reproduce.main(["--quick", "--runs", str(runs), "--duration", "90s", "--dry-run"]) == 0
    assert "finished, reused" in capsys.readouterr().out
    # ... but only with the same duration.
    assert reproduce.main(["--quick", "--runs", str(runs), "--duration", "120s", "--dry-run"]) == 0
    assert "to run" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--only", "nope"], ["--reps", "0"]])
def test_bad_arguments_exit_2(argv, tmp_path, capsys):
    assert reproduce.main(argv + ["--runs", str(tmp_path), "--dry-run"]) == 2
    assert "reproduce:" in capsys.readouterr().err


def test_a_row_against_another_baseline_is_compared_with_that_baseline(tmp_path):
    """A report's vs_baseline inference is against the run's baseline (vanilla); a row whose
    baseline is another variant must get its numbers from that comparison, not vanilla's."""
    from torbed.analysis import reproduce as r
    from torbed.analysis.report import analyse
    from torbed.analysis import summary as summary_mod
    run = Path(__file__).resolve().parents[2] / "data" / "golden-run"
    summ = summary_mod.round_floats(analyse(run)[2])
    metric = next(m for m, e in summ["metrics"].items()
                  if ((e["variants"].get("ewma-66") or {}).get("vs_baseline") or {}).get("inference", {}).get("status") == "tested")
    fwd = r.Row("p", "x", "y", "golden", metric, baseline="vanilla", variant="ewma-66")
    back = r.Row("p", "x", "y", "golden", metric, baseline="ewma-66", variant="vanilla")
    cache: dict = {}
    e_fwd = r.evaluate(fwd, r.summary_for(fwd, {"golden": summ}, {"golden": run}, cache))
    e_back = r.evaluate(back, r.summary_for(back, {"golden": summ}, {"golden": run}, cache))
    assert ("golden", "ewma-66") in cache and ("golden", "vanilla") not in cache
    # The reverse comparison's change is the inverse ratio: (1 + a)(1 + b) = 1.
    a, b = e_fwd["change_pct"] / 100, e_back["change_pct"] / 100
    assert abs((1 + a) * (1 + b) - 1) < 0.02, (a, b)


def test_throughput_is_shown_in_megabytes_per_second():
    assert reproduce._fmt(2465000.0, "B/s") == "2.46 MB/s"
    assert reproduce._fmt(0.374, "s") == "0.374 s" and reproduce._fmt(None, "B/s") == "–"


def _fake_summary(change_pct, ci95, equivalence, test="paired", n=3):
    inf = {"status": "tested", "test": test, "n": n, "n_baseline": n, "change_pct": change_pct,
           "change_ci95": ci95, "pvalue": 0.5, "equivalence": equivalence}
    return {"metrics": {"m": {"variants": {"vanilla": {"rep_summary": {"estimate": 1.0}},
                                           "x": {"rep_summary": {"estimate": 1.0},
                                                 "vs_baseline": {"inference": inf}}}}}}


def test_no_change_needs_the_equivalence_test_not_a_wide_interval():
    """A paper's 'no real change' row agrees only when TOST puts ours within the margin; an
    interval that merely holds 0 (low power) is inconclusive, whatever its point estimate."""
    row = reproduce.Row("p", "r", "v", "x", "m", variant="x", expect="small")
    wide = _fake_summary(+2.0, [-40.0, +70.0], {"margin_pct": 10.0, "pvalue": 0.6, "equivalent": False,
                                                "ci90": [-33.0, +55.0]})
    ev = reproduce.evaluate(row, wide)
    assert ev["direction"].startswith("inconclusive") and not ev["ok"]
    tight = _fake_summary(+2.0, [-3.0, +7.0], {"margin_pct": 10.0, "pvalue": 0.001, "equivalent": True,
                                               "ci90": [-2.0, +6.0]})
    ev = reproduce.evaluate(row, tight)
    assert ev["direction"].startswith("agrees: equivalent within ±10%") and ev["ok"]
    assert "paired, 3 blocks" in ev["ours"]


def test_rough_size_needs_the_ratio_interval_within_a_factor_two():
    row = reproduce.Row("p", "r", "v", "x", "m", variant="x", paper_change_pct=-50.0)
    eq = {"margin_pct": 10.0, "pvalue": 0.9, "equivalent": False}
    # Point estimate right on the paper's, interval from -90% to -5%: holds anything -> inconclusive.
    ev = reproduce.evaluate(row, _fake_summary(-50.0, [-92.0, -2.0], {**eq, "ci90": [-90.0, -5.0]}))
    assert ev["size"].startswith("inconclusive") and not ev["ok"]
    # -40% [-45%, -35%] vs -50%: ours / paper's in [1.1, 1.3] -> within a factor 2.
    ev = reproduce.evaluate(row, _fake_summary(-40.0, [-46.0, -33.0], {**eq, "ci90": [-45.0, -35.0]}))
    assert ev["size"].startswith("agrees within a factor 2") and ev["ok"]
    # +5% [+3%, +7%] (90%) vs -50%: ours / paper's from 2.06 to 2.14, all beyond 2 -> differs.
    ev = reproduce.evaluate(row, _fake_summary(+5.0, [+2.0, +8.0], {**eq, "ci90": [+3.0, +7.0]}))
    assert ev["size"].startswith("differs") and not ev["ok"]


def test_runs_are_never_niced(tmp_path, monkeypatch):
    """A niced run measures whatever else the machine does: neither the runner nor the Makefile nices."""
    calls = []
    monkeypatch.setattr(reproduce.subprocess, "call", lambda cmd: calls.append(cmd) or 1)
    reproduce._run(reproduce.EXPERIMENTS[0], tmp_path / "exp", 3, "90s")
    assert calls and calls[0][0] == reproduce.sys.executable and "nice" not in calls[0]
    make = (Path(reproduce.REPO) / "Makefile").read_text()
    recipe = make[make.index("\nreproduce:"):].split("\n\n")[0]
    assert "nice" not in recipe
