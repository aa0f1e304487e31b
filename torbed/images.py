"""Container images of the Kubernetes backend: build them with the local Docker engine.

``make images`` (``python -m torbed.images``) builds, for one platform, ``torbed/dirauth``,
``torbed/client``, ``torbed/locust`` (the client image plus Locust, for background load), one
``torbed/relay`` per variant family and ``torbed/prometheus`` (Debian's Prometheus, the chart's
optional in-cluster Prometheus), from images/*/Dockerfile with
the repository root as the build context, and prints their tags and sizes. Docker's layer
cache makes a rebuild without changes take seconds; the unpatched tor is compiled once per
architecture and shared by dirauth, client and the config-only families.

Public API:

- ``IMAGES`` the image kinds (``DEFAULT_IMAGES`` built by default, ``TOR_IMAGES`` those that compile tor; ``nightly`` on request); ``Image`` one image to build (kind, tag, Dockerfile, build args)
- ``plan(platform=None, kinds=IMAGES, families=None) -> list[Image]``
- ``build(images, verbose=False, console=None) -> list[Result]`` raises
  ``ImageError`` (the message names the image and its log)
- ``ensure_engine() -> str`` the docker client to build with (runs hack/images/docker.sh)
- ``ensure_base(arch) -> str`` the runtime base image for ``arch`` (runs hack/images/base-image.sh)
- ``tag(kind, family=None, arch=None, digest=None) -> str``
- ``build_inputs(img) -> list[Path]``, ``content_digest(img) -> str``, ``content_tag(img) -> str``:
  the files a build reads and the tag they name (``<version>-<12 hex digits>``), so an image
  rebuilt from other inputs (a changed tor patch, Dockerfile or torbed source) gets another tag;
  ``build`` tags every image with it too
- ``chart_tags(kinds, families) -> dict``: the chart's ``images.tags`` naming those content
  tags (the Kubernetes backend installs with them); ``content_tags_available() -> bool``

Tags: ``torbed/relay:<family>-<version>``, ``torbed/dirauth:<version>``,
``torbed/client:<version>`` (version: pyproject's). dockerd 20.10 keeps one architecture per
tag, so images for a foreign architecture get ``-<arch>`` appended (``vanilla-0.1.0-arm64``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform as _platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, builds, constants, resources
from .variants import VariantError, list_families, load_variant, stock_build_key
from .errors import InputError, RunFailed

REPO = resources.ROOT
IMAGES = ("dirauth", "client", "locust", "relay", "prometheus", "nightly")
# The images that compile tor (they share the tor stages).
TOR_IMAGES = ("dirauth", "client", "relay")
# Built by `make images` by default: those, the locust image (FROM the client tag) and
# Prometheus (one apt layer, so a release can switch prometheus.enabled on without another
# build); the nightly runner only when asked (--images ...,nightly).
DEFAULT_IMAGES = ("dirauth", "client", "locust", "relay", "prometheus")
STAGE = REPO / ".stage"
REGISTRY_PREFIX = "torbed"
ARCHES = {"x86_64": "amd64", "aarch64": "arm64", "amd64": "amd64", "arm64": "arm64"}
LOG_DIR = constants.CACHE_DIR / "logs"


class ImageError(RunFailed):
    """An image could not be built (exit code 1)."""


class ImageInputError(ImageError, InputError):
    """Bad input: an unknown platform, image kind or variant family (exit code 2)."""


@dataclass(frozen=True)
class Image:
    kind: str
    tag: str
    dockerfile: Path
    arch: str
    build_args: dict[str, str] = field(default_factory=dict)
    family: str | None = None
    patches: tuple[str, ...] = ()


@dataclass(frozen=True)
class Result:
    image: Image
    seconds: float
    size_bytes: int
    image_id: str
    cached: bool     # the tag already pointed at this image before the build
    content_tag: str = ""   # the same image under its content-addressed tag (content_tag)


def host_arch() -> str:
    machine = _platform.machine()
    if machine not in ARCHES:
        raise ImageError(f"unsupported host architecture {machine}")
    return ARCHES[machine]


def parse_platform(platform: str | None) -> str:
    """'linux/arm64' (or 'arm64') -> 'arm64'; None -> the host's architecture."""
    if not platform:
        return host_arch()
    os_, _, arch = platform.rpartition("/")
    if os_ not in ("", "linux") or arch not in ("amd64", "arm64"):
        raise ImageInputError(f"unsupported platform '{platform}' (linux/amd64 or linux/arm64)")
    return arch


