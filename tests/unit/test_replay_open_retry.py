"""A replay flow whose stream cannot be opened is opened again (replay/client.py).

On Kubernetes a CI run saw an exit refuse the first stream of the SSH client's only flow
(END MISC: the replay server was not reachable from the exit yet), and that flow, the whole
SSH session, was lost. Here a SOCKS5 front refuses the first CONNECTs the way tor's SOCKS
port does when the exit ends the stream (reply 0x01, general failure), then relays to a real
replay server: the flow must complete, carry every chunk, and keep the refusals in its record.
A front that refuses for longer than the retry window must end the flow as a typed error.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from torbed.client.driver import Driver
from torbed.records import RecordWriter, read_records
from torbed.replay import client, wire
from torbed.replay.server import ReplayServer
from torbed.replay.trace import DOWN, UP, Flow, Packet, Trace, write


class RefusingSocks:
    """SOCKS5 (no auth or username/password) on loopback: the first ``refuse`` CONNECTs are
    answered with a failure, later ones are relayed to the requested address."""

    def __init__(self, refuse: int):
        self.refuse = refuse
        self.connects = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            t.start()
            self.threads.append(t)

    @staticmethod
    def _recv(c: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            b = c.recv(n - len(buf))
            if not b:
                raise OSError("closed")
            buf += b
        return buf

    def _serve(self, c: socket.socket) -> None:
        with c:
            ver, nmethods = self._recv(c, 2)
            methods = self._recv(c, nmethods)
            if 2 in methods:
                c.sendall(b"\x05\x02")
                _, ulen = self._recv(c, 2)
                self._recv(c, ulen)
                (plen,) = self._recv(c, 1)
                self._recv(c, plen)
                c.sendall(b"\x01\x00")
            else:
                c.sendall(b"\x05\x00")
            _, cmd, _, atyp = self._recv(c, 4)
            if atyp == 1:
                host = socket.inet_ntoa(self._recv(c, 4))
            else:
                (hlen,) = self._recv(c, 1)
                host = self._recv(c, hlen).decode()
            (port,) = struct.unpack("!H", self._recv(c, 2))
            self.connects += 1
            if self.connects <= self.refuse:
                c.sendall(b"\x05\x01\x00\x01" + b"\x00" * 6)
                return
            up = self._upstream(host, port)
            c.sendall(b"\x05\x00\x00\x01" + b"\x00" * 6)
            with up:
                def pump(a: socket.socket, b: socket.socket) -> None:
                    try:
                        while data := a.recv(65536):
                            b.sendall(data)
                    except OSError:
                        pass
                    try:
                        b.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                t = threading.Thread(target=pump, args=(up, c), daemon=True)
                t.start()
                pump(c, up)
                t.join(10)

    def _upstream(self, host: str, port: int):
        return socket.create_connection((host, port))

    def close(self) -> None:
        self.sock.close()


def serve_trace(tmp_path, flow: Flow) -> tuple[Trace, ReplayServer]:
    """A real replay server on loopback serving a one-flow trace (t.jsonl in ``tmp_path``)."""
    trace = Trace([flow], {"source": "test", "tool": "hand", "licence": "CC0", "origin": "tests"})
    write(trace, tmp_path / "t.jsonl")
    srv = ReplayServer({"t": tmp_path / "t.jsonl"}, "127.0.0.1", 0, tmp_path / "server-cells.jsonl")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return trace, srv


@pytest.fixture
def replay_server(tmp_path):
    trace, srv = serve_trace(tmp_path, Flow("ssh", [Packet(0.0, UP, 120), Packet(0.1, DOWN, 3000),
                                                    Packet(0.3, UP, 80), Packet(0.4, DOWN, 700)], "s", "ssh"))
    yield trace, srv.tcp.server_address[1], tmp_path
    srv.shutdown()


def _driver(tmp_path, trace_port: int, socks_port: int, run_s: float) -> Driver:
    now = time.time()
    cfg = {"seed": 1, "client": "c1", "group": "ssh", "variant": "vanilla", "rep": 0,
           "output": str(tmp_path / "transfers.jsonl"), "socks_port": socks_port,
           "t_measure": now, "t_workload": now, "t_end": now + run_s,
           "workload": {"trace": str(tmp_path / "t.jsonl"), "trace_name": "t", "flows": ["ssh"],
                        "loop": False, "period_s": 10.0, "slack_s": 10.0, "server": "srv",
                        "address": "127.0.0.1", "port": trace_port}}
    return Driver(cfg)


def test_a_refused_open_is_retried_and_the_flow_completes(replay_server):
    trace, port, tmp_path = replay_server
    socks = RefusingSocks(refuse=2)
    try:
        driver = _driver(tmp_path, port, socks.port, run_s=30)
        cells = RecordWriter(tmp_path / "cells.jsonl")
        rec = client.replay_flow(driver, trace.flows[0], 0, threading.Event(), cells)
        cells.close()
        driver.writer.close()
    finally:
        socks.close()
    assert socks.connects == 3
    assert rec["status"] == "ok", rec["error"]
    assert [e["cause"] for e in rec["open_errors"]] == ["socks_error", "socks_error"]
    expected = sum(len(wire.chunk_sizes(p.size)) for p in trace.flows[0].packets if p.direction == DOWN)
    assert rec["chunks_down"] == expected and rec["bytes"] == trace.flows[0].bytes(DOWN)
    # The wait is in the stream's own times: the flow opened after the two refusals' backoff.
    assert rec["t_socks"] - rec["t_start"] >= client.OPEN_BACKOFF_S * 3 - 0.05
    assert len(list(read_records(tmp_path / "cells.jsonl"))) == expected
    [written] = list(read_records(tmp_path / "transfers.jsonl"))
    assert written["open_errors"] == rec["open_errors"]


def test_refusals_past_the_retry_window_end_the_flow_as_an_error(replay_server):
    trace, port, tmp_path = replay_server
    socks = RefusingSocks(refuse=1000)
    try:
        driver = _driver(tmp_path, port, socks.port, run_s=30)
        driver.cfg["workload"]["open_retry_s"] = 2.0
        cells = RecordWriter(tmp_path / "cells.jsonl")
        t0 = time.time()
        rec = client.replay_flow(driver, trace.flows[0], 0, threading.Event(), cells)
        cells.close()
        driver.writer.close()
    finally:
        socks.close()
    assert rec["status"] == "error" and rec["error"]["cause"] == "socks_error"
    assert rec["t_socks"] is None and rec["chunks_down"] == 0
    assert 1 <= len(rec["open_errors"]) < socks.connects
    assert time.time() - t0 < 2.0 + client.OPEN_BACKOFF_MAX_S


def test_a_flow_still_running_at_the_window_end_is_censored(tmp_path, monkeypatch):
    # A flow whose last downstream packet is due 4 s in, in a window that ends 0.5 s in (the
    # grace shortened to 0.5 s): cut about 1 s in, recorded as censored (cancelled,
    # run_ended, t_censor), with what had arrived; the analysis then keeps its time as
    # "longer than t_censor - t_request" like a cut-off bulk transfer.
    monkeypatch.setattr(client, "WINDOW_GRACE_S", 0.5)
    trace, srv = serve_trace(tmp_path, Flow("long", [Packet(0.0, UP, 100), Packet(0.1, DOWN, 2000),
                                                     Packet(4.0, DOWN, 2000)], "s", "long"))
    socks = RefusingSocks(refuse=0)
    try:
        driver = _driver(tmp_path, srv.tcp.server_address[1], socks.port, run_s=0.5)
        driver.cfg["workload"]["flows"] = ["long"]
        cells = RecordWriter(tmp_path / "cells.jsonl")
        rec = client.replay_flow(driver, trace.flows[0], 0, threading.Event(), cells)
        cells.close()
        driver.writer.close()
    finally:
        socks.close()
        srv.shutdown()
    assert rec["status"] == "cancelled" and rec["error"]["cause"] == "run_ended", rec
    first = len(wire.chunk_sizes(2000))
    assert rec["chunks_down"] == first and 0 < rec["bytes"] < rec["size"]
    assert driver.cfg["t_end"] <= rec["t_censor"] <= driver.cfg["t_end"] + 0.5 + 1.0
    assert rec["ttlb_s"] is None and rec["ttfb_s"] is not None
    [written] = list(read_records(tmp_path / "transfers.jsonl"))
    assert written["t_censor"] == rec["t_censor"]
