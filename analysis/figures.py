"""Figures of a report (matplotlib, Agg backend, PNG).

- CDFs with every variant overlaid; with more than one repetition holding data, a band
  shows, at each cumulative fraction, the range (min to max) of the repetitions' own
  quantiles (the per-repetition ECDFs), as tornettools draws its confidence bands.
- Quantile bars (p25, median with its cluster-bootstrap 95% CI, p75, p90, p99) per variant.
- Time series of relay throughput (trailing 30 s moving average) and of circuit-queue wait
  per cell (5 s bins), one panel per relay, the warm-up shaded.

Public API:

- ``CdfSeries``: ``x``, ``y`` (pooled ECDF, the line drawn), ``band`` (None or (y, lo, hi)),
  ``reps`` (number of repetitions with data), ``n``
- ``cdf_data(metric_samples, variants) -> {variant: CdfSeries}``  (the arrays plotted)
- ``plot_cdf(panels, variants, baseline, path, title)``
- ``plot_quantile_bars(entries, variants, path, title)``
- ``plot_throughput(series, variants, path)``, ``plot_cell_wait(series, variants, path)``
- ``relay_metric_series(run, match) -> {relay: {variant: {rep: (t, value)}}}`` a MetricsPort
  quantity over time (metrics.jsonl: the sum of the samples ``match`` selects);
  ``plot_relay_metric(series, variants, path, title, ylabel)``
- ``resource_summary(run) -> {node: {variant: (cpu_fraction, peak_rss_bytes, role)}}``
  (resources.jsonl); ``plot_resources(summary, variants, path)``
- ``Figure``: ``path``, ``title``, ``caption``, ``section``, ``metrics`` (the metric ids shown)
- ``make_all(run, extracted, summary, out_dir) -> list[Figure]``
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import faults as faults_mod  # noqa: E402
from . import metrics as metrics_mod  # noqa: E402
from . import stats, survival  # noqa: E402
from .load import Run  # noqa: E402
from .metrics import Extracted, MetricSamples  # noqa: E402

DPI = 110
BAND_POINTS = 201
REP_STYLES = ("-", "--", ":", "-.")
plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "legend.fontsize": 9,
                     "axes.grid": True, "grid.alpha": 0.3})


@dataclass
class CdfSeries:
    x: np.ndarray
    y: np.ndarray
    band: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    reps: int
    # Censored times (transfers the window cut off): when any, x/y are the Kaplan-Meier CDF
    # (1 - S) of observed and censored times, and the figure marks each censored time.
    censored: np.ndarray = field(default_factory=lambda: np.array([], dtype=float))

    @property
    def n(self) -> int:
        return int(self.x.size)


@dataclass
class Figure:
    path: Path
    title: str
    caption: str
    section: str
    metrics: tuple[str, ...] = ()     # the summary metric ids it shows (headline.lead_figure)


def _colors(variants: list[str]) -> dict[str, str]:
    cmap = plt.get_cmap("tab10")
    return {v: matplotlib.colors.to_hex(cmap(i % 10)) for i, v in enumerate(variants)}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


def cdf_data(m: MetricSamples, variants: list[str]) -> dict[str, CdfSeries]:
    """The arrays a CDF figure of ``m`` plots, per variant with data: the ECDF of all
    repetitions pooled (the same sample the summary's statistics use) and, with >= 2
    repetitions holding data, the band (y grid, per-y min and max of the repetitions'
    quantiles)."""
    out = {}
    for v in variants:
        cens = m.pooled_censored(v)
        if cens.size:
            obs = m.pooled(v)
            x, y = survival.km_cdf(np.concatenate([obs, cens]),
                                   np.concatenate([np.zeros(obs.size, bool), np.ones(cens.size, bool)]))
        else:
            x, y = stats.ecdf(m.pooled(v))
        if x.size == 0:
            continue
        per_rep = [a for _, a in sorted(m.values.get(v, {}).items()) if a.size]
        band = None
        if len(per_rep) >= 2:
            grid = np.linspace(0.0, 1.0, BAND_POINTS)
            q = np.array([np.quantile(a, grid, method="linear") for a in per_rep])
            band = (grid, q.min(axis=0), q.max(axis=0))
        out[v] = CdfSeries(x=x, y=y, band=band, reps=len(per_rep), censored=cens)
    return out


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _use_log(series: dict[str, CdfSeries]) -> bool:
    allx = np.concatenate([s.x for s in series.values()]) if series else np.array([])
    if allx.size < 2 or allx.min() <= 0:
        return False
    lo, hi = np.quantile(allx, [0.01, 0.99])
    return lo > 0 and hi / lo > 50


def plot_cdf(panels: list[tuple[str, MetricSamples]], variants: list[str], baseline: str,
             path: Path, title: str) -> bool:
    """CDF figure with one panel per (panel title, metric) and every variant overlaid.

    Returns False (and writes nothing) when no panel has data.
    """
    data = [(pt, m, cdf_data(m, variants)) for pt, m in panels]
    if not any(d for _, _, d in data):
        return False
    colors = _colors(variants)
    fig, axes = plt.subplots(1, len(data), figsize=(6.4 * len(data), 4.4), squeeze=False)
    for ax, (ptitle, m, series) in zip(axes[0], data):
        for v, s in series.items():
            c = colors[v]
            if s.band is not None:
                gy, lo, hi = s.band
                ax.fill_betweenx(gy, lo, hi, color=c, alpha=0.18, linewidth=0,
                                 label=f"{v}: range over {s.reps} repetitions")
            tag = " (baseline)" if v == baseline else ""
            if s.censored.size:
                # Kaplan-Meier: the step function of 1 - S, each censored time marked on it.
                obs = m.pooled(v)
                med = survival.km_quantile(np.concatenate([obs, s.censored]),
                                           np.concatenate([np.zeros(obs.size, bool), np.ones(s.censored.size, bool)]))
                ax.step(s.x, s.y, where="post", color=c, linewidth=1.8,
                        label=f"{v}{tag}: Kaplan-Meier, {obs.size} completed + {s.censored.size} censored "
                              f"({s.reps} rep{'s' if s.reps != 1 else ''}), median "
                              f"{_fmt(med) + ' ' + m.unit if med is not None else 'not reached'}")
                idx = np.searchsorted(s.x, s.censored, side="right") - 1
                ax.plot(s.censored, s.y[np.clip(idx, 0, None)], linestyle="none", marker="|", markersize=9,
                        color=c)
            else:
                med = float(np.median(s.x))
                ax.step(s.x, s.y, where="post", color=c, linewidth=1.8,
                        label=f"{v}{tag}: n={s.n} ({s.reps} rep{'s' if s.reps != 1 else ''}), "
                              f"median {_fmt(med)} {m.unit}")
        if _use_log(series):
            ax.set_xscale("log")
        ax.set_ylim(0, 1.0)
        ax.set_xlabel(m.label)
        ax.set_ylabel("Cumulative fraction")
        if len(data) > 1:
            ax.set_title(ptitle)
        if series:
            ax.legend(loc="best", framealpha=0.9)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    return _finish(fig, title, path)


def _finish(fig, title: str, path: Path) -> bool:
    """Title, layout, write the PNG (creating its folder), free the figure."""
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


QUANTILE_BARS = (("p25", "p25"), ("median", "median"), ("p75", "p75"), ("p90", "p90"), ("p99", "p99"))


def plot_quantile_bars(entries: list[tuple[str, dict]], variants: list[str], path: Path, title: str) -> bool:
    """Grouped bars of quantiles per variant, one panel per (panel title, summary metric
    entry); the median bar carries its cluster-bootstrap 95% CI (whole repetitions resampled) as an error bar.

    Returns False (and writes nothing) when no entry has data.
    """
    if not any(e["variants"].get(v, {}).get("n") for _, e in entries for v in variants):
        return False
    colors = _colors(variants)
    fig, axes = plt.subplots(1, len(entries), figsize=(6.4 * len(entries), 4.4), squeeze=False)
    width = 0.8 / max(1, len(variants))
    xs = np.arange(len(QUANTILE_BARS))
    for ax, (ptitle, e) in zip(axes[0], entries):
        for i, v in enumerate(variants):
            d = e["variants"].get(v, {})
            if not d.get("n"):
                continue
            vals = [d[k] for k, _ in QUANTILE_BARS]
            pos = xs + (i - (len(variants) - 1) / 2) * width
            ax.bar(pos, vals, width=width * 0.95, color=colors[v], label=f"{v} (n={d['n']})")
            lo, hi = d.get("median_ci95") or (d["median"], d["median"])
            ax.errorbar(pos[1], d["median"], yerr=[[d["median"] - lo], [hi - d["median"]]],
                        color="black", capsize=4, linewidth=1.2)
        ax.set_xticks(xs, [lbl for _, lbl in QUANTILE_BARS])
        ax.set_xlabel("Quantile (error bar: 95% CI of the median, resampling whole repetitions)")
        ax.set_ylabel(e["label"])
        ax.set_title(ptitle)
        ax.grid(axis="x", visible=False)
        ax.legend(loc="upper left", framealpha=0.9)
    return _finish(fig, title, path)


def _rate_unit(peak: float) -> tuple[float, str]:
    if peak >= 1 << 20:
        return float(1 << 20), "MiB/s"
    if peak >= 1 << 10:
        return float(1 << 10), "KiB/s"
    return 1.0, "bytes/s"


def _shared_legend(fig, axes, ncol: int = 4) -> None:
    """One legend below the panels, with each label once (panels share their styles)."""
    seen: dict[str, object] = {}
    for ax in np.ravel(axes):
        for h, lbl in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lbl, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=ncol, framealpha=0.9,
                   fontsize=9)


def _save(fig, path: Path, legend_rows: int) -> None:
    fig.tight_layout(rect=(0, 0.035 * legend_rows + 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


FAULT_COLOR = "#d62728"


def mark_faults(axes, windows) -> None:
    """Shade each fault's planned window (a line for an instant one, such as a restart
    without downtime; to the right edge for one that lasts to the end) on every axis."""
    for ax in np.ravel(axes):
        for start, end, label in windows:
            if end is None:
                ax.axvspan(start, ax.get_xlim()[1], color=FAULT_COLOR, alpha=0.10, label=label)
            elif end - start < 0.5:
                ax.axvline(start, color=FAULT_COLOR, linestyle=":", linewidth=1.2, label=label)
            else:
                ax.axvspan(start, end, color=FAULT_COLOR, alpha=0.10, label=label)


def plot_load(run: Run, variants: list[str], path: Path, faults=()) -> bool:
    """Background load over time (load.jsonl): requests/s and failures/s (top) and Locust's
    current-window p50 / p90 response times (bottom), per variant and repetition, from the
    workload's start."""
    from . import background
    series = []
    for r in run.reps:
        if r.path is None or not (r.path / background.LOAD_FILE).is_file() or r.t0 is None:
            continue
        recs = [x for x in background.read(r.path / background.LOAD_FILE) if x.get("label") != "end"]
        if recs:
            series.append((r.variant, r.index, np.array([x["t"] - r.t0 for x in recs]), recs))
    if not series:
        return False
    colors = _colors(variants)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for v, k, t, recs in series:
        style = REP_STYLES[k % len(REP_STYLES)]
        top.plot(t, [x["total"]["rps"] for x in recs], color=colors[v], linestyle=style, label=f"{v} rep {k} requests/s")
        fails = [x["total"]["fail_per_s"] for x in recs]
        if any(fails):
            top.plot(t, fails, color=colors[v], linestyle=style, alpha=0.5, linewidth=3, label=f"{v} rep {k} failures/s")
        for q, width in (("p50_ms", 2.0), ("p90_ms", 0.8)):
            y = [np.nan if x["total"].get(q) is None else x["total"][q] / 1e3 for x in recs]
            bottom.plot(t, y, color=colors[v], linestyle=style, linewidth=width, label=f"{v} rep {k} {q[:3]}")
    top.set_ylabel("per second")
    top.set_title("Background load: Locust requests and failures per second")
    top.set_ylim(bottom=0)
    top.legend(fontsize=7)
    bottom.set_ylabel("response time (s)")
    bottom.set_title("Locust response time, current 10 s window (thick p50, thin p90)")
    bottom.set_xlabel("seconds since the workload started")
    bottom.set_ylim(bottom=0)
    mark_faults([top, bottom], faults)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_throughput(series: dict, variants: list[str], path: Path, faults=()) -> bool:
    """Relay throughput over time (``metrics.throughput_series``): one panel per relay; per
    variant and repetition (line style = repetition) a thin line of the per-sample rate, a
    thick line of the trailing 30 s moving average and a marker at its maximum after the
    warm-up (the metric); the warm-up is shaded."""
    if not series:
        return False
    colors = _colors(variants)
    relays = list(series)
    peak = max((float(s["rate_raw"].max()) for per_v in series.values() for per_r in per_v.values()
                for s in per_r.values() if s["rate_raw"].size), default=0.0)
    div, unit = _rate_unit(peak)
    fig, axes = plt.subplots(len(relays), 1, figsize=(10, 2.9 * len(relays) + 1.3), sharex=True, squeeze=False)
    n_lines = 0
    for ax, relay in zip(axes[:, 0], relays):
        warm = 0.0
        for v in variants:
            for k, s in sorted(series[relay].get(v, {}).items()):
                warm = max(warm, s["warmup_s"])
                style = REP_STYLES[k % len(REP_STYLES)]
                ax.plot(s["t_raw"], s["rate_raw"] / div, color=colors[v], linestyle=style, linewidth=0.6, alpha=0.35)
                ax.plot(s["t"], s["rate"] / div, color=colors[v], linestyle=style, linewidth=2.0,
                        label=f"{v} rep {k}")
                if s["rate_max"] is not None:
                    ax.plot([s["t_max"]], [s["rate_max"] / div], marker="o", markersize=7, color=colors[v],
                            markeredgecolor="black", linestyle="none", label="maximum after warm-up (the metric)")
        n_lines = max(n_lines, sum(len(series[relay].get(v, {})) for v in variants))
        ax.axvspan(0, warm, color="grey", alpha=0.15, label=f"warm-up ({warm:.0f} s, excluded)")
        ax.set_ylabel(f"Throughput ({unit})")
        ax.set_title(f"Relay {relay}: bytes written per second")
        ax.set_ylim(bottom=0, top=peak / div * 1.08 if peak else None)
    axes[-1, 0].set_xlabel("Time since workload start (s)")
    mark_faults(axes, faults)
    fig.suptitle("Relay throughput: thin = each 500 ms sample, thick = 30 s moving average", fontsize=12)
    _shared_legend(fig, axes, ncol=4)
    _save(fig, path, legend_rows=math.ceil((n_lines + 2 + len(faults)) / 4))
    return True


