"""JSON-lines records: appended and flushed one per line, so a crash loses nothing written.

Public API:

- ``RecordWriter(path)``: ``.write(dict)`` appends one line with a single ``write(2)`` on an
  O_APPEND descriptor, so several processes may share a file without interleaving lines;
  ``.close()``.
- ``read_records(path) -> list[dict]``: raises ``ValueError`` naming the file and line of a
  malformed record; a truncated last line (a crash mid-write) is skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class RecordWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict) -> None:
        os.write(self.fd, (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_records(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) or (i == len(lines) - 1 and lines[-1] == "" and not path.read_text().endswith("\n")):
                continue  # truncated final line: the writer died mid-record
            raise ValueError(f"{path}:{i}: malformed record: {e}") from None
    return out
