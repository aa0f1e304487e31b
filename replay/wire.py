"""The replay protocol on one TCP stream (through Tor): a hello line, then tagged chunks.

1. The client sends one JSON line (``hello``): trace, flow, iteration and who is asking
   (client, group, variant, rep, circuit, t_measure), so the server can label what it records.
2. Both sides then send *chunks*, each at most ``CHUNK`` bytes (498: one relay cell's payload,
   as Torchestra's replayer sent 498-byte cells): a 24-byte header, then zero padding.

   header (network byte order): magic ``TC`` (2 bytes), chunk length incl. header (uint16),
   sequence number in this direction (uint32), intended send time (float64, UNIX seconds),
   actual send time (float64, UNIX seconds, taken just before the write).

   A trace packet of n bytes is sent as ceil(n / 498) chunks written at once; a remainder
   under 24 bytes is padded to 24 (a chunk must hold its header).
3. The server closes the stream once it has sent every downstream chunk and received every
   upstream one (or on timeout); the client then sees EOF.

One-way delay of a chunk = receive time - actual send time, both read from the host clock:
the local backend's namespaces share one kernel clock, so no offset correction is needed.
Scheduling error of the sender = actual - intended send time.

Public API: ``CHUNK``, ``HEADER``, ``chunk_sizes(n)``, ``encode(seq, t_sched, size)``,
``stamp(chunks, t_sent)``, ``Parser`` (``feed(data) -> [(length, seq, t_sched, t_sent)]``),
``WireError``.
"""

from __future__ import annotations

import struct

CHUNK = 498
HEADER = struct.Struct("!2sHIdd")
MAGIC = b"TC"
assert HEADER.size == 24


class WireError(ValueError):
    pass


def chunk_sizes(n: int) -> list[int]:
    """Chunk lengths for a packet of ``n`` payload bytes."""
    full, rest = divmod(max(n, 1), CHUNK)
    sizes = [CHUNK] * full
    if rest:
        sizes.append(max(rest, HEADER.size))
    return sizes


def packet_chunks(first_seq: int, t_sched: float, n: int, t_sent: float) -> bytes:
    """The bytes of one trace packet: its chunks, all stamped with ``t_sent``."""
    out = bytearray()
    for i, size in enumerate(chunk_sizes(n)):
        out += HEADER.pack(MAGIC, size, (first_seq + i) & 0xFFFFFFFF, t_sched, t_sent)
        out += bytes(size - HEADER.size)
    return bytes(out)


class Parser:
    """Splits a byte stream into chunks; returns their headers as they complete."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, float, float]]:
        self.buf += data
        out = []
        off = 0
        n = len(self.buf)
        while n - off >= HEADER.size:
            magic, length, seq, t_sched, t_sent = HEADER.unpack_from(self.buf, off)
            if magic != MAGIC or length < HEADER.size:
                raise WireError(f"bad chunk header at stream offset {off}: {bytes(self.buf[off:off + 8]).hex()}")
            if n - off < length:
                break
            out.append((length, seq, t_sched, t_sent))
            off += length
        del self.buf[:off]
        return out
