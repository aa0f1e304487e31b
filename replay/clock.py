"""One clock for both ends of a replay: the replay client's offset to its replay server.

A per-cell delay is receive time - send time, read on two hosts when the replay client and
server run on different machines (Kubernetes). The client measures the server's clock with
NTP-style exchanges over UDP, directly to the server (not through Tor), before the
replay, every ``DURING_INTERVAL_S`` during it and after it; the analysis corrects every
cell's delay with the estimate and carries its uncertainty into the report.

One exchange (RFC 5905's on-wire timestamps, here as float UNIX seconds):

    t1 client sends  ->  t2 server receives,  t3 server replies  ->  t4 client receives

    offset = ((t2 - t1) + (t3 - t4)) / 2     server clock - client clock
    delay  = (t4 - t1) - (t3 - t2)           round trip, the server's hold time removed

With one-way path delays d_out (client -> server) and d_back, the measured offset is the
true one plus (d_out - d_back) / 2. The four timestamps only show the sum d_out + d_back,
never how it splits, so an asymmetric path biases the estimate by an amount no exchange can
observe; since both delays are >= 0 the bias is at most delay / 2. That half round trip is
therefore the offset's uncertainty bound, and the exchanges with the smallest round trip
(least queueing) give the tightest one.

Estimation (``estimate``): the exchanges come in bursts; from each burst the exchange with the
smallest delay is kept (min-delay filter, as NTP's clock filter), and bursts whose best
round trip is over ``OUTLIER_FACTOR`` times the median are dropped. A line fitted by least
squares through the kept offsets against client time gives the offset at any time and the
drift (its slope). Assuming the true offset is linear over the run (a constant frequency
error), the true line differs from the fitted one, at every kept exchange, by at most its
half round trip plus its residual; both lines being straight, between two kept exchanges
the difference is at most the larger of those two bounds (``bound_at``), and beyond the
first or last exchange it grows with the distance. A clock that was stepped or slewed during
the run leaves large residuals, which widen the bound.

The wire format: one UDP datagram each way, ``REQUEST`` = magic ``TBCK``, sequence number
(uint32), t1 (float64); ``REPLY`` = the same plus t2 and t3. The replay server answers on
the UDP port with the number of its TCP replay port.

Public API: ``Exchange`` (``offset``, ``delay``, ``t``), ``Estimate`` (``offset_at(t)``,
``bound_at(t)``, ``to_record()``), ``estimate(exchanges) -> Estimate | None``,
``Responder(bind, port, clock=time.time)`` (``start()``, ``close()``),
``Probe(address, port, timeout)`` (``exchange(seq) -> Exchange | None``),
``Recorder(writer, base, probe)`` (``burst(phase, n)``, ``run_during(stop, interval)``,
``finish()``), ``read_exchanges(records) -> {client: [Exchange]}``, ``MAX_DRIFT``.
"""

from __future__ import annotations

import math
import socket
import struct
import threading
import time
from dataclasses import dataclass

MAGIC = b"TBCK"
REQUEST = struct.Struct("!4sId")
REPLY = struct.Struct("!4sIddd")

# Exchanges per burst, and seconds between exchanges of a burst (so one delayed datagram
# does not delay the next one too).
BURST_BEFORE = 16
BURST_DURING = 4
BURST_AFTER = 16
BURST_SPACING_S = 0.02
DURING_INTERVAL_S = 10.0
EXCHANGE_TIMEOUT_S = 1.0

# A burst's best exchange is dropped (but the first and last) when its round trip exceeds
# this many times the median of the bursts' best.
OUTLIER_FACTOR = 2.0

# The largest frequency error a working computer clock has: ntpd's MAXFREQ, 500 ppm. Used
# only when a single burst leaves the drift unmeasured.
MAX_DRIFT = 500e-6


@dataclass(frozen=True)
class Exchange:
    t1: float   # client send (client clock)
    t2: float   # server receive (server clock)
    t3: float   # server send (server clock)
    t4: float   # client receive (client clock)
    burst: int = 0
    phase: str = ""

    @property
    def offset(self) -> float:
        """Server clock - client clock, as measured (true offset + (d_out - d_back) / 2)."""
        return ((self.t2 - self.t1) + (self.t3 - self.t4)) / 2

    @property
    def delay(self) -> float:
        """Round-trip path delay, the server's hold time excluded."""
        return (self.t4 - self.t1) - (self.t3 - self.t2)

    @property
    def t(self) -> float:
        """When, on the client's clock (the middle of the exchange)."""
        return (self.t1 + self.t4) / 2