def _or_connections_open(key: str) -> bool:
    return key.startswith("tor_relay_connections{") and 'type="OR"' in key and 'state="opened"' in key


def relay_metric_series(run: Run, match) -> dict:
    """A MetricsPort quantity per relay over time, from metrics.jsonl: at each scrape, the
    sum of the samples whose key ``match(key)`` accepts; times since the workload start."""
    out: dict = {}
    for r in run.reps:
        t0 = (r.meta or {}).get("t_workload_start")
        if not r.metrics or t0 is None:
            continue
        by_relay: dict = {}
        for rec in r.metrics:
            vals = [v for k, v in rec["samples"].items() if match(k)]
            if vals:
                by_relay.setdefault(rec["relay"], []).append((rec["t"] - t0, sum(vals)))
        for relay, pts in by_relay.items():
            pts.sort()
            out.setdefault(relay, {}).setdefault(r.variant, {})[r.index] = (
                np.array([p[0] for p in pts]), np.array([p[1] for p in pts]))
    return dict(sorted(out.items()))


def plot_relay_metric(series: dict, variants: list[str], path: Path, title: str, ylabel: str, faults=()) -> bool:
    """One panel per relay; a line per variant and repetition (line style = repetition)."""
    if not series:
        return False
    colors = _colors(variants)
    relays = list(series)
    fig, axes = plt.subplots(len(relays), 1, figsize=(10, 2.4 * len(relays) + 1.3), sharex=True, squeeze=False)
    n_lines = 0
    for ax, relay in zip(axes[:, 0], relays):
        for v in variants:
            for k, (t, y) in sorted(series[relay].get(v, {}).items()):
                ax.plot(t, y, color=colors[v], linestyle=REP_STYLES[k % len(REP_STYLES)], linewidth=1.5,
                        label=f"{v} rep {k}", drawstyle="steps-post")
        n_lines = max(n_lines, sum(len(series[relay].get(v, {})) for v in variants))
        ax.set_title(f"Relay {relay}")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
    axes[-1, 0].set_xlabel("Time since workload start (s)")
    mark_faults(axes, faults)
    fig.suptitle(title, fontsize=12)
    _shared_legend(fig, axes, ncol=4)
    _save(fig, path, legend_rows=math.ceil((n_lines + len(faults)) / 4))
    return True


