"""A server group's pod: generate the scenario's files (and the background load's, on the
load's server group) from the seed (the same bytes and
checksums as the local backend's) and serve them over HTTP."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import fileserver
from ..errors import EXIT_OK
from . import load_scenario, log


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="torbed file server pod")
    ap.add_argument("--scenario", type=Path, required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args(argv)
    s = load_scenario(args.scenario)
    files = {name: size.bytes for name, size in s.servers[args.group].files.items()}
    if args.group == s.load_server():   # the background users' files (load-<mix name>), as locally
        files.update({name: size.bytes for name, size in s.load_files().items()})
    manifest = fileserver.generate_files(args.dir, files, s.seed)
    log(f"server {args.group}: {len(manifest)} files generated; serving on :{args.port}")
    fileserver.serve(args.dir, "0.0.0.0", args.port)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
