"""The mtrelay variant's selection and torrc."""

from __future__ import annotations

import pytest

from torbed import constants
from torbed.backends.local.torenv import tor_env
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


def test_relays_get_glibcs_arena_default_instead_of_one_arena():
    """torbed starts tor with MALLOC_ARENA_MAX=1; mtrelay's connection threads allocate on
    every read, so its variant.yaml unsets it (README A.9) and other variants keep it."""
    assert load_variant("mtrelay-3").env == {"MALLOC_ARENA_MAX": ""}
    assert load_variant("kist").env == {}
    assert "MALLOC_ARENA_MAX" not in tor_env(load_variant("mtrelay").env)
    assert tor_env(load_variant("kist").env).get("MALLOC_ARENA_MAX") == "1"
    assert tor_env({"MALLOC_ARENA_MAX": "4"})["MALLOC_ARENA_MAX"] == "4"


@pytest.mark.parametrize("env, match", [("[a]", "env must map"), ("{lower: 1}", "env must map"),
                                        ('{X: "{nope}"}', "undefined parameter")])
def test_bad_env_in_a_variant_yaml_is_refused(tmp_path, env, match):
    d = tmp_path / "fam"
    d.mkdir()
    (d / "variant.yaml").write_text(f"name: fam\ndescription: d\ntor: 0.4.9.11\ntorrc: ''\nenv: {env}\n")
    with pytest.raises(VariantError, match=match):
        load_variant("fam", variants_dir=tmp_path)
