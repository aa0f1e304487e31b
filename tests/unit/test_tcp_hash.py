"""Namespaces get a TCP hash table of their own while a run creates them (netns.private_tcp_hash):
the sysctl is set for that moment only, put back afterwards and after a crash (torbed clean),
and a value the machine already has is left alone. The sysctl is a stand-in file here; the
integration gate test checks the real one in real namespaces."""

from __future__ import annotations

import pytest

from torbed import constants
from torbed.backends.local import netns


@pytest.fixture
def sysctl(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "STATE_DIR", tmp_path / "state")
    f = tmp_path / "tcp_child_ehash_entries"
    f.write_text("0\n")
    return f


def test_set_while_creating_and_put_back_after(sysctl):
    with netns.private_tcp_hash(1024, sysctl) as got:
        assert got == "private 1024 buckets" and sysctl.read_text() == "1024\n"
        assert (constants.STATE_DIR / netns.EHASH_RESTORE).read_text() == "0\n"
    assert sysctl.read_text() == "0\n" and not (constants.STATE_DIR / netns.EHASH_RESTORE).exists()


def test_put_back_when_creating_fails(sysctl):
    with pytest.raises(RuntimeError):
        with netns.private_tcp_hash(1024, sysctl):
            raise RuntimeError("ip netns add failed")
    assert sysctl.read_text() == "0\n"


def test_a_value_the_machine_has_is_used_and_kept(sysctl):
    sysctl.write_text("4096\n")
    with netns.private_tcp_hash(1024, sysctl) as got:
        assert "private 4096 buckets" in got and sysctl.read_text() == "4096\n"
    assert sysctl.read_text() == "4096\n"


def test_without_the_sysctl_the_table_is_shared_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "STATE_DIR", tmp_path / "state")
    with netns.private_tcp_hash(1024, tmp_path / "missing") as got:
        assert got.startswith("shared: this kernel has no per-namespace TCP hash")


def test_clean_puts_back_what_a_killed_run_left(sysctl):
    assert netns.restore_tcp_hash(sysctl) is False          # nothing left: nothing done
    constants.STATE_DIR.mkdir(parents=True)
    (constants.STATE_DIR / netns.EHASH_RESTORE).write_text("0\n")
    sysctl.write_text("1024\n")                              # a run died between set and restore
    assert netns.restore_tcp_hash(sysctl) is True
    assert sysctl.read_text() == "0\n" and not (constants.STATE_DIR / netns.EHASH_RESTORE).exists()
