"""Where a result came from: time stamps, the host, torbed's Python dependencies.

Public API:

- ``utc_now() -> str``                 ISO 8601, seconds, UTC ("2026-11-23T20:01:02Z")
- ``host_info() -> dict``              hostname, kernel, arch, CPU model, cpus, memory, python
- ``cpu_model(cpuinfo=None)``          the CPU's model name from /proc/cpuinfo
- ``file_sha256(path) -> str``        hex SHA-256 of a file's bytes, read in 1 MiB blocks
- ``python_dependencies() -> dict``    {distribution: installed version} of every package
  torbed's metadata requires (pyproject's dependencies), e.g. for run.json / summary.json
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import re
import socket
from importlib import metadata
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def cpu_model(cpuinfo: str | None = None) -> str | None:
    """The CPU's model name from /proc/cpuinfo: x86's "model name", else an arm board's
    "Model" (a Raspberry Pi's "Raspberry Pi 3 Model B Plus Rev 1.3"), else "Hardware"."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return None
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip(), value.strip())
    return fields.get("model name") or fields.get("Model") or fields.get("Hardware") or None


def host_info() -> dict:
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {"hostname": socket.gethostname(), "kernel": platform.release(), "arch": platform.machine(),
            "cpu_model": cpu_model(), "cpus": os.cpu_count(), "memory_bytes": mem,
            "python": platform.python_version()}


def python_dependencies() -> dict[str, str | None]:
    """Installed versions of torbed's runtime dependencies (extras excluded); None for one
    that is missing. Empty when torbed itself is not installed (a bare source tree)."""
    try:
        requires = metadata.requires("torbed") or []
    except metadata.PackageNotFoundError:
        return {}
    out: dict[str, str | None] = {}
    for req in requires:
        if "extra ==" in req:
            continue
        name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return dict(sorted(out.items()))
