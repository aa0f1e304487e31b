"""The part table of ``python -m torbed.bench`` (make bench): every part runs something that exists."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from torbed.bench.__main__ import PARTS, command


@pytest.mark.parametrize("part", [p for p in PARTS if p.module], ids=lambda p: p.name)
def test_every_module_part_has_a_main_taking_out_and_its_quick_arguments(part):
    module = importlib.import_module(part.command[0])
    assert callable(module.main)
    cmd = command(part, "/tmp/bench-out", quick=True)
    assert cmd[:3] == [sys.executable, "-m", part.command[0]] and cmd[3:5] == ["--out", "/tmp/bench-out"]
    help_text = subprocess.run([sys.executable, "-m", part.command[0], "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    for arg in ["--out", *part.quick]:
        if arg.startswith("--"):
            assert arg in help_text, f"{part.name}: {arg} not among its options"


def test_an_unknown_part_is_refused_before_anything_runs():
    p = subprocess.run([sys.executable, "-m", "torbed.bench", "nosuch"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown part(s) nosuch" in p.stderr


def test_every_part_with_figures_has_rows_in_the_docs_table():
    # docs/performance.md's table (torbed.bench.table) knows each module part's results format;
    # `experiments` is a set of pass/fail tests.
    from torbed.bench import table
    assert list(table.PARTS) == [p.name for p in PARTS if p.module]
