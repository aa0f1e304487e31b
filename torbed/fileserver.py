"""The testbed's HTTP file server: seeded files of the scenario's sizes, checksummed.

Run inside a server node (``python -m torbed.fileserver --dir D --bind ADDR --port P``).
Files are generated once per run by ``generate_files`` (deterministic from the seed, file
name and size) and described by a manifest ``{name: {"size", "sha256"}}`` that clients use
to verify every download.

Public API:

- ``generate_files(directory, files: {name: size}, seed) -> manifest``
- ``prepare_files(scenario) -> {group: manifest}``: every server group's files, generated
  once into the cache (content is deterministic) and reused; ``manifest["_dir"]`` is where
- ``serve(directory, bind, port, log_path)`` (blocks; SIGTERM stops it)
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import random
import shutil
import signal
import sys
from pathlib import Path

CHUNK = 1 << 20


def generate_files(directory: Path, files: dict[str, int], seed: int) -> dict[str, dict]:
    directory.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name, size in sorted(files.items()):
        rng = random.Random(f"{seed}:{name}:{size}")
        h = hashlib.sha256()
        with open(directory / name, "wb") as f:
            left = size
            while left > 0:
                block = rng.randbytes(min(CHUNK, left))
                f.write(block)
                h.update(block)
                left -= len(block)
        manifest[name] = {"size": size, "sha256": h.hexdigest()}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def files_key(group: str, files: dict[str, int], seed: int) -> str:
    h = hashlib.sha256(json.dumps([seed, sorted(files.items())]).encode()).hexdigest()[:12]
    return f"{group}-{h}"


def prepare_files(scenario) -> dict[str, dict]:
    """Generate (or reuse from the cache) every server group's files. Returns {group:
    manifest}; files live in CACHE_DIR/files/<files_key>/."""
    from . import constants
    manifests = {}
    for g, sg in scenario.servers.items():
        if not sg.files:
            continue   # a replay-only server
        extra = scenario.load_files() if g == scenario.load_server() else {}
        files = {name: size.bytes for name, size in {**sg.files, **extra}.items()}
        d = constants.CACHE_DIR / "files" / files_key(g, files, scenario.seed)
        m = d / "manifest.json"
        if m.exists():
            manifests[g] = json.loads(m.read_text())
        else:
            tmp = d.with_name(d.name + f".tmp{os.getpid()}")
            manifests[g] = generate_files(tmp, files, scenario.seed)
            shutil.rmtree(d, ignore_errors=True)
            tmp.rename(d)
        manifests[g]["_dir"] = str(d)
    return manifests


class _Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_file = None

    def log_message(self, fmt, *args):
        if self.log_file:
            self.log_file.write("%s %s\n" % (self.address_string(), fmt % args))
            self.log_file.flush()


def serve(directory: Path, bind: str, port: int, log_path: Path | None = None) -> None:
    _Handler.log_file = open(log_path, "a") if log_path else None
    handler = lambda *a, **kw: _Handler(*a, directory=str(directory), **kw)  # noqa: E731
    server = http.server.ThreadingHTTPServer((bind, port), handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="torbed HTTP file server (runs inside a server node)")
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=80)
    ap.add_argument("--log", type=Path, default=None)
    args = ap.parse_args(argv)
    serve(args.dir, args.bind, args.port, args.log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
