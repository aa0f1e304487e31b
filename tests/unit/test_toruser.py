"""Which user tor runs as on the local backend (torbed.backends.local.toruser)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torbed.backends.local import toruser
from torbed.errors import InputError


@pytest.fixture
def as_root(monkeypatch):
    monkeypatch.delenv("TORBED_IN_USERNS", raising=False)
    monkeypatch.delenv("TORBED_TOR_UID", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)


def test_the_default_is_a_uid_without_an_account(as_root):
    user, why = toruser.choose()
    assert user == toruser.TorUser(toruser.DEFAULT_UID, toruser.DEFAULT_UID) and why is None
    argv = user.prefix()
    assert argv[1:] == [f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--pdeathsig=KILL", "--"]


def test_root_on_request_and_in_a_user_namespace(as_root, monkeypatch):
    monkeypatch.setenv("TORBED_TOR_UID", "0")
    assert toruser.choose() == (None, "TORBED_TOR_UID=0")
    monkeypatch.delenv("TORBED_TOR_UID")
    monkeypatch.setenv("TORBED_IN_USERNS", "1")
    user, why = toruser.choose()
    assert user is None and "user namespace" in why


@pytest.mark.parametrize("value, message", [("tor", "a whole number"), ("-5", "not a uid"),
                                            ("1", "is the account 'daemon'")])
def test_a_bad_or_taken_uid_is_refused(as_root, monkeypatch, value, message):
    monkeypatch.setenv("TORBED_TOR_UID", value)
    with pytest.raises(InputError, match=message):
        toruser.choose()


def test_a_binary_tor_cannot_reach_is_copied_into_the_scratch_directory(tmp_path):
    user = toruser.TorUser(toruser.DEFAULT_UID, toruser.DEFAULT_UID)
    assert toruser.reachable_binary("/usr/bin/env", tmp_path, user) == "/usr/bin/env"
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "tor").write_bytes(b"#!/bin/sh\n")
    copy = Path(toruser.reachable_binary(str(home / "tor"), tmp_path / "scratch", user))
    assert copy.parent.parent == tmp_path / "scratch" / "bin" and copy.read_bytes() == b"#!/bin/sh\n"
    assert copy.stat().st_mode & 0o777 == 0o755 and copy.parent.stat().st_mode & 0o777 == 0o755
    assert toruser.reachable_binary(str(home / "tor"), tmp_path / "scratch", None) == str(home / "tor")
    # Executable by anyone and on the same file system: a hard link, no copy.
    (home / "tor2").write_bytes(b"#!/bin/sh\n")
    (home / "tor2").chmod(0o755)
    link = Path(toruser.reachable_binary(str(home / "tor2"), tmp_path / "scratch", user))
    assert link.stat().st_ino == (home / "tor2").stat().st_ino
