"""The clock-offset estimator (replay/clock.py) against synthetic exchanges whose true offset,
drift and path delays are known, and one real exchange over UDP on loopback."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest

from torbed.records import RecordWriter
from torbed.replay import clock
from torbed.replay.clock import Exchange, estimate


def world(offset: float, drift: float, d_out, d_back, hold=lambda: 50e-6):
    """A server clock reading real + offset + drift * real, a client clock reading real time:
    returns exchange(real_t1, burst) -> Exchange, and truth(client time) -> true offset."""
    def server(r: float) -> float:
        return r + offset + drift * r

    def exchange(r1: float, burst: int) -> Exchange:
        r2 = r1 + d_out()
        r3 = r2 + hold()
        r4 = r3 + d_back()
        return Exchange(r1, server(r2), server(r3), r4, burst)

    return exchange, lambda t: offset + drift * t


def schedule(exchange, rng, span=600.0, every=10.0, n_ends=16, n_during=4):
    """Bursts as the replay client makes them: before, every ``every`` s, after."""
    out, b = [], 0
    times = [0.0] + list(np.arange(every, span, every)) + [span]
    for i, t0 in enumerate(times):
        n = n_ends if i in (0, len(times) - 1) else n_during
        for k in range(n):
            out.append(exchange(t0 + k * 0.02 + rng.random() * 1e-3, b))
        b += 1
    return out


def cell_times(rng, span=600.0, n=2000):
    return sorted(rng.uniform(0.0, span) for _ in range(n))


def queued(rng, base: float, mean_queue: float):
    """A path delay: a fixed part plus exponential queueing (most exchanges wait a little)."""
    return lambda: base + rng.expovariate(1 / mean_queue)


@pytest.mark.parametrize("seed", range(8))
def test_symmetric_paths_recover_offset_and_drift(seed):
    rng = random.Random(seed)
    offset, drift = rng.uniform(-2, 2), rng.uniform(-100e-6, 100e-6)
    ex, truth = world(offset, drift, queued(rng, 300e-6, 2e-3), queued(rng, 300e-6, 2e-3))
    est = estimate(schedule(ex, rng))
    for t in cell_times(rng):
        err = abs(est.offset_at(t) - truth(t))
        assert err <= est.bound_at(t)
        assert err < 1e-3          # symmetric: the min-delay exchanges are nearly exact
    assert est.drift == pytest.approx(drift, abs=2e-6)
    # Kept bursts have at most twice the median best round trip (~2 ms with 4 exchanges
    # queueing 2 ms on average each way), so the bound stays a few ms, not the worst burst's.
    assert est.uncertainty_s < 5e-3


@pytest.mark.parametrize("seed", range(8))
def test_asymmetric_paths_bias_the_estimate_within_the_bound(seed):
    """d_out 6 ms, d_back 1 ms (+ queueing): the estimate is off by about (6 - 1) / 2 ms, a
    bias the timestamps cannot reveal, and the reported bound still holds the truth."""
    rng = random.Random(100 + seed)
    offset, drift = rng.uniform(-2, 2), rng.uniform(-50e-6, 50e-6)
    ex, truth = world(offset, drift, queued(rng, 6e-3, 1e-3), queued(rng, 1e-3, 1e-3))
    est = estimate(schedule(ex, rng))
    errors = []
    for t in cell_times(rng):
        err = est.offset_at(t) - truth(t)
        assert abs(err) <= est.bound_at(t)
        errors.append(err)
    assert np.mean(errors) == pytest.approx(2.5e-3, abs=0.5e-3)
    assert est.uncertainty_s >= 2.5e-3


def test_asymmetry_is_unobservable():
    """Offset 0 with 8 ms out / 2 ms back gives exactly the timestamps of offset 3 ms with
    5 ms each way: no estimator can tell these apart, hence the half-round-trip bound."""
    a, _ = world(0.0, 0.0, lambda: 8e-3, lambda: 2e-3, hold=lambda: 0.0)
    b, _ = world(3e-3, 0.0, lambda: 5e-3, lambda: 5e-3, hold=lambda: 0.0)
    for r in (0.0, 1.0, 17.5):
        ea, eb = a(r, 0), b(r - 0.0, 0)
        assert (ea.t1, ea.t2, ea.t3, ea.t4) == pytest.approx((eb.t1, eb.t2, eb.t3, eb.t4), abs=1e-12)
        assert ea.offset == pytest.approx(3e-3) and ea.delay == pytest.approx(10e-3)


def test_min_delay_filter_picks_the_unqueued_exchange():
    """Each burst: one exchange straight through, the rest queued on the way out (which biases
    their offsets by half the queueing); the estimate follows the fast one."""
    rng = random.Random(7)
    exchanges = []
    for b, t0 in enumerate((0.0, 300.0, 600.0)):
        for k in range(16):
            out = 0.2e-3 if k == 11 else 0.2e-3 + rng.uniform(20e-3, 40e-3)
            exchanges.append(Exchange(t0 + k, t0 + k + out + 0.5, t0 + k + out + 0.5, t0 + k + out + 0.2e-3, b))
    est = estimate(exchanges)
    assert est.offset_s == pytest.approx(0.5, abs=1e-6)
    assert est.drift == pytest.approx(0.0, abs=1e-9)
    assert est.uncertainty_s == pytest.approx(0.2e-3, abs=1e-6)
    assert est.min_delay_s == pytest.approx(0.4e-3, abs=1e-6)


def test_a_clock_step_widens_the_bound():
    """A server clock stepped by 20 ms mid-run is not linear: the residuals show it, and the
    bound grows to cover the truth on both sides of the step."""
    rng = random.Random(3)
    sym = queued(rng, 200e-6, 1e-3)
    before, _ = world(0.1, 0.0, sym, sym)
    after, _ = world(0.12, 0.0, sym, sym)
    ex = schedule(lambda r, b: before(r, b) if r < 300 else after(r, b), rng)
    est = estimate(ex)
    assert est.uncertainty_s > 5e-3
    for t in cell_times(rng):
        assert abs(est.offset_at(t) - (0.1 if t < 300 else 0.12)) <= est.bound_at(t) + 1e-3


def test_single_burst_assumes_the_worst_drift():
    ex, truth = world(0.05, 80e-6, lambda: 1e-3, lambda: 1e-3)
    est = estimate([ex(10.0 + 0.02 * k, 0) for k in range(8)])
    assert est.drift is None
    assert est.bound_at(10.0) == pytest.approx(1e-3, abs=1e-6)
    assert est.bound_at(110.0) == pytest.approx(1e-3 + clock.MAX_DRIFT * 100, rel=1e-3)
    assert abs(est.offset_at(110.0) - truth(110.0)) <= est.bound_at(110.0)


def test_extrapolated_bound_holds_the_truth():
    rng = random.Random(11)
    ex, truth = world(-0.3, 40e-6, queued(rng, 1e-3, 1e-3), queued(rng, 3e-3, 1e-3))
    est = estimate(schedule(ex, rng, span=100.0))
    for t in (-30.0, -1.0, 100.5, 130.0):
        assert abs(est.offset_at(t) - truth(t)) <= est.bound_at(t)
    assert est.bound_at(130.0) > est.bound_at(100.0)


def test_bounds_at_matches_bound_at():
    rng = random.Random(5)
    ex, _ = world(0.0, 10e-6, queued(rng, 1e-3, 3e-3), queued(rng, 1e-3, 3e-3))
    est = estimate(schedule(ex, rng))
    ts = np.array([-5.0, 0.0, 3.3, 10.0, 299.9, 599.0, 600.0, 610.0] + cell_times(rng, n=100))
    assert np.allclose(est.bounds_at(ts), [est.bound_at(t) for t in ts])


def test_nothing_usable_gives_none():
    assert estimate([]) is None
    # A negative round trip (the clock stepped inside the exchange) is not evidence.
    assert estimate([Exchange(10.0, 10.5, 10.5, 9.0)]) is None


def test_real_exchange_on_loopback_finds_a_skewed_server():
    """A responder whose clock reads 250 ms ahead, on this machine: the estimate finds +250 ms
    within its bound, and the bound is small (loopback)."""
    resp = clock.Responder("127.0.0.1", 0, clock=lambda: time.time() + 0.25).start()
    probe = clock.Probe("127.0.0.1", resp.port)
    try:
        exchanges = []
        for b in range(3):
            for k in range(8):
                e = probe.exchange(b * 8 + k)
                assert e is not None
                exchanges.append(Exchange(e.t1, e.t2, e.t3, e.t4, b))
            time.sleep(0.2)
    finally:
        probe.close()
        resp.close()
    est = estimate(exchanges)
    assert abs(est.offset_at(est.t_ref) - 0.25) <= est.bound_at(est.t_ref)
    assert est.uncertainty_s < 5e-3


def test_probe_gives_up_without_a_server():
    resp = clock.Responder("127.0.0.1", 0)
    port = resp.port
    resp.sock.close()   # bound once, now nobody answers there
    probe = clock.Probe("127.0.0.1", port, timeout=0.2)
    try:
        assert probe.exchange(1) is None
    finally:
        probe.close()


def test_recorder_writes_exchanges_and_its_estimate(tmp_path):
    resp = clock.Responder("127.0.0.1", 0).start()
    path = tmp_path / "clock.jsonl"
    rec = clock.Recorder(RecordWriter(path), {"client": "web0", "server": "replay0"},
                         clock.Probe("127.0.0.1", resp.port))
    try:
        assert rec.burst("before", 5) == 5
        assert rec.burst("after", 5) == 5
        est = rec.finish()
    finally:
        rec.writer.close()
        rec.probe.close()
        resp.close()
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["type"] for r in records] == ["clock_exchange"] * 10 + ["clock_estimate"]
    assert {r["phase"] for r in records[:10]} == {"before", "after"}
    assert all(r["delay_s"] >= 0 and r["client"] == "web0" for r in records[:10])
    got = clock.read_exchanges(records)
    assert list(got) == ["web0"] and len(got["web0"][0]) == 10 and got["web0"][1] == 0
    again = estimate(got["web0"][0])
    assert records[-1]["offset_s"] == pytest.approx(again.offset_s)
    assert records[-1]["bursts"] == 2 and est.drift is not None
    # Same machine, same clock: the offset is zero within the bound.
    assert abs(records[-1]["offset_s"]) <= records[-1]["uncertainty_s"]
