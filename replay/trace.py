"""The trace format (torbed-trace, version 1): timing of flows, packet by packet.

A trace is JSON lines, optionally gzip-compressed (``.gz``, detected by content):

    line 1   {"format": "torbed-trace", "version": 1, "meta": {...}}
    line 2.. {"flow": "<id>", "circuit": "<key>" | null, "label": "...",
              "packets": [[t, "d" | "u", bytes], ...]}

- ``meta``: ``source`` (what was captured), ``tool`` (capture tool and converter),
  ``licence`` and ``origin`` (who made it, under which terms), ``created`` (ISO 8601 UTC),
  ``description``; free-form extra keys are kept.
- ``t``: seconds from the start of the trace (not of the flow), non-decreasing in a flow.
- direction: ``d`` = downstream (server -> client: what the replay server sends toward the
  client through Tor), ``u`` = upstream (client -> server).
- ``bytes``: application payload bytes of that packet (TCP payload; a cell's 498 payload bytes
  for cell logs), > 0. Packets of size 0 (pure ACKs, handshakes) are not in traces.
- ``circuit``: flows with the same key share one Tor circuit when replayed; ``null`` gives
  the flow a circuit of its own.

Readers ignore unknown keys. Writers sort flows by their first packet time.

Public API: ``Trace``, ``Flow``, ``Packet``, ``read(path) -> Trace``, ``write(trace, path)``,
``TraceError``, ``FORMAT``, ``VERSION``, ``slice_trace``, ``merge``, ``info(trace) -> dict``.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from ..errors import InputError
from ..safeload import FileInputError, open_lines

FORMAT = "torbed-trace"
VERSION = 1
DOWN, UP = "d", "u"


class TraceError(InputError, ValueError):
    """A trace that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Packet:
    t: float
    direction: str
    size: int


@dataclass
class Flow:
    id: str
    packets: list[Packet]
    circuit: str | None = None
    label: str = ""

    @property
    def start(self) -> float:
        return self.packets[0].t if self.packets else 0.0

    @property
    def end(self) -> float:
        return self.packets[-1].t if self.packets else 0.0

    def bytes(self, direction: str) -> int:
        return sum(p.size for p in self.packets if p.direction == direction)

    def count(self, direction: str) -> int:
        return sum(1 for p in self.packets if p.direction == direction)


@dataclass
class Trace:
    flows: list[Flow]
    meta: dict = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return max((f.end for f in self.flows), default=0.0)

    def flow(self, fid: str) -> Flow:
        for f in self.flows:
            if f.id == fid:
                return f
        raise KeyError(fid)


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# Bounds on a trace file (uncompressed): far above real captures (a 10-minute capture of
# 25 clients is ~30 MB), low enough that a gzip bomb stops within a second or so.
MAX_TRACE_BYTES = 256 << 20
MAX_LINE_BYTES = 64 << 20


def read(path: str | Path) -> Trace:
    """Read and check a trace file (plain or gzip). Raises TraceError naming file and line
    (also for a file that is binary, not UTF-8, empty or too large: see torbed.safeload)."""
    path = Path(path)
    try:
        return _read(path)
    except FileInputError as e:
        raise TraceError(str(e)) from None


def _read(path: Path) -> Trace:
    header = None
    flows: list[Flow] = []
    ids: set[str] = set()
    for i, line in open_lines(path, "trace", MAX_TRACE_BYTES, MAX_LINE_BYTES):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{i}: not JSON ({e.msg})") from None
        except RecursionError:
            raise TraceError(f"{path}:{i}: not JSON (nested too deeply)") from None
        if not isinstance(rec, dict):
            raise TraceError(f"{path}:{i}: expected a JSON object")
        if header is None:
            if rec.get("format") != FORMAT:
                raise TraceError(f"{path}:{i}: not a {FORMAT} file (first line must have format={FORMAT!r})")
            if rec.get("version") != VERSION:
                raise TraceError(f"{path}:{i}: unsupported version {rec.get('version')!r} (this torbed reads {VERSION})")
            header = rec
            continue
        flows.append(_flow(rec, f"{path}:{i}"))
        if flows[-1].id in ids:
            raise TraceError(f"{path}:{i}: flow id {flows[-1].id!r} appears twice")
        ids.add(flows[-1].id)
    if header is None:
        raise TraceError(f"{path}: empty file (no {FORMAT} header)")
    meta = header.get("meta") if isinstance(header.get("meta"), dict) else {}
    return Trace(flows=flows, meta=meta)


