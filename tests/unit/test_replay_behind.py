"""A replay flow that its circuit carries more slowly than the trace offers it is censored at
its own deadline, not failed; one that stops receiving is a stall (replay/client.py
``shortfall``).

Gopal & Heninger exp. 2's vanilla arm was rejected by the completion gate because 11% of the
web client's flows ran more than their ``timeout`` past their recorded length: round robin
gave the web circuit less than the trace's load, so its flows fell behind, still moving. That
lateness is the design's outcome; counting it as a failure threw the arm away. Here a SOCKS
front throttles the downstream to a trickle (behind schedule) or holds it (stall), in front of
a real replay server.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from torbed.records import RecordWriter, read_records
from torbed.replay import client, wire
from torbed.replay.trace import DOWN, UP, Flow, Packet

from .test_replay_open_retry import RefusingSocks, _driver, serve_trace


class SlowSocks(RefusingSocks):
    """Relays the stream with the server-to-client direction at ``rate`` bytes/s (0: nothing
    after the first ``hold_after`` bytes, until closed)."""

    def __init__(self, rate: float, hold_after: int = 0):
        super().__init__(refuse=0)
        self.rate, self.hold_after = rate, hold_after
        self.closed = threading.Event()

    def _upstream(self, host: str, port: int):
        return _Throttled(super()._upstream(host, port), self)

    def close(self) -> None:
        self.closed.set()
        super().close()


class _Throttled:
    """A socket whose recv() hands data on at the front's rate (or holds it)."""

    def __init__(self, sock: socket.socket, front: SlowSocks):
        self.sock, self.front, self.passed = sock, front, 0

    def recv(self, n: int) -> bytes:
        f = self.front
        if f.rate == 0 and self.passed >= f.hold_after:
            f.closed.wait(30)
            return b""
        step = 512 if f.rate else max(1, f.hold_after - self.passed)
        data = self.sock.recv(min(n, step))
        if f.rate:
            time.sleep(len(data) / f.rate)
        self.passed += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self.sock, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()


@pytest.fixture
def bulky(tmp_path):
    # 40 kB due 0.1 s in, a flow 0.2 s long: at 8 kB/s it needs ~5 s.
    trace, srv = serve_trace(tmp_path, Flow("f", [Packet(0.0, UP, 100), Packet(0.1, DOWN, 40_000),
                                                  Packet(0.2, UP, 50)], "s", "f"))
    yield trace, srv.tcp.server_address[1], tmp_path
    srv.shutdown()


def _replay(tmp_path, trace, port, socks, slack_s: float) -> dict:
    driver = _driver(tmp_path, port, socks.port, run_s=30)
    driver.cfg["workload"]["slack_s"] = slack_s
    cells = RecordWriter(tmp_path / "cells.jsonl")
    try:
        return client.replay_flow(driver, trace.flows[0], 0, threading.Event(), cells)
    finally:
        cells.close()
        driver.writer.close()
        socks.close()


def test_a_flow_behind_its_schedule_but_moving_is_censored(bulky):
    trace, port, tmp_path = bulky
    rec = _replay(tmp_path, trace, port, SlowSocks(rate=8_000), slack_s=1.5)
    assert rec["status"] == "cancelled" and rec["error"]["cause"] == "behind_schedule", rec
    expected = len(wire.chunk_sizes(40_000))
    assert 0 < rec["chunks_down"] < expected
    assert rec["t_censor"] >= rec["t_start"] + 1.5
    [written] = list(read_records(tmp_path / "transfers.jsonl"))
    assert written["status"] == "cancelled" and written["t_censor"] == rec["t_censor"]


def test_a_flow_that_stops_receiving_is_a_stall(bulky, monkeypatch):
    monkeypatch.setattr(client, "BEHIND_PROGRESS_S", 1.0)
    trace, port, tmp_path = bulky
    rec = _replay(tmp_path, trace, port, SlowSocks(rate=0, hold_after=3000), slack_s=2.5)
    assert rec["status"] == "error" and rec["error"]["cause"] == "stall", rec
    assert "t_censor" not in rec


def _flow() -> Flow:
    # Chunks of the 1st packet are due 1 s after the epoch, of the 2nd 50 s after.
    return Flow("f", [Packet(10.0, UP, 10), Packet(11.0, DOWN, 2 * wire.CHUNK), Packet(60.0, DOWN, wire.CHUNK)],
                "s", "f")


@pytest.mark.parametrize("n,last,now,cause", [
    (2, 5.0, 70.0, "behind_schedule"),    # the missing chunk was due at 50, 20 s before the cut
    (2, 5.0, 90.0, "stall"),              # due at 50, nothing for 40 s
    (1, 20.0, 45.0, "behind_schedule"),   # the last chunk 25 s ago
    (1, 2.0, 45.0, "stall"),              # due at 1, the last 43 s ago
    (0, None, 20.0, "behind_schedule"),   # nothing yet, due at 1, 19 s ago
    (0, None, 40.0, "stall"),
])
def test_shortfall_counts_silence_from_the_later_of_the_last_chunk_and_the_due_time(n, last, now, cause):
    epoch = 1000.0
    got, detail = client.shortfall(_flow(), n, 3, epoch, None if last is None else epoch + last, epoch + now)
    assert got == cause, detail
    assert f"received {n} of 3" in detail
