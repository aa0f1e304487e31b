"""The replay server: the far end of replayed flows, next to the exit (as in Torchestra's
evaluation, section 5.3: one thread per flow sends the recorded cells).

``python -m torbed.replay.server --bind ADDR --port P --trace NAME=PATH ... --cells OUT``

Each connection starts with a hello line (replay/wire.py) naming the trace and flow. The
server then sends the flow's downstream packets at their recorded times, relative to the
hello's arrival, as tagged chunks, and receives the upstream chunks the client sends,
recording each upstream chunk's one-way delay in OUT (cells.jsonl, ``direction: "u"``). It
closes the stream when both directions are done, or at the flow's deadline.

It also answers the replay clients' clock exchanges (replay/clock.py) on the UDP port with
the same number, so their delays can be corrected for this host's clock offset.
``--clock-skew S`` / ``--clock-drift-ppm P`` (tests only; env TORBED_TEST_CLOCK_SKEW /
TORBED_TEST_CLOCK_DRIFT_PPM) make the whole process read a clock
S seconds ahead, drifting P ppm: a second host's clock, on one machine.

Public API: ``ReplayServer(traces, bind, port, cells_path, log)``: ``.serve_forever()``,
``.shutdown()``; ``main(argv)``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import socketserver
import sys
import threading
import time
from pathlib import Path

from ..records import RecordWriter
from . import clock, engine, wire
from .trace import DOWN, UP, read

HELLO_TIMEOUT = 30.0
FLOW_SLACK = 60.0      # seconds a flow may run past its recorded duration


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        srv: ReplayServer = self.server.owner   # type: ignore[attr-defined]
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            hello = _read_line(sock, time.time() + HELLO_TIMEOUT)
            epoch = time.time()
            h = json.loads(hello)
            trace = srv.traces[h["trace"]]
            flow = trace.flow(h["flow"])
        except (OSError, ValueError, KeyError) as e:
            srv.log(f"{self.client_address}: bad hello: {type(e).__name__} {e}")
            return
        down = [p for p in flow.packets if p.direction == DOWN]
        up = [p for p in flow.packets if p.direction == UP]
        expected_up = sum(len(wire.chunk_sizes(p.size)) for p in up)
        deadline = epoch + (flow.end - flow.start) + h.get("slack_s", FLOW_SLACK)
        stop = threading.Event()
        base = {"variant": h.get("variant"), "rep": h.get("rep"), "client": h.get("client"),
                "group": h.get("group"), "trace": h["trace"], "flow": flow.id, "iteration": h.get("iteration", 0),
                "circuit": h.get("circuit"), "direction": UP}
        rec = engine.CellRecorder(srv.writer, base, float(h.get("t_measure", 0.0)))
        result = {}

        def upstream() -> None:
            result["up"] = engine.receive_chunks(sock, rec, deadline, expected_up, stop, stop_at_expected=True)

        t = threading.Thread(target=upstream, daemon=True)
        t.start()
        try:
            sent = engine.send_packets(sock, down, epoch, flow.start, stop, deadline=deadline)
        except OSError as e:
            srv.log(f"{h.get('client')} {flow.id}#{h.get('iteration')}: downstream broke: {e}")
            sent = None
        while t.is_alive() and time.time() < deadline and not srv.stopping.is_set():
            t.join(0.5)
        stop.set()
        t.join(2.0)
        got = result.get("up", (rec.count,))[0]
        srv.log(f"{h.get('client')} {flow.id}#{h.get('iteration')}: sent {sent} (chunks, bytes) down, "
                f"received {got}/{expected_up} chunks up")


def _read_line(sock: socket.socket, deadline: float) -> bytes:
    """One line, read byte by byte (chunks follow it on the same stream)."""
    buf = bytearray()
    sock.settimeout(1.0)
    while time.time() < deadline:
        try:
            b = sock.recv(1)
        except socket.timeout:
            continue
        if not b:
            raise ValueError("connection closed before the hello")
        if b == b"\n":
            return bytes(buf)
        buf += b
        if len(buf) > 65536:
            raise ValueError("hello line too long")
    raise ValueError("no hello before the timeout")


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class ReplayServer:
    def __init__(self, traces: dict[str, Path], bind: str, port: int, cells_path: Path, log=None):
        self.traces = {name: read(p) for name, p in traces.items()}
        self.writer = RecordWriter(cells_path)
        self.log_file = log
        self.stopping = threading.Event()
        self.tcp = _TCPServer((bind, port), _Handler)
        self.tcp.owner = self   # type: ignore[attr-defined]
        self.lock = threading.Lock()
        self.clock = clock.Responder(bind, port).start()

    def log(self, msg: str) -> None:
        if self.log_file:
            with self.lock:
                self.log_file.write(f"{time.time():.3f} {msg}\n")
                self.log_file.flush()

    def serve_forever(self) -> None:
        self.tcp.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        self.stopping.set()
        self.tcp.shutdown()
        self.tcp.server_close()
        self.clock.close()


def skew_clock(skew: float, drift_ppm: float) -> None:
    """Make every time.time() of this process read skew + drift * elapsed ahead (tests only:
    engine, wire stamps and the clock responder all read time.time at call time)."""
    real = time.time
    t0 = real()
    time.time = lambda: (lambda t: t + skew + drift_ppm * 1e-6 * (t - t0))(real())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="torbed replay server (runs inside a server node)")
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--trace", action="append", default=[], metavar="NAME=PATH", help="a trace it can replay")
    ap.add_argument("--cells", type=Path, required=True, help="cells.jsonl for upstream records")
    ap.add_argument("--log", type=Path, default=None)
    # Defaults from the environment so a test can skew the server of a whole `torbed run`.
    ap.add_argument("--clock-skew", type=float, default=float(os.environ.get("TORBED_TEST_CLOCK_SKEW") or 0),
                    help="tests only: read a clock this many seconds ahead (env TORBED_TEST_CLOCK_SKEW)")
    ap.add_argument("--clock-drift-ppm", type=float, default=float(os.environ.get("TORBED_TEST_CLOCK_DRIFT_PPM") or 0),
                    help="tests only: ... drifting this many ppm (env TORBED_TEST_CLOCK_DRIFT_PPM)")
    args = ap.parse_args(argv)
    if args.clock_skew or args.clock_drift_ppm:
        skew_clock(args.clock_skew, args.clock_drift_ppm)
    traces = {}
    for item in args.trace:
        name, _, path = item.partition("=")
        traces[name] = Path(path)
    log = open(args.log, "a") if args.log else sys.stderr
    srv = ReplayServer(traces, args.bind, args.port, args.cells, log)
    srv.log(f"serving {', '.join(traces)} on {args.bind}:{args.port}")
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown, daemon=True).start())
    srv.serve_forever()
    srv.writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
