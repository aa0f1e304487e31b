"""torbed installed from its wheel, used from outside the checkout: the package list and the
shipped data (torbed.resources) are complete. The run part needs root (network namespaces).

The wheel is built with pip (`pip wheel --no-deps`, no other build tool) and installed with
--no-deps into a fresh venv whose dependencies come from this test's own interpreter: a .pth
file appends that interpreter's site-packages after the new venv's own. Installing the
dependencies from PyPI instead would take minutes and the network, and install the very same
pinned versions (hack/constraints.txt); what this test checks is the wheel's own content.
Files in a directory added by a .pth are not processed as .pth files, so the checkout's
editable install stays invisible: torbed is imported from the wheel only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import require_root
from tests.integration.helpers import REPO, namespaces

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("install")
    wheels = tmp / "wheels"
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    [wheel] = wheels.glob("torbed-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "torbed-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TORBED_HOME", "TORBED_VARIANTS_DIR", "VIRTUAL_ENV")}
    env.update(COLUMNS="200", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    work = tmp / "elsewhere"      # not the checkout: nothing to find beside the working directory
    work.mkdir()

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, env=env, cwd=work, timeout=timeout)

    root = run(str(py), "-c", "import torbed, torbed.resources as r; print(r.ROOT); print(torbed.__file__)")
    assert root.returncode == 0, root.stderr
    data_root, package = (Path(line) for line in root.stdout.splitlines())
    return {"torbed": str(venv / "bin" / "torbed"), "run": run, "work": work, "root": data_root,
            "package": package, "purelib": Path(purelib)}


def test_the_wheel_has_its_packages_and_data(installed):
    from torbed import __version__
    assert installed["package"].is_relative_to(installed["purelib"])      # not the checkout's
    assert installed["root"] == installed["purelib"] / "torbed" / "_data"
    for rel in ("charts/torbed/Chart.yaml", "images/relay/variants/vanilla/variant.yaml",
                "images/relay/build-tor.sh", "scenarios/quickstart.yaml", "linkemu/Cargo.toml"):
        assert (installed["root"] / rel).is_file(), rel
    assert not (installed["root"] / "linkemu" / "target").exists()
    run, torbed = installed["run"], installed["torbed"]
    p = run(torbed, "--version")
    assert p.returncode == 0 and p.stdout.strip() == f"torbed {__version__}", p.stdout + p.stderr
    # --help imports every subcommand's module (torbed.nightly was missing from the old wheel).
    p = run(torbed, "--help")
    assert p.returncode == 0 and "nightly" in p.stdout, p.stderr
    p = run(torbed, "validate", str(installed["root"] / "scenarios" / "gopal-heninger-2012-exp2.yaml"))
    assert p.returncode == 0, p.stdout + p.stderr
    p = run(torbed, "variants", "--json")
    assert p.returncode == 0, p.stderr
    assert Path(json.loads(p.stdout)["variants_dir"]) == installed["root"] / "images" / "relay" / "variants"


def test_the_installed_torbed_runs_and_reports_the_quickstart(installed):
    require_root()
    run, torbed, out = installed["run"], installed["torbed"], installed["work"] / "runs"
    quickstart = installed["root"] / "scenarios" / "quickstart.yaml"
    # ewma-66 is config-only: the system tor, no build from source.
    p = run(torbed, "run", str(quickstart), "--variant", "ewma-66", "--system-tor", "--duration", "30s",
            "--out", str(out), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    run_dir = Path(p.stdout.strip().splitlines()[-1])
    assert run_dir.is_dir() and run_dir.is_relative_to(out)
    assert not namespaces(run_dir)
    transfers = (run_dir / "ewma-66" / "rep-0" / "transfers.jsonl").read_text().splitlines()
    assert any(json.loads(line)["status"] == "ok" for line in transfers)
    p = run(torbed, "report", str(run_dir), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    assert (run_dir / "report" / "summary.json").is_file() and (run_dir / "report" / "report.md").is_file()
