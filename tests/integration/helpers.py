"""Helpers for integration tests: write scenarios, run `torbed` as a real subprocess, check leftovers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
TORBED = [sys.executable, "-m", "torbed.cli"]


def small_scenario(name: str, **overrides) -> dict:
    """A quickstart-shaped network: 3 authorities, guard/middle/exit, one server."""
    s = {
        "apiVersion": "torbed/v1",
        "name": name,
        "variants": ["kist"],
        "network": {"authorities": 3, "relays": {"guard": {"guard": True}, "middle": {}, "exit": {"exit": True}}},
        "links": {"default": {"rate": "100mbit"}},
        "servers": {"www": {"files": {"small": "300KB", "bulk": "5MiB"}}},
        "clients": {"web": {"path": ["guard", "middle", "exit"],
                            "workload": {"kind": "fetch", "file": "small", "repeat": 5, "pause": "0s"}}},
        "measure": {"warmup": "0s", "duration": "30s", "ready_timeout": "120s"},
    }
    for key, value in overrides.items():
        node = s
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return s


def write_scenario(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO)
    e["COLUMNS"] = "200"
    return e


def run_torbed(args: list[str], timeout: float = 600, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(TORBED + args, capture_output=True, text=True, timeout=timeout,
                          env={**env(), **(env_extra or {})}, cwd=REPO)


def start_torbed(args: list[str], log: Path) -> subprocess.Popen:
    f = open(log, "w")
    return subprocess.Popen(TORBED + args, stdout=f, stderr=subprocess.STDOUT, env=env(), cwd=REPO)


def only_run_dir(out: Path) -> Path:
    dirs = [d for d in out.iterdir() if d.is_dir() and not d.is_symlink()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def wait_for(pred, timeout: float, what: str, interval: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def namespaces(run_dir: Path | None = None) -> list[str]:
    """torbed's namespaces; with ``run_dir``, only those of that run's repetitions (other
    runs may be going on at the same time on a developer's machine)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.startswith("tb-")]
    if run_dir is None:
        return names
    ids = [json.loads(m.read_text()).get("run_id") for m in Path(run_dir).glob("*/rep-*/meta.json")]
    assert ids and all(ids), f"no run ids in {run_dir}"
    return [n for n in names if any(n.startswith(f"tb-{i}-") for i in ids)]


def run_ids(run_dir: Path) -> list[str]:
    """The run ids (namespace and scratch names) of a run directory's repetitions."""
    return [i for m in Path(run_dir).glob("*/rep-*/meta.json") if (i := json.loads(m.read_text()).get("run_id"))]


def run_processes(run_dir: Path) -> list[str]:
    """Processes of this run: those naming its run directory (drivers, collectors, servers)
    and its scratch directories (tor reads its torrc there)."""
    return processes_mentioning(str(run_dir)) + [p for i in run_ids(run_dir)
                                                 for p in processes_mentioning(f"/tmp/torbed-{i}/")]


def states_under(out: Path) -> list[dict]:
    """torbed's state files (live or leftover runs) whose run directory is under ``out``."""
    from torbed import constants
    found = []
    for f in constants.STATE_DIR.glob("*.json"):
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if str(st.get("run_dir", "")).startswith(str(out)):
            found.append({**st, "_file": str(f)})
    return found


def leftovers(run_dir: Path) -> list[str]:
    """What of this run (only: other runs may be going on) is still on the machine:
    namespaces, processes (tor, drivers, the watchdog), state files, scratch directories."""
    from torbed import constants
    ids = run_ids(run_dir)
    assert ids, f"no run ids in {run_dir}"
    left = [f"namespace {n}" for n in namespaces(run_dir)]
    left += [f"process {p}" for p in run_processes(run_dir)]
    for i in ids:
        left += [f"process {p}" for p in processes_mentioning(str(constants.STATE_DIR / f"{i}.json"))]
        left += [f"state file {f}" for f in [constants.STATE_DIR / f"{i}.json"] if f.exists()]
        left += [f"scratch {d}" for d in [Path(f"/tmp/torbed-{i}")] if d.exists()]
    return left + [f"state file {st['_file']}" for st in states_under(run_dir)]


def processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def checked_build(variant: str, tmp_path: Path) -> tuple[dict, str]:
    """`build-tor.sh --check` of a variant's patches (tor and its unit tests built with
    --enable-fatal-warnings, the variant's test groups run): its build.json and the check's
    log. Slow (a full build with tests), so cached by the variant's content key under
    ~/.cache/torbed/check/: once per patch set. The build must succeed."""
    import shutil

    from torbed import constants
    from torbed.variants import load_variant
    v = load_variant(variant)
    done = constants.CACHE_DIR / "check" / v.build_key / "build.json"
    if not done.exists():
        out = tmp_path / "check-build"
        cmd = ["bash", str(constants.BUILD_SCRIPT), "--out", str(out), "--check"]
        for patch in v.patches:
            cmd += ["--patch", str(patch)]
        from torbed.builds import compiler_cache_env
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                           env={**os.environ, **compiler_cache_env()})
        assert p.returncode == 0, p.stderr[-4000:]
        done.parent.mkdir(parents=True, exist_ok=True)
        (done.parent / "check.log").write_text(p.stderr)
        shutil.copy(out / "build.json", done.with_suffix(".tmp"))
        done.with_suffix(".tmp").rename(done)
    return json.loads(done.read_text()), (done.parent / "check.log").read_text()
