"""tor's glibc malloc environment (torbed.backends.local.torenv.tor_env)."""

from torbed.backends.local.torenv import tor_env as _tor_env


def test_defaults(monkeypatch):
    monkeypatch.delenv("TORBED_MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("TORBED_MALLOC_MMAP_THRESHOLD", raising=False)
    env = _tor_env()
    assert env["MALLOC_ARENA_MAX"] == "1"
    assert env["MALLOC_MMAP_THRESHOLD_"] == "131072"


def test_overrides_and_empty_means_glibc_default(monkeypatch):
    monkeypatch.setenv("TORBED_MALLOC_ARENA_MAX", "")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    monkeypatch.setenv("TORBED_MALLOC_MMAP_THRESHOLD", "1048576")
    env = _tor_env()
    assert "MALLOC_ARENA_MAX" not in env
    assert env["MALLOC_MMAP_THRESHOLD_"] == "1048576"
