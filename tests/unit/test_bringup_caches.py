"""Local bring-up: when a relay's data directory can serve a client's bootstrap
(backends.local._cache_problem), from files laid out as tor writes them."""

from __future__ import annotations

from torbed.backends.local.backend import _cache_problem, _microdescs_held

MD = b"onion-key\n-----BEGIN RSA PUBLIC KEY-----\nAAAA\n-----END RSA PUBLIC KEY-----\nntor-onion-key x=\nid ed25519 y\n"


def test_no_consensus_then_partial_then_every_microdescriptor(tmp_path):
    assert _cache_problem(tmp_path, 3) == "no microdescriptor consensus"
    (tmp_path / "cached-microdesc-consensus").write_text("network-status-version 3 microdesc\n")
    assert _cache_problem(tmp_path, 3) == "0 of 3 microdescriptors"
    (tmp_path / "cached-microdescs.new").write_bytes(MD + MD)
    assert _microdescs_held(tmp_path) == 2
    assert _cache_problem(tmp_path, 3) == "2 of 3 microdescriptors"
    # tor moves the journal into cached-microdescs when it rebuilds the store: both count.
    (tmp_path / "cached-microdescs").write_bytes(b"@last-listed 2026-11-23 23:00:00\n" + MD)
    assert _cache_problem(tmp_path, 3) is None
