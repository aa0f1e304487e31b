"""Fixtures for torbed.analysis tests: the golden run (tests/data/golden-run) and its report.

torbed.analysis is normally importable through the editable install (pyproject maps
analysis/ to torbed.analysis); if it is not, it is registered here from the source tree.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data"
GOLDEN_RUN = DATA / "golden-run"
GOLDEN_SUMMARY = DATA / "golden-run.summary.json"

try:
    import torbed.analysis  # noqa: F401
except ImportError:  # pragma: no cover - only without the editable install
    sys.path.insert(0, str(REPO))
    import torbed
    spec = importlib.util.spec_from_file_location(
        "torbed.analysis", REPO / "analysis" / "__init__.py",
        submodule_search_locations=[str(REPO / "analysis")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["torbed.analysis"] = mod
    spec.loader.exec_module(mod)
    torbed.analysis = mod


def copy_golden(dest_parent: Path) -> Path:
    """A writable copy of the golden run, keeping its directory name (summary.json records it)."""
    dest = dest_parent / GOLDEN_RUN.name
    shutil.copytree(GOLDEN_RUN, dest, ignore=shutil.ignore_patterns("report"))
    return dest


@pytest.fixture
def golden_copy(tmp_path) -> Path:
    return copy_golden(tmp_path)


@pytest.fixture(scope="module")
def golden_report(tmp_path_factory):
    """The golden run copied and reported once per test module: (run_dir, summary)."""
    from torbed.analysis.report import report
    run_dir = copy_golden(tmp_path_factory.mktemp("golden"))
    summary = report(run_dir)
    return run_dir, summary
