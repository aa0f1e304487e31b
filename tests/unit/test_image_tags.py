"""Content-addressed image tags (torbed.images.content_tag): a hash of what each build reads,
computed on a copy of the repository whose files the tests change one at a time."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from torbed import images

KINDS = ["dirauth", "client", "locust", "relay", "prometheus", "nightly"]
COPIED = ["images", "hack", "torbed", "replay", "analysis", "charts/torbed", "scenarios",
          "pyproject.toml", "setup.py", "MANIFEST.in", "LICENSE"]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A copy of the files the image builds read, as the module's repository."""
    root = tmp_path / "repo"
    for rel in COPIED:
        src, dst = images.REPO / rel, root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "target"))
        elif src.exists():
            shutil.copy2(src, dst)
    monkeypatch.setattr(images, "REPO", root)
    return root


def _tags(families=None) -> dict[str, str]:
    return {img.tag: images.content_tag(img) for img in images.plan(None, KINDS, families)}


def _changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {t for t in before if before[t] != after[t]}


def test_a_content_tag_is_the_tag_plus_a_digest_and_stable(repo):
    a, b = _tags(), _tags()
    assert a == b
    for t, ct in a.items():
        assert ct.startswith(t + "-") and len(ct) == len(t) + 13, ct
        assert all(c in "0123456789abcdef" for c in ct[-12:])
    assert len(set(a.values())) == len(a)


def test_a_changed_tor_patch_gives_its_relay_image_a_new_tag_and_not_prometheus(repo):
    before = _tags()
    patch = repo / "images/relay/variants/torchestra/0001-torchestra-light-heavy-channel-pairs.patch"
    patch.write_text(patch.read_text() + "\n")
    after = _tags()
    changed = _changed(before, after)
    assert "torbed/relay:torchestra-0.1.0" in changed
    # Every image that copies images/relay/variants/ (dirauth, client, the relays, nightly)
    # changes; the one that does not, stays.
    assert "torbed/prometheus:0.1.0" not in changed and "torbed/dirauth:0.1.0" in changed


def test_a_changed_tor_build_script_retags_every_image_with_tor(repo):
    before = _tags()
    script = repo / "images/relay/build-tor.sh"
    script.write_text(script.read_text() + "\n# rebuilt\n")
    changed = _changed(before, _tags())
    tor_images = {t for t in before if t.split("/")[1].split(":")[0] in ("dirauth", "client", "locust", "relay")}
    assert changed == tor_images


def test_torbed_sources_retag_the_images_that_install_them_only(repo):
    before = _tags()
    f = repo / "torbed/pods/results.py"
    f.write_text(f.read_text() + "\n")
    assert _changed(before, _tags()) == {"torbed/client:0.1.0", "torbed/locust:0.1.0", "torbed/nightly:0.1.0"}


def test_what_the_context_leaves_out_and_labels_change_nothing(repo, monkeypatch):
    before = _tags()
    cache = repo / "torbed/pods/__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "results.cpython-311.pyc").write_bytes(b"\0")
    monkeypatch.setenv("TORBED_IMAGE_SOURCE", "https://example.org/another/clone.git")
    assert _tags() == before


def test_the_executable_bit_and_a_build_argument_count(repo, monkeypatch):
    before = _tags()
    (repo / "images/common").chmod(0o755)
    common = sorted(p for p in (repo / "images/common").iterdir() if p.is_file())[0]
    common.chmod(common.stat().st_mode ^ 0o111)
    assert "torbed/dirauth:0.1.0" in _changed(before, _tags())
    common.chmod(common.stat().st_mode ^ 0o111)
    assert _tags() == before
    monkeypatch.setattr(images.constants, "TOR_VERSION", "0.4.9.99")
    assert "torbed/relay:vanilla-0.1.0" in _changed(before, _tags())


def test_a_copy_source_that_does_not_exist_is_named(repo):
    df = repo / "images/prometheus/Dockerfile"
    df.write_text(df.read_text() + "\nCOPY images/prometheus/missing.yml /etc/x.yml\n")
    img = next(i for i in images.plan(None, ["prometheus"]) if i.kind == "prometheus")
    with pytest.raises(images.ImageInputError, match=r"images/prometheus/Dockerfile: COPY source "
                                                     r"images/prometheus/missing.yml does not exist"):
        images.content_tag(img)


def test_the_command_prints_each_tag_with_its_content_tag():
    p = subprocess.run([sys.executable, "-m", "torbed.images", "--content-tags", "--images", "relay",
                        "--variants", "vanilla"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (line,) = p.stdout.splitlines()
    plain, content = line.split()
    assert plain == "torbed/relay:vanilla-0.1.0" and content.startswith(plain + "-")
