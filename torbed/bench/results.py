"""What every benchmark part records about its own run, beside its figures: the ``bench_run``
field of each results file (``<out>/<part>-<UTC stamp>.json``). docs/performance.md's table
(torbed.bench.table) reads its date, settings and host from it.

- ``bench_run(part, argv, quick=False) -> dict``: part, started (UTC, ISO 8601), host
  (cores, hostname, 1-minute load average), settings (quick or full, and the part's own
  arguments but ``--out``), the checkout's commit
- ``stamp(started) -> str``: the file-name stamp of a ``started`` time
- ``QUICK_ENV``: set to 1 by ``python -m torbed.bench --quick`` for the parts it runs, so a
  part records that its arguments are its quick settings
"""

from __future__ import annotations

import datetime as dt
import os
import socket

from ..resume import git_commit

QUICK_ENV = "TORBED_BENCH_QUICK"


def _without_out(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            out.append(a)
    return out


def bench_run(part: str, argv: list[str] | None, quick: bool = False) -> dict:
    """``quick``: the part's own --quick flag; ``python -m torbed.bench --quick`` sets QUICK_ENV."""
    quick = quick or os.environ.get(QUICK_ENV) == "1"
    return {"part": part, "started": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": {"cpus": os.cpu_count(), "hostname": socket.gethostname(), "load1": round(os.getloadavg()[0], 2)},
            "settings": {"quick": quick, "args": _without_out(list(argv or []))}, "commit": git_commit()}


def stamp(started: str) -> str:
    """'2026-11-28T00:01:02Z' -> '20261128T000102Z' (the results file's name)."""
    return started.replace("-", "").replace(":", "")
