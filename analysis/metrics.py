"""The metrics: from a loaded run's records to samples per (metric, variant, repetition).

This module is where the metric definitions live (``DEFINITIONS`` is printed in every
report); stats.py does the statistics, figures.py the pictures.

Rules shared by all metrics: transfers with ``warmup: true`` are excluded everywhere;
transfers with status "timeout" or "error" (a stall included) are excluded from the time
metrics and counted in the error rate; transfers the end of the window cut off ("cancelled")
are right-censored observations of the time metrics (``MetricSamples.censored``, Kaplan-Meier
in inference.py), neither dropped nor errors; CELL_STATS events before the end of the scenario's warm-up are excluded; relay
throughput uses a warm-up of max(30 s, the scenario's warm-up), counted from the workload start.

Public API:

- ``METRICS``: metric -> ``MetricInfo`` (title, axis label, unit, definition)
- ``DEFINITIONS``: list of (name, definition text) for the report, including the error rate
- ``MetricSamples``: ``id``, ``metric``, ``params``, ``values[variant][rep] -> ndarray``,
  ``totals`` (cell wait: [variant][rep] -> (sum time_ms, sum removed)), ``title``,
  ``label``, ``unit``, ``pooled(variant)``
- ``extract(run) -> Extracted`` (``metrics``: id -> MetricSamples, in report order; ``notes``)
- ``error_rates(run) -> dict``, ``transfer_outcomes(run) -> dict`` (completed / censored /
  stalled / failed), ``censored_time(rep, transfer, metric)``
- ``circuit_key(record) -> str``, ``gh70_classes(records, t_min) -> dict``,
  ``rep_attribution(rep) -> analysis.circuits.Attribution`` (cached on the Rep)
- ``throughput_series(run) -> dict``, ``cell_wait_series(run, bin_s=5) -> dict``
- ``fmt_size(bytes) -> str``; constants ``THROUGHPUT_WINDOW_S``, ``THROUGHPUT_MIN_WARMUP_S``,
  ``GH70_SHARE``, ``TRANSFER_METRICS``, ``DIRECTIONS``, ``CLASSES``
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from . import clock as clock_mod
from . import stats
from .load import Rep, Run

THROUGHPUT_WINDOW_S = 30.0
THROUGHPUT_MIN_WARMUP_S = 30.0
GH70_SHARE = 0.70       # Gopal & Heninger 2012, sec. 6.2.1: heavy up to 70% of a connection's cells
TRANSFER_METRICS = ("ttfb_s", "ttlb_s", "ttfb_stream_s", "ttlb_stream_s")
DIRECTIONS = ("inbound", "outbound")
CLASSES = ("all", "gh70-light", "gh70-heavy")


@dataclass(frozen=True)
class MetricInfo:
    title: str
    label: str
    unit: str
    definition: str


METRICS: dict[str, MetricInfo] = {
    "ttfb_s": MetricInfo(
        "Time to first byte", "Time to first byte (s)", "s",
        "t_first_byte - t_request: from the HTTP request being sent (after SOCKS and circuit) "
        "to the first byte of the response body (the onionperf/tornettools convention); "
        "one value per successful transfer, per client group and file."),
    "ttlb_s": MetricInfo(
        "Time to last byte", "Time to last byte (s)", "s",
        "t_last_byte - t_request: from the HTTP request being sent to the last byte of the "
        "response body; one value per successful transfer, per client group and file."),
    "ttfb_stream_s": MetricInfo(
        "Time to first byte from stream start", "Time to first byte from stream start (s)", "s",
        "t_first_byte - t_start: as TTFB but from the start of the stream (includes SOCKS "
        "handshake, stream attachment and exit connect)."),
    "ttlb_stream_s": MetricInfo(
        "Time to last byte from stream start", "Time to last byte from stream start (s)", "s",
        "t_last_byte - t_start: as TTLB but from the start of the stream."),
    "circuit_build_s": MetricInfo(
        "Circuit build time", "Circuit build time (s)", "s",
        "Time the client's controller waited for its circuit to be built (circuit.build_s); "
        "one value per distinct circuit (client, circuit id) of a repetition that carried a "
        "successful transfer after the warm-up."),
    "relay_throughput_Bps": MetricInfo(
        "Relay throughput", "Relay throughput (bytes/s)", "B/s",
        "The maximum 30 s moving average of the bytes the relay's tor wrote (relay_bw "
        "samples, every 500 ms by default), counting only windows that start after a warm-up "
        "of max(30 s, the scenario's warm-up) from the workload start (Engler & Goldberg); "
        "one value per relay and repetition. A missing sample counts as 0 bytes."),
    "cell_wait_ms": MetricInfo(
        "Circuit-queue wait per cell", "Circuit-queue wait per cell (ms)", "ms",
        "From tor's CELL_STATS events (one per circuit and second at each relay): the mean "
        "wait of a cell in the circuit queue is sum(time_ms) / sum(removed) over the cells "
        "removed from the queue, per direction (inbound = toward the client, i.e. downloads; "
        "outbound = toward the exit). 'wait per cell' in the tables is that ratio over all "
        "events after the warm-up; the distribution (n, median, CDF) is over the per-event "
        "ratios (one circuit, one second, at least one cell removed). Per client group and "
        "position ('cell_wait_ms/client:<group>/<guard|middle|exit>/<direction>'): the circuits "
        "that carried that group's transfers, found at each relay by their identity (the "
        "client tor's circuit id on its guard channel, chained relay to relay through "
        "CELL_STATS channel and circuit ids; analysis/circuits.py), with no volume rule. Per "
        "relay: 'all' circuits, and the classes of Gopal & Heninger 2012 (sec. 6.2.1), "
        "'gh70-heavy' / 'gh70-light': at each relay, the circuits entering on one connection, "
        "in order of their cells (both directions, after the warm-up), are heavy until they "
        "make up 70% of that connection's cells, the rest light. CELL_STATS measures the "
        "circuit queue only, not connection output buffers or the kernel."),
    "cell_delay_ms": MetricInfo(
        "Per-cell delay", "One-way delay per cell (ms)", "ms",
        "Replay workloads (cells.jsonl): for every replayed chunk (at most 498 bytes, one relay "
        "cell's payload), receive time - send time, read on the replay server's and the replay "
        "client's clocks and corrected by the client's measured offset to the server "
        "(clock.jsonl: NTP-style exchanges outside Tor, offset and drift fitted over the run; "
        "one host, e.g. the local backend: ~0). '± clock' is how far the mean can be off "
        "through that correction (the mean of the cells' bounds: half the best exchanges' "
        "round trip plus the fit's residual); a difference of means within the two variants' "
        "± clock is reported as such, not as a number. Quantiles can move by up to the largest "
        "bound (the clock table). Per client group and direction (down = replay server -> client "
        "through Tor, up = client -> server). The mean is Torchestra's 'average delay per "
        "cell'. Chunks scheduled inside the warm-up are excluded. Groups whose flows differ in "
        "size are also split by flow with Gopal & Heninger's 70% rule: in order of their "
        "chunks after the warm-up, flows are 'gh70-heavy' until they hold 70% of the group's "
        "chunks, the rest 'gh70-light' (Torchestra reports light circuits)."),
    "sched_error_ms": MetricInfo(
        "Replay scheduling error", "Send time - recorded time (ms)", "ms",
        "How late the replayer sent each chunk relative to the trace's time (actual - intended "
        "send time, same clock); large values mean the sender was blocked (TCP back-pressure "
        "through Tor) or starved of CPU, and the replay was not faithful there."),
}

DEFINITIONS: list[tuple[str, str]] = [(m.title, m.definition) for m in METRICS.values()] + [
    ("Error rate", "Transfers with status other than 'ok' (timeout or error) divided by all "
     "transfers after the warm-up, with counts per error cause (error.cause, e.g. 'stall' for "
     "a stream silent for the workload's stallout; 'timeout' for timeouts without a cause). "
     "Errored transfers are excluded from the time metrics. Transfers the end of the "
     "measurement window cut off ('cancelled') are not errors."),
    ("Censored transfers", "A transfer still running when the measurement window ended is "
     "right-censored: its time is more than the time it was observed (t_censor, the driver "
     "giving up at the window's end, minus the metric's origin). The time metrics keep it: "
     "their median and 90th percentile are Kaplan-Meier estimates per repetition (equal to "
     "the sample median when nothing is censored); a median more than half censored is 'not "
     "reached'. The report's transfer-outcomes table counts completed / censored / stalled / "
     "failed transfers per variant; a stall (the stream stopped moving) is an error, not "
     "censored."),
    ("Warm-up", "Transfers flagged warmup=true (started inside the scenario's warm-up window) "
     "are excluded from every statistic and from the onionperf export."),
]


def fmt_size(n: int | float | None) -> str:
    """Bytes as a short human string: IEC units when divisible by 1024, else SI (300 KB)."""
    if n is None:
        return "? B"
    n = int(n)
    for div, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    for div, unit in ((10 ** 9, "GB"), (10 ** 6, "MB"), (10 ** 3, "KB")):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


@dataclass
class MetricSamples:
    """Samples of one metric for one subject (a transfer group, a relay, ...)."""

    id: str
    metric: str
    params: dict
    values: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)
    totals: dict[str, dict[int, tuple[float, float]]] | None = None
    # Per-cell delays: each value's clock-correction bound (same shape as values; NaN where
    # the repetition has no clock estimate), see analysis/clock.py.
    clock_bounds: dict[str, dict[int, np.ndarray]] | None = None
    # Time metrics of transfers: the right-censored times ([variant][rep] -> ndarray) of the
    # transfers the window cut off (still running: their time is more than this). ``values``
    # holds only observed times; None for metrics that cannot be censored.
    censored: dict[str, dict[int, np.ndarray]] | None = None

    @property
    def info(self) -> MetricInfo:
        return METRICS[self.metric]

    @property
    def subject(self) -> str:
        p = self.params
        if "group" in p:
            return f"{p['group']}: {p['file']} ({fmt_size(p.get('size'))})"
        if "position" in p:
            return f"{p['client_group']} clients' circuits at the {p['position']}, {p['direction']}"
        if "client_group" in p:
            cls = f", {p['class']} flows" if p.get("class") else ""
            return f"{p['client_group']}, {'downstream' if p['direction'] == 'down' else 'upstream'}{cls}"
        if "direction" in p:
            return f"{p['relay']}, {p['direction']}, {p['class']} circuits"
        if "relay" in p:
            return p["relay"]
        return "all clients"

    @property
    def title(self) -> str:
        return f"{self.info.title}, {self.subject}"

    @property
    def label(self) -> str:
        return self.info.label

    @property
    def unit(self) -> str:
        return self.info.unit

    def pooled(self, variant: str) -> np.ndarray:
        """All repetitions' values of ``variant`` concatenated (empty if none)."""
        reps = self.values.get(variant, {})
        parts = [reps[k] for k in sorted(reps)]
        return np.concatenate(parts) if parts else np.array([], dtype=float)

    def pooled_censored(self, variant: str) -> np.ndarray:
        """All repetitions' censored times of ``variant`` (empty if none or not censorable)."""
        reps = (self.censored or {}).get(variant, {})
        parts = [reps[k] for k in sorted(reps)]
        return np.concatenate(parts) if parts else np.array([], dtype=float)

    def n_censored(self, variant: str) -> int:
        return int(self.pooled_censored(variant).size)

    def clock_bound(self, variant: str) -> float | None:
        """How far the pooled mean can be off through clock correction: the mean of the
        values' bounds; None when any value's bound is unknown (or no clock bounds)."""
        if self.clock_bounds is None:
            return None
        reps = self.clock_bounds.get(variant, {})
        parts = [reps[k] for k in sorted(reps) if reps[k].size]
        if not parts:
            return None
        b = np.concatenate(parts)
        return None if np.isnan(b).any() else float(b.mean())


