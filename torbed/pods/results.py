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
                      shapers reported, whether the start barrier opened
The directory is fetched with ``kubectl exec ... tar`` (NOTES.txt, torbed run --backend k8s).
"""

from __future__ import annotations

import argparse
import http.server
import ipaddress
import json
import re
import signal
import sys
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..errors import EXIT_OK

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
START_LEAD_S = 2.0


def make_handler(directory: Path, clients: int = 0, shapers: int = 0):
    lock = threading.Lock()
    ready: dict[str, float] = {}
    shaped: dict[str, float] = {}
    start: dict[str, float] = {}
    peers: dict[str, dict[str, str]] = {}
    caches: dict[str, float] = {}
    registry = CollectorRegistry()
    appended_bytes = Counter("torbed_results_appended_bytes", "Bytes of records appended", ["file"], registry=registry)
    appended_lines = Counter("torbed_results_appended_lines", "Records (lines) appended", ["file"], registry=registry)
    Gauge("torbed_results_clients_ready", "Clients that reported ready", registry=registry).set_function(
        lambda: len(ready))
    Gauge("torbed_results_shapers_reported", "Shapers that reported", registry=registry).set_function(
        lambda: len(shaped))
    Gauge("torbed_results_workload_started", "1 once the start barrier opened", registry=registry).set_function(
        lambda: float("t_workload" in start))

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):
            pass

        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _announce(self, pod: str) -> None:
            if not NAME_RE.match(pod):
                return self._reply(400, {"error": f"bad name {pod!r}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                group, ip = str(body["group"]), str(ipaddress.IPv4Address(body["ip"]))
            except (ValueError, KeyError, TypeError) as e:
                return self._reply(400, {"error": f"want {{\"group\": ..., \"ip\": IPv4}}: {e}"})
            if not NAME_RE.match(group):
                return self._reply(400, {"error": f"bad group {group!r}"})
            with lock:
                peers[pod] = {"group": group, "ip": ip}
                return self._reply(200, {"peers": len(peers)})

        def do_GET(self):
            if self.path == "/healthz":
                return self._reply(200, {"ok": True})
            if self.path == "/metrics":
                data = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if self.path == "/files":
                return self._reply(200, {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()})
            if self.path.startswith("/files/"):
                name = self.path[len("/files/"):]
                if not NAME_RE.match(name) or not (directory / name).is_file():
                    return self._reply(404, {"error": f"no file {name!r}"})
                with lock:
                    data = (directory / name).read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if self.path == "/caches":
                with lock:
                    return self._reply(200, {"caches": sorted(caches)})
            if self.path == "/peers":
                with lock:
                    return self._reply(200, {"pods": dict(peers)})
            if self.path == "/start":
                with lock:
                    if "t_workload" in start:
                        return self._reply(200, {**start, "clients": sorted(ready)})
                self.send_response(204)
                self.end_headers()
                return
            self._reply(404, {"error": "not found"})

        def do_POST(self):
            if self.path.startswith("/peer/"):
                return self._announce(self.path[len("/peer/"):])
            if self.path.startswith("/cache/"):
                pod = self.path[len("/cache/"):]
                if not NAME_RE.match(pod):
                    return self._reply(400, {"error": f"bad name {pod!r}"})
                with lock:
                    caches.setdefault(pod, time.time())
                    return self._reply(200, {"caches": len(caches)})
            for prefix, seen in (("/ready/", ready), ("/shaped/", shaped)):
                if not self.path.startswith(prefix):
                    continue
                name = self.path[len(prefix):]
                if not NAME_RE.match(name):
                    return self._reply(400, {"error": f"bad name {name!r}"})
                with lock:
                    seen.setdefault(name, time.time())
                    if len(ready) >= clients and len(shaped) >= shapers and "t_workload" not in start:
                        start.update(t_workload=time.time() + START_LEAD_S, t_all_ready=time.time())
                    return self._reply(200, {"ready": len(ready), "of": clients, "shaped": len(shaped),
                                             "shapers": shapers, **start})
            prefix = "/append/"
            name = self.path[len(prefix):] if self.path.startswith(prefix) else ""
            if not NAME_RE.match(name):
                return self._reply(400, {"error": f"bad file name {name!r}"})
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length)
            if data and not data.endswith(b"\n"):
                return self._reply(400, {"error": "append whole lines only"})
            with lock, open(directory / name, "ab") as f:
                f.write(data)
            appended_bytes.labels(name).inc(len(data))
            appended_lines.labels(name).inc(data.count(b"\n"))
            self._reply(200, {"appended": len(data)})

    return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="torbed results service (runs in the results pod)")
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--clients", type=int, default=1, help="clients the start barrier waits for")
    ap.add_argument("--shapers", type=int, default=0, help="shapers the start barrier waits for")
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    server = http.server.ThreadingHTTPServer((args.bind, args.port), make_handler(args.dir, args.clients, args.shapers))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever(poll_interval=0.5)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
