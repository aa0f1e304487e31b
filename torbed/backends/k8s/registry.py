"""Publish the images and the chart to a registry: one tag per image for every architecture.

``make images-push`` (``python -m torbed.backends.k8s.registry``): for each image kind (and relay family)
it takes the locally built image of every architecture there is (``torbed/relay:vanilla-0.1.0``
for this machine's, ``...-arm64`` from ``make images-arm64``), checks each one's
``io.torbed.arch`` label against the architecture it is published as, pushes it as
``REGISTRY/torbed/relay:vanilla-0.1.0-<arch>`` and then pushes a manifest list
``REGISTRY/torbed/relay:vanilla-0.1.0`` naming them all, so a node of either architecture
pulls the same tag and gets its own image. With ``--chart`` it also packages charts/torbed
and pushes it as an OCI artifact to ``oci://REGISTRY/charts`` (``helm install torbed
oci://REGISTRY/charts/torbed --version V --set images.registry=REGISTRY``).

The local registry of hack/images/registry.sh (127.0.0.1:5000, plain HTTP) is the default; any
registry the Docker client is logged in to works (``--insecure`` only for plain HTTP).

Public API: ``publish_images(registry, kinds, families, insecure) -> list[Published]``,
``publish_chart(registry, insecure) -> str``, ``main(argv)``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ... import __version__, images
from ...errors import InputError, RunFailed

DEFAULT_REGISTRY = "127.0.0.1:5000"
ARCHES = ("amd64", "arm64")


class PublishError(RunFailed):
    """Something could not be pushed (exit code 1)."""


@dataclass
class Published:
    tag: str                  # the multi-arch tag, REGISTRY/torbed/kind:version
    arches: dict[str, str]    # arch -> the per-arch tag pushed


def _run(cmd: list[str], what: str) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise PublishError(f"{what}: {' '.join(cmd[:3])} ... failed: {(p.stderr or p.stdout).strip()[-800:]}")
    return p.stdout


def _label_arch(docker: str, ref: str) -> str | None:
    """The image's io.torbed.arch label and its config's architecture, or None if no image."""
    p = subprocess.run([docker, "image", "inspect", ref], capture_output=True, text=True)
    if p.returncode != 0:
        return None
    info = json.loads(p.stdout)[0]
    label = ((info.get("Config") or {}).get("Labels") or {}).get("io.torbed.arch")
    if label and label != info.get("Architecture"):
        raise PublishError(f"{ref}: label io.torbed.arch={label} but the image is {info.get('Architecture')}")
    return label or f"unlabelled:{info.get('Architecture')}"


def publish_images(registry: str, kinds: list[str], families: list[str] | None = None,
                   insecure: bool = True, say=print) -> list[Published]:
    docker = images.ensure_engine()
    out = []
    # One plan per architecture: the same kinds/families, each arch's local tags.
    plans = {arch: images.plan(f"linux/{arch}", kinds, families) for arch in ARCHES}
    for i, base in enumerate(plans[images.host_arch()]):
        name = images.tag(base.kind, base.family).split("/", 1)[1]    # torbed/relay:vanilla-0.1.0 -> relay:...
        target = f"{registry}/{images.REGISTRY_PREFIX}/{name}"
        pushed: dict[str, str] = {}
        for arch in ARCHES:
            local = plans[arch][i].tag
            found = _label_arch(docker, local)
            if found is None:
                continue
            if found != arch:
                raise PublishError(f"{local} is labelled {found}, not {arch}: rebuild it (make images"
                                   f"{'-arm64' if arch == 'arm64' else ''})")
            per_arch = f"{target}-{arch}"
            _run([docker, "tag", local, per_arch], f"tag {local}")
            say(f"pushing {per_arch}")
            _run([docker, "push", per_arch], f"push {per_arch}")
            pushed[arch] = per_arch
        if not pushed:
            raise PublishError(f"{images.tag(base.kind, base.family)}: not built for any architecture; run "
                               "`make images` (and `make images-arm64` for arm64 nodes) first")
        flags = ["--insecure"] if insecure else []
        subprocess.run([docker, "manifest", "rm", target], capture_output=True, text=True)   # a stale local list
        _run([docker, "manifest", "create", *flags, target, *pushed.values()], f"manifest list {target}")
        for arch, ref in pushed.items():
            _run([docker, "manifest", "annotate", "--os", "linux", "--arch", arch, target, ref],
                 f"annotate {target} {arch}")
        _run([docker, "manifest", "push", *flags, "--purge", target], f"push manifest list {target}")
        say(f"{target}: {', '.join(sorted(pushed))}")
        out.append(Published(target, pushed))
    return out


def publish_chart(registry: str, insecure: bool = True, say=print) -> str:
    """helm package charts/torbed, helm push to oci://REGISTRY/charts; returns the chart's reference."""
    from .backend import CHART, helm_binary
    helm = helm_binary()
    with tempfile.TemporaryDirectory() as d:
        _run([helm, "package", str(CHART), "-d", d], "helm package")
        [pkg] = list(Path(d).glob("torbed-*.tgz"))
        cmd = [helm, "push", str(pkg), f"oci://{registry}/charts"] + (["--plain-http"] if insecure else [])
        _run(cmd, "helm push")
    version = pkg.name.removeprefix("torbed-").removesuffix(".tgz")
    ref = f"oci://{registry}/charts/torbed"
    say(f"{ref} version {version}")
    return f"{ref}:{version}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torbed.backends.k8s.registry", description=__doc__.splitlines()[0])
    ap.add_argument("--registry", default=DEFAULT_REGISTRY, help=f"host[:port] (default {DEFAULT_REGISTRY})")
    ap.add_argument("--images", default=",".join(images.DEFAULT_IMAGES),
                    help="comma-separated image kinds (default: %(default)s)")
    ap.add_argument("--variants", default=None, help="comma-separated relay families (default: all)")
    ap.add_argument("--chart", action="store_true", help="also push the chart as an OCI artifact")
    ap.add_argument("--no-images", action="store_true", help="push only the chart")
    ap.add_argument("--secure", action="store_true", help="the registry speaks HTTPS (default: plain HTTP)")
    a = ap.parse_args(argv)
    try:
        if not a.no_images:
            publish_images(a.registry, [k for k in a.images.split(",") if k],
                           a.variants.split(",") if a.variants else None, insecure=not a.secure)
        if a.chart or a.no_images:
            publish_chart(a.registry, insecure=not a.secure)
    except InputError as e:
        print(f"registry: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"registry: {e}", file=sys.stderr)
        return 1
    print(f"published to {a.registry} (torbed {__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
