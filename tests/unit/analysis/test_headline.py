"""The report's first sentence and figure, the declared primary comparison and the terminal's
80-column table (analysis/headline.py, summary.add_primary, cli.report_table).

Summaries: the golden run's (a synthetic Tang & Goldberg experiment 1 in miniature: a Holm
finding), two real quickstart runs, trimmed: tests/data/demo.summary.json (`make demo`, every
repetition valid: it concludes) and tests/data/demo-busy.summary.json (a busy machine: the CPU
gate left too few repetitions to test), and an A/A run made of tests/data/aa-recorded's six
repetitions of one variant split into two arms.
"""

import copy
import io
import json
import re
import shutil

import pytest
from rich.console import Console

from torbed.analysis import cli, headline
from torbed.analysis.errors import InputError
from torbed.analysis.summary import add_primary, round_floats

from .conftest import DATA, GOLDEN_SUMMARY


def golden() -> dict:
    return json.loads(GOLDEN_SUMMARY.read_text())


def busy() -> dict:
    return json.loads((DATA / "demo-busy.summary.json").read_text())


def demo() -> dict:
    return json.loads((DATA / "demo.summary.json").read_text())


def terminal(summary: dict) -> list[str]:
    """What `torbed report` prints for the summary at 80 columns (lead, table, notes)."""
    con = Console(width=80, file=io.StringIO(), record=True)
    con.print(headline.lead(summary).text.replace("**", ""), markup=False, highlight=False)
    table, notes = cli.report_table(summary)
    con.print(table)
    for line in notes:
        con.print(line, markup=False, highlight=False)
    return con.export_text().splitlines()


def test_lead_without_primary_is_the_clients_holm_finding():
    ld = headline.lead(golden())
    assert ld.text.startswith("**Finding:** ewma-66 cut time to last byte, web: small (50 KiB) by 45.6% against vanilla")
    assert "95% CI −49.6% to −41.3%" in ld.text and "Holm-adjusted p = 0.00072" in ld.text
    assert "Welch t-test, 3 vs 3 repetitions" in ld.text and "3 of 13 comparisons significant" in ld.text
    assert (ld.metric, ld.variant) == ("ttlb_s/web:small", "ewma-66")


def test_primary_is_read_alone_at_alpha():
    s = golden()
    pr = add_primary(s, "ttlb_s/web:small")
    assert pr["variant"] == "ewma-66" and pr["status"] == "tested" and pr["significant"]
    assert pr["pvalue"] < pr["alpha"] and pr["declared"] == "torbed report --primary"
    text = headline.lead(s).text
    assert text.startswith("**Finding:** ewma-66 cut time to last byte")
    assert re.search(r"; p = [0-9.e-]+, Welch", text) and "declared before the run" in text


def test_make_demo_concludes():
    """The real `make demo` run: the declared comparison, paired over 3 blocks, is the finding;
    it also survives Holm over the 27 outcome comparisons."""
    s = demo()
    assert headline.lead(s).text == (
        "**Finding:** ewma-66 cut time to last byte, web: small (300 KB) by 57.9% against vanilla (median per "
        "repetition; 95% CI −62.7% to −52.5%; p = 0.001, paired t-test over 3 blocks; the primary comparison, "
        "declared before the run).")
    s["inference"].pop("primary")
    text = headline.lead(s).text
    assert text.startswith("**Finding:** ewma-66 cut time to last byte, web: small (300 KB) by 57.9%")
    assert "Holm-adjusted p = 0.027, paired t-test over 3 blocks; 2 of 27 comparisons significant" in text


def test_primary_errors_and_no_data():
    s = golden()
    with pytest.raises(InputError, match="not a metric of this run"):
        add_primary(s, "ttlb_s/web:smal")
    with pytest.raises(InputError, match="not a variant compared"):
        add_primary(s, "ttlb_s/web:small", "vanilla")
    # A kind of metric no repetition recorded (e.g. every repetition excluded): no data, no error.
    pr = add_primary(s, "cell_delay_ms/replay/up")
    assert pr["status"] == "no data" and not pr["significant"]
    assert headline.lead(s).text.startswith("**Not tested:** cell_delay_ms/replay/up, ewma-66 against vanilla: no data")


def test_untested_lead_is_descriptive_and_says_why():
    s = busy()
    text = headline.lead(s).text
    assert text.startswith("**Not tested:** ewma-66 cut time to last byte, web: small (300 KB) by 57.7% against vanilla")
    assert "descriptive only, no interval and no p" in text
    assert "3 vs 1 repetitions with data, 2 of 6 repetitions excluded by the mechanism gates" in text
    s["inference"].pop("primary")                     # the same lead without a declared primary
    assert headline.lead(s).text == text


