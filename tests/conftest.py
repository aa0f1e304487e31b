import contextlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo() -> Path:
    return REPO


def require_root():
    if os.geteuid() != 0:
        pytest.fail("integration tests need root (network namespaces); run `make test` as root")


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.fail(f"'{name}' not found: run `make setup`")
    return path


@contextlib.contextmanager
def scratch_veth(prefix: str):
    """A throwaway network namespace with a veth ``eth0`` (peer ``eth1``) up, for tc tests;
    yields the ``ip netns exec NS`` prefix and removes the namespace afterwards."""
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        ex = ["ip", "netns", "exec", ns]
        subprocess.run(ex + ["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"], check=True)
        subprocess.run(ex + ["ip", "link", "set", "eth0", "up"], check=True)
        yield ex
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
