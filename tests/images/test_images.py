"""The container images themselves (`make images`), run with the local Docker engine.

The session fixture makes Docker available (hack/images/docker.sh) and brings the images for this
machine's architecture up to date (torbed.images: seconds when nothing changed); when either
is impossible the tests fail, they never skip. TORBED_IMAGES_BUILD=0 uses the images as they
are. Every container is started with --rm, --network none (a tor must never reach out) and a
label, and the last test checks that none is left.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from torbed import __version__, constants, images, resources
from torbed.variants import list_families

pytestmark = pytest.mark.images

LABEL = "io.torbed.test=images"
FAMILIES = list_families()
KINDS = ["dirauth", "client"] + [f"relay-{f}" for f in FAMILIES]

# tor writes only into its DataDirectory; the pods mount emptyDirs here and at /run/torbed
# and /tmp over a read-only root filesystem.
MINIMAL_TORRC = """\
DataDirectory /var/lib/torbed/data
SocksPort 0
Log notice stdout
{extra}
"""
READ_ONLY = ["--read-only", "--tmpfs", "/tmp", "--tmpfs", "/run/torbed:uid=10000,gid=10000",
             "--tmpfs", "/var/lib/torbed:uid=10000,gid=10000,mode=0700"]


@pytest.fixture(scope="session")
def docker() -> str:
    try:
        engine = images.ensure_engine()
    except images.ImageError as e:
        pytest.fail(f"Docker is not available: {e}")
    yield engine
    # Every container the tests started is gone (--rm), checked once all have run, whatever
    # their order.
    proc = subprocess.run([engine, "ps", "-aq", "--filter", f"label={LABEL}"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "", f"containers left behind: {proc.stdout}"


@pytest.fixture(scope="session")
def built(docker) -> dict[str, str]:
    """kind ('dirauth', 'client', 'relay-<family>') -> image tag, up to date."""
    plan = images.plan()
    if os.environ.get("TORBED_IMAGES_BUILD", "1") != "0":
        try:
            images.build(plan)
        except images.ImageError as e:
            pytest.fail(f"building the images failed: {e}")
    return {(f"relay-{i.family}" if i.kind == "relay" else i.kind): i.tag for i in plan}


def run(docker: str, image: str, *cmd: str, args: tuple[str, ...] = (), entrypoint: str | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    argv = [docker, "run", "--rm", "--network", "none", "--label", LABEL, *args]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    return subprocess.run([*argv, image, *cmd], capture_output=True, text=True, timeout=timeout)


def inspect(docker: str, image: str, fmt: str) -> str:
    proc = subprocess.run([docker, "image", "inspect", "-f", fmt, image], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def verify_config(docker, image, tmp_path, extra: str, read_only: bool = True):
    torrc = tmp_path / "torrc"
    torrc.write_text(MINIMAL_TORRC.format(extra=extra))
    torrc.chmod(0o644)
    args = ["-v", f"{torrc}:/etc/torbed-test/torrc:ro", *(READ_ONLY if read_only else [])]
    return run(docker, image, "tor", "--verify-config", "-f", "/etc/torbed-test/torrc", args=tuple(args))


@pytest.mark.parametrize("kind", KINDS)
def test_runs_as_torbed_user(docker, built, kind):
    proc = run(docker, built[kind], "sh", "-c", "id -u; id -g; getent passwd torbed; stat -c '%u %g %a' /var/lib/torbed")
    assert proc.returncode == 0, proc.stderr
    uid, gid, passwd, datadir = proc.stdout.splitlines()
    assert (uid, gid) == ("10000", "10000")
    assert passwd == "torbed:x:10000:10000::/var/lib/torbed:/usr/sbin/nologin"
    assert datadir == "10000 10000 700"
    assert inspect(docker, built[kind], "{{.Config.User}}") == "10000:10000"


@pytest.mark.parametrize("kind", KINDS)
def test_labels(docker, built, kind):
    labels = dict(line.split("=", 1) for line in
                  inspect(docker, built[kind], "{{range $k, $v := .Config.Labels}}{{$k}}={{$v}}\n{{end}}").splitlines())
    for key in ("org.opencontainers.image.title", "org.opencontainers.image.description",
                "org.opencontainers.image.source"):
        assert labels.get(key), key
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["io.torbed.tor-version"] == constants.TOR_VERSION
    assert labels["io.torbed.variant"] == (kind.removeprefix("relay-") if kind.startswith("relay-") else "stock")


@pytest.mark.parametrize("kind", KINDS)
def test_tor_version(docker, built, kind):
    proc = run(docker, built[kind], "tor", "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"Tor version {constants.TOR_VERSION}."
    # The default entrypoint (torbed-node) passes a command through.
    assert inspect(docker, built[kind], "{{json .Config.Entrypoint}}") == '["/usr/local/bin/torbed-node"]'


@pytest.mark.parametrize("kind", ["dirauth", "client"])
def test_tor_gencert(docker, built, kind):
    proc = run(docker, built[kind], "sh", "-c", "command -v tor-gencert && ! ldd /usr/local/bin/tor-gencert | grep 'not found'")
    assert proc.returncode == 0 and proc.stdout.strip() == "/usr/local/bin/tor-gencert", proc.stdout + proc.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_read_only_root(docker, built, kind, tmp_path):
    proc = verify_config(docker, built[kind], tmp_path, "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Configuration was valid" in proc.stdout
    # And a tor that runs (network disabled) can create its data directory on the emptyDir.
    torrc = tmp_path / "torrc"
    torrc.write_text(MINIMAL_TORRC.format(extra="DisableNetwork 1"))
    torrc.chmod(0o644)
    proc = run(docker, built[kind], "sh", "-c",
               "timeout -s INT 3 tor -f /etc/torbed-test/torrc; ls /var/lib/torbed/data",
               args=("-v", f"{torrc}:/etc/torbed-test/torrc:ro", *READ_ONLY))
    assert "[err]" not in proc.stdout, proc.stdout
    assert "Read-only file system" not in proc.stdout + proc.stderr
    assert "state" in proc.stdout.split() or "lock" in proc.stdout.split(), proc.stdout + proc.stderr


def test_round_robin_patch_only_in_vanilla(docker, built, tmp_path):
    # The patch adds CircuitMuxPolicy: vanilla's tor knows it, the unpatched tor does not.
    assert "vanilla" in FAMILIES and "ewma" in FAMILIES
    ok = verify_config(docker, built["relay-vanilla"], tmp_path, "CircuitMuxPolicy RoundRobin")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    rejected = verify_config(docker, built["relay-ewma"], tmp_path, "CircuitMuxPolicy RoundRobin")
    assert rejected.returncode != 0
    assert "CircuitMuxPolicy" in rejected.stdout + rejected.stderr


def test_config_only_families_share_the_unpatched_tor(docker, built):
    digests = {}
    for kind in KINDS:
        proc = run(docker, built[kind], "sha256sum", "/usr/local/bin/tor")
        assert proc.returncode == 0, proc.stderr
        digests[kind] = proc.stdout.split()[0]
    stock = {k for k in KINDS if k in ("dirauth", "client", "relay-ewma", "relay-kist", "relay-kistlite")}
    assert len({digests[k] for k in stock}) == 1, digests
    assert digests["relay-vanilla"] != digests["dirauth"]


def test_tor_is_this_machines_own_build_where_it_is_the_same(docker, built, tmp_path):
    """Where torbed.images takes the image's tor from this machine's build (same Debian release
    and architecture as the base image), the image holds exactly that build, stripped as the
    image's tor stage strips it, and its build.json says so; elsewhere the tor stage compiled it."""
    import json
    import shutil

    from torbed import builds
    from torbed.variants import load_variant

    base = images.ensure_base(images.host_arch(), docker)
    for kind, variant in (("dirauth", None), ("relay-vanilla", load_variant("vanilla"))):
        img = next(i for i in images.plan() if (f"relay-{i.family}" if i.kind == "relay" else i.kind) == kind)
        source, why = images.tor_source(img, base)
        info = json.loads(run(docker, built[kind], "cat", "/usr/local/share/torbed/tor-build.json").stdout)
        if source == "image":
            assert "built_on" not in info, why
            continue
        b = builds.ensure(variant)
        copy = tmp_path / f"{kind}-tor"
        shutil.copy2(b.tor, copy)
        subprocess.run(["strip", "--strip-unneeded", str(copy)], check=True)
        proc = run(docker, built[kind], "sha256sum", "/usr/local/bin/tor")
        assert proc.stdout.split()[0] == subprocess.run(["sha256sum", str(copy)], capture_output=True,
                                                        text=True).stdout.split()[0], kind
        assert info["built_on"].startswith("build machine") and info["patches"] == b.info["patches"]


