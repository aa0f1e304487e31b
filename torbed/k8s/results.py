"""The results service: measuring pods append JSON lines to files here as they write them.

POST /append/<file>   append the body (whole lines) to <file>, under one lock per service so
                      concurrent writers never interleave within a line
GET  /files           {file: size}
GET  /healthz         readiness
The directory is fetched with ``kubectl exec ... tar`` (NOTES.txt, torbed run --backend k8s).
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import signal
import sys
import threading
from pathlib import Path

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def make_handler(directory: Path):
    lock = threading.Lock()

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

        def do_GET(self):
            if self.path == "/healthz":
                return self._reply(200, {"ok": True})
            if self.path == "/files":
                return self._reply(200, {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()})
            self._reply(404, {"error": "not found"})

        def do_POST(self):
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
            self._reply(200, {"appended": len(data)})

    return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="torbed results service (runs in the results pod)")
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    server = http.server.ThreadingHTTPServer((args.bind, args.port), make_handler(args.dir))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever(poll_interval=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
