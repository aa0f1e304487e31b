"""The results service: measuring pods append JSON lines to files here as they write them,
and the clients' start barrier.

POST /append/<file>   append the body (whole lines) to <file>, under one lock per service so
                      concurrent writers never interleave within a line
GET  /files           {file: size}
GET  /files/<file>    its content
POST /ready/<client>  a client's network view is ready (torbed.pods.client's evidence)
POST /shaped/<pod>    a pod's shaper has classified every shaped peer (torbed.pods.shaper)
POST /peer/<pod>      {"group": g, "ip": a}: a shaper announces its pod's address
GET  /peers           {"pods": {pod: {"group": g, "ip": a}}}: every address announced. The
                      shapers classify their peers from these until cluster DNS lists them all:
                      a name looked up before its pods existed is cached by CoreDNS as
                      NXDOMAIN or as a partial answer for its TTL (30 s in kubeadm's Corefile
                      and ours), which held every shaper's report, and so the start, until
                      ~28 s after the pods were up
POST /cache/<pod>     a directory cache (guard) holds the consensus and every microdescriptor
GET  /caches          {"caches": [pod, ...]}: the client drivers keep their tor offline until
                      every directory guard is in it (torbed.pods.bringup)
GET  /start           200 {"t_workload": t} once every one of --clients clients is ready
                      and every one of --shapers shapers has reported
                      (t = then + START_LEAD_S, so all start their workload together, as on
                      the local backend), 204 before
GET  /healthz         readiness
GET  /metrics         Prometheus exposition: bytes and lines appended per file, clients ready,
                      shapers reported, whether the start barrier opened (and writes
                      refused, by status)
The directory is fetched with ``kubectl exec ... tar`` (NOTES.txt, torbed run --backend k8s).

Every POST must carry the release's token (``Authorization: Bearer <token>``; the chart's
Secret <release>-results-token, TORBED_RESULTS_TOKEN in every writing pod): without one the
service answers 401, with a wrong one 403, and logs the refusal with the writer's address.
GETs stay open: they are how `torbed run` and `helm test` read, through the API server's
Service proxy, and the records are no secret from the release's own pods.
"""

from __future__ import annotations

import argparse
import hmac
import http.server
import ipaddress
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..errors import EXIT_BAD_INPUT, EXIT_OK
from . import RESULTS_TOKEN_ENV

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
START_LEAD_S = 2.0
TOKEN_ENV = RESULTS_TOKEN_ENV
# Shorter tokens are refused at start: the chart's own are 40 random characters.
MIN_TOKEN_CHARS = 16


def make_handler(directory: Path, clients: int = 0, shapers: int = 0, token: str | None = None):
    """The request handler class of a results service over ``directory`` whose start barrier
    waits for ``clients`` clients and ``shapers`` shapers. ``token``: what every POST must
    present as ``Authorization: Bearer``; None accepts any writer (in-process tests only:
    ``main`` always has one)."""
    return type("Handler", (_Handler,), {"state": _State(directory, clients, shapers, token)})


class _State:
    """What one service holds across requests (under ``lock``), and its Prometheus metrics."""

    def __init__(self, directory: Path, clients: int, shapers: int, token: str | None = None):
        self.directory, self.clients, self.shapers = directory, clients, shapers
        self.token = token.encode() if token is not None else None
        self.lock = threading.Lock()
        self.ready: dict[str, float] = {}
        self.shaped: dict[str, float] = {}
        self.start: dict[str, float] = {}
        self.peers: dict[str, dict[str, str]] = {}
        self.caches: dict[str, float] = {}
        self.registry = registry = CollectorRegistry()
        self.appended_bytes = Counter("torbed_results_appended_bytes", "Bytes of records appended", ["file"],
                                      registry=registry)
        self.appended_lines = Counter("torbed_results_appended_lines", "Records (lines) appended", ["file"],
                                      registry=registry)
        self.refused = Counter("torbed_results_refused_writes", "POSTs refused for a missing (401) or wrong (403) "
                               "token", ["code"], registry=registry)
        Gauge("torbed_results_clients_ready", "Clients that reported ready", registry=registry).set_function(
            lambda: len(self.ready))
        Gauge("torbed_results_shapers_reported", "Shapers that reported", registry=registry).set_function(
            lambda: len(self.shaped))
        Gauge("torbed_results_workload_started", "1 once the start barrier opened", registry=registry).set_function(
            lambda: float("t_workload" in self.start))


