"""Both ends of a replayed flow: sending a direction's packets at their recorded times and
receiving the other direction's chunks, timestamping each (shared by server and client).

Receivers keep per-chunk tuples in memory and write the cells.jsonl records (docs/records.md)
when the flow ends, so JSON encoding never sits between a chunk's arrival and the read
that timestamps it (other flows' threads finishing can still take the GIL for a few ms).

Public API: ``send_packets(sock, packets, epoch, t0, stop, start_seq=0, deadline=None) -> (chunks, bytes)``,
``receive_chunks(sock, recorder, deadline, expected, stop, stop_at_expected=False) -> (chunks, t_first, t_last, eof)``,
``CellRecorder(writer, base, t_measure)``.
"""

from __future__ import annotations

import socket
import threading
import time

from . import wire
from .trace import Packet

# Records are written when the flow's replay ends; only a flow longer than this many chunks
# is written (and JSON-encoded, ~20 ms per 1000) mid-flow, which delays the next reads.
BATCH = 50_000


class CellRecorder:
    """Turns received chunk headers into cells.jsonl records: ``add`` is cheap (a tuple),
    ``flush`` encodes and writes."""

    def __init__(self, writer, base: dict, t_measure: float):
        self.writer = writer
        self.base = base
        self.t_measure = t_measure
        self.rows: list[tuple] = []
        self.count = 0

    def add(self, t_recv: float, chunks: list[tuple[int, int, float, float]]) -> None:
        for length, seq, t_sched, t_sent in chunks:
            self.rows.append((length, seq, t_sched, t_sent, t_recv))
        self.count += len(chunks)
        if len(self.rows) >= BATCH:
            self.flush()

    def flush(self) -> None:
        rows, self.rows = self.rows, []
        for length, seq, t_sched, t_sent, t_recv in rows:
            self.writer.write({**self.base, "type": "cell", "seq": seq, "bytes": length,
                               "t_sched": t_sched, "t_sent": t_sent, "t_recv": t_recv,
                               "delay_s": t_recv - t_sent, "sched_error_s": t_sent - t_sched,
                               "warmup": t_sched < self.t_measure})


def _sleep_until(t: float, stop: threading.Event) -> None:
    while True:
        left = t - time.time()
        if left <= 0 or stop.is_set():
            return
        # Event.wait for long pauses (so stop is seen), plain sleep for the last stretch:
        # Event.wait's timed condition wait overshoots more than nanosleep.
        if left > 0.05:
            stop.wait(left - 0.02)
        else:
            time.sleep(left)


def _send(sock: socket.socket, data: bytes, stop: threading.Event, deadline: float | None) -> bool:
    """All of ``data``, for as long as the peer's window stays shut. The other direction's
    receiver sets a timeout on the shared socket, and a socket's timeout applies to sends too:
    there it only means "no room yet" (a congested circuit: tor reads no more from a stream
    whose window is spent), not a broken stream, so this waits on until ``deadline`` (TimeoutError,
    an OSError) or ``stop`` (returns False). ``sendall`` would give up after the timeout, with
    an unknown part of the data sent. Raises OSError when the stream breaks."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except socket.timeout:          # nothing was sent by this call
            if stop.is_set():
                return False
            if deadline is not None and time.time() >= deadline:
                raise TimeoutError(f"the flow's deadline passed with {len(view)} of a chunk's "
                                   f"{len(data)} bytes unsent (the peer's window stayed shut)") from None
    return True


def send_packets(sock: socket.socket, packets: list[Packet], epoch: float, t0: float,
                 stop: threading.Event, start_seq: int = 0, deadline: float | None = None) -> tuple[int, int]:
    """Send ``packets`` (one direction of a flow) at ``epoch + (p.t - t0)``, or as soon after
    as the stream takes them (``_send``). Returns the chunks and payload bytes sent. Raises
    OSError when the stream breaks, TimeoutError when ``deadline`` passes with data unsent."""
    seq = start_seq
    sent = 0
    for p in packets:
        t_sched = epoch + (p.t - t0)
        _sleep_until(t_sched, stop)
        if stop.is_set():
            break
        data = wire.packet_chunks(seq, t_sched, p.size, time.time())
        if not _send(sock, data, stop, deadline):
            break
        seq += len(wire.chunk_sizes(p.size))
        sent += p.size
    return seq - start_seq, sent


def receive_chunks(sock: socket.socket, recorder: CellRecorder, deadline: float, expected: int,
                   stop: threading.Event, stop_at_expected: bool = False) -> tuple[int, float | None, float | None, bool]:
    """Receive chunks until EOF, the deadline or ``stop`` (with ``stop_at_expected``: also
    once ``expected`` chunks arrived). Returns (chunks, first arrival, last arrival, EOF seen)."""
    parser = wire.Parser()
    first = last = None
    sock.settimeout(0.5)
    eof = False
    try:
        while not stop.is_set() and time.time() < deadline:
            if stop_at_expected and recorder.count >= expected:
                break
            try:
                data = sock.recv(1 << 16)
            except socket.timeout:
                continue
            t = time.time()
            if not data:
                eof = True
                break
            chunks = parser.feed(data)
            if chunks:
                first = first or t
                last = t
                recorder.add(t, chunks)
    finally:
        recorder.flush()
    return recorder.count, first, last, eof

