"""hack/ as components (hack/README.md): one file of version pins, one of shell helpers, a
README per folder."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
PIN = re.compile(r"^([A-Z][A-Z0-9_]*_VERSION)=(\S+)", re.M)


def _versions() -> dict[str, str]:
    return dict(PIN.findall((HACK / "versions.env").read_text()))


def _scripts() -> list[Path]:
    return sorted(p for p in HACK.rglob("*.sh"))


def test_versions_env_is_what_bash_reads():
    """Plain NAME=VALUE lines: the regular expression tests use and bash agree."""
    pins = _versions()
    assert {"K8S_VERSION", "HELM_VERSION", "CHAOS_MESH_VERSION", "COREDNS_VERSION"} <= pins.keys()
    names = " ".join(pins)
    out = subprocess.run(["bash", "-c", f'. "{HACK}/versions.env"; for n in {names}; do echo "$n=${{!n}}"; done'],
                         capture_output=True, text=True, check=True).stdout
    assert dict(line.split("=", 1) for line in out.splitlines()) == pins


def test_versions_are_pinned_only_in_versions_env():
    """A version assigned in a script would drift from the one the others read."""
    for script in _scripts():
        assert not PIN.findall(script.read_text()), f"{script.relative_to(REPO)} pins a version; move it to hack/versions.env"


def test_schemas_match_the_cluster():
    """The chart is validated against the schemas of the Kubernetes the e2e cluster runs."""
    pins = _versions()
    assert pins["K8S_SCHEMA_VERSION"] == pins["K8S_VERSION"]


def test_log_helpers_come_from_lib_sh():
    for script in (s for s in _scripts() if s.name != "lib.sh"):
        assert not re.search(r"^log\(\)", script.read_text(), re.M), \
            f"{script.relative_to(REPO)} defines log(); source hack/lib.sh and set LOG_TAG"


def test_every_component_folder_has_a_readme():
    for folder in (p for p in HACK.iterdir() if p.is_dir()):
        assert (folder / "README.md").is_file(), f"hack/{folder.name}/ has no README.md"


def test_the_cluster_has_config_files_not_heredocs():
    """hack/cluster/config/ holds every file the cluster scripts write or apply, each with
    __NAME__ placeholders that common.sh's render fills in."""
    for script in sorted((HACK / "cluster").glob("*.sh")):
        assert not re.search(r"<<-?\s*'?[A-Z]+'?\s*$", script.read_text(), re.M), \
            f"{script.relative_to(REPO)} writes a heredoc; put it in hack/cluster/config/ and render it"
    used = set()
    for script in sorted((HACK / "cluster").glob("*.sh")):
        used |= set(re.findall(r"\brender ([\w-]+\.[\w.]+)", script.read_text()))
    assert used == {p.name for p in (HACK / "cluster" / "config").iterdir()}, "a template unused, or one missing"
