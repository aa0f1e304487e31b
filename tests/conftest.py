import os
import shutil
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
