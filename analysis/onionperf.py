"""Export of transfers in onionperf's analysis JSON layout (so onionperf/tornettools tooling
can read torbed results). One uncompressed file per variant and repetition:
``report/onionperf/<variant>-rep<k>.onionperf.analysis.json``.

Layout written (onionperf analysis format 3.1, whose tgen part is tgentools' analysis):

    {"type": "onionperf", "version": "3.1", "data": {<client>: {
        "measurement_ip": <client address from meta.json, else "unknown">,
        "tgen": {"streams": {<stream id>: <stream>},
                 "stream_summary": {"time_to_first_byte_recv": {<size>: {<unix second>: [s]}},
                                    "time_to_last_byte_recv": {...}, "time_to_first_byte_send": {},
                                    "time_to_last_byte_send": {}, "errors": {<code>: {<second>: [[sent, recv]]}}}},
        "tor": {"circuits": {<id>: {"circuit_id", "buildtime_seconds", "elapsed_seconds",
                                    "unix_ts_start", "unix_ts_end"}}, "streams": {}}}}}

A stream: ``stream_id``, ``is_complete`` (true), ``is_success``, ``is_error``,
``unix_ts_start`` (t_start), ``unix_ts_end`` (t_last_byte, else the last timestamp the
transfer reached), ``stream_info`` (id, name = client, peername = server, recvsize, sendsize
"0", recvstate, sendstate, vertexid = file, error), ``transport_info`` (fd, local, proxy,
remote, state, error), ``byte_info`` (payload-/total-bytes-recv/-send and
payload-progress-recv/-send as tgen prints them), ``time_info`` (created-ts, now-ts and
usecs-to-* from t_start; -1 where torbed has no such step), and for successes
``elapsed_seconds`` with ``payload_bytes_recv`` {"<bytes>": s} and ``payload_progress_recv``
{"0.1": s, ..., "1.0": s}, seconds since stream start, from the transfer's ``progress``
marks (the body's arrival time at tgen's byte counts and at each tenth of the file; records
without it give the last byte only). Warm-up transfers are not exported.

What tornettools' parse_onionperf reads, and where it comes from here (checked by
tests/unit/analysis/test_onionperf.py):

    RTT        (usecs-to-response - usecs-to-command) / 1e6       t_first_byte - t_request
    download   payload_bytes_recv[<size>] - usecs-to-command/1e6  t_last_byte - t_request (TTLB)
    goodput    (1048576 - 512000) * 8 / (s@1048576 - s@512000)    bit/s between 500 KiB and 1 MiB
               (5242880 - 4194304) * 8 / (s@5242880 - s@4194304)  the 5th MiB; 9 -> 10 MiB likewise
    build time tor.circuits.<id>.buildtime_seconds                circuit.build_s
    failures   is_error + stream_info.error (TIMEOUT/STALLOUT = timeout), payload-bytes-recv
               < recvsize
    s@B: elapsed_seconds.payload_bytes_recv["B"], else payload_progress_recv[str(B / recvsize)].

Circuits: torbed records a circuit's build time but not its launch or close time; the
exported ``unix_ts_start``/``unix_ts_end`` are the first exported stream's start on that
circuit minus the build time, and the last stream's end. Hop paths are not exported.

Public API:

- ``VERSION``, ``ERROR_CODES``
- ``rep_analysis(rep) -> dict``     the document for one repetition
- ``export(run, out_dir) -> list[Path]``   writes one file per repetition with transfers
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path

from .load import Rep, Run

VERSION = "3.1"

# torbed error.cause -> tgen stream error code.
ERROR_CODES = {
    "circuit_failed": "PROXY", "stream_detached": "PROXY", "socks_error": "PROXY",
    "timeout": "TIMEOUT", "stall": "STALLOUT", "checksum_mismatch": "CHECKSUM", "http_error": "HEADER",
    "connection_error": "READ",
}


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _usecs(t, t_start) -> str:
    return str(int(round((t - t_start) * 1e6))) if _num(t) and _num(t_start) else "-1"


def _source_name(name: str) -> str:
    # onionperf source names match ^[A-Za-z0-9-]+$
    return re.sub(r"[^A-Za-z0-9-]+", "-", name) or "unknown"


def _endpoint(rep: Rep, node: str | None, port_key: str, default_port: int) -> str:
    n = rep.node(node) if node else None
    addr = (n or {}).get("address") or "0.0.0.0"
    port = ((n or {}).get("ports") or {}).get(port_key, default_port)
    return f"{node or 'unknown'}:{addr}:{port}"


def _stream(rep: Rep, t: dict) -> tuple[str, dict]:
    ok = t.get("status") == "ok"
    ts = t.get("t_start")
    known = [t.get(k) for k in ("t_start", "t_socks", "t_request", "t_first_byte", "t_last_byte")]
    known = [x for x in known if _num(x)]
    end = t["t_last_byte"] if ok and _num(t.get("t_last_byte")) else (max(known) if known else ts)
    size = int(t.get("size") or 0)
    got = int(t.get("bytes") or 0)
    cause = (t.get("error") or {}).get("cause") if isinstance(t.get("error"), dict) else None
    if ok:
        code = "NONE"
    else:
        code = ERROR_CODES.get(cause or t.get("status"), "MISC")
    client = str(t.get("client") or "unknown")
    sid = f"{t.get('slot', 0)}-{t.get('seq', 0)}:{client}:{t.get('server') or 'unknown'}"
    progress = 100.0 * got / size if size else (100.0 if ok else 0.0)
    stream = {
        "stream_id": sid,
        "is_complete": True,
        "is_success": ok,
        "is_error": not ok,
        "unix_ts_start": ts,
        "unix_ts_end": end,
        "stream_info": {
            "id": f"{t.get('seq', 0)}", "name": client, "peername": str(t.get("server") or "(null)"),
            "recvsize": str(size), "sendsize": "0",
            "recvstate": "RECV_SUCCESS" if ok else "RECV_ERROR",
            "sendstate": "SEND_SUCCESS" if ok else ("SEND_COMMAND" if _num(t.get("t_request")) else "SEND_NONE"),
            "vertexid": str(t.get("file") or "stream"), "error": code,
        },
        "transport_info": {
            "fd": str(t.get("slot", 0)),
            "local": _endpoint(rep, t.get("client"), "local", 0),
            "proxy": _endpoint(rep, t.get("client"), "socks", 9050),
            "remote": _endpoint(rep, t.get("server"), "http", 80),
            "state": "SUCCESS_EOF" if ok else "ERROR",
            "error": "NONE" if ok else ("STATUS" if code == "PROXY" else code),
        },
        "byte_info": {
            "payload-bytes-recv": str(got), "payload-bytes-send": "0",
            "payload-progress-recv": f"{progress:.2f}%", "payload-progress-send": "100.00%",
            "total-bytes-recv": str(got), "total-bytes-send": "0",
        },
        "time_info": _time_info(t, ts, end, ok),
    }
    if ok and _num(t.get("t_last_byte")) and _num(ts):
        stream["elapsed_seconds"] = _elapsed_seconds(t, size, got, ts)
    return sid, stream


def _time_info(t: dict, ts, end, ok: bool) -> dict:
    """tgen's time_info: microseconds from the stream's start to each step ("-1": not reached
    or not measured)."""
    return {
        "created-ts": str(int(round(ts * 1e6))) if _num(ts) else "0",
        "now-ts": str(int(round(end * 1e6))) if _num(end) else "0",
        "usecs-to-socket-create": "0" if _num(ts) else "-1",
        "usecs-to-socket-connect": "-1", "usecs-to-proxy-init": "-1",
        "usecs-to-proxy-choice": "-1", "usecs-to-proxy-request": "-1",
        "usecs-to-proxy-response": _usecs(t.get("t_socks"), ts),
        "usecs-to-command": _usecs(t.get("t_request"), ts),
        # tgen's "response" is the server's first reply bytes; ours is the first byte of the
        # HTTP response (t_first_byte), so response - command is the circuit round trip
        # tornettools reads as RTT.
        "usecs-to-response": _usecs(t.get("t_first_byte"), ts),
        "usecs-to-first-byte-recv": _usecs(t.get("t_first_byte"), ts),
        "usecs-to-last-byte-recv": _usecs(t.get("t_last_byte"), ts) if ok else "-1",
        "usecs-to-checksum-recv": "-1", "usecs-to-first-byte-send": "-1",
        "usecs-to-last-byte-send": "-1", "usecs-to-checksum-send": "-1",
    }


def _elapsed_seconds(t: dict, size: int, got: int, ts: float) -> dict:
    """elapsed_seconds of a successful stream: seconds since its start at each byte count and
    tenth of the payload, the last byte included."""
    last = round(t["t_last_byte"] - ts, 6)
    by_bytes, by_fraction = _progress(t, size, ts)
    by_bytes.setdefault(str(got or size), last)
    by_fraction.setdefault("1.0", last)
    return {
        "payload_bytes_recv": by_bytes,
        "payload_progress_recv": by_fraction,
        "payload_bytes_send": {},
        "payload_progress_send": {},
    }


def _progress(t: dict, size: int, ts: float) -> tuple[dict, dict]:
    """elapsed_seconds' payload_bytes_recv ({"<bytes>": s}) and payload_progress_recv
    ({"0.1": s, ..., "1.0": s}) from the transfer's ``progress`` marks, seconds since stream
    start. Fraction keys are Python's str() of tenths, the spelling tornettools looks up
    (str(bytes / recvsize)); byte marks that are not a tenth of the file go under bytes."""
    by_bytes: dict[str, float] = {}
    by_fraction: dict[str, float] = {}
    for mark in t.get("progress") or []:
        if not (isinstance(mark, (list, tuple)) and len(mark) == 2 and _num(mark[0]) and _num(mark[1])):
            continue
        b, when = int(mark[0]), round(mark[1] - ts, 6)
        by_bytes.setdefault(str(b), when)
        if size:
            for k in range(1, 11):
                if b == -(-size * k // 10):
                    by_fraction.setdefault(str(k / 10), when)
    return by_bytes, by_fraction


def _summary_add(summary: dict, t: dict, stream: dict) -> None:
    second = str(int(stream["unix_ts_end"])) if _num(stream["unix_ts_end"]) else "0"
    size = str(int(t.get("size") or 0))
    if stream["is_success"]:
        for key, metric in (("time_to_first_byte_recv", "ttfb_s"), ("time_to_last_byte_recv", "ttlb_s")):
            if _num(t.get(metric)):
                summary[key].setdefault(size, {}).setdefault(second, []).append(round(t[metric], 6))
    else:
        code = stream["stream_info"]["error"]
        summary["errors"].setdefault(code, {}).setdefault(second, []).append(
            [0, int(t.get("bytes") or 0)])


def rep_analysis(rep: Rep) -> dict:
    """The onionperf analysis document of one repetition's measured transfers (see the
    module docstring for the layout). Keyed by client node name."""
    data: dict = {}
    circuits: dict[str, dict[str, dict]] = defaultdict(dict)
    for t in rep.measured_transfers:
        client = str(t.get("client") or "unknown")
        src = _source_name(client)
        node = rep.node(client) or {}
        entry = data.setdefault(src, {
            "measurement_ip": node.get("address") or "unknown",
            "tgen": {"streams": {}, "stream_summary": {
                "time_to_first_byte_recv": {}, "time_to_last_byte_recv": {},
                "time_to_first_byte_send": {}, "time_to_last_byte_send": {}, "errors": {}}},
            "tor": {"circuits": {}, "streams": {}}})
        sid, stream = _stream(rep, t)
        entry["tgen"]["streams"][sid] = stream
        _summary_add(entry["tgen"]["stream_summary"], t, stream)
        c = t.get("circuit")
        if isinstance(c, dict) and c.get("id") is not None and str(c["id"]).isdigit() and _num(c.get("build_s")):
            cid = str(c["id"])
            start = (t["t_start"] - c["build_s"]) if _num(t.get("t_start")) else None
            prev = circuits[src].get(cid)
            end = stream["unix_ts_end"]
            if prev is None:
                circuits[src][cid] = {"circuit_id": int(cid), "buildtime_seconds": round(c["build_s"], 6),
                                      "elapsed_seconds": [["GENERAL:BUILT", round(c["build_s"], 6)]],
                                      "unix_ts_start": start, "unix_ts_end": end}
            else:
                if _num(start) and (prev["unix_ts_start"] is None or start < prev["unix_ts_start"]):
                    prev["unix_ts_start"] = start
                if _num(end) and (prev["unix_ts_end"] is None or end > prev["unix_ts_end"]):
                    prev["unix_ts_end"] = end
    for src, circs in circuits.items():
        data[src]["tor"]["circuits"] = circs
    return {"type": "onionperf", "version": VERSION, "data": data}


def export(run: Run, out_dir: str | Path) -> list[Path]:
    """Write ``<variant>-rep<k>.onionperf.analysis.json`` into ``out_dir`` for every
    repetition with measured transfers. Returns the paths written; raises OSError."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.onionperf.analysis.json"):
        old.unlink()
    written = []
    for rep in run.reps:
        if not rep.measured_transfers:
            continue
        p = out_dir / f"{rep.variant}-rep{rep.index}.onionperf.analysis.json"
        p.write_text(json.dumps(rep_analysis(rep), sort_keys=True, indent=2) + "\n")
        written.append(p)
    return written