@dataclass
class Extracted:
    metrics: dict[str, MetricSamples]
    notes: list[str]


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _ok_measured(rep: Rep) -> list[dict]:
    return [t for t in rep.measured_transfers if t.get("status") == "ok"]


def _group_key(t: dict) -> tuple[str, str]:
    return str(t.get("group") or t.get("client") or "?"), str(t.get("file") or "?")


def _new(run: Run, mid: str, metric: str, params: dict, totals: bool = False) -> MetricSamples:
    m = MetricSamples(id=mid, metric=metric, params=params)
    for r in run.reps:
        m.values.setdefault(r.variant, {})[r.index] = np.array([], dtype=float)
    if totals:
        m.totals = {r.variant: {} for r in run.reps}
    return m


def circuit_key(rec: dict) -> str:
    """Identity of the circuit of a CELL_STATS record at its relay.

    The collector writes ``circuit`` (the ID of an origin circuit, else "<inbound conn>:<inbound
    circuit id>"); records without it (older runs: tor gives relayed circuits no ID) fall back
    to the inbound, else outbound, queue and connection ids.
    """
    session = f"#{rec['session']}" if rec.get("session") is not None else ""
    if rec.get("circuit") not in (None, ""):
        return f"id:{rec['circuit']}{session}"
    for side in DIRECTIONS:
        s = rec.get(side)
        if isinstance(s, dict) and (s.get("queue") is not None or s.get("conn") is not None):
            return f"{side}:{s.get('queue')}@{s.get('conn')}{session}"
    return "unknown"


