"""A/A calibration: the report's own tests applied to two arms that differ only by chance.

The repetitions of ONE variant are split into two arms, A and B, and every metric is compared
exactly as ``torbed report`` compares variants (inference.compare_arms: per-repetition
summaries, Welch, Holm over the outcome metrics). Nothing differs but chance, so every
"significant" result is a false alarm. The same splits are also run through the pooled
per-sample KS / Mann-Whitney tests the report keeps as descriptive, to show what they would
have claimed.

- The *primary split* interleaves the repetitions in run order (0, 2, 4, ... vs 1, 3, 5, ...),
  so a slow drift of the machine lands in both arms.
- The *false-positive rate* is averaged over every balanced split of the repetitions (up to
  ``MAX_SPLITS``, else a seeded random sample of them). The splits re-use the same
  repetitions, so they are not independent replications: with few repetitions the rate is a
  rough estimate (its spread is shown as the number of splits behind it).

``torbed aa SCENARIO`` runs the scenario's variant with 2 x N repetitions on the local
backend (``torbed run``, unchanged) and analyses that run; ``torbed aa RUN_DIR`` analyses an
existing run directory.

Public API:

- ``MAX_SPLITS``
- ``aa_analyse(run_dir, variant=None) -> dict``  (nothing written; raises InputError)
- ``aa_report(run_dir, variant=None, out_dir=None) -> dict``  writes aa-<variant>.json/.md
- ``markdown(result) -> str``
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from . import gates, inference, metrics, stats
from . import summary as summary_mod
from .errors import InputError, UnknownVariantError
from .load import Run, load_run
from .render import fmt_p, fmt_pct

MAX_SPLITS = 70


def _splits(reps: list[int], rng: np.random.Generator) -> list[tuple[list[int], list[int]]]:
    """Balanced splits of ``reps`` into two arms, each unordered split once (an odd count gives
    arm A the smaller half). The first is the interleaved primary split."""
    k, half = len(reps), len(reps) // 2
    a0 = reps[0::2] if k % 2 == 0 else reps[1::2]
    out = [(a0, [r for r in reps if r not in a0])]

    def key(a):
        rest = tuple(r for r in reps if r not in a)
        return min(tuple(a), rest) if k % 2 == 0 else tuple(a)

    seen = {key(a0)}
    combos = list(itertools.combinations(reps, half))
    if len(combos) > 4 * MAX_SPLITS:
        combos = [combos[i] for i in sorted(rng.choice(len(combos), 4 * MAX_SPLITS, replace=False))]
    for c in combos:
        if len(out) >= MAX_SPLITS:
            break
        if key(c) in seen:
            continue
        seen.add(key(c))
        out.append((list(c), [r for r in reps if r not in c]))
    return out


def _test_split(ex: metrics.Extracted, variant: str, arm_a: list[int], arm_b: list[int],
                rng: np.random.Generator) -> list[dict]:
    """Every metric of one split, tested as the report tests: the i-th repetition of arm A
    (in run order) and the i-th of arm B form block i - in the interleaved primary split
    neighbours in run order, as repetition k of two variants are - and the paired test is
    used where those blocks are intact, Welch where not (``inference.block_check``). The
    Welch test of the same split is kept beside it (``welch``) for comparison."""
    rows = []
    for mid, m in ex.metrics.items():
        prim = inference.primary_stat(m.metric)
        summ = inference.rep_summaries(m, variant)

        def vals(arm):
            return [summ[k][prim] for k in arm if k in summ and summ[k].get(prim) is not None]

        def blocks(arm):
            return {i: summ[k][prim] for i, k in enumerate(arm) if k in summ and summ[k].get(prim) is not None}

        def pooled(arm):
            parts = [m.values[variant][k] for k in arm if k in m.values.get(variant, {})]
            return np.concatenate(parts) if parts else np.array([])

        scale = stats.choose_scale(vals(arm_a) + vals(arm_b))
        new, base = blocks(arm_b), blocks(arm_a)
        paired, why = inference.block_check(new, base, same_run=len(arm_a) == len(arm_b))
        res = inference.test_arms(new, base, paired, scale, rng, None)
        res["test_reason"] = ("A/A blocks: the i-th repetitions of A and B in run order (neighbours in the "
                              "primary split), so paired" if paired else why)
        res["statistic"] = prim
        res["in_family"] = inference.in_family(m.metric)
        welch = stats.compare_reps(vals(arm_b), vals(arm_a), scale=scale, rng=rng)
        pt = stats.two_sample_tests(pooled(arm_b), pooled(arm_a)) or {}
        rows.append({"id": mid, "title": m.title, "inference": res, "welch_pvalue": welch.get("pvalue"),
                     "ks_pvalue": pt.get("ks_pvalue"), "mwu_pvalue": pt.get("mwu_pvalue")})
    inference.apply_holm(rows)
    return rows


def aa_analyse(run_dir: str | Path, variant: str | None = None) -> dict:
    """Split the repetitions of ``variant`` (default: the run's baseline, or its only variant
    with data) into two arms and measure the false-alarm rates (see the module docstring)."""
    run: Run = load_run(run_dir)
    gates.exclude_invalid(run)      # as the report: repetitions a mechanism gate rejected do not count
    with_data = [v for v in run.variants if any(r.variant == v and r.transfers for r in run.reps)]
    if variant is None:
        variant = run.baseline if run.baseline in with_data else (with_data[0] if with_data else run.baseline)
    if variant not in run.variants:
        raise UnknownVariantError(f"--variant {variant!r} is not a variant of {run.path} "
                                  f"(variants: {', '.join(run.variants)})")
    reps = sorted(r.index for r in run.reps if r.variant == variant and r.files)
    if len(reps) < 2:
        raise InputError(f"{run.path}: variant {variant} has {len(reps)} repetition(s) with records; "
                         f"an A/A split needs at least 2 (2 x {stats.MIN_REPS} to test anything)")
    ex = metrics.extract(run)
    rng = stats.rng_for(run.seed, "aa", variant)
    splits = _splits(reps, rng)
    per_split = [_test_split(ex, variant, a, b, rng) for a, b in splits]

    primary = per_split[0]
    return {
        "schema": 1, "run": run.name, "path": str(run.path), "scenario": run.scenario_name, "variant": variant,
        "repetitions": reps, "alpha": stats.ALPHA, "splits": len(splits),
        "primary_split": {"A": splits[0][0], "B": splits[0][1]},
        "rates": _rates(per_split, stats.ALPHA),
        "primary": [_primary_row(row) for row in primary],
        "false_alarms": [row["id"] for row in primary if row["inference"]["significant"]],
        "pooled_false_alarms": [row["id"] for row in primary
                                if min(p for p in (row["ks_pvalue"], row["mwu_pvalue"], 1.0) if p is not None)
                                < stats.ALPHA],
        "enough_repetitions": len(reps) >= 2 * stats.MIN_REPS,
    }


def _rate(xs) -> float | None:
    return (sum(xs) / len(xs)) if xs else None


def _rates(per_split: list[list[dict]], a: float) -> dict:
    """The false-alarm rates over every split's rows (aa_analyse's ``rates``)."""
    rows_all = [row for rows in per_split for row in rows]
    tested = [row for row in rows_all if row["inference"]["status"] == "tested"]
    ks = [row["ks_pvalue"] for row in rows_all if row["ks_pvalue"] is not None]
    mw = [row["mwu_pvalue"] for row in rows_all if row["mwu_pvalue"] is not None]
    fam_splits = [rows for rows in per_split if any(r["inference"]["in_family"] and
                                                    r["inference"]["status"] == "tested" for r in rows)]
    paired = [row for row in tested if row["inference"]["test"] == "paired"]
    welch = [row["welch_pvalue"] for row in rows_all if row["welch_pvalue"] is not None]
    return {
        # Per test: how often a single comparison's unadjusted p < alpha (nominal: alpha).
        "per_test": _rate([row["inference"]["pvalue"] < a for row in tested]),
        "per_test_n": len(tested),
        "per_test_paired": _rate([row["inference"]["pvalue"] < a for row in paired]),
        "per_test_paired_n": len(paired),
        # The unpaired Welch test on the same splits (what the report used before blocks were paired).
        "per_test_welch": _rate([p < a for p in welch]),
        "per_test_welch_n": len(welch),
        # Per report: how often the headline (Holm) shows anything (nominal: <= alpha).
        "family": _rate([any(r["inference"]["significant"] for r in rows) for rows in fam_splits]),
        "family_n": len(fam_splits),
        "pooled_ks": _rate([p < a for p in ks]), "pooled_mwu": _rate([p < a for p in mw]),
        "pooled_n": len(mw),
    }


def _primary_row(row: dict) -> dict:
    inf = row["inference"]
    return {"metric": row["id"], "title": row["title"], "status": inf["status"],
            "statistic": inf["statistic"], "in_family": inf["in_family"],
            "test": inf["test"], "welch_pvalue": row["welch_pvalue"],
            "n_a": inf["n_baseline"], "n_b": inf["n"],
            "change_pct": inf.get("change_pct"), "pvalue": inf.get("pvalue"),
            "pvalue_holm": inf.get("pvalue_holm"), "significant": inf["significant"],
            "ks_pvalue": row["ks_pvalue"], "mwu_pvalue": row["mwu_pvalue"]}


def markdown(r: dict) -> str:
    from .render import to_markdown
    rt = r["rates"]

    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}%"

    bl: list[tuple] = [("h", 1, f"torbed aa: {r['scenario']}, variant {r['variant']}")]
    bl.append(("p", f"A/A calibration of {r['run']}: the {len(r['repetitions'])} repetitions of variant "
                    f"{r['variant']} split into two arms that differ only by chance, compared with the report's "
                    f"own tests (per-repetition summaries; the paired test on blocks - the i-th repetition of A with "
                    f"the i-th of B - where intact, else Welch; Holm). Primary split: A = repetitions "
                    f"{r['primary_split']['A']}, B = {r['primary_split']['B']}. Rates are averaged over "
                    f"{r['splits']} balanced split(s) of the same repetitions (not independent replications)."))
    if not r["enough_repetitions"]:
        bl.append(("p", f"**Not enough repetitions**: an arm needs at least {stats.MIN_REPS} repetitions with "
                        f"data, so {2 * stats.MIN_REPS} in all; nothing below is tested."))
    bl.append(("table", ["", "false-positive rate", "nominal", "based on"], [
        ["report's test, per comparison (unadjusted p < α)", pct(rt["per_test"]), f"{r['alpha']:.0%}",
         f"{rt['per_test_n']} comparisons"],
        ["  of which paired tests", pct(rt["per_test_paired"]), f"{r['alpha']:.0%}",
         f"{rt['per_test_paired_n']} comparisons"],
        ["unpaired Welch on the same splits", pct(rt["per_test_welch"]), f"{r['alpha']:.0%}",
         f"{rt['per_test_welch_n']} comparisons"],
        ["report's headline (any Holm-significant result)", pct(rt["family"]), f"≤ {r['alpha']:.0%}",
         f"{rt['family_n']} splits"],
        ["pooled KS (descriptive, not a test)", pct(rt["pooled_ks"]), f"{r['alpha']:.0%} if samples were independent",
         f"{rt['pooled_n']} comparisons"],
        ["pooled Mann-Whitney (descriptive, not a test)", pct(rt["pooled_mwu"]),
         f"{r['alpha']:.0%} if samples were independent", f"{rt['pooled_n']} comparisons"]]))
    bl.append(("h", 2, "Headline of the primary split"))
    bl.append(("p", ("False alarms (Holm-significant): " + ", ".join(r["false_alarms"])) if r["false_alarms"]
                else "Nothing survives Holm: no false alarm." if r["rates"]["family_n"]
                else "Nothing was tested (not enough repetitions)."))
    if r["pooled_false_alarms"]:
        bl.append(("p", f"The pooled per-sample tests would have called {len(r['pooled_false_alarms'])} metric(s) "
                        f"different (p < {r['alpha']}): " + ", ".join(r["pooled_false_alarms"])))
    bl.append(("table", ["metric", "reps A/B", "Δ B vs A", "test", "p", "Holm p", "p (Welch)", "pooled KS p",
                         "pooled MWU p"],
               [[row["metric"] + ("" if row["in_family"] else " (secondary)"), f"{row['n_a']}/{row['n_b']}",
                 fmt_pct(row["change_pct"]) if row["status"] == "tested" else row["status"], row["test"],
                 fmt_p(row["pvalue"]), fmt_p(row["pvalue_holm"]), fmt_p(row["welch_pvalue"]),
                 fmt_p(row["ks_pvalue"]), fmt_p(row["mwu_pvalue"])]
                for row in r["primary"]]))
    return to_markdown(bl, Path("."))


def aa_report(run_dir: str | Path, variant: str | None = None, out_dir: str | Path | None = None) -> dict:
    """aa_analyse and write ``aa-<variant>.json`` and ``.md`` into ``out_dir`` (default
    RUN_DIR/report). Returns the result (floats rounded)."""
    r = summary_mod.round_floats(aa_analyse(run_dir, variant))
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"aa-{r['variant']}.json").write_text(summary_mod.dumps(r))
    (out / f"aa-{r['variant']}.md").write_text(markdown(r))
    return r
