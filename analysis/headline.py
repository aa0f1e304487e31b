"""The report's first sentence (the finding, its interval and p) and the figure that shows it;
the terminal's compact table of the outcome comparisons. Both are read from a rounded summary
(summary.py), so report.md, report.html and `torbed report`'s terminal output say the same.

Which comparison leads: the declared primary one (summary ``inference.primary``, from
``torbed report --primary``) when there is one; else the Holm-significant comparisons, else the
tested ones, else the descriptive ones, by kind of metric (what a client experiences first:
TTLB, TTFB, per-cell delay, circuit build, relay throughput, queue wait) and then by the size
of the change. A comparison that was not tested still leads with its descriptive change,
labelled so, never with a p-value.

Public API:

- ``Lead``: ``text`` (one sentence, **bold** marker on its first words), ``metric``, ``variant``
- ``lead(summary) -> Lead``
- ``lead_figure(figures, metric) -> Figure | None``  the CDF figure of ``metric``, else the
  first transfer CDF
- ``outcome_table(summary, limit=10) -> (headers, rows, left_out)``: the terminal's table
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .figures import Figure
from .inference import FAMILY_METRICS, STAT_NAMES
from .stats import ALPHA, MIN_REPS

# Lead order by kind of metric (a client's experience first); gh70 classes are duplicates of
# the per-client rows and never lead or fill the terminal.
KIND_ORDER = ("ttlb_s", "ttfb_s", "cell_delay_ms", "circuit_build_s", "relay_throughput_Bps", "cell_wait_ms")
SHORT = {"ttlb_s": "TTLB", "ttfb_s": "TTFB", "circuit_build_s": "circuit build", "relay_throughput_Bps": "throughput",
         "cell_wait_ms": "wait", "cell_delay_ms": "cell delay"}
DASH = "–"


@dataclass
class Lead:
    text: str
    metric: str | None = None
    variant: str | None = None


def _comparisons(s: dict) -> list[tuple[str, str, dict, dict]]:
    """(metric id, variant, metric entry, inference) of every outcome comparison that may lead."""
    out = []
    for mid, e in s["metrics"].items():
        if e["metric"] not in FAMILY_METRICS or str(e.get("class", "")).startswith("gh70"):
            continue
        for v, d in e["variants"].items():
            if d.get("vs_baseline"):
                out.append((mid, v, e, d["vs_baseline"]["inference"]))
    return out


def _change(inf: dict) -> float | None:
    return inf.get("change_pct") if inf.get("status") == "tested" else inf.get("change_pct_descriptive")


def _rank(item) -> tuple:
    mid, _, e, inf = item
    ch = _change(inf)
    size = abs(math.log1p(ch / 100)) if ch is not None and ch > -100 else (math.inf if ch is not None else -1)
    return (KIND_ORDER.index(e["metric"]) if e["metric"] in KIND_ORDER else len(KIND_ORDER), -size, mid)


def _subject(title: str) -> str:
    return title[:1].lower() + title[1:]


def _pct(x: float) -> str:
    return f"{x:+.1f}%".replace("-", "−")


def _design(inf: dict) -> str:
    if inf.get("test") == "paired":
        return f"paired t-test over {inf.get('n')} blocks"
    return f"Welch t-test, {inf.get('n')} vs {inf.get('n_baseline')} repetitions"


def _p(x) -> str:
    return "< 1e-6" if x < 1e-6 else f"= {x:.2g}"


def _claim(title: str, variant: str, baseline: str, statistic: str, change: float) -> str:
    verb = "cut" if change < 0 else "raised"
    stat = STAT_NAMES.get(statistic, statistic).split(" (")[0]
    return (f"{variant} {verb} {_subject(title)} by {abs(change):.1f}% against {baseline} "
            f"({stat} per repetition")


def _tested_sentence(title, variant, baseline, inf, p_text, tail) -> str:
    lo, hi = inf.get("change_ci95") or (None, None)
    ci = f"95% CI {_pct(lo)} to {_pct(hi)}" if lo is not None and hi is not None else "no interval"
    return _claim(title, variant, baseline, inf.get("statistic", "median"), inf["change_pct"]) + \
        f"; {ci}; {p_text}, {_design(inf)}{tail})."


def _excluded(s: dict) -> str:
    """", N excluded by the mechanism gates" when a gate rejected repetitions (a busy machine)."""
    n = sum(1 for r in s["repetitions"] if r["status"] == "invalid")
    return f", {n} of {len(s['repetitions'])} repetitions excluded by the mechanism gates" if n else ""


def _untested_sentence(title, variant, baseline, inf, lead_words: str, excluded: str = "") -> str:
    ch = inf.get("change_pct_descriptive")
    why = (f"{inf.get('n', 0)} vs {inf.get('n_baseline', 0)} repetitions with data{excluded}, "
           f"{MIN_REPS} per variant needed")
    if ch is None:
        return f"**{lead_words}** {_subject(title)}, {variant} against {baseline}: no data to compare ({why})."
    return (f"**{lead_words}** " + _claim(title, variant, baseline, inf.get("statistic", "median"), ch)
            + f"; descriptive only, no interval and no p: {why}).")


def _primary_lead(s: dict, pr: dict) -> Lead:
    t, v, b = pr["title"], pr["variant"], pr["baseline"]
    if pr.get("status") != "tested":
        text = _untested_sentence(t, v, b, pr, "Not tested:", _excluded(s))
    elif pr["significant"]:
        text = "**Finding:** " + _tested_sentence(t, v, b, pr, f"p {_p(pr['pvalue'])}",
                                                  "; the primary comparison, declared before the run")
    else:
        text = (f"**No finding** at α = {pr['alpha']}: " + _tested_sentence(
            t, v, b, pr, f"p {_p(pr['pvalue'])}", "; the primary comparison, declared before the run"))
    return Lead(text, pr["metric"], v)


def lead(s: dict) -> Lead:
    """The report's first sentence (see the module docstring)."""
    inf_all = s["inference"]
    if inf_all.get("primary"):
        return _primary_lead(s, inf_all["primary"])
    items = _comparisons(s)
    if not items:
        return Lead("**No comparison:** the run has one variant (`torbed aa` splits one variant's repetitions "
                    "into two arms).")
    b = s["baseline"]
    sig = [it for it in items if it[3].get("significant")]
    tested = [it for it in items if it[3].get("status") == "tested"]
    fam = inf_all["family_size"]
    if sig:
        mid, v, e, inf = min(sig, key=_rank)
        n_sig = len(inf_all.get("significant") or sig)
        more = f"; {n_sig} of {fam} comparisons significant after Holm" if n_sig > 1 else ""
        return Lead("**Finding:** " + _tested_sentence(e["title"], v, b, inf, f"Holm-adjusted p {_p(inf['pvalue_holm'])}",
                                                       more), mid, v)
    if tested:
        mid, v, e, inf = min(tested, key=_rank)
        return Lead(f"**No finding:** no difference survives Holm's correction over {fam} comparisons; for "
                    "example, " + _tested_sentence(e["title"], v, b, inf, f"p {_p(inf['pvalue'])} unadjusted", ""),
                    mid, v)
    mid, v, e, inf = min(items, key=_rank)
    return Lead(_untested_sentence(e["title"], v, b, inf, "Not tested:", _excluded(s)), mid, v)


