"""linkemu's control socket from Python: one JSON request line, one JSON answer line.

The protocol is the crate's (linkemu/src/control.rs). Two sides speak it: the local backend,
which runs linkemu (torbed.backends.local.emulator: link table, runtime link changes), and
the collectors' exporter (torbed.collectors), which reads linkemu's counters for Prometheus.

- ``request(socket_path, obj, timeout=5.0) -> dict``: the answer; raises ``EmulatorError``
- ``EmulatorError``: linkemu cannot be reached, built or started, or refused a request
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from .errors import RunFailed


class EmulatorError(RunFailed):
    pass


def request(socket_path: str | Path, obj: dict, timeout: float = 5.0) -> dict:
    """Send one request to linkemu's control socket; returns the answer. Raises EmulatorError."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(socket_path))
            s.sendall(json.dumps(obj).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as e:
        raise EmulatorError(f"linkemu control socket {socket_path}: {e}") from None
    try:
        answer = json.loads(data)
    except json.JSONDecodeError:
        raise EmulatorError(f"linkemu control socket {socket_path}: unreadable answer {data[:200]!r}") from None
    if not answer.get("ok"):
        raise EmulatorError(f"linkemu refused {obj.get('op')}: {answer.get('error')}")
    return answer
