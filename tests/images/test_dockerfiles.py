"""The Dockerfiles and the image build plan, checked without Docker (fast, every run)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tomllib

import pytest

from torbed import __version__, constants, images, resources
from torbed.variants import list_families, load_variant

REPO = resources.checkout("tests/images")
DOCKERFILES = {kind: REPO / "images" / kind / "Dockerfile" for kind in images.TOR_IMAGES}


def shared_stages(text: str) -> str:
    """From the global BASE_IMAGE arg to the last stage shared by all images (tor-out: the
    compiled tor or this machine's own build)."""
    start = text.index("ARG BASE_IMAGE=debian:bookworm-slim")
    end = text.index("\n", text.index("AS tor-out"))
    return text[start:end]


def test_shared_stages_are_identical():
    # Identical text = identical BuildKit cache keys: the unpatched tor is compiled once for
    # dirauth, client and every config-only relay family.
    texts = {k: shared_stages(p.read_text()) for k, p in DOCKERFILES.items()}
    assert texts["dirauth"] == texts["relay"]
    assert texts["client"] == texts["relay"]


@pytest.mark.parametrize("kind", images.TOR_IMAGES)
def test_dockerfile_conventions(kind):
    text = DOCKERFILES[kind].read_text()
    assert "FROM --platform=$BUILDPLATFORM debian:bookworm-slim AS tor" in text
    # The runtime stage's base defaults to the standard image (another name only for cross
    # builds on dockerd 20.10, which keeps one architecture per tag).
    assert text.startswith("#") and "ARG BASE_IMAGE=debian:bookworm-slim" in text
    runtime = text[text.rindex("\nFROM "):]
    assert runtime.startswith("\nFROM ${BASE_IMAGE}\n")
    assert "USER 10000:10000" in runtime
    assert 'ENTRYPOINT ["/usr/local/bin/torbed-node"]' in runtime
    for label in ("org.opencontainers.image.title", "org.opencontainers.image.description",
                  "org.opencontainers.image.source", "org.opencontainers.image.version",
                  "io.torbed.tor-version", "io.torbed.variant"):
        assert label + "=" in runtime, label
    assert f"ARG TOR_VERSION={constants.TOR_VERSION}" in runtime
    assert f"ARG TORBED_VERSION={__version__}" in runtime
    # Every apt install in a final image cleans its lists.
    for run in re.findall(r"RUN (?:[^\n]*\\\n)*[^\n]*", runtime):
        if "apt-get install" in run:
            assert "--no-install-recommends" in run and "rm -rf /var/lib/apt/lists/*" in run


def test_locust_dockerfile():
    """FROM the client image (tor, torbed-node, torbed) plus Locust at hack/constraints.txt's pin."""
    text = (REPO / "images" / "locust" / "Dockerfile").read_text()
    runtime = text[text.rindex("\nFROM "):]
    assert runtime.startswith("\nFROM ${CLIENT_IMAGE}\n") and "COPY --from=venv /opt/locust/ /opt/locust/" in runtime
    assert "ARG BASE_IMAGE=debian:bookworm-slim" in text and "-c /src/constraints.txt" in text
    assert re.search(r"^locust==\d", (REPO / "hack" / "constraints.txt").read_text(), re.M)


def test_nightly_runner_dockerfile():
    text = (REPO / "images" / "nightly" / "Dockerfile").read_text()
    runtime = text[text.rindex("\nFROM "):]
    assert runtime.startswith("\nFROM ${BASE_IMAGE}\n") and "USER 10000:10000" in runtime
    assert "COPY .stage/nightly/helm /usr/local/bin/helm" in runtime
    # The chart and scenarios must be in the image, so .dockerignore must not drop them.
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "charts" not in ignored and "scenarios" not in ignored
    for label in ("org.opencontainers.image.title", "org.opencontainers.image.version", "io.torbed.arch"):
        assert label + "=" in runtime, label
    assert "nightly" in images.IMAGES and "nightly" not in images.DEFAULT_IMAGES
    assert [i.kind for i in images.plan(kinds=["nightly"])] == ["nightly"]


def test_build_tor_lists_the_patches_torbed_variants_lists():
    for family in list_families():
        out = subprocess.run(["bash", str(constants.BUILD_SCRIPT), "--list-patches",
                              str(constants.VARIANTS_DIR / family)],
                             capture_output=True, text=True, check=True).stdout.split()
        assert out == [str(p) for p in load_variant(family).patches], family


def test_build_tor_list_patches_forms(tmp_path):
    (tmp_path / "a.patch").write_text("")
    (tmp_path / "b.patch").write_text("")
    forms = [
        "name: x\npatches: [a.patch, 'b.patch']  # two\ntorrc: |\n  X 1\n",
        'name: x\npatches:\n  - "a.patch"   # first\n\n  - b.patch\ntorrc: |\n  - not a patch\n',
    ]
    for form in forms:
        (tmp_path / "variant.yaml").write_text(form)
        out = subprocess.run(["bash", str(constants.BUILD_SCRIPT), "--list-patches", str(tmp_path)],
                             capture_output=True, text=True, check=True).stdout.split()
        assert out == [str(tmp_path / "a.patch"), str(tmp_path / "b.patch")], form
    (tmp_path / "variant.yaml").write_text("patches: [missing.patch]\n")
    proc = subprocess.run(["bash", str(constants.BUILD_SCRIPT), "--list-patches", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "missing.patch" in proc.stderr


def test_client_requirements_follow_pyproject():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    by_name = {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower(): d.replace(" ", "") for d in deps}
    text = DOCKERFILES["client"].read_text()
    line = re.search(r"pip install --no-cache-dir -q \\\n([^\n]*)\n", text).group(1)
    installed = re.findall(r'"([A-Za-z0-9_.-]+[=<>!~][^"]*)"', line)
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower(): r for r in installed}
    # prometheus-client: the driver's exporter and the results service's /metrics.
    assert set(names) == {"stem", "python-socks", "pydantic", "pyyaml", "rich", "prometheus-client"}
    for name, req in names.items():
        assert by_name[name] == req, f"client Dockerfile has {req}, pyproject.toml {by_name[name]}"
    assert "--no-deps" in text


def test_plan_tags_and_args():
    plan = images.plan("linux/amd64" if images.host_arch() == "amd64" else "linux/arm64")
    tags = [i.tag for i in plan]
    assert tags[:3] == [f"torbed/dirauth:{__version__}", f"torbed/client:{__version__}", f"torbed/locust:{__version__}"]
    assert sorted(tags[3:-1]) == sorted(f"torbed/relay:{f}-{__version__}" for f in list_families())
    assert tags[-1] == f"torbed/prometheus:{__version__}"
    # The locust image is built FROM the client tag just built (and asking for it brings the client along).
    assert plan[2].build_args["CLIENT_IMAGE"] == f"torbed/client:{__version__}"
    assert [i.kind for i in images.plan(kinds=["locust"])] == ["client", "locust"]
    relays = {i.family: i for i in plan if i.kind == "relay"}
    assert relays["vanilla"].build_args["PATCHES"] == "0001-circuitmux-round-robin-policy.patch"
    assert relays["kist"].build_args["PATCHES"] == ""
    assert all(i.build_args["TOR_VERSION"] == constants.TOR_VERSION for i in plan)
    foreign = "linux/arm64" if images.host_arch() == "amd64" else "linux/amd64"
    assert all(i.tag.endswith(foreign.rsplit("/", 1)[1]) for i in images.plan(foreign))


def test_plan_rejects_bad_input():
    with pytest.raises(images.ImageInputError, match="platform"):
        images.plan("linux/s390x")
    with pytest.raises(images.ImageInputError, match="family"):
        images.plan(None, families=["nope"])
    with pytest.raises(images.ImageInputError, match="kind"):
        images.plan(None, kinds=["relay", "bridge"])


def test_client_installs_the_staged_wheel():
    # The same package `pip install .` gives (data files included), not a copy of the sources.
    text = DOCKERFILES["client"].read_text()
    assert "COPY .stage/client/ /src/wheel/" in text and "--no-deps /src/wheel/torbed-*.whl" in text
    assert "COPY torbed/" not in text
    assert ".stage" not in (REPO / ".dockerignore").read_text().split()


def test_host_build_deps_are_build_tors():
    # The packages whose absence keeps an image's tor in Docker are the ones build-tor.sh installs.
    text = constants.BUILD_SCRIPT.read_text()
    listed = []
    for name in ("LIB_DEPS", "TOOL_DEPS", "AUTOTOOLS_DEPS"):
        listed += re.search(rf"^{name}=\(([^)]*)\)", text, re.M).group(1).split()
    assert sorted(listed) == sorted(images.HOST_BUILD_DEPS)


def _relay(platform=None, family="vanilla"):
    return images.plan(platform, kinds=["relay"], families=[family])[0]


BOOKWORM = {"ID": "debian", "VERSION_CODENAME": "bookworm", "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)"}


def test_tor_from_this_machine_only_where_it_is_the_same_build(monkeypatch):
    monkeypatch.setattr(images.builds, "cached", lambda key: object())
    assert images.base_release() == "bookworm"
    base = "debian:bookworm-slim"
    assert images.host_tor_problem(_relay(), base, BOOKWORM) is None
    assert images.host_tor_problem(images.plan(kinds=["dirauth"])[0], base, BOOKWORM) is None
    foreign = "linux/arm64" if images.host_arch() == "amd64" else "linux/amd64"
    assert "cross-compiled" in images.host_tor_problem(_relay(foreign), base, BOOKWORM)
    ubuntu = {"ID": "ubuntu", "VERSION_CODENAME": "noble", "PRETTY_NAME": "Ubuntu 24.04 LTS"}
    assert "Ubuntu 24.04" in images.host_tor_problem(_relay(), base, ubuntu)
    trixie = dict(BOOKWORM, VERSION_CODENAME="trixie", PRETTY_NAME="Debian GNU/Linux 13 (trixie)")
    assert "trixie" in images.host_tor_problem(_relay(), base, trixie)
    assert "base is localhost/other" in images.host_tor_problem(_relay(), "localhost/other:1", BOOKWORM)
    assert "no tor stage" in images.host_tor_problem(images.plan(kinds=["prometheus"])[0], base, BOOKWORM)
    # Not built yet and no build dependencies: building would install packages on this machine.
    monkeypatch.setattr(images.builds, "cached", lambda key: None)
    monkeypatch.setattr(images, "_missing_build_deps", lambda: ["libssl-dev"])
    assert "libssl-dev; make setup" in images.host_tor_problem(_relay(), base, BOOKWORM)
    monkeypatch.setattr(images, "_missing_build_deps", lambda: [])
    assert images.host_tor_problem(_relay(), base, BOOKWORM) is None


def test_torbed_image_tor_setting(monkeypatch):
    monkeypatch.setattr(images, "host_tor_problem", lambda img, base: None)
    monkeypatch.delenv(images.TOR_SOURCE_ENV, raising=False)
    assert images.tor_source(_relay(), "debian:bookworm-slim")[0] == "host"
    monkeypatch.setenv(images.TOR_SOURCE_ENV, "image")
    assert images.tor_source(_relay(), "debian:bookworm-slim")[0] == "image"
    monkeypatch.setenv(images.TOR_SOURCE_ENV, "host")
    assert images.tor_source(_relay(), "debian:bookworm-slim")[0] == "host"
    monkeypatch.setattr(images, "host_tor_problem", lambda img, base: "the image is for arm64")
    with pytest.raises(images.ImageError, match="TORBED_IMAGE_TOR=host, but the image is for arm64"):
        images.tor_source(_relay(), "debian:bookworm-slim")
    monkeypatch.setenv(images.TOR_SOURCE_ENV, "auto")
    assert images.tor_source(_relay(), "debian:bookworm-slim") == ("image", "the image is for arm64")
    monkeypatch.setenv(images.TOR_SOURCE_ENV, "native")
    with pytest.raises(images.ImageInputError, match="auto, image or host"):
        images.tor_source(_relay(), "debian:bookworm-slim")


def test_where_tor_comes_from_is_not_in_the_content_tag():
    # The same sources and build script either way: the tag names what is built, not where.
    img = _relay()
    other = dataclasses.replace(img, build_args=dict(img.build_args, TOR_STAGE="tor-native",
                                                     TOR_NATIVE=".stage/tor/0.4.9.11-0123"))
    assert images.content_digest(other) == images.content_digest(img)
    patched = dataclasses.replace(img, build_args=dict(img.build_args, PATCHES="x.patch"))
    assert images.content_digest(patched) != images.content_digest(img)
    # The staged directory is named by a build argument, not read as a COPY source of its own.
    assert not any(".stage/tor" in p.as_posix() for p in images.build_inputs(img))