def lead_figure(figures: list[Figure], metric: str | None) -> Figure | None:
    """The figure that shows ``metric`` (a CDF of it), else the first transfer-time CDF."""
    for f in figures:
        if metric and metric in f.metrics:
            return f
    return next((f for f in figures if f.metrics and f.metrics[0].startswith("ttfb_s/")), None)


def _short_name(e: dict) -> str:
    kind = SHORT.get(e["metric"], e["metric"])
    if "group" in e:
        where = f"{e['group']}:{e['file']}"
    elif "client_group" in e:
        where = e["client_group"] + (f"@{e['position']}" if e.get("position") else "")
    else:
        where = e.get("relay")
    unit = "MiB/s" if e["unit"] == "B/s" else e["unit"]
    return " ".join(str(x) for x in (kind, where, (e.get("direction") or "")[:3]) if x) + f" ({unit})"


def _num(x, unit: str) -> str:
    if x is None:
        return DASH
    x = x / 1048576 if unit == "B/s" else x
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _verdict(inf: dict, primary: bool) -> str:
    """sig. (Holm, or for the primary comparison its own p, below alpha), equiv. (TOST within
    the margin), n.s. (neither: inconclusive), untested."""
    if inf.get("status") != "tested":
        return "untested" if inf.get("status") in ("not enough repetitions", "no data") else str(inf.get("status"))
    if inf.get("significant") or (primary and inf["pvalue"] < ALPHA):
        return "sig."
    return "equiv." if (inf.get("equivalence") or {}).get("equivalent") else "n.s."


def _p_cell(p) -> str:
    return DASH if p is None else "<0.001" if p < 0.001 else f"{p:.2g}"


def _delta(inf: dict) -> str:
    if inf.get("status") == "tested" and inf.get("change_pct") is None:
        return f"{DASH} (base 0)"       # tested on a linear scale whose baseline mean is 0: no % change
    if inf.get("status") == "tested":
        lo, hi = inf.get("change_ci95") or (None, None)
        if lo is None or hi is None:
            ci = ""
        else:   # an interval past ±1000% (a linear-scale test of near-zero values) says only "wide"
            ci = f" [{lo:+.0f},{hi:+.0f}]" if max(abs(lo), abs(hi)) < 1000 else " [wide]"
        return f"{inf['change_pct']:+.0f}%{ci}"
    ch = inf.get("change_pct_descriptive")
    return DASH if ch is None else f"{ch:+.0f}% descr."


def outcome_table(s: dict, limit: int = 10) -> tuple[list[str], list[list[str]], int]:
    """The terminal's table: (headers, rows, comparisons left out). One row per outcome
    comparison with something to show (tested, or a descriptive change), the primary one
    first (marked *), then by kind of metric (client-side first) and size of change; at most
    ``limit``. Values are the arms' per-repetition centres. With one variant besides the
    baseline the two value columns are named by the variants, else a variant column is added."""
    pr = s["inference"].get("primary") or {}
    b = s["baseline"]
    others = [v for v in s["run"]["variants"] if v != b]
    items = [it for it in _comparisons(s) if it[3].get("status") == "tested" or _change(it[3]) is not None]
    items.sort(key=lambda it: (not (it[0] == pr.get("metric") and it[1] == pr.get("variant")), _rank(it)))
    one = len(others) == 1
    headers = ["outcome"] + ([b, others[0]] if one else ["variant", f"{b} → variant"]) + ["Δ [95% CI]", "p", "verdict"]
    rows = []
    for mid, v, e, inf in items[:limit]:
        is_primary = mid == pr.get("metric") and v == pr.get("variant")
        base = _num((e["variants"][b].get("rep_summary") or {}).get("estimate"), e["unit"])
        new = _num((e["variants"][v].get("rep_summary") or {}).get("estimate"), e["unit"])
        p = inf.get("pvalue") if is_primary else inf.get("pvalue_holm")
        rows.append([_short_name(e) + (" *" if is_primary else "")] + ([base, new] if one else [v, f"{base} → {new}"])
                    + [_delta(inf), _p_cell(p), _verdict(inf, is_primary)])
    return headers, rows, len(_comparisons(s)) - len(rows)