class _Handler(http.server.BaseHTTPRequestHandler):
    state: _State   # set by make_handler

    def log_message(self, fmt, *args):
        pass

    def _send(self, code: int, content_type: str, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reply(self, code: int, body: dict) -> None:
        self._send(code, "application/json", json.dumps(body).encode())

    def do_GET(self):
        st = self.state
        if self.path == "/healthz":
            return self._reply(200, {"ok": True})
        if self.path == "/metrics":
            return self._send(200, CONTENT_TYPE_LATEST, generate_latest(st.registry))
        if self.path == "/files":
            return self._reply(200, {p.name: p.stat().st_size for p in sorted(st.directory.iterdir()) if p.is_file()})
        if self.path.startswith("/files/"):
            return self._file(self.path[len("/files/"):])
        if self.path == "/caches":
            with st.lock:
                return self._reply(200, {"caches": sorted(st.caches)})
        if self.path == "/peers":
            with st.lock:
                return self._reply(200, {"pods": dict(st.peers)})
        if self.path == "/start":
            with st.lock:
                if "t_workload" in st.start:
                    return self._reply(200, {**st.start, "clients": sorted(st.ready)})
            self.send_response(204)
            self.end_headers()
            return
        self._reply(404, {"error": "not found"})

    def _file(self, name: str) -> None:
        st = self.state
        if not NAME_RE.match(name) or not (st.directory / name).is_file():
            return self._reply(404, {"error": f"no file {name!r}"})
        with st.lock:
            data = (st.directory / name).read_bytes()
        self._send(200, "application/octet-stream", data)

    def _authorized(self) -> bool:
        """Whether this POST presents the service's token; answers 401/403 and logs when not."""
        want = self.state.token
        if want is None:
            return True
        got = self.headers.get("Authorization") or ""
        scheme, _, token = got.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), want):
            return True
        code, why = (401, "no token") if not got else (403, "wrong token")
        # Drain a small body, so the writer reads the answer rather than a reset connection.
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if 0 < length <= 1 << 20:
            self.rfile.read(length)
        self.state.refused.labels(str(code)).inc()
        print(f"{time.strftime('%H:%M:%S')} results: refused POST {self.path[:200]!r} from "
              f"{self.client_address[0]}: {why}", file=sys.stderr, flush=True)
        self._reply(code, {"error": f"{why}: writes need the release's results token "
                                    f"(Authorization: Bearer, from {TOKEN_ENV})"})
        return False

    def do_POST(self):
        if not self._authorized():
            self.close_connection = True
            return
        if self.path.startswith("/peer/"):
            return self._announce(self.path[len("/peer/"):])
        if self.path.startswith("/cache/"):
            return self._cache(self.path[len("/cache/"):])
        for prefix, seen in (("/ready/", self.state.ready), ("/shaped/", self.state.shaped)):
            if self.path.startswith(prefix):
                return self._report(self.path[len(prefix):], seen)
        prefix = "/append/"
        return self._append(self.path[len(prefix):] if self.path.startswith(prefix) else "")

    def _announce(self, pod: str) -> None:
        st = self.state
        if not NAME_RE.match(pod):
            return self._reply(400, {"error": f"bad name {pod!r}"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            group, ip = str(body["group"]), str(ipaddress.IPv4Address(body["ip"]))
        except (ValueError, KeyError, TypeError) as e:
            return self._reply(400, {"error": f"want {{\"group\": ..., \"ip\": IPv4}}: {e}"})
        if not NAME_RE.match(group):
            return self._reply(400, {"error": f"bad group {group!r}"})
        with st.lock:
            st.peers[pod] = {"group": group, "ip": ip}
            return self._reply(200, {"peers": len(st.peers)})

    def _cache(self, pod: str) -> None:
        st = self.state
        if not NAME_RE.match(pod):
            return self._reply(400, {"error": f"bad name {pod!r}"})
        with st.lock:
            st.caches.setdefault(pod, time.time())
            return self._reply(200, {"caches": len(st.caches)})

    def _report(self, name: str, seen: dict[str, float]) -> None:
        """A client ready or a shaper done; the barrier opens with the last one expected."""
        st = self.state
        if not NAME_RE.match(name):
            return self._reply(400, {"error": f"bad name {name!r}"})
        with st.lock:
            seen.setdefault(name, time.time())
            if len(st.ready) >= st.clients and len(st.shaped) >= st.shapers and "t_workload" not in st.start:
                st.start.update(t_workload=time.time() + START_LEAD_S, t_all_ready=time.time())
            return self._reply(200, {"ready": len(st.ready), "of": st.clients, "shaped": len(st.shaped),
                                     "shapers": st.shapers, **st.start})

    def _append(self, name: str) -> None:
        st = self.state
        if not NAME_RE.match(name):
            return self._reply(400, {"error": f"bad file name {name!r}"})
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length)
        if data and not data.endswith(b"\n"):
            return self._reply(400, {"error": "append whole lines only"})
        with st.lock, open(st.directory / name, "ab") as f:
            f.write(data)
        st.appended_bytes.labels(name).inc(len(data))
        st.appended_lines.labels(name).inc(data.count(b"\n"))
        self._reply(200, {"appended": len(data)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="torbed results service (runs in the results pod)")
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--clients", type=int, default=1, help="clients the start barrier waits for")
    ap.add_argument("--shapers", type=int, default=0, help="shapers the start barrier waits for")
    args = ap.parse_args(argv)
    token = (os.environ.get(TOKEN_ENV) or "").strip()
    if len(token) < MIN_TOKEN_CHARS:
        print(f"torbed.pods.results: environment variable {TOKEN_ENV}: "
              f"{'not set' if not token else f'{len(token)} characters'}; the service needs the release's "
              f"token of at least {MIN_TOKEN_CHARS} characters (the chart passes its Secret "
              "<release>-results-token, or the value results.token)", file=sys.stderr)
        return EXIT_BAD_INPUT
    args.dir.mkdir(parents=True, exist_ok=True)
    server = http.server.ThreadingHTTPServer((args.bind, args.port),
                                             make_handler(args.dir, args.clients, args.shapers, token))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever(poll_interval=0.5)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
