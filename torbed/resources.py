"""Where torbed's data files are: the chart, the relay variants and their build script, the
example scenarios, the replay traces and the linkemu crate's sources.

They sit under one root with the repository's layout (``charts/torbed``, ``scenarios``, ...),
the first of:

1. ``$TORBED_HOME``, when set: a checkout, or any copy of that layout;
2. the checkout this package was imported from (``<root>/torbed`` beside ``<root>/pyproject.toml``);
3. the copy a wheel carries (``torbed/_data``, written by setup.py from ``SHIPPED``).

- ``ROOT: Path``            that root
- ``CHECKOUT: Path | None`` ``ROOT`` when it is a whole repository (pyproject.toml, hack/,
  images/...), else None (an installed copy)
- ``checkout(purpose) -> Path`` ``CHECKOUT``, for what only a repository has (image builds,
  benchmarks, docs/); raises ``ResourceError`` saying so in an installed copy
- ``package_parent() -> Path`` the folder ``import torbed`` works from (helper processes' PYTHONPATH)
- ``path(rel) -> Path``     ``ROOT / rel``; raises ``ResourceError`` for a path not in ``SHIPPED``
- ``SHIPPED``               the paths under the root that a wheel carries (setup.py, MANIFEST.in)

Nothing here imports the rest of torbed: setup.py reads ``SHIPPED`` from this file at build time.
"""

from __future__ import annotations

import os
from pathlib import Path

# Everything runtime code reads from the root; setup.py copies these into the wheel and
# MANIFEST.in into the sdist (a unit test checks both agree).
SHIPPED = (
    "charts/torbed",
    "images/relay/variants",
    "images/relay/build-tor.sh",
    "scenarios",
    "replay/traces",
    "linkemu",
)
# Never shipped: build output and caches inside those folders.
EXCLUDED = ("target", "__pycache__", "*.pyc")

PACKAGE_DIR = Path(__file__).resolve().parent
INSTALLED_DATA = PACKAGE_DIR / "_data"


class ResourceError(LookupError):
    """A data path torbed does not ship was asked for."""


def _is_checkout(root: Path) -> bool:
    return (root / "pyproject.toml").is_file() and (root / "charts" / "torbed").is_dir()


def _root() -> Path:
    if os.environ.get("TORBED_HOME"):
        return Path(os.environ["TORBED_HOME"]).resolve()
    return PACKAGE_DIR.parent if _is_checkout(PACKAGE_DIR.parent) else INSTALLED_DATA


ROOT = _root()
CHECKOUT = ROOT if _is_checkout(ROOT) else None


def checkout(purpose: str) -> Path:
    """The repository, for ``purpose`` (e.g. "building images"); raises ResourceError without one."""
    if CHECKOUT is None:
        raise ResourceError(f"{purpose} needs a torbed checkout, and this torbed is an installed copy "
                            f"(data in {ROOT}): run it from a clone, or set TORBED_HOME to one")
    return CHECKOUT


def package_parent() -> Path:
    return PACKAGE_DIR.parent


def path(rel: str) -> Path:
    """``ROOT / rel`` for a path inside one of ``SHIPPED`` (so an installed copy has it too)."""
    if not any(rel == s or rel.startswith(s + "/") for s in SHIPPED):
        raise ResourceError(f"{rel} is not among torbed's shipped data ({', '.join(SHIPPED)}); "
                            "add it to torbed.resources.SHIPPED and MANIFEST.in")
    return ROOT / rel
