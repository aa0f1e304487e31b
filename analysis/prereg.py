"""The reproduction's pre-registration (analysis/preregistration.yaml) and its verdict rules
(issue 37 item 1).

A comparison is judged from per-block values only (block k: repetition k of both arms, run
together), so the verdict is the same whether the blocks came from one run directory or from
committed records of several sessions (analysis/campaign.py).

Rules (docs/reproduction.md "Verdict rules"):

- the test: paired t on the per-block log ratios (stats.compare_paired); a primary's p-value
  is Holm-adjusted over the primaries only;
- direction: "agrees" needs the paper's sign and (Holm-adjusted, for a primary) p < alpha; a
  significant change of the other sign "disagrees"; a change the TOST shows within the margin
  is "no change"; anything else is "inconclusive" (low power could have decided it);
- rough size: the (1 - 2 alpha) interval of log(ours / paper's), ours and the paper's being
  the effects as log ratios (``effect_within_factor``), inside +-log ``size_factor`` "agrees",
  wholly outside "differs", otherwise "inconclusive";
- a paper claiming no change (``expect: none``): "agrees" only by the TOST, "disagrees" on a
  significant change, else "inconclusive".

Public API: ``load(path=None) -> Prereg``, ``Comparison``, ``judge(values, baseline, comp,
prereg, holm_p=None) -> dict``, ``judge_all(prereg, blocks_of) -> dict``,
``effect_within_factor(ci_log, target_pct, factor) -> str``,
``blocks_planned(sd_diff, comps, prereg, n_max) -> int``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from scipy import stats as sps

from . import stats

PATH = Path(__file__).with_name("preregistration.yaml")
EXPECT = ("decrease", "increase", "none")
KEYS = {"id", "paper", "result", "paper_value", "source", "experiment", "metric", "baseline", "variant",
        "expect", "paper_change_pct"}


class PreregError(ValueError):
    """The pre-registration file is malformed (the message names the entry and field)."""


@dataclass(frozen=True)
class Comparison:
    id: str
    paper: str
    result: str
    paper_value: str
    source: str
    experiment: str
    metrics: tuple[str, ...]      # several: the per-block geometric mean of them
    baseline: str
    variant: str
    expect: str
    paper_change_pct: float | None
    primary: bool


@dataclass(frozen=True)
class Experiment:
    name: str
    scenario: str
    variants: tuple[str, ...]
    pilot_blocks: int
    max_blocks: int
    precheck: str | None = None    # analysis/precheck.py: a check the setup must pass first


@dataclass
class Prereg:
    alpha: float
    power: float
    size_factor: float
    margin_pct: float
    halfwidth_log: float
    experiments: dict[str, Experiment]
    primaries: list[Comparison]
    secondaries: list[Comparison]
    path: Path = field(default=PATH)

    @property
    def comparisons(self) -> list[Comparison]:
        return self.primaries + self.secondaries

    def of_experiment(self, name: str) -> list[Comparison]:
        return [c for c in self.comparisons if c.experiment == name]


def _comparison(d: dict, primary: bool, exps: dict, where: str) -> Comparison:
    unknown, missing = set(d) - KEYS, KEYS - set(d) - {"paper_change_pct"}
    if unknown or missing:
        raise PreregError(f"{where}: unknown field(s) {sorted(unknown)}, missing {sorted(missing)}")
    if d["expect"] not in EXPECT:
        raise PreregError(f"{where}.expect: {d['expect']!r} is not one of {EXPECT}")
    exp = exps.get(d["experiment"])
    if exp is None:
        raise PreregError(f"{where}.experiment: {d['experiment']!r} is not under experiments:")
    for arm in ("baseline", "variant"):
        if d[arm] not in exp.variants:
            raise PreregError(f"{where}.{arm}: {d[arm]!r} is not a variant of {exp.name} ({', '.join(exp.variants)})")
    pct = d.get("paper_change_pct")
    if pct is not None and (pct <= -100 or (pct < 0) != (d["expect"] == "decrease")):
        raise PreregError(f"{where}.paper_change_pct: {pct} does not match expect: {d['expect']}")
    if primary and pct is None:
        raise PreregError(f"{where}: a primary needs the paper's number (paper_change_pct)")
    metrics = tuple(d["metric"]) if isinstance(d["metric"], list) else (d["metric"],)
    return Comparison(d["id"], d["paper"], d["result"], d["paper_value"], d["source"], d["experiment"], metrics,
                      d["baseline"], d["variant"], d["expect"], None if pct is None else float(pct), primary)


def load(path: str | Path | None = None) -> Prereg:
    """Read and check the pre-registration; raises PreregError naming the entry and field."""
    path = Path(path or PATH)
    raw = yaml.safe_load(path.read_text())
    from .precheck import KINDS
    exps = {name: Experiment(name, e["scenario"], tuple(e["variants"]), int(e["pilot_blocks"]), int(e["max_blocks"]),
                             e.get("precheck"))
            for name, e in (raw.get("experiments") or {}).items()}
    for e in exps.values():
        if not stats.MIN_REPS <= e.pilot_blocks <= e.max_blocks:
            raise PreregError(f"{path}: experiments.{e.name}: need {stats.MIN_REPS} <= pilot_blocks <= max_blocks")
        if e.precheck is not None and e.precheck not in KINDS:
            raise PreregError(f"{path}: experiments.{e.name}.precheck: {e.precheck!r} is not one of {', '.join(KINDS)}")
    prim = [_comparison(d, True, exps, f"{path}: primaries[{i}]") for i, d in enumerate(raw.get("primaries") or [])]
    sec = [_comparison(d, False, exps, f"{path}: secondaries[{i}]") for i, d in enumerate(raw.get("secondaries") or [])]
    ids = [c.id for c in prim + sec]
    if len(ids) != len(set(ids)):
        raise PreregError(f"{path}: comparison ids are not unique")
    return Prereg(float(raw["alpha"]), float(raw["power"]), float(raw["size_factor"]), float(raw["margin_pct"]),
                  float(raw["halfwidth_log"]), exps, prim, sec, path)


def _direction(comp: Comparison, res: dict, p: float, alpha: float) -> tuple[str, str]:
    """(verdict word, text) for the direction / no-change question."""
    ch = res["change_pct"]
    eq = res.get("equivalence") or {}
    sig = p < alpha
    if comp.expect == "none":
        if eq.get("equivalent"):
            return "agrees", f"no change: equivalent within ±{eq['margin_pct']:g}% (TOST p = {eq['pvalue']:.2g})"
        if sig:
            return "disagrees", f"changed: a clear {'decrease' if ch < 0 else 'increase'} (p = {p:.2g})"
        return "inconclusive", "not significant and not shown equivalent: low power could decide it"
    want_down = comp.expect == "decrease"
    if sig and (ch < 0) == want_down:
        return "agrees", f"changed as the paper says (p = {p:.2g})"
    if sig:
        return "disagrees", f"changed the other way (p = {p:.2g})"
    if eq.get("equivalent"):
        return "disagrees", f"no change: equivalent within ±{eq['margin_pct']:g}% (TOST p = {eq['pvalue']:.2g})"
    return "inconclusive", f"not significant (p = {p:.2g}) and not shown equivalent: low power could decide it"


def effect_within_factor(ci_log: tuple[float, float], target_pct: float, factor: float) -> str:
    """Whether the interval ``ci_log`` of our effect, log(variant / baseline), puts
    log(ours / paper's) - the ratio of our effect to the paper's, both as log ratios - within
    +-log ``factor``: ours within [paper's / factor, paper's x factor]. "inside", "outside"
    or "overlaps" (too wide to tell).

    Effects, not ratios: stats.ratio_within_factor compares the ratios variant / baseline, by
    which no change at all (ratio 1) lies within a factor 2 of any change from -50% to +100%;
    here a -32.7% change (log ratio -0.40) is matched by -18% to -55% only."""
    p = math.log1p(target_pct / 100.0)
    lo_b, hi_b = sorted((p / factor, p * factor))
    lo, hi = ci_log
    if lo_b <= lo and hi <= hi_b:
        return "inside"
    if hi < lo_b or lo > hi_b:
        return "outside"
    return "overlaps"


def _size(comp: Comparison, res: dict, factor: float) -> tuple[str, str]:
    if comp.paper_change_pct is None:
        return "–", "the paper gives no number"
    lo, hi = (res.get("equivalence") or {}).get("ci90") or (None, None)
    if lo is None or lo <= -100:
        return "inconclusive", "no interval"
    where = effect_within_factor((math.log1p(lo / 100), math.log1p(hi / 100)), comp.paper_change_pct, factor)
    ratio = math.log1p(res["change_pct"] / 100) / math.log1p(comp.paper_change_pct / 100)
    word = {"inside": "agrees", "outside": "differs", "overlaps": "inconclusive"}[where]
    return word, f"our effect / the paper's {ratio:.2f} (log ratios), its 90% interval {where} a factor {factor:g}"


def judge(values, baseline, comp: Comparison, prereg: Prereg, holm_p: float | None = None) -> dict:
    """The verdict of one comparison from per-block values (``values[k]``, ``baseline[k]``:
    block k of the variant and of the baseline; NaN where missing). ``holm_p``: the
    Holm-adjusted p-value (primaries); else the test's own p is used."""
    res = stats.compare_paired(values, baseline, scale="log", margin_pct=prereg.margin_pct)
    out = {"id": comp.id, "primary": comp.primary, "n": res.get("n", 0), "test": res}
    if res.get("status") != "tested":
        return {**out, "direction": "inconclusive", "direction_text": res.get("reason") or res.get("status"),
                "size": "inconclusive" if comp.paper_change_pct is not None else "–", "size_text": "not tested",
                "verdict": "inconclusive", "p": None}
    p = res["pvalue"] if holm_p is None else holm_p
    d, dtext = _direction(comp, res, p, prereg.alpha)
    s, stext = _size(comp, res, prereg.size_factor)
    if d == "agrees" and s in ("agrees", "–"):
        verdict = "agrees"
    elif d == "disagrees" or s == "differs":
        verdict = "disagrees"
    else:
        verdict = "inconclusive"
    return {**out, "direction": d, "direction_text": dtext, "size": s, "size_text": stext,
            "verdict": verdict, "p": p}


def per_block(blocks: dict[int, dict[str, float]], comp: Comparison, arm: str) -> float:
    """The value of an arm in one block from its {metric: value}: the geometric mean over
    the comparison's metrics; NaN when one is missing."""
    vals = [blocks.get(m) for m in comp.metrics]
    if any(v is None or not v > 0 or not math.isfinite(v) for v in vals):
        return float("nan")
    return float(np.exp(np.mean(np.log(vals))))


def judge_all(prereg: Prereg, blocks_of) -> dict[str, dict]:
    """Every comparison's verdict. ``blocks_of(experiment) -> {block: {variant: {metric:
    value}}}`` (valid repetitions only). Holm over all the pre-registered primaries."""
    arms: dict[str, tuple[list, list]] = {}
    for c in prereg.comparisons:
        blocks = blocks_of(c.experiment)
        ks = sorted(blocks)
        arms[c.id] = ([per_block(blocks[k].get(c.variant) or {}, c, c.variant) for k in ks],
                      [per_block(blocks[k].get(c.baseline) or {}, c, c.baseline) for k in ks])
    raw = {c.id: stats.compare_paired(*arms[c.id], scale="log", margin_pct=prereg.margin_pct) for c in prereg.primaries}
    # The family is the pre-registered one: a primary not (yet) testable counts as p = 1, so an
    # interim document never adjusts over fewer tests than the campaign will make.
    pvals = [raw[c.id]["pvalue"] if raw[c.id].get("status") == "tested" else 1.0 for c in prereg.primaries]
    adjusted = dict(zip([c.id for c in prereg.primaries], stats.holm(pvals)))
    out = {}
    for c in prereg.comparisons:
        out[c.id] = judge(*arms[c.id], c, prereg, holm_p=adjusted.get(c.id) if c.primary else None)
    return out


def blocks_planned(sd_diff: float | None, comps: list[Comparison], prereg: Prereg, n_max: int) -> int:
    """Blocks an experiment needs, from the spread of its driving comparisons' block log
    ratios (``sd_diff``, the largest of them): the 90% interval at most +-halfwidth_log, and
    the paper's change (where given) detected with ``power`` at alpha / (number of
    primaries). Capped at ``n_max``; ``n_max`` without a spread estimate."""
    if sd_diff is None or not math.isfinite(sd_diff):
        return n_max
    need = stats.MIN_REPS
    for n in range(stats.MIN_REPS, n_max + 1):
        need = n
        if float(sps.t.ppf(1 - prereg.alpha, n - 1)) * sd_diff / math.sqrt(n) <= prereg.halfwidth_log:
            break
    fam = prereg.alpha / max(1, len(prereg.primaries))
    for c in comps:
        if c.paper_change_pct is not None:
            n = stats.blocks_needed(math.log1p(c.paper_change_pct / 100), sd_diff, fam, prereg.power)
            need = max(need, n if n is not None else n_max)
    return min(need, n_max)