def _side_sums(side) -> tuple[float, float]:
    """(sum time_ms, sum removed) of one direction of a CELL_STATS record (0, 0 if null)."""
    if not isinstance(side, dict):
        return 0.0, 0.0
    removed = sum(v for v in (side.get("removed") or {}).values() if _num(v))
    time_ms = sum(v for v in (side.get("time_ms") or {}).values() if _num(v))
    return float(time_ms), float(removed)


def gh70_classes(records: list[dict], t_min: float = float("-inf"), share: float = GH70_SHARE) -> dict[str, str]:
    """Gopal & Heninger 2012's classes (sec. 6.2.1: "We labelled the circuits 'heavy' in order
    of contribution to total cells over the connection, up to a threshold of 70% of total
    cells") for the CELL_STATS ``records`` of ONE relay in one repetition: the circuits are
    grouped by the connection they enter on (inbound channel; the relay's own circuits form
    one group), counted by their removed cells (both directions) in records from ``t_min``
    (the end of the warm-up) on; in each group, in order of cells, a circuit is
    'gh70-heavy' while the circuits before it hold less than ``share`` of the group's cells,
    'gh70-light' after. Returns circuit key -> class (circuits with no cells after t_min are
    absent)."""
    removed: Counter = Counter()
    conn_of: dict[str, tuple] = {}
    for r in records:
        if not _num(r.get("t")) or r["t"] < t_min:
            continue
        key = circuit_key(r)
        removed[key] += sum(_side_sums(r.get(d))[1] for d in DIRECTIONS)
        side = r.get("inbound")
        conn_of[key] = (r.get("session"), side.get("conn") if isinstance(side, dict) else None)
    groups: dict[tuple, list[str]] = defaultdict(list)
    for key in removed:
        groups[conn_of[key]].append(key)
    out: dict[str, str] = {}
    for keys in groups.values():
        total = sum(removed[k] for k in keys)
        before = 0.0
        for k in sorted(keys, key=lambda k: (-removed[k], k)):
            out[k] = "gh70-heavy" if before < share * total else "gh70-light"
            before += removed[k]
    return out


