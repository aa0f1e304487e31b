"""What pyproject.toml cannot say: torbed's package list and its data files.

- Packages are discovered, not listed: ``torbed.*`` under torbed/, and analysis/ and replay/
  (top-level folders, a fixed layout) as ``torbed.analysis`` and ``torbed.replay``.
- The wheel carries the data runtime code reads (torbed.resources.SHIPPED: chart, variants,
  build script, scenarios, traces, linkemu's sources) under ``torbed/_data`` with the
  repository's layout, so torbed.resources finds them the same way in a checkout and in an
  installed copy. Editable installs need no copy (the checkout is the root).
"""

import fnmatch
import runpy
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
MAPPED = {"torbed.analysis": "analysis", "torbed.replay": "replay"}
_resources = runpy.run_path(str(HERE / "torbed" / "resources.py"))


def packages() -> list[str]:
    found = find_packages(include=["torbed", "torbed.*"])
    for name, folder in MAPPED.items():
        found += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]
    return found


def _ignored(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if any(fnmatch.fnmatch(n, pat) for pat in _resources["EXCLUDED"])}


class BuildWithData(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        dest_root = Path(self.build_lib) / "torbed" / "_data"
        shutil.rmtree(dest_root, ignore_errors=True)  # nothing stale from an earlier build/
        for rel in _resources["SHIPPED"]:
            src, dest = HERE / rel, dest_root / rel
            if not src.exists():
                # An sdist without it (MANIFEST.in) or a partial copy: fail rather than build
                # a wheel whose torbed cannot find its chart or variants.
                raise FileNotFoundError(f"{src}: torbed.resources.SHIPPED lists it, the source tree lacks it")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dest, ignore=_ignored)
            else:
                shutil.copy2(src, dest)


setup(
    package_dir={"torbed": "torbed", **MAPPED},
    packages=packages(),
    # The trace-capture scenario (hack/capture-traces.sh) beside its scripts; tor's option list
    # (torbed.torrc_policy), so installed copies (the client image) check torrc lines too.
    package_data={"torbed.replay.capture": ["*.yaml"], "torbed.analysis": ["*.yaml"], "torbed": ["data/*.txt"]},
    # Not MANIFEST.in's files as package data too: replay/traces lies inside a package folder
    # but ships once, under torbed/_data (as does linkemu/, the crate beside the package).
    include_package_data=False,
    cmdclass={"build_py": BuildWithData},
)
