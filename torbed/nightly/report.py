"""The nightly report: tonight's findings, and a trend plot per tracked metric and history.

Writes into ``out_dir``: ``nightly.json`` (every finding, machine-readable), ``nightly.md``,
``nightly.html`` (self-contained) and ``figures/trend-*.png``: per night the median of its
repetitions' medians, the repetitions' range as a bar, the lookback window's prediction
band (what tonight had to fall outside of to be flagged), flagged nights in red.

Public API: ``write_report(findings, spec, night, out_dir, runs) -> dict`` (the JSON written)
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .. import __version__  # noqa: E402
from ..analysis import render  # noqa: E402
from ..analysis.figures import Figure  # noqa: E402
from .detect import Finding  # noqa: E402
from .spec import NightlySpec  # noqa: E402

SCHEMA = 1
ORDER = {"regression": 0, "improvement": 1, "ok": 2, "insufficient-history": 3, "no-data": 4}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:120]


def _key_text(key: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in key.items() if k != "scenario") or "-"


def _fmt(x, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:+.1%}" if pct else f"{x:.4g}"


def plot_trend(f: Finding, path: Path) -> None:
    hist = f.history
    xs = list(range(len(hist)))
    vals = [h["value"] for h in hist]
    lo = [min(h["rep_medians"]) for h in hist]
    hi = [max(h["rep_medians"]) for h in hist]
    fig, ax = plt.subplots(figsize=(7.5, 3.2), dpi=100)
    ax.vlines(xs, lo, hi, color="#9ecae1", lw=4, label="repetitions' range")
    ax.plot(xs, vals, "o-", color="#3182bd", ms=4, label="night (median of repetition medians)")
    if f.center is not None and f.scale is not None and f.critical is not None and f.lookback_nights:
        first = next(i for i, h in enumerate(hist) if h["night"] == f.lookback_nights[0])
        tonight = next(i for i, h in enumerate(hist) if h["night"] == f.night)
        log_center = math.log(f.center) if f.center > 0 else None
        if log_center is not None:
            band = (math.exp(log_center - f.critical * f.scale), math.exp(log_center + f.critical * f.scale))
            ax.fill_between([first - 0.3, tonight + 0.3], *band, color="#cccccc", alpha=0.5,
                            label="flag threshold (lookback prediction band)")
    for i, h in enumerate(hist):
        if h["night"] == f.night and f.flagged:
            ax.plot([i], [h["value"]], "o", color="#d62728", ms=9, label=f.status)
    ax.set_xticks(xs, [h["night"] for h in hist], rotation=45, ha="right", fontsize=7)
    ax.set_title(f"{f.metric} ({_key_text(f.key)})", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(findings: list[Finding], spec: NightlySpec, night: str, out_dir: str | Path,
                 runs: list[dict] | None = None) -> dict:
    out = Path(out_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    findings = sorted(findings, key=lambda f: (ORDER.get(f.status, 9), f.metric, _key_text(f.key)))
    flagged = [f for f in findings if f.flagged]
    data = {"schema": SCHEMA, "torbed_version": __version__, "nightly": spec.name, "night": night,
            "settings": {"lookback": spec.lookback, "min_history": spec.min_history,
                         "thresholds": spec.thresholds.model_dump(), "compare_by": spec.compare_by,
                         "metrics": spec.metrics},
            "runs": runs or [], "flagged": len(flagged),
            "regressions": sum(f.status == "regression" for f in findings),
            "improvements": sum(f.status == "improvement" for f in findings),
            "findings": [f.to_dict() for f in findings]}
    (out / "nightly.json").write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")

    figs = []
    for f in findings:
        if f.history:
            p = out / "figures" / f"trend-{_slug(f.metric + '-' + _key_text(f.key))}.png"
            plot_trend(f, p)
            figs.append((f, Figure(path=p, title=f"{f.metric}, {_key_text(f.key)}",
                                   caption=f"{f.status}: {f.reason}", section="trend")))

    th = spec.thresholds
    b: list[tuple] = [("h", 1, f"torbed nightly: {spec.name}, {night}")]
    b.append(("p", f"**{len(flagged)}** change(s) flagged ({data['regressions']} regression(s), "
                   f"{data['improvements']} improvement(s)) among {len(findings)} tracked series. A change is "
                   f"flagged when tonight's median of repetition medians lies outside the prediction band of the "
                   f"last (up to) {spec.lookback} comparable nights (Student t at the level of a {th.z}-sigma normal), the "
                   f"Mann-Whitney test of tonight's samples against those nights' has p < {th.p}, and the median "
                   f"moved by at least {th.min_change}. Only runs alike in {', '.join(spec.compare_by)} are compared."))
    if runs:
        b.append(("h", 2, "Tonight's runs"))
        b.append(("table", ["scenario", "variants", "overrides", "status", "run directory"],
                  [[r.get("scenario", ""), ", ".join(r.get("variants", [])),
                    ", ".join(f"{k} {v}" for k, v in (r.get("overrides") or {}).items()) or "none",
                    r.get("status", ""), r.get("run_dir", "")] for r in runs]))
    b.append(("h", 2, "Findings"))
    b.append(("table", ["status", "metric", "series", "tonight", "lookback", "change", "z (needed)", "p", "why"],
              [[f.status, f.metric, _key_text(f.key), _fmt(f.value), _fmt(f.center), _fmt(f.change, pct=True),
                "-" if f.z is None else f"{f.z:+.2f} ({f.critical:.2f})", _fmt(f.p), f.reason] for f in findings]))
    b.append(("h", 2, "Trends"))
    b += [("fig", fig) for _, fig in figs]
    (out / "nightly.md").write_text(render.to_markdown(b, out))
    (out / "nightly.html").write_text(render.to_html(b, f"torbed nightly {spec.name} {night}"))
    return data
