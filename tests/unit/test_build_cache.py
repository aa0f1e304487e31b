"""The compiler cache in front of tor builds (torbed.builds.compiler_cache_env):
on when ccache is installed, off with TORBED_CCACHE=0 or without ccache, and set up so a
build in another random temporary directory still hits."""

from __future__ import annotations

import os

from torbed import constants
from torbed import builds


def test_ccache_in_front_of_the_compiler_when_installed(monkeypatch, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ccache").write_text("#!/bin/sh\n")
    (fake / "ccache").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("TORBED_CCACHE", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    env = builds.compiler_cache_env()
    assert env["CC"] == f"{fake / 'ccache'} gcc"
    assert env["CCACHE_DIR"] == str(constants.CACHE_DIR / "ccache")
    # build-tor.sh builds in $TMPDIR/build-tor.XXXXXX: paths below it are made relative.
    assert env["CCACHE_BASEDIR"] == os.path.realpath(tmp_path) and env["CCACHE_NOHASHDIR"] == "1"
    monkeypatch.setenv("CC", "clang")
    assert builds.compiler_cache_env()["CC"].endswith("ccache clang")
    monkeypatch.setenv("TORBED_CCACHE", "0")
    assert builds.compiler_cache_env() == {}


def test_no_ccache_no_change(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("TORBED_CCACHE", raising=False)
    assert builds.compiler_cache_env() == {}