def tag(kind: str, family: str | None = None, arch: str | None = None, digest: str | None = None) -> str:
    """The image's tag; with ``digest`` (``content_digest``) its content-addressed tag."""
    version = __version__ if kind != "relay" else f"{family}-{__version__}"
    if digest:
        version += f"-{digest[:12]}"
    if arch and arch != host_arch():
        version += f"-{arch}"
    return f"{REGISTRY_PREFIX}/{kind}:{version}"


# Build-context paths made at build time from other files: hashed through those sources.
STAGED_INPUTS = {".stage/client": ("torbed", "replay", "analysis", "pyproject.toml", "setup.py", "MANIFEST.in"),
                 ".stage/nightly": ("hack/versions.env", "hack/chart/k8s-tools.sh")}
# Build arguments that describe an image (labels) without changing what it runs.
LABEL_ARGS = frozenset({"TORBED_SOURCE"})
# Build arguments that say where the image's tor comes from (the tor stage or this machine's own
# build of the same sources): the same build either way, so not hashed (``content_digest``).
TOR_SOURCE_ARGS = frozenset({"TOR_STAGE", "TOR_NATIVE"})
# TORBED_IMAGE_TOR: where an image's tor comes from. auto (default): this machine's own build
# (torbed.builds, cached, shared with local runs) where it is the build the image's tor stage
# would make, else compiled inside Docker; image: always compiled inside Docker; host: this
# machine's build or an error saying why not.
TOR_SOURCE_ENV = "TORBED_IMAGE_TOR"
# build-tor.sh's LIB_DEPS, TOOL_DEPS and AUTOTOOLS_DEPS (tests/images/test_tor_source.py keeps
# them equal): without them a host build would install packages on this machine.
HOST_BUILD_DEPS = ("libssl-dev", "libevent-dev", "zlib1g-dev", "liblzma-dev", "libzstd-dev", "libcap-dev",
                   "gcc", "make", "pkg-config", "dpkg-dev", "autoconf", "automake")
# What .dockerignore keeps out of the context.
_IGNORED = re.compile(r"(^|/)(__pycache__|[^/]*\.pyc|[^/]*\.egg-info|target)(/|$)")
# An image built FROM another of ours reads that one's inputs too.
_FROM_IMAGE = {"locust": "client"}


def _copy_sources(dockerfile: Path) -> list[str]:
    """The build-context paths a Dockerfile's COPY/ADD lines read (not those --from a stage)."""
    out = []
    for line in dockerfile.read_text().replace("\\\n", " ").splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD") or any(w.startswith("--from") for w in words):
            continue
        # A source named by a build argument (${TOR_NATIVE}) is staged by ``build`` from a tor
        # build whose inputs the tor stage's own COPY lines already name.
        out += [w for w in [w for w in words[1:] if not w.startswith("--")][:-1] if "$" not in w]
    return out


def build_inputs(img: Image) -> list[Path]:
    """Every file of the build context the image's build reads: its Dockerfile(s), what they
    COPY (staged files through their sources). Raises ImageInputError for a COPY source that
    does not exist."""
    dockerfiles = [img.dockerfile]
    if img.kind in _FROM_IMAGE:
        dockerfiles.append(REPO / "images" / _FROM_IMAGE[img.kind] / "Dockerfile")
    rels = []
    for df in dockerfiles:
        rels.append(df.relative_to(REPO).as_posix())
        for src in _copy_sources(df):
            src = src.rstrip("/")
            staged = next((k for k in STAGED_INPUTS if src == k or src.startswith(k + "/")), None)
            rels += STAGED_INPUTS[staged] if staged else [src]
    files: set[Path] = set()
    for rel in rels:
        p = REPO / rel
        if p.is_dir():
            files.update(f for f in p.rglob("*") if f.is_file() and not _IGNORED.search(f.relative_to(REPO).as_posix()))
        elif p.is_file():
            files.add(p)
        else:
            raise ImageInputError(f"{img.dockerfile.relative_to(REPO)}: COPY source {rel} does not exist")
    return sorted(files)


