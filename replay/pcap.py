"""A small reader of pcap and pcapng captures down to TCP segments (no dependencies).

Supports classic pcap (microsecond and nanosecond, either byte order) and pcapng (section,
interface, enhanced/simple/obsolete packet blocks; per-interface ``if_tsresol``), link types
Ethernet (with 802.1Q tags), Linux cooked v1/v2, BSD loopback/null and raw IP; IPv4 and
IPv6 (skipping the common extension headers); TCP. Non-TCP packets and IP fragments other
than the first are skipped.

Payload length comes from the IP header, not from the captured length, so Ethernet padding
never counts as data and a short snap length still gives true sizes.

Public API: ``read_segments(path) -> list[Segment]``, ``Segment``, ``PcapError``.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from pathlib import Path
from ..errors import InputError
from ..safeload import FileInputError, read_bytes

LINK_NULL, LINK_ETHERNET, LINK_RAW, LINK_LOOP = 0, 1, 101, 108
LINK_SLL, LINK_SLL2, LINK_IPV4, LINK_IPV6 = 113, 276, 228, 229

# Captures are headers only (snap length 128); 256 MiB is hours of them.
MAX_CAPTURE_BYTES = 256 << 20


class PcapError(InputError, ValueError):
    pass


@dataclass(frozen=True)
class Segment:
    t: float
    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    flags: int          # TCP flags byte (FIN 1, SYN 2, RST 4, PSH 8, ACK 16)
    payload: int        # TCP payload bytes (from the IP length)

    @property
    def syn(self) -> bool:
        return bool(self.flags & 2)

    @property
    def ack(self) -> bool:
        return bool(self.flags & 16)


def read_segments(path: str | Path) -> list[Segment]:
    try:
        data = read_bytes(path, "capture", MAX_CAPTURE_BYTES)
    except FileInputError as e:
        raise PcapError(str(e)) from None
    if len(data) < 4:
        raise PcapError(f"{path}: too short to be a capture")
    magic = data[:4]
    if magic == b"\x0a\x0d\x0d\x0a":
        frames = _pcapng(data, path)
    elif magic in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d"):
        frames = _pcap(data, path)
    else:
        raise PcapError(f"{path}: not a pcap or pcapng file (magic {magic.hex()})")
    out = []
    for t, link, frame in frames:
        seg = _decode(t, link, frame)
        if seg is not None:
            out.append(seg)
    return out


def _pcap(data: bytes, path) -> list[tuple[float, int, bytes]]:
    magic = data[:4]
    e = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    if len(data) < 24:
        raise PcapError(f"{path}: truncated pcap header")
    link = struct.unpack_from(e + "I", data, 20)[0] & 0xFFFF
    div = 1e9 if nano else 1e6
    off = 24
    frames = []
    while off + 16 <= len(data):
        sec, frac, incl, _orig = struct.unpack_from(e + "IIII", data, off)
        off += 16
        frames.append((sec + frac / div, link, data[off:off + incl]))
        off += incl
    return frames


def _pcapng(data: bytes, path) -> list[tuple[float, int, bytes]]:
    frames = []
    e = "<"
    ifaces: list[tuple[int, float]] = []   # (link type, seconds per timestamp unit)
    off = 0
    while off + 12 <= len(data):
        btype = struct.unpack_from(e + "I", data, off)[0]
        if btype == 0x0A0D0D0A:   # section header: byte order from its magic; interfaces reset
            bom = data[off + 8:off + 12]
            e = "<" if bom == b"\x4d\x3c\x2b\x1a" else ">"
            ifaces = []
        blen = struct.unpack_from(e + "I", data, off + 4)[0]
        if blen < 12 or off + blen > len(data):
            raise PcapError(f"{path}: truncated pcapng block at byte {off}")
        body = data[off + 8:off + blen - 4]
        if btype == 1:   # interface description
            link = struct.unpack_from(e + "H", body, 0)[0]
            ifaces.append((link, _tsresol(body[8:], e)))
        elif btype in (6, 2):   # enhanced packet / obsolete packet
            if btype == 6:
                iface, hi, lo, cap, _orig = struct.unpack_from(e + "IIIII", body, 0)
            else:
                iface, _drops, hi, lo, cap, _orig = struct.unpack_from(e + "HHIIII", body, 0)
            link, unit = ifaces[iface]
            frames.append((((hi << 32) | lo) * unit, link, body[20:20 + cap]))
        elif btype == 3 and ifaces:   # simple packet: no timestamp (rare; kept in order at t=0)
            orig = struct.unpack_from(e + "I", body, 0)[0]
            frames.append((0.0, ifaces[0][0], body[4:4 + orig]))
        off += blen
    return frames


def _tsresol(opts: bytes, e: str) -> float:
    off = 0
    while off + 4 <= len(opts):
        code, length = struct.unpack_from(e + "HH", opts, off)
        if code == 0:
            break
        if code == 9 and length >= 1:
            v = opts[off + 4]
            return 2.0 ** -(v & 0x7F) if v & 0x80 else 10.0 ** -v
        off += 4 + ((length + 3) & ~3)
    return 1e-6


def _decode(t: float, link: int, f: bytes) -> Segment | None:
    if link == LINK_ETHERNET:
        if len(f) < 14:
            return None
        etype, off = struct.unpack_from(">H", f, 12)[0], 14
        while etype in (0x8100, 0x88A8) and len(f) >= off + 4:
            etype, off = struct.unpack_from(">H", f, off + 2)[0], off + 4
    elif link == LINK_SLL:
        if len(f) < 16:
            return None
        etype, off = struct.unpack_from(">H", f, 14)[0], 16
    elif link == LINK_SLL2:
        if len(f) < 20:
            return None
        etype, off = struct.unpack_from(">H", f, 0)[0], 20
    elif link in (LINK_NULL, LINK_LOOP):
        if len(f) < 4:
            return None
        fam = struct.unpack_from("<I", f, 0)[0]
        if fam > 0xFFFF:
            fam = struct.unpack_from(">I", f, 0)[0]
        etype, off = (0x0800 if fam == 2 else 0x86DD), 4
    elif link in (LINK_RAW, LINK_IPV4, LINK_IPV6):
        if not f:
            return None
        etype, off = (0x0800 if f[0] >> 4 == 4 else 0x86DD), 0
    else:
        return None
    if etype == 0x0800:
        return _ipv4(t, f, off)
    if etype == 0x86DD:
        return _ipv6(t, f, off)
    return None


def _ipv4(t: float, f: bytes, off: int) -> Segment | None:
    if len(f) < off + 20 or f[off] >> 4 != 4:
        return None
    ihl = (f[off] & 15) * 4
    total = struct.unpack_from(">H", f, off + 2)[0]
    frag = struct.unpack_from(">H", f, off + 6)[0]
    if f[off + 9] != 6 or frag & 0x1FFF:
        return None
    src = str(ipaddress.IPv4Address(f[off + 12:off + 16]))
    dst = str(ipaddress.IPv4Address(f[off + 16:off + 20]))
    if total == 0:   # TSO on the capturing host: length unknown in the header
        total = len(f) - off
    return _tcp(t, f, off + ihl, total - ihl, src, dst)


_V6_EXT = {0, 43, 60}


def _ipv6(t: float, f: bytes, off: int) -> Segment | None:
    if len(f) < off + 40 or f[off] >> 4 != 6:
        return None
    plen = struct.unpack_from(">H", f, off + 4)[0]
    nxt = f[off + 6]
    src = str(ipaddress.IPv6Address(f[off + 8:off + 24]))
    dst = str(ipaddress.IPv6Address(f[off + 24:off + 40]))
    p = off + 40
    while nxt in _V6_EXT and len(f) >= p + 8:
        hlen = (f[p + 1] + 1) * 8
        nxt, p, plen = f[p], p + hlen, plen - hlen
    if nxt != 6:
        return None
    return _tcp(t, f, p, plen, src, dst)


def _tcp(t: float, f: bytes, off: int, length: int, src: str, dst: str) -> Segment | None:
    if len(f) < off + 20:
        return None
    sport, dport, seq = struct.unpack_from(">HHI", f, off)
    doff = (f[off + 12] >> 4) * 4
    flags = f[off + 13]
    return Segment(t=t, src=src, sport=sport, dst=dst, dport=dport, seq=seq, flags=flags,
                   payload=max(0, length - doff))