def test_client_python_and_tc(docker, built):
    code = ("import torbed.client.driver, torbed.collectors, torbed.fileserver, torbed.keys, torbed.variants\n"
            "import torbed.pods.results\n"
            "import importlib.util as u\n"
            "assert not any(u.find_spec(m) for m in ('numpy', 'scipy', 'matplotlib')), 'analysis stack installed'\n"
            "from torbed.variants import list_families\n"
            "print(' '.join(list_families()))\n")
    proc = run(docker, built["client"], "python", "-c", code, args=tuple(READ_ONLY))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == FAMILIES
    proc = run(docker, built["client"], "sh", "-c", "command -v python; tc -V")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "/opt/torbed/bin/python"
    assert "iproute2" in proc.stdout


def test_locust_image_runs_the_pinned_locust_beside_torbed(docker, built):
    """The load pods' image: Locust at hack/constraints.txt's pin in /opt/locust (read-only
    root, as in the pods), torbed's pod program and torbed-node from the client image."""
    import re
    pin = re.search(r"^locust==(\S+)", (resources.checkout("tests/images") / "hack" / "constraints.txt").read_text(), re.M).group(1)
    proc = run(docker, built["locust"], "/opt/locust/bin/locust", "--version", args=tuple(READ_ONLY))
    assert proc.returncode == 0 and f"locust {pin} " in proc.stdout, proc.stdout + proc.stderr
    # requests' SOCKS support (socks5h through the load node's tor) in Locust's venv.
    proc = run(docker, built["locust"], "/opt/locust/bin/python", "-c",
               "import socks, requests.adapters as a; a.SOCKSProxyManager('socks5h://u:p@127.0.0.1:9050')",
               args=tuple(READ_ONLY))
    assert proc.returncode == 0, proc.stderr
    proc = run(docker, built["locust"], "python", "-c",
               "import torbed.pods.locust as m, torbed.load as l, os; print(m.locust_argv()[0], l.LOCUSTFILE.exists())",
               args=tuple(READ_ONLY))
    assert proc.returncode == 0 and proc.stdout.split() == ["/opt/locust/bin/locust", "True"], proc.stdout + proc.stderr
    proc = run(docker, built["locust"], "tor", "--version")
    assert proc.returncode == 0 and constants.TOR_VERSION in proc.stdout, proc.stderr