@dataclass
class Estimate:
    """The client->server clock offset over a run. Times are client-clock UNIX seconds."""

    t_ref: float            # the first kept exchange's time
    offset_s: float         # server - client at t_ref
    drift: float | None     # d(offset)/dt (s/s); None when only one burst answered
    points: list[tuple[float, float, float]]   # kept exchanges: (t, offset, bound there)
    exchanges: int
    lost: int
    min_delay_s: float

    def offset_at(self, t):
        """The offset at client time ``t`` (a number or a numpy array)."""
        return self.offset_s + (self.drift or 0.0) * (t - self.t_ref)

    @property
    def uncertainty_s(self) -> float:
        """The bound over the measured span (first to last kept exchange)."""
        return max(b for _, _, b in self.points)

    @property
    def span(self) -> tuple[float, float]:
        return self.points[0][0], self.points[-1][0]

    def bound_at(self, t: float) -> float:
        """How far the true offset can be from ``offset_at(t)`` (see the module docstring)."""
        ts = [p[0] for p in self.points]
        bs = [p[2] for p in self.points]
        if self.drift is None:
            return bs[0] + MAX_DRIFT * abs(t - ts[0])
        first, last = ts[0], ts[-1]
        if t <= first or t >= last:
            # Extrapolation: the error line through the two ends, at most.
            span = last - first
            near, far, dist = (bs[0], bs[-1], first - t) if t <= first else (bs[-1], bs[0], t - last)
            return near + (near + far) * max(dist, 0.0) / span
        for i in range(1, len(ts)):
            if ts[i] >= t:
                return max(bs[i - 1], bs[i])
        return bs[-1]   # pragma: no cover - t < last was checked

    def bounds_at(self, t):
        """``bound_at`` for a numpy array of times."""
        import numpy as np
        t = np.asarray(t, dtype=float)
        return np.array([self.bound_at(x) for x in t]) if t.size < 64 else self._bounds_np(t)

    def _bounds_np(self, t):
        import numpy as np
        ts = np.array([p[0] for p in self.points])
        bs = np.array([p[2] for p in self.points])
        out = np.empty_like(t)
        if self.drift is None:
            return bs[0] + MAX_DRIFT * np.abs(t - ts[0])
        lo, hi = t <= ts[0], t >= ts[-1]
        span = ts[-1] - ts[0]
        out[lo] = bs[0] + (bs[0] + bs[-1]) * (ts[0] - t[lo]) / span
        out[hi] = bs[-1] + (bs[-1] + bs[0]) * (t[hi] - ts[-1]) / span
        mid = ~(lo | hi)
        i = np.searchsorted(ts, t[mid], side="left")
        out[mid] = np.maximum(bs[i - 1], bs[i])
        return out

    def to_record(self) -> dict:
        return {"t_ref": self.t_ref, "offset_s": self.offset_s, "drift": self.drift,
                "drift_ppm": None if self.drift is None else self.drift * 1e6,
                "uncertainty_s": self.uncertainty_s, "t_first": self.span[0], "t_last": self.span[1],
                "bursts": len(self.points), "exchanges": self.exchanges, "lost": self.lost,
                "min_delay_s": self.min_delay_s}


def estimate(exchanges: list[Exchange], lost: int = 0) -> Estimate | None:
    """Offset, drift and uncertainty from a run's exchanges (None when there are none).
    Exchanges whose delay is negative (a clock step within the exchange) are ignored."""
    good = [e for e in exchanges if e.delay >= 0 and all(math.isfinite(x) for x in (e.t1, e.t2, e.t3, e.t4))]
    if not good:
        return None
    best: dict[int, Exchange] = {}
    for e in good:
        if e.burst not in best or e.delay < best[e.burst].delay:
            best[e.burst] = e
    kept = sorted(best.values(), key=lambda e: e.t)
    if len(kept) > 2:
        # A burst whose every exchange queued says little and would widen the bound around
        # it; dropping it loses no validity (its neighbours' bounds cover the gap).
        limit = OUTLIER_FACTOR * sorted(e.delay for e in kept)[len(kept) // 2]
        kept = [kept[0]] + [e for e in kept[1:-1] if e.delay <= limit] + [kept[-1]]
    ts = [e.t for e in kept]
    ys = [e.offset for e in kept]
    t_ref = ts[0]
    if len(kept) < 2 or ts[-1] - ts[0] <= 0:
        e = min(kept, key=lambda e: e.delay)
        return Estimate(t_ref=e.t, offset_s=e.offset, drift=None, points=[(e.t, e.offset, e.delay / 2)],
                        exchanges=len(good), lost=lost + len(exchanges) - len(good),
                        min_delay_s=min(x.delay for x in good))
    n = len(kept)
    xs = [t - t_ref for t in ts]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    points = [(t, y, e.delay / 2 + abs(y - (intercept + slope * x)))
              for t, x, y, e in zip(ts, xs, ys, kept)]
    return Estimate(t_ref=t_ref, offset_s=intercept, drift=slope, points=points, exchanges=len(good),
                    lost=lost + len(exchanges) - len(good), min_delay_s=min(x.delay for x in good))


def read_exchanges(records) -> dict[str, tuple[list[Exchange], int]]:
    """clock.jsonl records -> {client: ([Exchange], lost count)} (other record types ignored)."""
    out: dict[str, tuple[list[Exchange], int]] = {}
    for r in records:
        if r.get("type") != "clock_exchange":
            continue
        ex, lost = out.get(str(r.get("client")), ([], 0))
        if r.get("status") == "ok":
            ex.append(Exchange(float(r["t1"]), float(r["t2"]), float(r["t3"]), float(r["t4"]),
                               int(r.get("burst", 0)), str(r.get("phase", ""))))
        else:
            lost += 1
        out[str(r.get("client"))] = (ex, lost)
    return out


class Responder:
    """The server side: answers every request datagram on ``(bind, port)`` with t2 and t3
    read from ``clock`` (time.time; tests pass a skewed clock) in a thread of its own."""

    def __init__(self, bind: str, port: int, clock=None):
        # Looked up at call time, so a process-wide clock change (the server's
        # --clock-skew test option) reaches the answers too.
        self.clock = clock or (lambda: time.time())
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind, port))
        self.sock.settimeout(0.5)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.answered = 0

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def start(self) -> "Responder":
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                data, peer = self.sock.recvfrom(64)
            except socket.timeout:
                continue
            except OSError:
                return
            t2 = self.clock()
            if len(data) != REQUEST.size:
                continue
            magic, seq, t1 = REQUEST.unpack(data)
            if magic != MAGIC:
                continue
            try:
                self.sock.sendto(REPLY.pack(MAGIC, seq, t1, t2, self.clock()), peer)
                self.answered += 1
            except OSError:
                pass

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(2.0)
        self.sock.close()


