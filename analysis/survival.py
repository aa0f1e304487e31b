"""Kaplan-Meier estimates for right-censored times (transfers still running at the end of
the measurement window).

A transfer the window cut off was observed for ``t`` seconds without finishing: its time
to last byte is *more than* ``t``. Dropping it (what the analysis did before issue 36)
leaves only the transfers fast enough to finish, so the slower arm's median is biased
down; counting ``t`` as its time biases it down as well. The Kaplan-Meier estimator uses
it for exactly what is known: it was still at risk up to ``t``.

Public API:

- ``km(times, censored) -> (t, S)``: the event times (sorted, distinct) and the survival
  S(t) just after each (right-continuous step function, S = 1 before the first event)
- ``km_quantile(times, censored, q) -> float | None``: the q-quantile of the time (the
  KM median for q = 0.5); None when the estimate never falls to 1 - q (too much censoring)
- ``km_cdf(times, censored) -> (x, F)``: step points of 1 - S for a CDF figure
- ``counts(censored) -> {"completed", "censored"}``

Conventions (tests/unit/analysis/test_survival.py checks them by hand):

- A censored time equal to an event time is taken as still at risk at that time (the usual
  convention: events first, then censorings).
- Quantile: the smallest event time t with S(t) <= 1 - q; where S equals 1 - q exactly on
  a flat stretch [t_j, t_j+1) the midpoint (t_j + t_j+1) / 2 of the stretch's two event
  times is taken (t_j when no event follows). Without censoring the KM median is then the
  ordinary sample median (np.median) for odd and even n alike.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-12


def _arrays(times, censored) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(times, dtype=float).ravel()
    c = np.zeros(t.shape, dtype=bool) if censored is None else np.asarray(censored, dtype=bool).ravel()
    if t.shape != c.shape:
        raise ValueError(f"times ({t.size}) and censored ({c.size}) differ in length")
    keep = np.isfinite(t)
    return t[keep], c[keep]


def km(times, censored=None) -> tuple[np.ndarray, np.ndarray]:
    """Kaplan-Meier: (distinct event times ascending, S just after each). Empty arrays when
    there is no event (no data, or everything censored: S stays 1 as far as observed)."""
    t, c = _arrays(times, censored)
    ev = np.unique(t[~c])
    if ev.size == 0:
        return ev, np.array([], dtype=float)
    s = 1.0
    out = np.empty(ev.size)
    for i, u in enumerate(ev):
        at_risk = int(np.count_nonzero(t >= u))       # censored at u still at risk at u
        d = int(np.count_nonzero((t == u) & ~c))
        s *= 1.0 - d / at_risk
        out[i] = s
    return ev, out


def km_quantile(times, censored=None, q: float = 0.5) -> float | None:
    """The q-quantile (0 < q < 1) of the KM estimate, None when it is not reached."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    ev, s = km(times, censored)
    target = 1.0 - q
    idx = np.flatnonzero(s <= target + EPS)
    if idx.size == 0:
        return None
    j = int(idx[0])
    if abs(s[j] - target) <= EPS and j + 1 < ev.size:
        return float((ev[j] + ev[j + 1]) / 2.0)
    return float(ev[j])


def km_cdf(times, censored=None) -> tuple[np.ndarray, np.ndarray]:
    """(x, F) with F = 1 - S at each event time, for ``step(where="post")``; starts at
    (the smallest time, 0) so the curve begins on the axis."""
    t, _ = _arrays(times, censored)
    ev, s = km(times, censored)
    if t.size == 0:
        return np.array([]), np.array([])
    x0 = float(min(t.min(), ev.min())) if ev.size else float(t.min())
    return np.concatenate([[x0], ev]), np.concatenate([[0.0], 1.0 - s])


def counts(censored) -> dict:
    c = np.asarray(censored, dtype=bool).ravel()
    return {"completed": int(np.count_nonzero(~c)), "censored": int(np.count_nonzero(c))}