def test_sizes(docker, built, capsys):
    sizes = {kind: int(inspect(docker, tag, "{{.Size}}")) for kind, tag in built.items()}
    with capsys.disabled():
        print("\nimage sizes: " + ", ".join(f"{built[k]} {v / 1e6:.1f} MB" for k, v in sizes.items()))
    # Guards against an image suddenly growing (a build toolchain left in it).
    for kind, size in sizes.items():
        # locust: the client image plus Locust's venv (about 55 MB).
        assert size < {"client": 250e6, "locust": 300e6, "prometheus": 160e6}.get(kind, 120e6), (kind, size)


def test_prometheus_is_debians_and_serves_from_a_read_only_root(docker, built):
    """The chart's Prometheus image: Debian's 2.42, as uid 10000, starts over a read-only root
    with its TSDB on the (here tmpfs) volume, and its web UI's assets are all there (the image
    deletes data it does not load)."""
    image = built["prometheus"]
    assert inspect(docker, image, "{{.Config.User}}") == "10000:10000"
    proc = run(docker, image, "--version")
    assert proc.returncode == 0 and "prometheus, version 2.42." in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    script = ("printf 'scrape_configs: []\\n' > /tmp/p.yml; "
              "timeout -s INT 6 prometheus --config.file=/tmp/p.yml --storage.tsdb.path=/prometheus "
              "--web.listen-address=127.0.0.1:9090 2>&1; ls /prometheus")
    proc = run(docker, image, "-c", script, entrypoint="sh",
               args=("--read-only", "--tmpfs", "/tmp", "--tmpfs", "/prometheus:uid=10000,gid=10000"))
    assert "Server is ready to receive web requests." in proc.stdout, proc.stdout[-3000:]
    assert "wal" in proc.stdout.split(), proc.stdout[-2000:]
    # Every asset the classic UI's templates load exists (no dangling link after the cleanup).
    check = ("cd /usr/share/prometheus/web; "
             "for f in $(grep -ho 'static/[^\"?]*' templates/*.html | sort -u); do [ -e \"$f\" ] || echo MISSING $f; done; "
             "find -L . -type l | sed 's/^/DANGLING /'; echo checked")
    proc = run(docker, image, "-c", check, entrypoint="sh")
    assert proc.stdout.strip() == "checked", proc.stdout
