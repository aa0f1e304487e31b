"""Converters to the trace format: packet captures and relay cell-timing logs.

pcap/pcapng -> trace (``from_pcap``): every TCP connection matching the filter becomes a
flow; every segment carrying payload becomes a packet with its payload size, so TCP payload
boundaries are kept as the capture saw them (a capture on a host with segmentation offload
sees the large segments the kernel handed to the NIC: capture on the wire, or turn offloads
off, when boundaries matter). Retransmitted bytes are dropped (a segment entirely below the
highest sequence number already seen in its direction; a partial overlap keeps the new
bytes). The client is the side that sent the SYN (else the side with the higher port);
downstream = server -> client.

Filter: terms joined by ``and``: ``host A`` (either end), ``net CIDR``, ``port N`` (either
end), ``server port N``; e.g. ``"host 10.0.0.2 and server port 22"``. Empty: every TCP flow.

Cell logs -> trace (``from_cell_log``): the relay-side log the paper replays in its
experiment 3 (section 5.4): one line per cell, ``time,connection,circuit,direction`` (CSV;
``#`` comments; time in seconds; direction ``d``/``in``/``inbound`` = toward the client,
``u``/``out``/``outbound`` = away from it). Each circuit becomes a flow of 498-byte packets
(a relay cell's payload) on a circuit of its own; ``connection`` selects the connection to
replay (``"busiest"``: the one with the most cells, as the paper chose).

torbed's own cellstats.jsonl -> cell log (``cell_log_from_cellstats``): CELL_STATS counts the
relay cells leaving each circuit queue per second (tor fills the "removed" counts only), not
each cell's time, so the cells of one event are spread evenly over the second before it
(documented approximation, 1 s grain; it is the relay's departure, not arrival, timing).

Public API: ``from_pcap(path, filter="", circuit_by="server", min_bytes=1, meta=None)``,
``parse_filter(text)``, ``from_cell_log(path, connection="busiest", meta=None)``,
``read_cell_log(path) -> list[(t, conn, circ, dir)]``,
``cell_log_from_cellstats(cellstats_path, relay) -> list[(t, conn, circ, dir)]``,
``write_cell_log(rows, path)``, ``CELL_PAYLOAD``.
"""

from __future__ import annotations

import ipaddress
import json
from collections import Counter, defaultdict
from pathlib import Path

from .pcap import Segment, read_segments
from .trace import DOWN, UP, Flow, Packet, Trace, TraceError, rebase

CELL_PAYLOAD = 498   # RELAY_PAYLOAD_SIZE: stream bytes a relay cell carries


def parse_filter(text: str):
    """A predicate on (client, cport, server, sport) from the filter language above."""
    terms = [t.strip() for t in (text or "").split(" and ") if t.strip()]
    preds = []
    for term in terms:
        words = term.split()
        try:
            if words[0] == "host" and len(words) == 2:
                a = str(ipaddress.ip_address(words[1]))
                preds.append(lambda c, cp, s, sp, a=a: a in (c, s))
            elif words[0] == "net" and len(words) == 2:
                n = ipaddress.ip_network(words[1], strict=False)
                preds.append(lambda c, cp, s, sp, n=n: ipaddress.ip_address(c) in n or ipaddress.ip_address(s) in n)
            elif words[0] == "port" and len(words) == 2:
                p = int(words[1])
                preds.append(lambda c, cp, s, sp, p=p: p in (cp, sp))
            elif words[:2] == ["server", "port"] and len(words) == 3:
                p = int(words[2])
                preds.append(lambda c, cp, s, sp, p=p: sp == p)
            else:
                raise ValueError
        except (ValueError, IndexError):
            raise TraceError(f"filter term {term!r} not understood "
                             "(use: host A, net CIDR, port N, server port N; joined by 'and')") from None
    return lambda *a: all(p(*a) for p in preds)


def _flows(segs: list[Segment]) -> dict[tuple, list[Segment]]:
    by: dict[tuple, list[Segment]] = defaultdict(list)
    for s in segs:
        key = tuple(sorted([(s.src, s.sport), (s.dst, s.dport)]))
        by[key].append(s)
    return by


def _client_side(segs: list[Segment]) -> tuple[str, int]:
    for s in segs:
        if s.syn and not s.ack:
            return s.src, s.sport
    s = segs[0]
    return (s.src, s.sport) if s.sport > s.dport else (s.dst, s.dport)


