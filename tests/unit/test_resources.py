"""torbed.resources: one data root, the same layout in a checkout and in a wheel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torbed import resources

REPO = Path(__file__).resolve().parents[2]


def test_a_checkout_is_its_own_root():
    assert resources.ROOT == REPO and resources.CHECKOUT == REPO
    assert resources.checkout("a test") == REPO


def test_every_shipped_path_exists():
    for rel in resources.SHIPPED:
        assert (REPO / rel).exists(), rel


def test_manifest_carries_what_the_wheel_carries():
    # setup.py copies SHIPPED into the wheel; an sdist without them builds a wheel that fails.
    lines = [ln.split() for ln in (REPO / "MANIFEST.in").read_text().splitlines() if ln and not ln.startswith("#")]
    carried = {args[0] for verb, *args in lines if verb in ("graft", "include")}
    assert set(resources.SHIPPED) <= carried
    assert ["prune", "linkemu/target"] in lines


def test_path_refuses_what_is_not_shipped():
    assert resources.path("charts/torbed/Chart.yaml") == REPO / "charts" / "torbed" / "Chart.yaml"
    with pytest.raises(resources.ResourceError, match="SHIPPED"):
        resources.path("docs/reproduction.md")
    with pytest.raises(resources.ResourceError, match="SHIPPED"):
        resources.path("charts/torbedx")


def _resolved(env: dict) -> list[str]:
    code = "from torbed import constants, resources; print(resources.ROOT); print(resources.CHECKOUT); print(constants.VARIANTS_DIR)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=REPO).stdout
    return out.splitlines()


def test_torbed_home_wins(tmp_path):
    env = {**os.environ, "TORBED_HOME": str(tmp_path)}
    env.pop("TORBED_VARIANTS_DIR", None)
    assert _resolved(env) == [str(tmp_path), "None", str(tmp_path / "images" / "relay" / "variants")]
    # Not a checkout there: what needs one says so and what to do.
    p = subprocess.run([sys.executable, "-c", "from torbed import resources; resources.checkout('building images')"],
                       capture_output=True, text=True, env=env, cwd=REPO)
    assert p.returncode != 0 and "building images needs a torbed checkout" in p.stderr and "TORBED_HOME" in p.stderr


def test_no_module_finds_data_beside_its_own_file():
    # Data is found through torbed.resources; a path built from __file__'s parents breaks in a wheel.
    offenders = []
    for base in ("torbed", "analysis", "replay"):
        for f in (REPO / base).rglob("*.py"):
            if f.name == "resources.py":
                continue
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if "__file__" in line and re.search(r"parents\[|\.parent\.parent", line) and "sys.path" not in line:
                    offenders.append(f"{f.relative_to(REPO)}:{n}")
    assert not offenders
