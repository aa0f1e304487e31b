"""Generated files kept in the repository and checked to be in sync with their sources (the
chart's generated files, the docs' reference pages).

- ``write(root, files) -> list[str]``  write {relative path: text} under ``root``; the paths whose
  content changed
- ``stale(root, files) -> list[str]``  the paths missing or differing from ``files``
"""

from __future__ import annotations

from pathlib import Path


def write(root: Path, files: dict[str, str]) -> list[str]:
    changed = []
    for rel, text in files.items():
        path = root / rel
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(rel)
    return changed


def stale(root: Path, files: dict[str, str]) -> list[str]:
    return [rel for rel, text in files.items() if not (root / rel).exists() or (root / rel).read_text() != text]