def content_digest(img: Image) -> str:
    """sha256 over the image's build inputs (path, executable bit, content) and its build
    arguments (not labels): equal inputs, equal digest, on any machine and for either
    architecture. The architecture is not in it: locally a foreign one's tag carries -<arch>
    (``tag``), and in a cluster an arm64 node holds its image under the same tag as the amd64
    nodes (hack/cluster/cluster.sh load-image --node pi), as a multi-architecture manifest
    lists both under one tag; the chart names one tag for every node."""
    h = hashlib.sha256()
    for f in build_inputs(img):
        h.update(f.relative_to(REPO).as_posix().encode() + b"\0" + (b"x" if os.access(f, os.X_OK) else b"-")
                 + hashlib.sha256(f.read_bytes()).digest())
    for k, v in sorted(img.build_args.items()):
        if k not in LABEL_ARGS | TOR_SOURCE_ARGS and k != "CLIENT_IMAGE":   # the client's inputs: hashed in already
            h.update(f"{k}={v}\0".encode())
    return h.hexdigest()


def content_tag(img: Image) -> str:
    """The tag naming what the image is built from: ``tag`` with ``content_digest``'s first 12
    hex digits (torbed/relay:vanilla-0.1.0-0123456789ab)."""
    return tag(img.kind, img.family, img.arch, content_digest(img))


def content_tags_available() -> bool:
    """Whether this installation can compute content tags: the Dockerfiles and build inputs
    are here (a checkout), not in a wheel install or the nightly runner's image."""
    return (REPO / "images" / "relay" / "Dockerfile").is_file()


def chart_tags(kinds: tuple[str, ...] | list[str] = DEFAULT_IMAGES, families: list[str] | None = None) -> dict[str, str]:
    """The chart's ``images.tags`` for the images ``plan`` names (this machine's architecture):
    {"client": "0.1.0-0123456789ab", "relay-vanilla": "vanilla-0.1.0-...", ...}, each the tag
    part of ``content_tag``, so a release runs exactly the images built from this checkout."""
    out = {}
    for img in plan(None, kinds, families):
        key = f"relay-{img.family}" if img.kind == "relay" else img.kind
        out[key] = content_tag(img).split(":", 1)[1]
    return out


def _content_tags_of(img: Image, tags: list[str]) -> list[str]:
    """Those of ``tags`` that are content tags of ``img`` (any digest)."""
    base = tag(img.kind, img.family)      # without the foreign architecture's suffix
    suffix = f"-{img.arch}" if img.arch != host_arch() else ""
    pattern = re.compile(re.escape(base) + r"-[0-9a-f]{12}" + re.escape(suffix) + "$")
    return [t for t in tags if pattern.match(t)]