def resource_summary(run: Run) -> dict:
    """Per node and variant (repetitions pooled): CPU used per second of wall time between
    the first and last resources.jsonl sample, and the peak RSS."""
    acc: dict = {}
    for r in run.reps:
        by_node: dict = {}
        for rec in r.resources:
            by_node.setdefault(rec["node"], []).append(rec)
        for node, recs in by_node.items():
            recs.sort(key=lambda x: x["t"])
            a = acc.setdefault(node, {}).setdefault(r.variant, {"cpu": 0.0, "wall": 0.0, "rss": 0, "role": recs[0].get("role")})
            if len(recs) > 1 and recs[-1]["t"] > recs[0]["t"]:
                a["cpu"] += recs[-1]["cpu_s"] - recs[0]["cpu_s"]
                a["wall"] += recs[-1]["t"] - recs[0]["t"]
            a["rss"] = max(a["rss"], max(x.get("rss_peak_bytes") or x["rss_bytes"] for x in recs))
    return {node: {v: (a["cpu"] / a["wall"] if a["wall"] else None, a["rss"], a["role"]) for v, a in per.items()}
            for node, per in sorted(acc.items())}


def plot_resources(summary: dict, variants: list[str], path: Path) -> bool:
    """Two bar panels, one bar per node and variant: CPU (share of one core) and peak RSS."""
    if not summary:
        return False
    colors = _colors(variants)
    nodes = list(summary)
    x = np.arange(len(nodes))
    width = 0.8 / max(1, len(variants))
    fig, (ax_cpu, ax_rss) = plt.subplots(2, 1, figsize=(max(8, 0.55 * len(nodes) + 3), 7.5), sharex=True)
    for i, v in enumerate(variants):
        cpu = [(summary[n].get(v) or (None,))[0] for n in nodes]
        rss = [(summary[n].get(v) or (None, 0))[1] for n in nodes]
        off = (i - (len(variants) - 1) / 2) * width
        ax_cpu.bar(x + off, [c * 100 if c is not None else 0 for c in cpu], width, color=colors[v], label=v)
        ax_rss.bar(x + off, [b / 2**20 for b in rss], width, color=colors[v], label=v)
    ax_cpu.set_ylabel("CPU (% of one core)")
    ax_cpu.set_title("CPU of each tor between the first and last sample")
    ax_rss.set_ylabel("Peak RSS (MiB)")
    ax_rss.set_title("Peak resident memory of each tor")
    ax_rss.set_xticks(x, [f"{n}\n({(next(iter(summary[n].values())))[2]})" for n in nodes], rotation=60, fontsize=8)
    fig.suptitle("Resources per node (resources.jsonl)", fontsize=12)
    _shared_legend(fig, np.array([[ax_cpu], [ax_rss]]), ncol=4)
    _save(fig, path, legend_rows=math.ceil(len(variants) / 4))
    return True


