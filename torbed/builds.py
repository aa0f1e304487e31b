"""tor binaries per variant: built once by images/relay/build-tor.sh, cached by content hash.

Config-only variants (kist, kistlite, ewma-H) share the unpatched "stock" build, so every
variant of a comparison is the same compiler output except for its patches. Authorities and
clients always run the stock build.

Public API:

- ``Build``: key, directory, tor, tor_gencert, info (build.json) ; ``Build.describe()``
- ``cached(key) -> Build | None``
- ``ensure(variant_or_None, console=None, system_tor=False) -> Build`` builds when missing (once
  across processes: a lock per build key);
  with ``system_tor`` config-only variants use the tor on PATH instead (quick experiments;
  recorded as such in meta.json)
- ``BuildError``
- ``compiler_cache_env() -> dict``: the environment that puts ccache in front of the compiler

Builds go through ccache when it is installed (hack/install-deps.sh; TORBED_CCACHE=0 turns it
off): after the first build of a tor version a variant recompiles only the files its patches
change, or that include a header they change (docs/variants.md, "Builds": measured). ccache
hands back the compiler's own output, and build-tor.sh maps its random build directory to a
fixed name (-ffile-prefix-map), so a build is the same binary with or without the cache.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import constants
from .variants import Variant, stock_build_key
from .errors import RunFailed
from .provenance import file_sha256


class BuildError(RunFailed):
    pass


@dataclass(frozen=True)
class Build:
    key: str
    directory: Path | None
    tor: str
    tor_gencert: str
    info: dict = field(default_factory=dict)

    def describe(self) -> dict:
        sha = self.info.get("tor_sha256") or self.info.get("binaries", {}).get("tor", {}).get("sha256")
        return {"key": self.key, "tor": self.tor, "tor_sha256": sha, "tor_version": self.info.get("tor_version"),
                "patches": [p.get("file") for p in self.info.get("patches", [])]}


def build_dir(key: str) -> Path:
    return constants.CACHE_DIR / "tor" / key


@functools.lru_cache(maxsize=None)
def _cached_info(key: str, mtime: float) -> dict:
    return json.loads((build_dir(key) / "build.json").read_text())


def cached(key: str) -> Build | None:
    d = build_dir(key)
    tor, gencert, info = d / "bin" / "tor", d / "bin" / "tor-gencert", d / "build.json"
    if tor.exists() and gencert.exists() and info.exists():
        return Build(key=key, directory=d, tor=str(tor), tor_gencert=str(gencert),
                     info=_cached_info(key, info.stat().st_mtime))
    return None


@functools.lru_cache(maxsize=None)
def system_build() -> Build:
    tor, gencert = shutil.which("tor"), shutil.which("tor-gencert")
    if not tor or not gencert:
        raise BuildError("--system-tor: no tor/tor-gencert on PATH (apt-get install tor)")
    version = subprocess.run([tor, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return Build(key="system", directory=None, tor=tor, tor_gencert=gencert,
                 info={"tor_version": version.removeprefix("Tor version ").rstrip("."), "tor_sha256": file_sha256(tor)})


def compiler_cache_env() -> dict[str, str]:
    """What build-tor.sh's environment gets for ccache (empty: no ccache, or TORBED_CCACHE=0).
    The build tree lies in a fresh temporary directory each time, so ccache rewrites paths
    below the temporary directory to relative ones (base_dir) and leaves the working directory
    out of the hash (the debug info maps it anyway)."""
    cc = shutil.which("ccache")
    if not cc or os.environ.get("TORBED_CCACHE", "1") == "0":
        return {}
    return {"CC": f"{cc} {os.environ.get('CC', 'gcc')}", "CCACHE_DIR": str(constants.CACHE_DIR / "ccache"),
            "CCACHE_BASEDIR": os.path.realpath(os.environ.get("TMPDIR") or tempfile.gettempdir()),
            "CCACHE_NOHASHDIR": "1", "CCACHE_MAXSIZE": os.environ.get("CCACHE_MAXSIZE", "2G")}


def ensure(variant: Variant | None, console=None, system_tor: bool = False) -> Build:
    """The variant's build (None: stock), built when missing. Two processes that need the same
    build (the tests' prebuild and the images built beside it) build it once: the second waits
    for the first on the key's lock and finds it cached."""
    patches = tuple(variant.patches) if variant else ()
    if system_tor and not patches:
        return system_build()
    key = variant.build_key if variant else stock_build_key()
    hit = cached(key)
    if hit:
        return hit
    lock = build_dir(key).with_name(f".{key}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return cached(key) or _build(variant, key, patches, console)


def _build(variant: Variant | None, key: str, patches: tuple, console) -> Build:
    if not constants.BUILD_SCRIPT.exists():
        raise BuildError(f"{constants.BUILD_SCRIPT} is missing")
    cmd = ["bash", str(constants.BUILD_SCRIPT), "--out", str(build_dir(key))]
    for p in patches:
        cmd += ["--patch", str(p)]
    name = variant.name if variant else "stock"
    if console:
        console.log(f"building tor for variant {name} (key {key}); a few minutes, cached afterwards")
    log = constants.CACHE_DIR / "logs" / f"build-{key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **compiler_cache_env()}).returncode
    if rc != 0:
        raise BuildError(f"building variant {name} failed (exit {rc}); log: {log}\n"
                         + "\n".join(log.read_text(errors="replace").splitlines()[-20:]))
    hit = cached(key)
    if not hit:
        raise BuildError(f"build script succeeded but {build_dir(key)} is incomplete")
    return hit