def _source_url() -> str:
    if os.environ.get("TORBED_IMAGE_SOURCE"):
        return os.environ["TORBED_IMAGE_SOURCE"]
    try:
        url = subprocess.run(["git", "-C", str(REPO), "config", "--get", "remote.origin.url"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        url = ""
    return url or f"file://{REPO}"


def plan(platform: str | None = None, kinds: tuple[str, ...] | list[str] = DEFAULT_IMAGES,
         families: list[str] | None = None) -> list[Image]:
    """The images to build, in build order (dirauth first: it compiles the unpatched tor)."""
    arch = parse_platform(platform)
    unknown = set(kinds) - set(IMAGES)
    if unknown:
        raise ImageInputError(f"unknown image kind(s) {sorted(unknown)} (known: {', '.join(IMAGES)})")
    known = list_families()
    families = known if families is None else families
    if "locust" in kinds and "client" not in kinds:
        kinds = [*kinds, "client"]   # the locust image is built FROM the client tag
    for f in families:
        if f not in known:
            raise ImageInputError(f"unknown variant family '{f}' (known: {', '.join(known)})")
    common = {"TORBED_VERSION": __version__, "TOR_VERSION": constants.TOR_VERSION,
              "TORBED_SOURCE": _source_url()}
    out = []
    for kind in IMAGES:
        if kind not in kinds:
            continue
        dockerfile = REPO / "images" / kind / "Dockerfile"
        if kind == "locust":
            out.append(Image(kind, tag(kind, arch=arch), dockerfile, arch,
                             dict(common, CLIENT_IMAGE=tag("client", arch=arch))))
            continue
        if kind != "relay":
            out.append(Image(kind, tag(kind, arch=arch), dockerfile, arch, dict(common)))
            continue
        # Patched families first: they are the ones that compile anything.
        loaded = []
        for family in families:
            try:
                loaded.append(load_variant(family))
            except VariantError as e:
                raise ImageInputError(str(e)) from e
        loaded.sort(key=lambda v: (not v.patches, v.family))
        for v in loaded:
            patches = tuple(p.name for p in v.patches)
            args = dict(common, VARIANT=v.family, PATCHES=" ".join(patches))
            out.append(Image(kind, tag(kind, v.family, arch), dockerfile, arch, args, v.family, patches))
    return out


def _run_hack(script: str, *args: str, env: dict | None = None) -> str:
    proc = subprocess.run([str(REPO / "hack" / script), *args], stdout=subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        raise ImageError(f"hack/{script} {' '.join(args)} failed (exit {proc.returncode}; see its messages above)")
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def ensure_engine() -> str:
    """Start or install the Docker engine if needed; return the client to build with."""
    if os.environ.get("TORBED_DOCKER"):
        return os.environ["TORBED_DOCKER"]
    return _run_hack("images/docker.sh", "--client")


def ensure_base(arch: str, docker: str) -> str:
    """Make the base image for ``arch`` exist; return its reference (for BASE_IMAGE)."""
    return _run_hack("images/base-image.sh", "--arch", arch, env=dict(os.environ, DOCKER=docker))


def _os_release(path: Path = Path("/etc/os-release")) -> dict[str, str]:
    try:
        text = path.read_text()
    except OSError:
        return {}
    return {k: v.strip().strip('"') for k, _, v in (line.partition("=") for line in text.splitlines()) if v}


def base_release() -> str:
    """The Debian release of the images' default base ('bookworm' from the relay Dockerfile's
    ``ARG BASE_IMAGE=debian:bookworm-slim``)."""
    m = re.search(r"^ARG BASE_IMAGE=debian:([a-z]+)", (REPO / "images" / "relay" / "Dockerfile").read_text(), re.M)
    if not m:
        raise ImageError("images/relay/Dockerfile: no `ARG BASE_IMAGE=debian:<release>...` line")
    return m.group(1)


def _missing_build_deps() -> list[str]:
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Status}\n", *HOST_BUILD_DEPS],
                          capture_output=True, text=True) if shutil.which("dpkg-query") else None
    ok = {line.split()[0] for line in (proc.stdout if proc else "").splitlines() if line.endswith("install ok installed")}
    return [d for d in HOST_BUILD_DEPS if d not in ok]


def _tor_variant(img: Image):
    """The variant whose tor the image carries (None: the unpatched build)."""
    return load_variant(img.family) if img.kind == "relay" and img.family else None


def host_tor_problem(img: Image, base: str, os_release: dict[str, str] | None = None) -> str | None:
    """Why this machine's own tor build cannot be the image's (None: it can): the image is for
    another architecture, its base is not the default one, this machine runs another release, or
    the build is not cached and this machine lacks tor's build dependencies."""
    release = base_release()
    osr = _os_release() if os_release is None else os_release
    if img.kind not in TOR_IMAGES:
        return f"the {img.kind} image has no tor stage"
    if img.arch != host_arch():
        return f"the image is for {img.arch}, this machine is {host_arch()} (cross-compiled in Docker)"
    if base != f"debian:{release}-slim":
        return f"the image's base is {base}, not debian:{release}-slim"
    if osr.get("ID") != "debian" or osr.get("VERSION_CODENAME") != release:
        return (f"this machine runs {osr.get('PRETTY_NAME') or 'an unknown system'}, the image Debian {release} "
                "(other libraries)")
    variant = _tor_variant(img)
    if builds.cached(variant.build_key if variant else stock_build_key()) is None:
        missing = _missing_build_deps()
        if missing:
            return f"tor's build dependencies are not installed here ({', '.join(missing)}; make setup installs them)"
    return None


def tor_source(img: Image, base: str) -> tuple[str, str]:
    """("host" or "image", why): where ``img``'s tor comes from under TORBED_IMAGE_TOR."""
    mode = os.environ.get(TOR_SOURCE_ENV, "auto")
    if mode not in ("auto", "image", "host"):
        raise ImageInputError(f"{TOR_SOURCE_ENV}={mode!r}: expected auto, image or host")
    if mode == "image":
        return "image", f"{TOR_SOURCE_ENV}=image"
    why = host_tor_problem(img, base)
    if why is None:
        return "host", "this machine's own build (same release, architecture and build script)"
    if mode == "host":
        raise ImageError(f"{img.tag}: {TOR_SOURCE_ENV}=host, but {why}")
    return "image", why


def _stage_tor(img: Image) -> dict[str, str]:
    """This machine's build of ``img``'s tor (built when missing), stripped as the image's tor
    stage strips it, into .stage/tor/<build key>/; returns the build arguments that make the
    image take it. Its build.json says where it was built."""
    try:
        b = builds.ensure(_tor_variant(img))
    except builds.BuildError as e:
        raise ImageError(f"{img.tag}: building its tor on this machine failed: {e}") from e
    dest = STAGE / "tor" / b.key
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "bin").mkdir(parents=True)
    for name, src in (("tor", b.tor), ("tor-gencert", b.tor_gencert)):
        shutil.copy2(src, tmp / "bin" / name)
        if subprocess.run(["strip", "--strip-unneeded", str(tmp / "bin" / name)]).returncode != 0:
            raise ImageError(f"strip --strip-unneeded {src} failed")
    info = dict(b.info, built_on="build machine (torbed.images: its cached build, not compiled in the image)")
    (tmp / "build.json").write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return {"TOR_STAGE": "tor-native", "TOR_NATIVE": dest.relative_to(REPO).as_posix()}