CELL_WAIT_PANELS = (("inbound/gh70-light", "inbound (toward the client), GH70 light circuits"),
                    ("inbound/gh70-heavy", "inbound (toward the client), GH70 heavy circuits"),
                    ("outbound/all", "outbound (toward the exit), all circuits"))


def plot_cell_wait(series: dict, variants: list[str], path: Path, bin_s: float = 5.0, faults=()) -> bool:
    """Circuit-queue wait per cell over time (``metrics.cell_wait_series``): a row per relay,
    columns = inbound Gopal & Heninger light / heavy circuits, outbound all circuits; a line
    per variant and repetition (line style = repetition), the warm-up shaded."""
    if not series:
        return False
    colors = _colors(variants)
    relays = list(series)
    fig, axes = plt.subplots(len(relays), len(CELL_WAIT_PANELS), figsize=(14, 3.1 * len(relays) + 1.2),
                             sharex=True, squeeze=False)
    n_lines = 0
    for row, relay in enumerate(relays):
        for col, (key, name) in enumerate(CELL_WAIT_PANELS):
            ax = axes[row, col]
            warm = 0.0
            drawn = 0
            for v in variants:
                for k, s in sorted(series[relay].get(key, {}).get(v, {}).items()):
                    warm = max(warm, s["warmup_s"])
                    ax.plot(s["t"], s["wait_ms"], color=colors[v], linestyle=REP_STYLES[k % len(REP_STYLES)],
                            linewidth=1.4, marker=".", markersize=4, label=f"{v} rep {k}")
                    drawn += 1
            n_lines = max(n_lines, drawn)
            if warm > 0:
                ax.axvspan(0, warm, color="grey", alpha=0.15, label=f"warm-up ({warm:.0f} s, excluded)")
            ax.set_title(f"{relay}: {name}", fontsize=10)
            ax.set_ylabel("Wait per cell (ms)")
            ax.set_ylim(bottom=0)
            if not drawn:
                ax.text(0.5, 0.5, "no cells", ha="center", va="center", transform=ax.transAxes)
    for ax in axes[-1]:
        ax.set_xlabel("Time since workload start (s)")
    mark_faults(axes, faults)
    fig.suptitle(f"Circuit-queue wait per cell (CELL_STATS): sum of waits / cells removed, {bin_s:.0f} s bins",
                 fontsize=12)
    _shared_legend(fig, axes, ncol=5)
    _save(fig, path, legend_rows=math.ceil((n_lines + 1 + len(faults)) / 5))
    return True


