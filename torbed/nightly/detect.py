"""Regression detection that survives noisy machines.

For each tracked metric and comparison key (scenario, variant, tor and torbed versions,
hardware, ... as the nightly file's ``compare_by`` says), tonight is compared with the
``lookback`` nights before it:

1. The night's value is the median of its repetitions' medians (the repetition is the unit
   of replication: samples inside one network are not independent).
2. On the log scale (times and rates vary multiplicatively), z = (tonight - mean of the
   lookback nights) / (their sd x sqrt(1 + 1/n)): a prediction interval for one new night.
   It is compared with Student's t quantile (n - 1 degrees of freedom) at the two-sided
   level that ``thresholds.z`` means for a normal (z = 3: 0.27%), because with a handful of
   nights the sd is itself uncertain and a plain |z| >= 3 would cry wolf about one night in
   twenty. An odd night inside the window widens the sd: the detector gets more cautious,
   never more trigger-happy.
3. A two-sided Mann-Whitney U test of tonight's raw samples against the lookback nights'
   pooled samples.

A change is flagged only when all of: enough history (``min_history`` nights), |z| >=
``thresholds.z``, p < ``thresholds.p`` and |relative change of the median| >=
``thresholds.min_change``. The pooled test alone would cry wolf (samples of one night are
correlated, so its p-values are too small); the night-level z alone would flag one unlucky
night's outliers; requiring both and a minimum size is what keeps false alarms rare on this
noisy, shared hardware. Direction: ``regression`` when the metric got worse (times up,
throughput down), ``improvement`` when it got better; both are flagged.

Public API: ``Finding``, ``detect(history, spec, night) -> list[Finding]``,
``assess(nights, night, spec, metric) -> Finding-fields``
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import stats

from .history import History, Night
from .spec import NightlySpec, higher_is_better

SCALE_FLOOR = 0.005   # 0.5% on the log scale: a perfectly flat history is not infinitely sure


@dataclass
class Finding:
    metric: str
    key: dict
    night: str
    status: str                   # regression, improvement, ok, insufficient-history, no-data
    value: float | None = None    # tonight's night value
    center: float | None = None   # lookback median of night values
    scale: float | None = None
    z: float | None = None        # (tonight - lookback mean) / prediction scale, log scale
    critical: float | None = None  # |z| needed: Student t for the nominal level of thresholds.z
    p: float | None = None
    change: float | None = None   # relative change of tonight vs center
    lookback_nights: list[str] = field(default_factory=list)
    reason: str = ""
    history: list[dict] = field(default_factory=list)   # every night: night, value, rep_medians

    @property
    def flagged(self) -> bool:
        return self.status in ("regression", "improvement")

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        return d


def assess(nights: list[Night], night: str, spec: NightlySpec, metric: str, key: dict) -> Finding:
    hist = [{"night": n.night, "value": n.value, "rep_medians": list(n.rep_medians)} for n in nights]
    tonight = next((n for n in nights if n.night == night), None)
    f = Finding(metric=metric, key=key, night=night, status="no-data", history=hist)
    if tonight is None or not tonight.rep_medians:
        f.reason = "no data tonight"
        return f
    earlier = [n for n in nights if n.night < night and n.rep_medians][-spec.lookback:]
    f.value = tonight.value
    f.lookback_nights = [n.night for n in earlier]
    if len(earlier) < spec.min_history:
        f.status = "insufficient-history"
        f.reason = f"{len(earlier)} earlier night(s), {spec.min_history} needed"
        return f
    values = np.array([n.value for n in earlier])
    # Multiplicative noise (times, rates) is symmetric on the log scale; fall back to the
    # linear scale if anything is not positive.
    log = bool(np.all(values > 0) and f.value > 0)
    x, y = (np.log(values), math.log(f.value)) if log else (values, f.value)
    n = len(x)
    center = float(np.mean(x))
    sd = max(float(np.std(x, ddof=1)), SCALE_FLOOR if log else abs(center) * SCALE_FLOOR, 1e-12)
    # A prediction interval for one new night, not a z against a known sigma: with a handful
    # of lookback nights the sample sd is itself uncertain (Student's t with n-1 degrees of
    # freedom), which a plain |z| >= 3 ignores and then cries wolf about 5% of the time.
    scale = sd * math.sqrt(1 + 1 / n)
    f.center = float(math.exp(center)) if log else center
    f.scale = scale
    f.z = (y - center) / scale
    alpha = 2 * stats.norm.sf(spec.thresholds.z)
    f.critical = float(stats.t.isf(alpha / 2, n - 1))
    f.change = (f.value - f.center) / abs(f.center) if f.center else math.inf
    pooled = np.concatenate([n.samples for n in earlier]) if earlier else np.array([])
    if len(tonight.samples) and len(pooled):
        f.p = float(stats.mannwhitneyu(tonight.samples, pooled, alternative="two-sided").pvalue)
    th = spec.thresholds
    reasons = []
    if abs(f.z) < f.critical:
        reasons.append(f"|z| {abs(f.z):.2f} < {f.critical:.2f}")
    if f.p is None:
        reasons.append("no samples for the Mann-Whitney test")
    elif f.p >= th.p:
        reasons.append(f"p {f.p:.3g} >= {th.p}")
    if abs(f.change) < spec.min_change_fraction:
        reasons.append(f"change {f.change:+.1%} smaller than {th.min_change}")
    if reasons:
        f.status, f.reason = "ok", "; ".join(reasons)
        return f
    worse = (f.value < center) if higher_is_better(metric) else (f.value > center)
    f.status = "regression" if worse else "improvement"
    f.reason = f"z {f.z:+.2f}, p {f.p:.3g}, change {f.change:+.1%} vs {len(earlier)} night(s)"
    return f


def detect(history: History, spec: NightlySpec, night: str) -> list[Finding]:
    """Every tracked metric x comparison key that has data, assessed for ``night``."""
    out = []
    for metric in history.metrics():
        if not spec.tracks(metric):
            continue
        for key, nights in sorted(history.series(spec.compare_by, metric).items()):
            if not any(n.night == night for n in nights):
                continue
            out.append(assess(nights, night, spec, metric, dict(zip(spec.compare_by, key))))
    return out