class Probe:
    """The client side: one exchange at a time with the server at ``(address, port)``."""

    def __init__(self, address: str, port: int, timeout: float = EXCHANGE_TIMEOUT_S):
        self.addr = (address, port)
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect(self.addr)

    def exchange(self, seq: int) -> Exchange | None:
        """One exchange; None when no matching reply came within the timeout. Replies to
        earlier (timed-out) requests are skipped by their sequence number and t1."""
        t1 = time.time()
        try:
            self.sock.send(REQUEST.pack(MAGIC, seq & 0xFFFFFFFF, t1))
        except OSError:
            return None
        deadline = t1 + self.timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(64)
            except (socket.timeout, OSError):
                return None
            t4 = time.time()
            if len(data) != REPLY.size:
                continue
            magic, rseq, rt1, t2, t3 = REPLY.unpack(data)
            if magic == MAGIC and rseq == seq & 0xFFFFFFFF and rt1 == t1:
                return Exchange(t1, t2, t3, t4)

    def close(self) -> None:
        self.sock.close()


class Recorder:
    """Runs a replay client's exchanges and writes them to clock.jsonl (``writer``: a
    torbed.records.RecordWriter) with ``base`` (variant, rep, client, group, server, ...)
    in every record; ``finish()`` adds the client's own estimate (``clock_estimate``)."""

    def __init__(self, writer, base: dict, probe: Probe):
        self.writer, self.base, self.probe = writer, base, probe
        self.seq = 0
        self.burst_no = 0
        self.exchanges: list[Exchange] = []
        self.lost = 0
        self.lock = threading.Lock()

    def burst(self, phase: str, n: int, spacing: float = BURST_SPACING_S) -> int:
        """``n`` exchanges; returns how many were answered."""
        with self.lock:
            b = self.burst_no
            self.burst_no += 1
            got = missed = 0
            for i in range(n):
                if missed >= 3 and not got:
                    break   # the server does not answer: don't spend n timeouts finding out
                if i:
                    time.sleep(spacing)
                self.seq += 1
                e = self.probe.exchange(self.seq)
                rec = {**self.base, "type": "clock_exchange", "phase": phase, "burst": b, "seq": self.seq}
                if e is None:
                    self.lost += 1
                    missed += 1
                    self.writer.write({**rec, "status": "lost", "t1": None, "t2": None, "t3": None, "t4": None,
                                       "offset_s": None, "delay_s": None})
                    continue
                e = Exchange(e.t1, e.t2, e.t3, e.t4, b, phase)
                self.exchanges.append(e)
                got += 1
                self.writer.write({**rec, "status": "ok", "t1": e.t1, "t2": e.t2, "t3": e.t3, "t4": e.t4,
                                   "offset_s": e.offset, "delay_s": e.delay})
            return got

    def run_during(self, stop: threading.Event, interval: float = DURING_INTERVAL_S) -> threading.Thread:
        """A thread making a DURING burst every ``interval`` seconds until ``stop``."""
        def loop() -> None:
            while not stop.wait(interval):
                self.burst("during", BURST_DURING)
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        return t

    def finish(self) -> Estimate | None:
        est = estimate(self.exchanges, self.lost)
        rec = {**self.base, "type": "clock_estimate", "t": time.time()}
        if est is None:
            self.writer.write({**rec, "status": "no_exchange", "exchanges": 0, "lost": self.lost})
        else:
            self.writer.write({**rec, "status": "ok", **est.to_record()})
        return est
