"""Reading files that come from users, safely: bounded size, bounded nesting, one clear line.

Every file torbed takes in (scenario, Helm values, trace, pcap, a nightly list) goes through
here first, so a file that is binary, not UTF-8, empty, enormous or absurdly nested fails in
well under a second, with bounded memory, as an ``InputError`` whose message is one line
naming the file. Callers that have their own error type wrap the message (``ScenarioError``,
``TraceError``, ``PcapError`` are InputErrors too).

Public API:

- ``read_bytes(path, what, max_bytes) -> bytes``   size-checked, never reads past the limit
- ``read_text(path, what, max_bytes) -> str``      + not empty, not binary, strict UTF-8
- ``load_yaml(path, what, ...) -> object``         + YAML, nesting and expanded size checked
- ``load_json(path, what, ...) -> object``         + JSON, the same checks
- ``check_shape(data, where, max_depth, max_nodes)``  the nesting/size check on parsed data
- ``open_lines(path, what, max_bytes, max_line)``  line iterator for (gzip) JSON lines files
- ``FileInputError``: InputError with ``.path``
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from pathlib import Path

import yaml

from .errors import InputError

MiB = 1 << 20
# A scenario or values file is a few KB; 4 MiB leaves room for generated ones.
MAX_CONFIG_BYTES = 4 * MiB
# Deeper than any scenario (about 6 levels) by far; far below Python's recursion limit.
MAX_DEPTH = 64
# Nodes after expanding YAML aliases: stops "billion laughs" before validation walks them.
MAX_NODES = 200_000


class FileInputError(InputError):
    """A file that cannot be used. str() is one line: '<path>: <what is wrong>'."""

    def __init__(self, path: str | Path, why: str):
        self.path = str(path)
        self.why = why
        super().__init__(f"{path}: {why}")


def _size_text(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n} bytes"


def read_bytes(path: str | Path, what: str = "file", max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """The file's bytes; FileInputError if it cannot be read or exceeds ``max_bytes``.
    Reads at most max_bytes + 1 bytes (so /dev/zero or a huge file costs nothing)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > max_bytes:   # a regular file: no need to read it
                raise FileInputError(path, f"too large for a {what} (more than {_size_text(max_bytes)})")
            data = f.read(max_bytes + 1)
    except IsADirectoryError:
        raise FileInputError(path, f"is a directory, not a {what}") from None
    except OSError as e:
        raise FileInputError(path, f"cannot read {what}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise FileInputError(path, f"too large for a {what} (more than {_size_text(max_bytes)})")
    return data


def decode_text(data: bytes, path: str | Path, what: str) -> str:
    """Strict UTF-8 text that is not empty and not binary."""
    if not data.strip():
        raise FileInputError(path, f"empty file (expected a {what})")
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise FileInputError(path, f"UTF-16 text (byte order mark); not UTF-8 text: a {what} must be UTF-8")
    if b"\x00" in data:
        at = data.index(b"\x00")
        raise FileInputError(path, f"binary data (a NUL byte at offset {at}), not a {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileInputError(path, f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                                   f"a {what} must be UTF-8") from None


def read_text(path: str | Path, what: str = "file", max_bytes: int = MAX_CONFIG_BYTES) -> str:
    return decode_text(read_bytes(path, what, max_bytes), path, what)


def check_shape(data: object, where: str | Path, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Raise FileInputError when ``data`` nests deeper than max_depth or has more than
    max_nodes nodes counting shared (aliased) ones each time they occur. Iterative, and
    memoised by identity, so an alias bomb is measured without being expanded."""
    sizes: dict[int, int] = {}
    # (node, depth, children pushed?) -- post-order without recursion.
    stack: list[tuple[object, int, bool]] = [(data, 1, False)]
    while stack:
        node, depth, expanded = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth > max_depth:
            raise FileInputError(where, f"nested more than {max_depth} levels deep")
        children = list(node.values()) + list(node.keys()) if isinstance(node, dict) else node
        if id(node) in sizes:
            continue
        if not expanded:
            stack.append((node, depth, True))
            stack.extend((c, depth + 1, False) for c in children if isinstance(c, (dict, list)) and id(c) not in sizes)
            continue
        total = 1 + sum(sizes.get(id(c), 1) for c in children)
        if total > max_nodes:
            raise FileInputError(where, f"too many values (more than {max_nodes} once aliases are expanded)")
        sizes[id(node)] = total


def _yaml_depth(text: str, path, max_depth: int) -> None:
    """Stop at the first collection nested deeper than max_depth, from the event stream
    (iterative, so it is fast where the recursive composer would crawl into a
    RecursionError)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                raise FileInputError(path, f"nested more than {max_depth} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load_yaml(path: str | Path, what: str = "YAML file", max_bytes: int = MAX_CONFIG_BYTES,
              max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> object:
    """Parse a YAML file (safe loader) after the text checks; shape-checked."""
    text = read_text(path, what, max_bytes)
    try:
        _yaml_depth(text, path, max_depth)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise FileInputError(path, f"not valid YAML: {at}{problem}") from None
    except RecursionError:
        raise FileInputError(path, f"nested more than {max_depth} levels deep") from None
    check_shape(data, path, max_depth, max_nodes)
    return data


def load_json(path: str | Path, what: str = "JSON file", max_bytes: int = MAX_CONFIG_BYTES,
              max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> object:
    text = read_text(path, what, max_bytes)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FileInputError(path, f"not valid JSON: line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise FileInputError(path, f"nested more than {max_depth} levels deep") from None
    check_shape(data, path, max_depth, max_nodes)
    return data


class _Limited(io.RawIOBase):
    """A read-only stream that fails once more than ``limit`` bytes came through (a
    gzip bomb stops at the limit instead of filling memory)."""

    def __init__(self, inner, limit: int, path, what):
        self.inner, self.limit, self.seen, self.path, self.what = inner, limit, 0, path, what

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.inner.readinto(b)
        self.seen += n or 0
        if self.seen > self.limit:
            raise FileInputError(self.path, f"too large for a {self.what} (more than {_size_text(self.limit)}"
                                            " uncompressed)")
        return n


def open_lines(path: str | Path, what: str, max_bytes: int, max_line: int = MiB, max_lines: int = 1_000_000):
    """Yield (line number, str) of a text file, plain or gzip (by content), checking as it
    goes: at most ``max_bytes`` (uncompressed) in at most ``max_lines`` lines (blank ones
    included: a gzip of nothing but newlines would otherwise cost a loop turn per byte),
    lines of at most ``max_line`` bytes, strict UTF-8, no NUL bytes, not empty. Raises
    FileInputError."""
    try:
        raw = open(path, "rb")
    except IsADirectoryError:
        raise FileInputError(path, f"is a directory, not a {what}") from None
    except OSError as e:
        raise FileInputError(path, f"cannot read {what}: {e.strerror or e}") from None
    with raw:
        head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
        stream = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw
        limited = io.BufferedReader(_Limited(stream, max_bytes, path, what))
        any_text = False
        n = 0
        try:
            while True:
                line = limited.readline(max_line + 1)
                if not line:
                    break
                n += 1
                if n > max_lines:
                    raise FileInputError(path, f"more than {max_lines} lines; too large for a {what}")
                if len(line) > max_line and not line.endswith(b"\n"):
                    raise FileInputError(path, f"line {n} is longer than {_size_text(max_line)}; not a {what}")
                if b"\x00" in line:
                    raise FileInputError(path, f"binary data (a NUL byte on line {n}), not a {what}")
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise FileInputError(path, f"not UTF-8 text (line {n}, byte 0x{line[e.start]:02x}); "
                                               f"a {what} must be UTF-8") from None
                any_text = any_text or bool(text.strip())
                yield n, text
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise FileInputError(path, f"damaged gzip data: {e}") from None
        except OSError as e:
            raise FileInputError(path, f"cannot read {what}: {e.strerror or e}") from None
        if not any_text:
            raise FileInputError(path, f"empty file (expected a {what})")
