"""The mtrelay variant's selection and torrc."""

from __future__ import annotations

import pytest

from torbed import constants
from torbed.variants import VariantError, load_variant

PATCH = constants.VARIANTS_DIR / "mtrelay" / "0001-mtrelay-connection-threads.patch"


def test_default_is_two_connection_threads_on_kist():
    v = load_variant("mtrelay")
    assert v.patches == (PATCH,)
    lines = v.torrc.splitlines()
    assert "RelayConnectionThreads 2" in lines
    assert "Schedulers KIST" in lines


def test_name_sets_the_thread_count_within_the_patch_bounds():
    assert "RelayConnectionThreads 3" in load_variant("mtrelay-3").torrc.splitlines()
    assert "RelayConnectionThreads 1" in load_variant("mtrelay-1").torrc.splitlines()
    assert load_variant("mtrelay-3").build_key == load_variant("mtrelay").build_key
    for bad in ("mtrelay-0", "mtrelay-65"):
        with pytest.raises(VariantError, match="outside"):
            load_variant(bad)


def test_option_and_its_bounds_are_the_patchs():
    text = PATCH.read_text()
    assert 'V(RelayConnectionThreads,      POSINT,   "1")' in text
    assert "RelayConnectionThreads > 64" in text