def from_pcap(path: str | Path, filter: str = "", circuit_by: str = "server", min_bytes: int = 1,
              meta: dict | None = None) -> Trace:
    """Trace of the TCP flows in a capture. ``circuit_by``: ``server`` (flows to one server
    address share a circuit, as Tor Browser isolates by first party), ``flow`` (each flow its
    own), ``one`` (all flows on one circuit). Flows with fewer than ``min_bytes`` payload bytes
    are dropped."""
    if circuit_by not in ("server", "flow", "one"):
        raise TraceError(f"circuit_by must be server, flow or one (got {circuit_by!r})")
    pred = parse_filter(filter)
    segs = read_segments(path)
    flows = []
    for key, fs in _flows(segs).items():
        fs.sort(key=lambda s: s.t)
        client = _client_side(fs)
        server = key[0] if key[1] == client else key[1]
        if not pred(client[0], client[1], server[0], server[1]):
            continue
        highest: dict[bool, int | None] = {True: None, False: None}
        packets = []
        for s in fs:
            down = (s.src, s.sport) == server
            if s.syn:
                highest[down] = (s.seq + 1) & 0xFFFFFFFF
            if s.payload <= 0:
                continue
            end = (s.seq + s.payload) & 0xFFFFFFFF
            new = s.payload
            h = highest[down]
            if h is not None:
                ahead = (end - h) & 0xFFFFFFFF   # bytes past the highest seen (mod 2^32)
                if ahead == 0 or ahead >= 0x80000000:
                    continue   # entirely old data: a retransmission
                new = min(s.payload, ahead)
            highest[down] = end
            packets.append(Packet(s.t, DOWN if down else UP, new))
        if sum(p.size for p in packets) < max(1, min_bytes):
            continue
        circuit = {"server": server[0], "flow": None, "one": "all"}[circuit_by]
        fid = f"{client[0]}:{client[1]}-{server[0]}:{server[1]}"
        flows.append(Flow(fid, packets, circuit, label=f"tcp {server[0]}:{server[1]}"))
    if not flows:
        raise TraceError(f"{path}: no TCP flow with payload matches the filter {filter!r}")
    m = {"source": str(Path(path).name), "tool": "torbed.replay.convert.from_pcap",
         "filter": filter, "circuit_by": circuit_by, **(meta or {})}
    return rebase(Trace(flows=flows, meta=m))


_DIRS = {"d": DOWN, "in": DOWN, "inbound": DOWN, "down": DOWN,
         "u": UP, "out": UP, "outbound": UP, "up": UP}


def read_cell_log(path: str | Path) -> list[tuple[float, str, str, str]]:
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or parts[3].lower() not in _DIRS:
            raise TraceError(f"{path}:{i}: expected time,connection,circuit,direction (d|u|in|out), got {line!r}")
        try:
            t = float(parts[0])
        except ValueError:
            raise TraceError(f"{path}:{i}: time {parts[0]!r} is not a number") from None
        rows.append((t, parts[1], parts[2], _DIRS[parts[3].lower()]))
    return rows


def write_cell_log(rows, path: str | Path, header: str = "") -> None:
    lines = [f"# {h}" for h in header.splitlines()] + ["# time,connection,circuit,direction"]
    lines += [f"{t:.6f},{c},{circ},{d}" for t, c, circ, d in rows]
    Path(path).write_text("\n".join(lines) + "\n")


def from_cell_log(path: str | Path, connection: str = "busiest", meta: dict | None = None,
                  max_circuits: int | None = None) -> Trace:
    """Trace of one connection's circuits from a cell-timing log (see the module docstring).
    ``max_circuits`` keeps the busiest circuits only."""
    rows = read_cell_log(path)
    if not rows:
        raise TraceError(f"{path}: no cells")
    if connection == "busiest":
        connection = Counter(r[1] for r in rows).most_common(1)[0][0]
    rows = sorted((r for r in rows if r[1] == connection), key=lambda r: r[0])
    if not rows:
        raise TraceError(f"{path}: no cells on connection {connection!r}")
    by: dict[str, list[Packet]] = defaultdict(list)
    for t, _conn, circ, d in rows:
        by[circ].append(Packet(t, d, CELL_PAYLOAD))
    circs = sorted(by, key=lambda c: -len(by[c]))[:max_circuits] if max_circuits else list(by)
    flows = [Flow(f"circ-{c}", by[c], circuit=f"circ-{c}", label=f"relay circuit {c} on connection {connection}")
             for c in circs]
    m = {"source": str(Path(path).name), "tool": "torbed.replay.convert.from_cell_log",
         "connection": connection, **(meta or {})}
    return rebase(Trace(flows=flows, meta=m))


def cell_log_from_cellstats(path: str | Path, relay: str) -> list[tuple[float, str, str, str]]:
    """Per-cell rows from torbed's cellstats.jsonl records of ``relay`` (cells spread evenly
    over each event's second; cell counts from ``removed``)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("type") != "cellstats" or rec.get("relay") != relay:
            continue
        conn = None
        for side, d in (("inbound", DOWN), ("outbound", UP)):
            s = rec.get(side)
            if not isinstance(s, dict):
                continue
            conn = conn or str((rec.get("inbound") or {}).get("conn") or s.get("conn"))
            # tor fills only the 'removed' counts (cells leaving the circuit queue, per
            # command); every relay cell that crossed the relay was removed once.
            n = sum(v for k, v in (s.get("removed") or {}).items() if k in ("relay", "relay_early"))
            for i in range(n):
                rows.append((rec["t"] - 1.0 + (i + 0.5) / n, conn, str(rec["circuit"]), d))
    rows.sort()
    return rows
