"""The process environments torbed starts tor and its own helpers with.

Public API:

- ``tor_env(overrides=None) -> dict``: tor's environment (two glibc malloc settings, see
  below), with a variant's own settings over them (an empty value unsets)
- ``child_env() -> dict``: torbed's helper processes (drivers, collectors, servers): the
  repository importable, output unbuffered
- ``TOR_MALLOC_ENV``: {variable: (torbed override variable, default)}
"""

from __future__ import annotations

import os

from ... import resources

# glibc malloc settings for tor, by environment variable: (torbed override, default).
# Neither changes what tor does, only how freed memory goes back to the kernel; see tor_env.
TOR_MALLOC_ENV = {"MALLOC_ARENA_MAX": ("TORBED_MALLOC_ARENA_MAX", "1"),
                  "MALLOC_MMAP_THRESHOLD_": ("TORBED_MALLOC_MMAP_THRESHOLD", "131072")}


def tor_env(overrides: dict | None = None) -> dict:
    """tor's environment, with two glibc malloc settings (each overridable by its TORBED_
    variable; empty leaves glibc's default). Directory caches (guards) and authorities
    compress every new consensus and each consensus diff with lzma (preset 6: 12.5 + 16.3 + 64 MiB
    of encoder state) and zstd (level 9: 16.7 MiB) in worker threads, several times per
    consensus; tor's own data is ~3 MiB.

    - MALLOC_MMAP_THRESHOLD_=131072 (128 KiB, glibc's initial value, now fixed): glibc
      otherwise raises its mmap threshold to the size of the first such buffer it frees, so
      later ones come from the heap, and freed heap is kept (holes below live chunks; a top
      below the equally raised trim threshold). Measured on a 100-relay network: guards
      held 45-85 MiB, of which 71 MiB free heap (malloc_info; malloc_trim brought one from 85
      to 14 MiB); with the fixed threshold 17-30 MiB. Allocations below 128 KiB (cells,
      buffers, circuits) are served as before.
    - MALLOC_ARENA_MAX=1: each worker thread otherwise keeps its own arena: 70 MiB RSS per
      guard instead of 41 MiB (before the threshold was fixed).

    Cell processing is single-threaded and never allocates 128 KiB at once, so this changes
    memory, not scheduling. A multi-threaded relay variant sets its own (``overrides``, from
    its variant.yaml ``env``: mtrelay unsets MALLOC_ARENA_MAX, see its README A.9)."""
    env = dict(os.environ)
    for var, (override, default) in TOR_MALLOC_ENV.items():
        value = os.environ.get(override, default)
        if value:
            env[var] = value
        else:
            env.pop(var, None)
    for var, value in (overrides or {}).items():
        if value:
            env[var] = value
        else:
            env.pop(var, None)
    return env


def child_env() -> dict:
    env = dict(os.environ)
    root = str(resources.package_parent())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env
