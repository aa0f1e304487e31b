"""`torbed images load --to TARGET`: the exact command line each kind of cluster uses, and that
it is run as built (stand-in tools on PATH record their argv and stdin; kind, k3s and
minikube themselves cannot run on this machine). The local cluster's path and a k3s import
into a real containerd are checked by hand (docs/kubernetes.md); this is the unit level."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torbed import resources
from torbed.backends.k8s import imageload
from torbed.errors import InputError

REFS = ["torbed/client:0.1.0", "torbed/relay:vanilla-0.1.0"]


def test_each_setup_gets_its_own_command_line():
    assert [s.shell() for s in imageload.steps("kind", REFS)] == [
        "kind load docker-image torbed/client:0.1.0 torbed/relay:vanilla-0.1.0 --name kind"]
    assert [s.shell() for s in imageload.steps("kind", REFS, cluster="dev")] == [
        "kind load docker-image torbed/client:0.1.0 torbed/relay:vanilla-0.1.0 --name dev"]
    assert [s.shell() for s in imageload.steps("k3s", REFS)] == [
        "docker save torbed/client:0.1.0 torbed/relay:vanilla-0.1.0 | k3s ctr images import -"]
    assert [s.shell() for s in imageload.steps("minikube", REFS, cluster="p2")] == [
        "minikube image load torbed/client:0.1.0 -p p2", "minikube image load torbed/relay:vanilla-0.1.0 -p p2"]
    [local] = imageload.steps("local", REFS)
    assert local.argv == (str(resources.ROOT / "hack" / "cluster" / "cluster.sh"), "load-image", *REFS)


def test_bad_targets_and_flags_are_refused():
    with pytest.raises(InputError, match="--to: 'docker' is not one of local, kind, k3s, minikube, registry"):
        imageload.steps("docker", REFS)
    with pytest.raises(InputError, match="k3s imports into the node it runs on"):
        imageload.steps("k3s", REFS, cluster="x")
    with pytest.raises(InputError, match="--to registry needs --registry"):
        imageload.load("registry")
    with pytest.raises(InputError, match="--registry is only for --to registry"):
        imageload.load("kind", registry="reg:5000", dry_run=True)


def test_the_images_are_the_charts_default_references_and_their_content_tags():
    from torbed import images
    refs = imageload.refs(["client", "dirauth", "relay"], ["vanilla", "kist"])
    plain = {"torbed/client:0.1.0", "torbed/dirauth:0.1.0", "torbed/relay:vanilla-0.1.0", "torbed/relay:kist-0.1.0"}
    assert set(refs[:4]) == plain and len(refs) == 8
    content = refs[4:]
    assert {c.rsplit("-", 1)[0] for c in content} == plain
    # What `torbed run --backend k8s` installs with (backend.content_tags) is what is loaded.
    tags = images.chart_tags(["client", "dirauth", "relay"], ["vanilla", "kist"])
    assert {f"torbed/{k.split('-')[0]}:{v}" for k, v in tags.items()} == set(content)


def _stub(bindir: Path, name: str, body: str) -> None:
    p = bindir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)


@pytest.fixture
def stubs(tmp_path, monkeypatch):
    """kind, k3s, minikube and docker stand-ins that record what they were given."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls"
    for tool in ("kind", "minikube"):
        _stub(bindir, tool, f'echo "{tool} $*" >> {log}\n')
    # k3s logs after reading its stdin to the end, i.e. after docker save exited: the two run
    # at once in a pipe, and logging first made the order of the two lines a race
    _stub(bindir, "k3s", f'cat > {tmp_path}/imported.tar\necho "k3s $*" >> {log}\n')
    _stub(bindir, "docker", f'echo "docker $*" >> {log}\nprintf "TAR:%s" "$*"\n')
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return tmp_path


def test_the_commands_run_as_built(stubs):
    for target in ("kind", "minikube", "k3s"):
        for step in imageload.steps(target, REFS):
            imageload.run(step, say=lambda *_: None)
    assert (stubs / "calls").read_text().splitlines() == [
        "kind load docker-image torbed/client:0.1.0 torbed/relay:vanilla-0.1.0 --name kind",
        "minikube image load torbed/client:0.1.0 -p minikube",
        "minikube image load torbed/relay:vanilla-0.1.0 -p minikube",
        "docker save torbed/client:0.1.0 torbed/relay:vanilla-0.1.0",
        "k3s ctr images import -"]
    # docker save's output is what k3s read on its stdin
    assert (stubs / "imported.tar").read_text() == "TAR:save torbed/client:0.1.0 torbed/relay:vanilla-0.1.0"


def test_a_failing_or_missing_tool_is_an_error_naming_the_command(stubs):
    _stub(stubs / "bin", "kind", 'echo "ERROR: no nodes found for cluster \\"kind\\"" >&2; exit 1\n')
    [step] = imageload.steps("kind", REFS)
    with pytest.raises(imageload.LoadError, match=r'kind load docker-image .*: kind exited 1: ERROR: no nodes found'):
        imageload.run(step, say=lambda *_: None)
    (stubs / "bin" / "minikube").unlink()
    with pytest.raises(imageload.LoadError, match="minikube: not found on PATH"):
        imageload.run(imageload.steps("minikube", REFS)[0], say=lambda *_: None)


def test_cli_dry_run_prints_the_command_lines_and_bad_input_exits_2():
    base = [str(Path(sys.executable).parent / "torbed"), "images", "load"]
    p = subprocess.run([*base, "--to", "kind", "--images", "client", "--dry-run"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(r"kind load docker-image torbed/client:0\.1\.0 torbed/client:0\.1\.0-[0-9a-f]{12} --name kind",
                        p.stdout.strip()), p.stdout
    p = subprocess.run([*base, "--to", "k3s", "--images", "client,relay", "--variants", "vanilla", "--dry-run"],
                       capture_output=True, text=True)
    assert re.fullmatch(r"docker save torbed/client:0\.1\.0 torbed/relay:vanilla-0\.1\.0 torbed/client:0\.1\.0-[0-9a-f]{12} "
                        r"torbed/relay:vanilla-0\.1\.0-[0-9a-f]{12} \| k3s ctr images import -", p.stdout.strip()), p.stdout
    p = subprocess.run([*base, "--to", "kind", "--images", "clinet", "--dry-run"], capture_output=True, text=True)
    assert p.returncode == 2 and "--images: clinet not one of" in p.stderr, p.stderr
    p = subprocess.run([*base, "--to", "kind", "--variants", "nope", "--dry-run"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown variant family 'nope'" in p.stderr, p.stderr
    p = subprocess.run([*base, "--to", "podman"], capture_output=True, text=True)
    assert p.returncode == 2 and "invalid choice: 'podman'" in p.stderr, p.stderr