@pytest.mark.parametrize("which", ["golden", "golden+primary", "busy", "demo"])
def test_terminal_fits_80_columns(which):
    s = {"busy": busy, "demo": demo}.get(which, golden)()
    if which == "golden+primary":
        add_primary(s, "ttlb_s/web:small")
    lines = terminal(round_floats(s))
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert not any("…" in line for line in lines[:16]), lines      # no cell cut short
    text = "\n".join(lines)
    assert "TTLB web:small (s)" in text and "Δ [95% CI]" in text
    if which == "busy":
        assert "-58% descr." in text and "variant vanilla rep 1: invalid" in text
    if which in ("golden+primary", "demo"):
        row = next(line for line in lines if "TTLB web:small (s) *" in line)
        assert row.rstrip().endswith("sig.")
    if which == "demo":
        assert "-100% [-530,+330]" in text and "+1007% " in text    # near-zero queue waits, still whole


def test_lead_figure_is_the_metric_cdf(golden_report):
    """report.md: the title, the finding, then the web client's transfer-time CDFs; that
    figure is not embedded a second time in the Figures section."""
    run_dir, _ = golden_report
    md = (run_dir / "report" / "report.md").read_text().split("\n\n")
    assert md[0].startswith("# torbed report") and md[1].startswith("**Finding:** ewma-66 cut time to last byte")
    assert md[2].startswith("![Transfer times from the request, web: small") and "cdf-transfer-web-small.png" in md[2]
    assert sum("cdf-transfer-web-small.png" in part for part in md) == 1


def _aa_run(tmp_path, arm_a, arm_b):
    """A two-variant run from aa-recorded's repetitions of one variant (an A/A in disguise)."""
    src = DATA / "aa-recorded"
    dest = tmp_path / f"aa-{''.join(map(str, arm_a))}"
    info = json.loads((src / "run.json").read_text())
    for name, reps in (("vanilla", arm_a), ("ewma-66", arm_b)):
        for i, k in enumerate(reps):
            shutil.copytree(src / "vanilla" / f"rep-{k}", dest / name / f"rep-{i}")
    info.update(variants=["vanilla", "ewma-66"], baseline="vanilla", repetitions=len(arm_a),
                order=[[v, i] for i in range(len(arm_a)) for v in ("vanilla", "ewma-66")])
    (dest / "run.json").write_text(json.dumps(info))
    return dest


@pytest.mark.parametrize("arms", [((0, 1, 2), (3, 4, 5)), ((0, 2, 4), (1, 3, 5))])
def test_a_variant_against_itself_finds_nothing(tmp_path, arms):
    from torbed.analysis.report import analyse
    _, _, s = analyse(_aa_run(tmp_path, *arms), primary="ttlb_s/web:small")
    s = round_floats(s)
    pr = s["inference"]["primary"]
    assert pr["status"] == "tested" and pr["test"] == "paired" and not pr["significant"], pr
    assert s["inference"]["headline"] == []
    assert headline.lead(copy.deepcopy(s)).text.startswith("**No finding** at α = 0.05")


def test_a_tested_change_with_a_zero_baseline_prints_no_percentage():
    """A queue wait that is 0 in every baseline repetition is tested on a linear scale and has
    no % change (`make demo` hit one: exit0's outbound cell wait); the table says so instead
    of failing the whole report."""
    s = round_floats(demo())
    mid, v, e, inf = next(it for it in headline._comparisons(s) if it[3].get("status") == "tested"
                          and it[3].get("change_pct") is not None and round(it[3]["change_pct"]) == -100)
    inf.update(change_pct=None, change_ci95=[None, None], scale="linear")
    assert headline._delta(inf) == "– (base 0)"
    lines = terminal(s)                               # ranked last (no size), and no crash
    assert all(len(line) <= 80 for line in lines) and "TTLB web:small (s) *" in "\n".join(lines)


def test_a_significant_change_from_a_zero_baseline_has_a_headline_without_a_percentage():
    from torbed.analysis.inference import headline_line
    inf = {"statistic": "wait_per_cell", "change_pct": None, "change_ci95": [None, None], "pvalue_holm": 0.01,
           "test": "paired", "n": 5}
    line = headline_line("Cell wait, exit0 outbound", "ewma-66", "vanilla", inf)
    assert "changed from 0 in the baseline (no % change; Holm-adjusted p = 0.01; paired, 5 blocks)" in line