def rep_attribution(r: Rep):
    """analysis.circuits.attribute of one repetition (its cellstats, the clients'
    circuits.jsonl, its transfers; relay names from meta.json), computed once per Rep."""
    from . import circuits
    cached = r.__dict__.get("_attribution")
    if cached is None:
        nodes = (r.meta or {}).get("nodes") or []
        names = {str(n["fingerprint"]).upper(): n["name"] for n in nodes
                 if isinstance(n, dict) and n.get("fingerprint") and n.get("name")}
        cached = circuits.attribute(r.cellstats, r.circuits, r.transfers, names=names or None)
        r.__dict__["_attribution"] = cached
    return cached


def _classes_of(cls: str) -> tuple[str, ...]:
    return ("all", cls) if cls in CLASSES else ("all",)


def _by_relay(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        out[str(r["relay"])].append(r)
    return dict(sorted(out.items()))


def extract(run: Run) -> Extracted:
    """Samples of every metric, for every variant and repetition of ``run``.

    Returns an Extracted: ``metrics`` (id -> MetricSamples; ids like ``ttlb_s/web:small``,
    ``circuit_build_s``, ``relay_throughput_Bps/middle0``, ``cell_wait_ms/middle0/inbound/all``)
    and ``notes`` (what could not be computed, per repetition).
    """
    notes: list[str] = []
    out: dict[str, MetricSamples] = {}
    _transfer_times(run, out)
    _circuit_builds(run, out)
    _relay_throughput(run, out, notes)
    _relay_cell_waits(run, out)
    _client_cell_waits(run, out, notes)
    _cell_delays(run, out)
    return Extracted(metrics=out, notes=notes)


def _transfer_times(run: Run, out: dict[str, MetricSamples]) -> None:
    """TRANSFER_METRICS per transfer group (client group, file; with its most common size),
    censored transfers' times apart."""
    sizes: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in run.reps:
        for t in r.transfers:
            sizes[_group_key(t)][t.get("size")] += 1
    for gk in sorted(sizes):
        size = sizes[gk].most_common(1)[0][0]
        for metric in TRANSFER_METRICS:
            mid = f"{metric}/{gk[0]}:{gk[1]}"
            out[mid] = _new(run, mid, metric, {"group": gk[0], "file": gk[1], "size": size})
            out[mid].censored = {r.variant: {} for r in run.reps}
    for r in run.reps:
        ok = _ok_measured(r)
        for metric in TRANSFER_METRICS:
            per: dict[tuple[str, str], list[float]] = defaultdict(list)
            for t in ok:
                if _num(t.get(metric)):
                    per[_group_key(t)].append(float(t[metric]))
            cens: dict[tuple[str, str], list[float]] = defaultdict(list)
            for t in r.censored_transfers:
                observed, censored_at = censored_time(r, t, metric)
                if observed is not None:
                    per[_group_key(t)].append(observed)
                elif censored_at is not None:
                    cens[_group_key(t)].append(censored_at)
            for gk, vals in per.items():
                out[f"{metric}/{gk[0]}:{gk[1]}"].values[r.variant][r.index] = np.array(vals)
            for gk, vals in cens.items():
                out[f"{metric}/{gk[0]}:{gk[1]}"].censored[r.variant][r.index] = np.array(vals)


def _circuit_builds(run: Run, out: dict[str, MetricSamples]) -> None:
    """Circuit build time: distinct circuits of successful measured transfers."""
    cb = _new(run, "circuit_build_s", "circuit_build_s", {})
    for r in run.reps:
        seen: dict[tuple, float] = {}
        for t in _ok_measured(r):
            c = t.get("circuit")
            if isinstance(c, dict) and _num(c.get("build_s")):
                seen.setdefault((t.get("client"), c.get("id"), c["build_s"]), float(c["build_s"]))
        cb.values[r.variant][r.index] = np.array(list(seen.values()))
    out[cb.id] = cb


def _relay_throughput(run: Run, out: dict[str, MetricSamples], notes: list[str]) -> None:
    """Each relay's largest moving-average throughput after the warm-up."""
    relays = sorted({str(b["relay"]) for r in run.reps for b in r.relay_bw})
    groups = {str(b["relay"]): b.get("group") for r in run.reps for b in r.relay_bw}
    for relay in relays:
        mid = f"relay_throughput_Bps/{relay}"
        out[mid] = _new(run, mid, "relay_throughput_Bps", {"relay": relay, "relay_group": groups.get(relay)})
    for r in run.reps:
        if not r.relay_bw:
            continue
        t0 = r.t0
        warm = max(THROUGHPUT_MIN_WARMUP_S, r.warmup_s)
        for relay, recs in _by_relay(r.relay_bw).items():
            t = [b["t"] for b in recs if _num(b.get("written"))]
            w = [b["written"] for b in recs if _num(b.get("written"))]
            v = stats.moving_average_max(t, w, THROUGHPUT_WINDOW_S, start=t0 + warm)
            if v is None:
                span = (max(t) - t0) if t else 0.0
                notes.append(f"{r.label}: relay {relay}: no complete {THROUGHPUT_WINDOW_S:.0f} s window "
                             f"after the {warm:.0f} s warm-up (samples cover {span:.0f} s); "
                             f"no throughput value")
            else:
                out[f"relay_throughput_Bps/{relay}"].values[r.variant][r.index] = np.array([v])


def _relay_cell_waits(run: Run, out: dict[str, MetricSamples]) -> None:
    """Circuit-queue wait per cell at each relay, per direction and circuit class."""
    cw_relays = sorted({str(c["relay"]) for r in run.reps for c in r.cellstats})
    cw_groups = {str(c["relay"]): c.get("group") for r in run.reps for c in r.cellstats}
    for relay in cw_relays:
        for d in DIRECTIONS:
            for cls in CLASSES:
                mid = f"cell_wait_ms/{relay}/{d}/{cls}"
                out[mid] = _new(run, mid, "cell_wait_ms", {"relay": relay, "relay_group": cw_groups.get(relay),
                                                           "direction": d, "class": cls}, totals=True)
    for r in run.reps:
        if not r.cellstats:
            continue
        t_min = (r.t0 or 0.0) + r.warmup_s
        for relay, recs in _by_relay(r.cellstats).items():
            classes = gh70_classes(recs, t_min)
            samples = {(d, c): [] for d in DIRECTIONS for c in CLASSES}
            sums = {(d, c): [0.0, 0.0] for d in DIRECTIONS for c in CLASSES}
            for rec in recs:
                if rec["t"] < t_min:
                    continue
                cls = classes.get(circuit_key(rec), "")
                for d in DIRECTIONS:
                    time_ms, removed = _side_sums(rec.get(d))
                    if removed <= 0:
                        continue
                    for c in _classes_of(cls):
                        samples[(d, c)].append(time_ms / removed)
                        sums[(d, c)][0] += time_ms
                        sums[(d, c)][1] += removed
            for (d, c), vals in samples.items():
                m = out[f"cell_wait_ms/{relay}/{d}/{c}"]
                m.values[r.variant][r.index] = np.array(vals)
                m.totals[r.variant][r.index] = (sums[(d, c)][0], sums[(d, c)][1])


def _client_cell_waits(run: Run, out: dict[str, MetricSamples], notes: list[str]) -> None:
    """Circuit-queue wait per cell of each client group's circuits at each position
    (``cell_wait_ms/client:<group>/<position>/<direction>``): the hops analysis/circuits.py
    labels with a client of the group, on circuits that carried the client's transfers,
    CELL_STATS records after the warm-up."""
    acc: dict[tuple, dict[tuple, list]] = {}
    for r in run.reps:
        if not r.cellstats:
            continue
        if not r.circuits:
            notes.append(f"{r.label}: no circuits.jsonl: relay-side circuits are not known by client "
                         f"(runs made before the driver recorded them)")
            continue
        att = rep_attribution(r)
        from .circuits import coverage
        cov = coverage(att, r.cellstats)
        if cov["workload_complete"] < cov["workload_circuits"] or cov["data_hops_unlabelled"]:
            notes.append(f"{r.label}: circuits known by client: {cov['workload_complete']} of "
                         f"{cov['workload_circuits']} workload circuits found at every relay of their path; "
                         f"{cov['data_hops_unlabelled']} of {cov['data_hops']} relay-side circuits that carried "
                         f"data are not attributed (e.g. through a tor without a collector, an authority)")
        t_min = (r.t0 or 0.0) + r.warmup_s
        per = acc.setdefault((r.variant, r.index), {})
        for rec in r.cellstats:
            if not _num(rec.get("t")) or rec["t"] < t_min:
                continue
            lb = att.label_of(rec)
            if lb is None or lb.origin != "client" or (lb.node, lb.circuit) not in att.workload:
                continue
            for d in DIRECTIONS:
                time_ms, removed = _side_sums(rec.get(d))
                if removed <= 0:
                    continue
                v = per.setdefault((str(lb.group), lb.position, d), [[], 0.0, 0.0])
                v[0].append(time_ms / removed)
                v[1] += time_ms
                v[2] += removed
    keys = sorted({k for per in acc.values() for k in per},
                  key=lambda k: (k[0], _POSITION_ORDER.get(k[1], 9), k[1], k[2]))
    for g, pos, d in keys:
        mid = f"cell_wait_ms/client:{g}/{pos}/{d}"
        m = out[mid] = _new(run, mid, "cell_wait_ms", {"client_group": g, "position": pos, "direction": d},
                            totals=True)
        for (variant, index), per in acc.items():
            vals, t_sum, n_sum = per.get((g, pos, d), ([], 0.0, 0.0))
            m.values[variant][index] = np.array(vals, dtype=float)
            m.totals[variant][index] = (t_sum, n_sum)


_POSITION_ORDER = {"guard": 0, "middle": 1, "exit": 2}


CELL_DIRECTIONS = ("down", "up")   # CellTable.direction codes 0, 1


def classify_flows(table, share: float = GH70_SHARE) -> dict[int, dict[int, str]]:
    """Gopal & Heninger's classes (``gh70_classes``) of the replayed flows of each client
    group of one repetition's CellTable (a group replays one trace: the connection whose
    circuits the paper classed): a flow's size is its chunks (both directions, outside the
    warm-up) in its largest replay (client, iteration); in order of size, a flow is
    'gh70-heavy' while the flows before it hold less than ``share`` of the group's chunks,
    'gh70-light' after. Flows with no chunk after the warm-up are absent. Returns {group
    code: {flow code: class}}."""
    out: dict[int, dict[int, str]] = {}
    if table is None or len(table) == 0:
        return out
    keep = ~table.warmup
    if not keep.any():
        return out
    replays, counts = np.unique(table.replay[keep], return_counts=True)
    first = {}
    for rp, i in zip(*np.unique(table.replay, return_index=True)):
        first[int(rp)] = (int(table.group[i]), int(table.flow[i]))
    size: dict[tuple[int, int], int] = {}
    for rp, k in zip(replays, counts):
        g, f = first[int(rp)]
        size[(g, f)] = max(size.get((g, f), 0), int(k))
    by_group: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for (g, f), k in size.items():
        by_group[g].append((k, f))
    for g, flows in by_group.items():
        total = sum(k for k, _ in flows)
        before = 0
        for k, f in sorted(flows, key=lambda x: (-x[0], x[1])):
            out.setdefault(g, {})[f] = "gh70-heavy" if before < share * total else "gh70-light"
            before += k
    return out


def _cell_delays(run: Run, out: dict[str, MetricSamples]) -> None:
    """Per-cell one-way delay and scheduling error of replayed chunks, per client group and
    direction (``cell_delay_ms/<group>/<down|up>``, ``sched_error_ms/<group>/<down|up>``); for
    groups whose flows are of both classes also per class (``cell_delay_ms/<group>/<dir>/gh70-light``
    and ``/gh70-heavy``, see ``classify_flows``)."""
    tables = [(r, r.cells) for r in run.reps if r.cells is not None and len(r.cells)]
    classes = {(r.variant, r.index): classify_flows(t) for r, t in tables}
    keys: set[tuple[str, str]] = set()
    mixed: set[str] = set()
    for r, t in tables:
        for gi, g in enumerate(t.groups):
            for di in np.unique(t.direction[t.group == gi]):
                keys.add((g, CELL_DIRECTIONS[int(di)]))
            if len(set(classes[(r.variant, r.index)].get(gi, {}).values())) > 1:
                mixed.add(g)
    for g, d in sorted(keys):
        for metric in ("cell_delay_ms", "sched_error_ms"):
            mid = f"{metric}/{g}/{d}"
            out[mid] = _new(run, mid, metric, {"client_group": g, "direction": d})
        if g in mixed:
            for cls in ("gh70-light", "gh70-heavy"):
                mid = f"cell_delay_ms/{g}/{d}/{cls}"
                out[mid] = _new(run, mid, "cell_delay_ms", {"client_group": g, "direction": d, "class": cls})
    for m in out.values():
        if m.metric == "cell_delay_ms":
            m.clock_bounds = {v: {k: np.array([]) for k in reps} for v, reps in m.values.items()}
    for r, t in tables:
        add, bound = clock_mod.correction(r, t)
        delay = (t.t_recv - t.t_sent + add) * 1e3
        bound = bound * 1e3
        sched = (t.t_sent - t.t_sched) * 1e3
        keep = ~t.warmup
        cls_of = classes[(r.variant, r.index)]
        for gi, g in enumerate(t.groups):
            heavy_flows = np.array([f for f, c in cls_of.get(gi, {}).items() if c == "gh70-heavy"], dtype=np.int32)
            for di, d in enumerate(CELL_DIRECTIONS):
                sel = keep & (t.group == gi) & (t.direction == di)
                if not sel.any():
                    continue
                out[f"cell_delay_ms/{g}/{d}"].values[r.variant][r.index] = delay[sel]
                out[f"cell_delay_ms/{g}/{d}"].clock_bounds[r.variant][r.index] = bound[sel]
                out[f"sched_error_ms/{g}/{d}"].values[r.variant][r.index] = sched[sel]
                if g in mixed:
                    heavy = np.isin(t.flow, heavy_flows)
                    for cls, part in (("gh70-heavy", sel & heavy), ("gh70-light", sel & ~heavy)):
                        out[f"cell_delay_ms/{g}/{d}/{cls}"].values[r.variant][r.index] = delay[part]
                        out[f"cell_delay_ms/{g}/{d}/{cls}"].clock_bounds[r.variant][r.index] = bound[part]


# metric -> (the timestamp it ends at, the one it counts from)
TIME_FIELDS = {"ttfb_s": ("t_first_byte", "t_request"), "ttlb_s": ("t_last_byte", "t_request"),
               "ttfb_stream_s": ("t_first_byte", "t_start"), "ttlb_stream_s": ("t_last_byte", "t_start")}


def censored_time(rep: Rep, t: dict, metric: str) -> tuple[float | None, float | None]:
    """A cancelled transfer's (observed time, censored time) for a transfer time metric: the
    first byte of a transfer cut off later was observed (TTFB an ordinary value); a time
    that had not ended is censored at ``rep.censor_time(t) - origin``. (None, None) when the
    transfer never reached the metric's origin (cut off before its request was sent)."""
    end, origin = TIME_FIELDS[metric]
    if not _num(t.get(origin)):
        return None, None
    if end == "t_first_byte" and _num(t.get(end)):
        return float(t[end]) - float(t[origin]), None
    tc = rep.censor_time(t)
    if tc is None:
        return None, None
    return None, max(0.0, tc - float(t[origin]))


def transfer_outcomes(run: Run) -> dict:
    """Per variant and transfer group ("group:file"), the measured transfers by outcome:
    ``completed`` (ok), ``censored`` (cut off by the window's end), ``stalled`` (a stall:
    the stream stopped moving, a typed error) and ``failed`` (every other error or timeout);
    also ``per_rep``. The report shows them, so "N censored" is never hidden."""
    outcome = transfer_outcome
    blank = {"completed": 0, "censored": 0, "stalled": 0, "failed": 0}
    out: dict = {}
    for v in run.variants:
        groups: dict[str, dict] = {}
        per_rep: dict[str, dict] = {}
        total = dict(blank)
        for r in run.reps_of(v):
            rc = dict(blank)
            for t in r.transfers:
                if t.get("warmup") is True:
                    continue
                o = outcome(t)
                groups.setdefault(":".join(_group_key(t)), dict(blank))[o] += 1
                rc[o] += 1
                total[o] += 1
            per_rep[str(r.index)] = rc
        out[v] = {**total, "by_group": dict(sorted(groups.items())), "per_rep": per_rep}
    return out


def transfer_outcome(t: dict) -> str:
    """One transfer record's outcome: completed, censored, stalled or failed (transfer_outcomes;
    the mechanism gate's completion check, analysis/gates.py, counts the same way)."""
    st = t.get("status")
    if st == "ok":
        return "completed"
    if st == "cancelled":
        return "censored"
    return "stalled" if _cause(t) == "stall" else "failed"


def _cause(t: dict) -> str:
    err = t.get("error")
    if isinstance(err, dict) and err.get("cause"):
        return str(err["cause"])
    return str(t.get("status") or "unknown")


def error_rates(run: Run) -> dict:
    """Error rate per variant over measured (non-warm-up) transfers.

    Returns {variant: {"transfers", "errors", "rate" (None if no transfers), "causes":
    {cause: n}, "by_group": {"group:file": {"transfers", "errors", "rate"}}, "per_rep":
    {rep: {"transfers", "errors", "rate"}}}}.
    """
    def rate(n, e):
        return {"transfers": n, "errors": e, "rate": (e / n) if n else None}

    out = {}
    for v in run.variants:
        causes: Counter = Counter()
        groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        per_rep = {}
        n_all = e_all = 0
        for r in run.reps_of(v):
            n = e = 0
            for t in r.measured_transfers:
                g = groups[":".join(_group_key(t))]
                n += 1
                g[0] += 1
                if t.get("status") != "ok":
                    e += 1
                    g[1] += 1
                    causes[_cause(t)] += 1
            per_rep[str(r.index)] = rate(n, e)
            n_all += n
            e_all += e
        out[v] = {**rate(n_all, e_all), "causes": dict(sorted(causes.items())),
                  "by_group": {k: rate(*g) for k, g in sorted(groups.items())}, "per_rep": per_rep}
    return out


def throughput_series(run: Run) -> dict:
    """Relay throughput over time, for the figure.

    Returns {relay: {variant: {rep: {"t_raw", "rate_raw" (each sample's bytes written /
    interval, B/s), "t", "rate" (trailing 30 s moving average at each sample whose window
    is complete), "t_max", "rate_max" (the metric: the largest moving average over windows
    starting after the warm-up; None if none), "warmup_s"}}}}, times in seconds since the
    workload start.
    """
    out: dict = defaultdict(lambda: defaultdict(dict))
    eps = 1e-6
    for r in run.reps:
        if not r.relay_bw or r.t0 is None:
            continue
        warm = max(THROUGHPUT_MIN_WARMUP_S, r.warmup_s)
        for relay, recs in _by_relay(r.relay_bw).items():
            pts = sorted((b["t"], float(b["written"]), b.get("interval_s")) for b in recs if _num(b.get("written")))
            if not pts:
                continue
            t = np.array([p[0] for p in pts])
            w = np.array([p[1] for p in pts])
            step = float(np.median(np.diff(t))) if t.size > 1 else 0.5
            iv = np.array([p[2] if _num(p[2]) and p[2] > 0 else step for p in pts])
            csum = np.concatenate([[0.0], np.cumsum(w)])
            first = np.searchsorted(t, t - THROUGHPUT_WINDOW_S + eps, side="left")
            rate = (csum[1:] - csum[first]) / THROUGHPUT_WINDOW_S
            rel = t - r.t0
            complete = t - THROUGHPUT_WINDOW_S >= t[0] - step - eps
            # Windows counted by the metric: complete and starting after the warm-up (the
            # moving average restarted after the warm-up, as stats.moving_average_max does).
            after = rel > warm
            ta, wa = t[after], w[after]
            t_max = rate_max = None
            if ta.size:
                cs = np.concatenate([[0.0], np.cumsum(wa)])
                fa = np.searchsorted(ta, ta - THROUGHPUT_WINDOW_S + eps, side="left")
                ra = (cs[1:] - cs[fa]) / THROUGHPUT_WINDOW_S
                ok = ta - THROUGHPUT_WINDOW_S >= r.t0 + warm - eps
                if ok.any():
                    i = int(np.argmax(np.where(ok, ra, -np.inf)))
                    t_max, rate_max = float(ta[i] - r.t0), float(ra[i])
            out[relay][r.variant][r.index] = {"t_raw": rel, "rate_raw": w / iv, "t": rel[complete],
                                              "rate": rate[complete], "t_max": t_max, "rate_max": rate_max,
                                              "warmup_s": warm}
    return {k: dict(v) for k, v in sorted(out.items())}


def cell_wait_series(run: Run, bin_s: float = 5.0) -> dict:
    """Circuit-queue wait per cell over time, for the figure: sum(time_ms) / sum(removed) of
    the circuits of a class at a relay, in bins of ``bin_s`` seconds.

    Returns {relay: {"<direction>/<class>": {variant: {rep: {"t": bin centre in seconds since
    the workload start, "wait_ms": ms per cell, "warmup_s": the scenario's warm-up}}}}}, for
    every direction and class ("all", "gh70-light", "gh70-heavy"; classes from the records
    after the warm-up, so warm-up bins have "all" only) with cells.
    """
    out: dict = {}
    for r in run.reps:
        if not r.cellstats or r.t0 is None:
            continue
        for relay, recs in _by_relay(r.cellstats).items():
            classes = gh70_classes(recs, r.t0 + r.warmup_s)
            acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
            for rec in recs:
                b = int(math.floor((rec["t"] - r.t0) / bin_s))
                cls = classes.get(circuit_key(rec), "")
                for d in DIRECTIONS:
                    time_ms, removed = _side_sums(rec.get(d))
                    for c in _classes_of(cls):
                        acc[f"{d}/{c}"][b][0] += time_ms
                        acc[f"{d}/{c}"][b][1] += removed
            for key, bins_acc in acc.items():
                bins = sorted(b for b, (_, n) in bins_acc.items() if n > 0)
                if not bins:
                    continue
                out.setdefault(relay, {}).setdefault(key, {}).setdefault(r.variant, {})[r.index] = {
                    "t": np.array([(b + 0.5) * bin_s for b in bins]),
                    "wait_ms": np.array([bins_acc[b][0] / bins_acc[b][1] for b in bins]),
                    "warmup_s": r.warmup_s}
    return dict(sorted(out.items()))