REPS_NOTE = ("Lines: all repetitions pooled; shaded band: per-quantile range over the "
             "repetitions (shown when >= 2 repetitions have data). Where transfers were cut off "
             "by the end of the window, the line is the Kaplan-Meier CDF (1 - survival) with "
             "each censored time marked '|', and the band is of the completed transfers.")


def make_all(run: Run, extracted: Extracted, summary: dict, out_dir: Path) -> list[Figure]:
    """Draw every figure of the report into ``out_dir`` (created). Returns the figures
    written, in report order; metrics without data are skipped (the report says so)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ms = extracted.metrics
    fw = faults_mod.planned_windows(run)   # shaded on every time series
    return [*_transfer_figures(run, ms, summary, out_dir),
            *_circuit_figures(run, ms, summary, out_dir),
            *_relay_series_figures(run, out_dir, fw),
            *_cell_figures(run, ms, summary, out_dir, fw),
            *_resource_figures(run, out_dir)]


def _transfer_figures(run: Run, ms: dict, summary: dict, out_dir: Path) -> list[Figure]:
    """Per (group, file): the CDFs from the request and from stream start, and the quantile bars."""
    variants, baseline = run.variants, summary["baseline"]
    figs: list[Figure] = []
    groups = sorted({(m.params["group"], m.params["file"]) for m in ms.values() if "group" in m.params})
    for g, f in groups:
        sub = ms[f"ttlb_s/{g}:{f}"].subject
        for pair, what, stem in ((("ttfb_s", "ttlb_s"), "from the request", "cdf-transfer"),
                                 (("ttfb_stream_s", "ttlb_stream_s"), "from stream start", "cdf-transfer-stream")):
            panels = [(metrics_mod.METRICS[k].title, ms[f"{k}/{g}:{f}"]) for k in pair]
            p = out_dir / f"{stem}-{_safe(g)}-{_safe(f)}.png"
            title = f"Transfer times {what}, {sub}"
            if plot_cdf(panels, variants, baseline, p, title):
                figs.append(Figure(p, title, f"CDFs of TTFB and TTLB {what}. {REPS_NOTE}", "Transfers",
                                   tuple(f"{k}/{g}:{f}" for k in pair)))
        entries = [(metrics_mod.METRICS[k].title, summary["metrics"][f"{k}/{g}:{f}"]) for k in ("ttfb_s", "ttlb_s")]
        p = out_dir / f"quantiles-{_safe(g)}-{_safe(f)}.png"
        title = f"Transfer time quantiles, {sub}"
        if plot_quantile_bars(entries, variants, p, title):
            figs.append(Figure(p, title, "Quantiles of TTFB and TTLB per variant, repetitions pooled; "
                               "the error bar is the 95% CI of the median from a cluster bootstrap over whole repetitions.", "Transfers"))
    return figs


def _circuit_figures(run: Run, ms: dict, summary: dict, out_dir: Path) -> list[Figure]:
    m = ms.get("circuit_build_s")
    if m is None:
        return []
    p = out_dir / "cdf-circuit_build_s.png"
    title = "Circuit build time, all clients"
    if plot_cdf([(m.info.title, m)], run.variants, summary["baseline"], p, title):
        return [Figure(p, title, f"CDF of circuit build times. {REPS_NOTE}", "Circuits", ("circuit_build_s",))]
    return []


def _relay_series_figures(run: Run, out_dir: Path, fw) -> list[Figure]:
    """Time series of the relays (throughput, OR connections, circuits) and of the background load."""
    variants = run.variants
    figs: list[Figure] = []
    ts = metrics_mod.throughput_series(run)
    p = out_dir / "timeseries-relay-throughput.png"
    if plot_throughput(ts, variants, p, faults=fw):
        figs.append(Figure(p, "Relay throughput over time",
                           "Bytes written per second by each relay: every sample (thin) and the trailing "
                           "30 s moving average (thick, complete windows only); the dot marks the "
                           "largest 30 s average of a window starting after the warm-up, the metric.",
                           "Relays"))

    p = out_dir / "timeseries-relay-connections.png"
    if plot_relay_metric(relay_metric_series(run, _or_connections_open), variants, p,
                         "Open OR connections per relay (MetricsPort)", "OR connections", faults=fw):
        figs.append(Figure(p, "Open OR connections over time",
                           "OR connections each relay had open at each MetricsPort scrape "
                           "(tor_relay_connections, type OR, state opened; metrics.jsonl).", "Relays"))
    p = out_dir / "timeseries-relay-circuits.png"
    if plot_relay_metric(relay_metric_series(run, lambda k: k == 'tor_relay_circuits_total{state="opened"}'),
                         variants, p, "Circuits each relay has opened so far (MetricsPort)", "circuits (cumulative)",
                         faults=fw):
        figs.append(Figure(p, "Circuits opened over time",
                           "Circuits each relay had opened since it started, at each MetricsPort scrape "
                           "(tor_relay_circuits_total; metrics.jsonl): the relay's load in circuits.", "Relays"))
    p = out_dir / "timeseries-load.png"
    if plot_load(run, variants, p, faults=fw):
        figs.append(Figure(p, "Background load over time",
                           "The Locust master's statistics (load.jsonl) every load.stats_interval: requests "
                           "and failures per second, and response-time percentiles over Locust's current "
                           "10 s window.", "Background load"))
    return figs


def _cell_figures(run: Run, ms: dict, summary: dict, out_dir: Path, fw) -> list[Figure]:
    """Per-cell timing: circuit-queue waits per relay, replayed traffic's one-way delay, waits over time."""
    variants, baseline = run.variants, summary["baseline"]
    figs: list[Figure] = []
    cw_relays = sorted({m.params["relay"] for m in ms.values() if m.metric == "cell_wait_ms" and "relay" in m.params})
    for relay in cw_relays:
        panels = [(f"{d.capitalize()} ({'toward the client' if d == 'inbound' else 'toward the exit'})",
                   ms[f"cell_wait_ms/{relay}/{d}/all"]) for d in metrics_mod.DIRECTIONS]
        p = out_dir / f"cdf-cell_wait-{_safe(relay)}.png"
        title = f"Circuit-queue wait per cell at relay {relay} (all circuits)"
        if plot_cdf(panels, variants, baseline, p, title):
            figs.append(Figure(p, title, "CDF of per-circuit, per-second mean waits (CELL_STATS). "
                               + REPS_NOTE, "Relays", tuple(f"cell_wait_ms/{relay}/{d}/all" for d in metrics_mod.DIRECTIONS)))
    figs += _cell_delay_figure(ms, summary, variants, out_dir)
    cws = metrics_mod.cell_wait_series(run)
    p = out_dir / "timeseries-cell-wait.png"
    if plot_cell_wait(cws, variants, p, faults=fw):
        figs.append(Figure(p, "Circuit-queue wait per cell over time",
                           "sum(time_ms) / sum(removed) over the circuits of a class at each relay, "
                           "5 s bins; light and heavy as Gopal & Heninger 2012 class circuits (70% of a connection's cells), after the warm-up.", "Relays"))
    return figs