def _stage_helm() -> None:
    """The pinned helm (hack/chart/k8s-tools.sh builds it, cached) into the build context."""
    _run_hack("chart/k8s-tools.sh")
    helm = constants.CACHE_DIR / "tools" / "bin" / "helm"
    if not helm.exists():
        raise ImageError(f"hack/chart/k8s-tools.sh did not produce {helm}")
    dest = STAGE / "nightly" / "helm"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists() or dest.read_bytes() != helm.read_bytes():
        dest.write_bytes(helm.read_bytes())
        dest.chmod(0o755)


def _stage_wheel() -> None:
    """torbed's wheel, built from this checkout as `pip install .` builds it, into the build
    context: the client image installs it (no source tree in the image)."""
    dest = STAGE / "client"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), str(REPO)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"pip wheel --no-deps {REPO} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def _ca_bundle() -> str | None:
    # For PyPI behind a TLS-inspecting proxy: the bundle this machine's pip trusts.
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(name) and Path(os.environ[name]).is_file():
            return os.environ[name]
    default = Path("/etc/ssl/certs/ca-certificates.crt")
    return str(default) if default.is_file() else None


def _inspect(docker: str, ref: str) -> tuple[str, int] | None:
    proc = subprocess.run([docker, "image", "inspect", "-f", "{{.Id}} {{.Size}}", ref],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    image_id, size = proc.stdout.split()
    return image_id, int(size)


def _build_command(img: Image, docker: str, base: str, ca: str | None) -> tuple[list[str], str, str]:
    """``docker build``'s command line for ``img`` with what it reads staged (the wheel, helm,
    this machine's tor build), and where its tor comes from ("host", "image" or "") and why."""
    args = dict(img.build_args)
    if base != "debian:bookworm-slim":
        args["BASE_IMAGE"] = base
    if img.kind == "nightly":
        _stage_helm()
    if img.kind == "client":
        _stage_wheel()
    tor_from, why = tor_source(img, base) if img.kind in TOR_IMAGES else ("", "")
    if tor_from == "host":
        args.update(_stage_tor(img))
    cmd = [docker, "build", "--progress=plain", "--platform", f"linux/{img.arch}",
           "-f", str(img.dockerfile.relative_to(REPO)), "-t", img.tag]
    for k, v in args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    if img.kind in ("client", "locust", "nightly") and ca:
        cmd += ["--secret", f"id=ca-certificates,src={ca}"]
    return [*cmd, "."], tor_from, why


def build(images: list[Image], verbose: bool = False, console=None) -> list[Result]:
    """Build ``images`` (from ``plan``) in order; stop at the first failure."""
    say = console.print if console else print
    try:
        resources.checkout("building images")   # Dockerfiles, hack/ and the package sources
    except resources.ResourceError as e:
        raise ImageInputError(str(e)) from e
    docker = ensure_engine()
    bases = {arch: ensure_base(arch, docker) for arch in sorted({i.arch for i in images})}
    ca = _ca_bundle()
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    results = []
    for img in images:
        before = _inspect(docker, img.tag)
        cmd, tor_from, why = _build_command(img, docker, bases[img.arch], ca)
        log = LOG_DIR / f"image-{img.tag.replace('/', '_').replace(':', '_')}.log"
        say(f"building {img.tag} (linux/{img.arch}{', patches: ' + ' '.join(img.patches) if img.patches else ''}"
            f"{f'; tor: {tor_from} ({why})' if tor_from else ''}); log {log}")
        t0 = time.monotonic()
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            if verbose:
                proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
                for line in proc.stdout:
                    f.write(line)
                    sys.stdout.write(line)
                rc = proc.wait()
            else:
                rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
        seconds = time.monotonic() - t0
        if rc != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
            raise ImageError(f"building {img.tag} failed (exit {rc}) after {seconds:.0f} s; log: {log}\n{tail}")
        after = _inspect(docker, img.tag)
        if after is None:
            raise ImageError(f"docker build succeeded but {img.tag} does not exist; log: {log}")
        ctag = _retag(docker, img, before[0] if before else None, after[0])
        results.append(Result(img, seconds, after[1], after[0], cached=before is not None and before[0] == after[0],
                              content_tag=ctag))
        say(f"  {img.tag} ({ctag}): {after[1] / 1e6:.1f} MB, {seconds:.1f} s"
            f"{' (unchanged)' if results[-1].cached else ''}")
    return results


def _retag(docker: str, img: Image, before: str | None, after: str) -> str:
    """Tag the image just built with its content tag, which names what it was built from (a
    rebuilt tor gets another; releases run it, backends/k8s: images.tags, so a node never runs
    a stale image under a reused tag); drop the previous build of the tag and its content
    tag(s) unless something else uses it. Returns the content tag."""
    if before is not None and before != after:
        tags = subprocess.run([docker, "image", "inspect", "-f", "{{range .RepoTags}}{{.}} {{end}}", before],
                              capture_output=True, text=True).stdout.split()
        for old_tag in _content_tags_of(img, tags):
            subprocess.run([docker, "rmi", old_tag], capture_output=True)
        subprocess.run([docker, "rmi", before], capture_output=True)
    ctag = content_tag(img)
    if subprocess.run([docker, "tag", img.tag, ctag], capture_output=True).returncode != 0:
        raise ImageError(f"docker tag {img.tag} {ctag} failed")
    return ctag


def _table(results: list[Result], console=None) -> None:
    rows = [(r.image.tag, f"linux/{r.image.arch}", f"{r.size_bytes / 1e6:.1f} MB", f"{r.seconds:.1f} s",
             "unchanged" if r.cached else "built", r.image_id.removeprefix("sha256:")[:12]) for r in results]
    try:
        from rich.table import Table
    except ImportError:
        Table = None
    if console is not None and Table is not None:
        table = Table("image", "platform", "size", "time", "", "id")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    for row in rows:
        print("  ".join(row))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m torbed.images",
        description="Build torbed's container images (dirauth, client, relay per variant family, prometheus) "
                    "with the local Docker engine, starting it if needed.")
    ap.add_argument("--platform", default=os.environ.get("PLATFORM") or None,
                    help="linux/amd64 or linux/arm64 (default: this machine's; env PLATFORM)")
    ap.add_argument("--images", default=",".join(DEFAULT_IMAGES),
                    help=f"comma-separated image kinds to build (default: {','.join(DEFAULT_IMAGES)}; "
                         f"known: {','.join(IMAGES)})")
    ap.add_argument("--variants", default=None,
                    help="comma-separated relay variant families (default: all under images/relay/variants)")
    ap.add_argument("--list", action="store_true", help="print the plan (tags, build args) and exit")
    ap.add_argument("--content-tags", action="store_true",
                    help="print each planned image's tag and its content-addressed tag (a hash of its build "
                         "inputs) and exit")
    ap.add_argument("-v", "--verbose", action="store_true", help="stream docker build's output")
    a = ap.parse_args(argv)
    try:
        from rich.console import Console
        # Not a terminal (make, CI logs): wide enough that tags are not cut.
        console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    except ImportError:
        console = None
    try:
        images = plan(a.platform, [k for k in a.images.split(",") if k],
                      a.variants.split(",") if a.variants else None)
        if a.content_tags:
            for img in images:
                print(img.tag, content_tag(img))
            return 0
        if a.list:
            for img in images:
                print(img.tag, img.dockerfile.relative_to(REPO),
                      " ".join(f"{k}={v}" for k, v in img.build_args.items()))
            return 0
        t0 = time.monotonic()
        results = build(images, a.verbose, console)
    except ImageError as e:
        print(f"images: {e}", file=sys.stderr)
        return 2 if isinstance(e, ImageInputError) else 1
    except KeyboardInterrupt:
        return 130
    _table(results, console)
    print(f"{len(results)} images in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