def _flow(rec: dict, where: str) -> Flow:
    fid = rec.get("flow")
    if not isinstance(fid, str) or not fid:
        raise TraceError(f"{where}: 'flow' must be a non-empty string")
    circuit = rec.get("circuit")
    if circuit is not None and not isinstance(circuit, str):
        raise TraceError(f"{where}: 'circuit' must be a string or null")
    pk = rec.get("packets")
    if not isinstance(pk, list):
        raise TraceError(f"{where}: 'packets' must be a list of [t, direction, bytes]")
    packets = []
    last = 0.0
    for j, p in enumerate(pk):
        if not (isinstance(p, list) and len(p) == 3 and isinstance(p[0], (int, float))
                and p[1] in (DOWN, UP) and isinstance(p[2], int) and not isinstance(p[2], bool)):
            raise TraceError(f"{where}: packets[{j}] must be [t, 'd'|'u', bytes], got {p!r}")
        if p[0] < 0 or p[0] < last - 1e-9:
            raise TraceError(f"{where}: packets[{j}] time {p[0]} is negative or before the previous packet")
        if p[2] <= 0:
            raise TraceError(f"{where}: packets[{j}] has {p[2]} bytes (must be > 0)")
        last = float(p[0])
        packets.append(Packet(float(p[0]), p[1], p[2]))
    return Flow(id=fid, packets=packets, circuit=circuit, label=str(rec.get("label") or ""))


def dumps(trace: Trace) -> str:
    meta = {"created": utc_now(), **trace.meta}
    lines = [json.dumps({"format": FORMAT, "version": VERSION, "meta": meta}, sort_keys=True)]
    for f in sorted(trace.flows, key=lambda f: (f.start, f.id)):
        # Microsecond resolution is what pcap gives; more digits only bloat the file.
        pk = [[round(p.t, 6), p.direction, p.size] for p in f.packets]
        lines.append(json.dumps({"flow": f.id, "circuit": f.circuit, "label": f.label, "packets": pk},
                                separators=(",", ":")))
    return "\n".join(lines) + "\n"


def write(trace: Trace, path: str | Path) -> None:
    """Write ``trace``; gzip-compressed when the name ends with .gz (mtime 0: reproducible bytes)."""
    path = Path(path)
    data = dumps(trace).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data, compresslevel=9, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def rebase(trace: Trace) -> Trace:
    """The same trace with time 0 at its first packet."""
    t0 = min((f.start for f in trace.flows if f.packets), default=0.0)
    return Trace(flows=[Flow(f.id, [Packet(p.t - t0, p.direction, p.size) for p in f.packets], f.circuit, f.label)
                        for f in trace.flows], meta=dict(trace.meta))


def slice_trace(trace: Trace, start: float = 0.0, end: float | None = None,
                flows: list[str] | None = None) -> Trace:
    """Packets with start <= t < end of the chosen flows (all by default), rebased to 0."""
    want = set(flows) if flows else None
    if want:
        unknown = want - {f.id for f in trace.flows}
        if unknown:
            raise TraceError(f"no such flow(s): {', '.join(sorted(unknown))}")
    out = []
    for f in trace.flows:
        if want is not None and f.id not in want:
            continue
        pk = [p for p in f.packets if p.t >= start and (end is None or p.t < end)]
        if pk:
            out.append(Flow(f.id, [Packet(p.t - start, p.direction, p.size) for p in pk], f.circuit, f.label))
    meta = dict(trace.meta)
    meta["sliced"] = {"start": start, "end": end, "flows": sorted(want) if want else None}
    return Trace(flows=out, meta=meta)


def merge(traces: list[tuple[str, Trace]], offsets: list[float] | None = None) -> Trace:
    """Several traces as one: flow ids and circuit keys are prefixed with each trace's name
    (so they stay distinct); trace i's times are shifted by ``offsets[i]`` (default 0)."""
    offsets = offsets or [0.0] * len(traces)
    flows = []
    for (name, tr), off in zip(traces, offsets):
        for f in tr.flows:
            flows.append(Flow(f"{name}/{f.id}", [Packet(p.t + off, p.direction, p.size) for p in f.packets],
                              f"{name}/{f.circuit}" if f.circuit is not None else None, f.label))
    return Trace(flows=flows, meta={"merged": [{"name": n, "offset": o, "meta": t.meta}
                                               for (n, t), o in zip(traces, offsets)],
                                    "source": "merge of " + ", ".join(n for n, _ in traces)})


def info(trace: Trace) -> dict:
    """Totals for ``torbed trace info``."""
    circuits = {f.circuit if f.circuit is not None else f"#own:{f.id}" for f in trace.flows}
    return {"meta": trace.meta, "flows": len(trace.flows), "circuits": len(circuits),
            "duration_s": trace.duration,
            "packets": {"down": sum(f.count(DOWN) for f in trace.flows), "up": sum(f.count(UP) for f in trace.flows)},
            "bytes": {"down": sum(f.bytes(DOWN) for f in trace.flows), "up": sum(f.bytes(UP) for f in trace.flows)},
            "per_flow": [{"flow": f.id, "circuit": f.circuit, "label": f.label, "start": f.start, "end": f.end,
                          "packets_down": f.count(DOWN), "packets_up": f.count(UP),
                          "bytes_down": f.bytes(DOWN), "bytes_up": f.bytes(UP)} for f in trace.flows]}