def _cell_delay_figure(ms: dict, summary: dict, variants: list[str], out_dir: Path) -> list[Figure]:
    delay = sorted({(m.params["client_group"], m.params["direction"]) for m in ms.values()
                    if m.metric == "cell_delay_ms" and not m.params.get("class")})
    if not delay:
        return []
    panels = [(f"{g}, {d}stream", ms[f"cell_delay_ms/{g}/{d}"]) for g, d in delay]
    p = out_dir / "cdf-cell-delay.png"
    title = "Per-cell one-way delay of replayed traffic"
    if not plot_cdf(panels, variants, summary["baseline"], p, title):
        return []
    means = "; ".join(f"{g} {d}: " + ", ".join(
        f"{v} {summary['metrics'][f'cell_delay_ms/{g}/{d}']['variants'][v].get('mean', float('nan')):.1f} ms"
        for v in variants if summary["metrics"][f"cell_delay_ms/{g}/{d}"]["variants"][v].get("n"))
        for g, d in delay)
    return [Figure(p, title, "CDF of receive - send time of every replayed chunk (one cell's "
                   f"payload) after the warm-up. Average delay per cell: {means}. " + REPS_NOTE,
                   "Replayed traffic")]


def _resource_figures(run: Run, out_dir: Path) -> list[Figure]:
    p = out_dir / "resources-per-node.png"
    if plot_resources(resource_summary(run), run.variants, p):
        return [Figure(p, "CPU and memory per node",
                       "Per tor process, repetitions pooled: CPU seconds used per second between the first "
                       "and last sample (at readiness, every 30 s, at the end) and the largest peak RSS "
                       "(VmHWM) (resources.jsonl).", "Resources")]
    return []
