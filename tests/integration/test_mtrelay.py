"""The mtrelay variant with real tor: tor's own unit tests of the connection threads under
-Werror, then a network whose middle relay runs ``mtrelay-2`` (two connection threads own
the sockets and TLS of its relay connections) between stock relays, carrying sha256-checked
transfers: a lost, reordered or corrupted byte between the threads would break the relay
crypto of every later cell and fail the transfer or close the circuit.

Not exercised here: ThreadSanitizer (README A.10), rate limits (A.8), load beyond a few
circuits (that is the throughput experiment, not yet written).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.conftest import require_root
from tests.integration.helpers import only_run_dir, run_torbed, write_scenario
from torbed import bench_torchestra, constants
from torbed.variants import load_variant

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The patch's notice lines (connthreads.c).
THREADS_RUNNING = re.compile(r"RelayConnectionThreads: (\d+) connection threads running")
FIRST_CONN = re.compile(r"RelayConnectionThreads: connection thread (\d+) took over its first connection")
STOPPED = re.compile(r"RelayConnectionThreads: connection thread (\d+) stopped; it owned (\d+) connections, "
                     r"read (\d+) and wrote (\d+) bytes of cells")
OUR_TESTS = ("bytequeue_order", "bytequeue_two_threads", "one_thread_is_stock", "jobs_in_order")


@pytest.fixture(autouse=True)
def _root():
    require_root()


def test_tor_unit_tests_with_our_patch_pass_under_werror(tmp_path):
    """build-tor.sh --check: tor and its unit tests built with --enable-fatal-warnings, our
    mtrelay/.. group run. Slow (a full build with tests), so the result is cached by the
    variant's content key: once per patch."""
    v = load_variant("mtrelay")
    done = constants.CACHE_DIR / "check" / v.build_key / "build.json"
    if not done.exists():
        out = tmp_path / "check-build"
        cmd = ["bash", str(constants.BUILD_SCRIPT), "--out", str(out), "--check"]
        for p in v.patches:
            cmd += ["--patch", str(p)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        assert p.returncode == 0, p.stderr[-4000:]
        ours = re.findall(r"^mtrelay/(\S+): \[forking\] OK", p.stderr, re.M)
        assert sorted(ours) == sorted(OUR_TESTS), p.stderr[-3000:]
        done.parent.mkdir(parents=True, exist_ok=True)
        (done.parent / "check.log").write_text(p.stderr)
        shutil.copy(out / "build.json", done.with_suffix(".tmp"))
        done.with_suffix(".tmp").rename(done)
    info = json.loads(done.read_text())
    assert info["check"] is True
    assert "--enable-fatal-warnings" in info["configure_flags"]
    assert "mtrelay/.." in info["check_test_groups"]
    assert [x["file"] for x in info["patches"]] == [p.name for p in v.patches]
    log = (done.parent / "check.log").read_text()
    for t in OUR_TESTS:
        assert f"mtrelay/{t}: [forking] OK" in log


def test_middle_with_two_connection_threads_between_stock_relays(tmp_path):
    """Guard and exit run the unpatched build (variant kist), the middle mtrelay-2: both
    connection threads take over relay connections, bulk and fetch transfers through them
    all arrive sha256-checked, no circuit is closed for a protocol reason, and the
    threads carried (at least) every byte the clients received."""
    data = bench_torchestra.scenario("it-mtrelay-mixed", "40s", variant="kist", surge=1, light=2)
    data["network"]["relays"]["middle"]["variant"] = "mtrelay-2"
    out = tmp_path / "runs"
    p = run_torbed(["run", str(write_scenario(tmp_path, data)), "--out", str(out)], timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run = only_run_dir(out)
    meta = json.loads((run / "kist" / "rep-0" / "meta.json").read_text())
    # The middle alone ran without torbed's MALLOC_ARENA_MAX=1 (variant.yaml env).
    assert meta["bootstrap"]["variant_env"] == {"mtrelay-2": {"MALLOC_ARENA_MAX": ""}}
    assert meta["bootstrap"]["malloc_arena_max"] == "1"
    summary = bench_torchestra.analyse(run, "kist")
    print(json.dumps({k: v for k, v in summary.items() if k != "relays"}))
    assert bench_torchestra.problems(summary) == []
    assert summary["transfers_ok"] >= 3
    logs = run / "kist" / "rep-0" / "logs"
    middle = (logs / "middle0.log").read_text(errors="replace")
    assert [m.group(1) for m in THREADS_RUNNING.finditer(middle)] == ["2"]
    assert sorted(m.group(1) for m in FIRST_CONN.finditer(middle)) == ["0", "1"]
    stopped = {m.group(1): [int(x) for x in m.groups()[1:]] for m in STOPPED.finditer(middle)}
    print("middle connection threads (connections, bytes in, bytes out):", stopped)
    assert sorted(stopped) == ["0", "1"], "the relay did not stop its threads cleanly"
    # Each received byte crossed the middle once in each direction as cells (payload
    # plus cell overhead), so both directions carried more than the payload.
    assert sum(v[1] for v in stopped.values()) > summary["bytes_ok"]
    assert sum(v[2] for v in stopped.values()) > summary["bytes_ok"]
    for stock in ("guard0", "exit0"):
        assert not THREADS_RUNNING.search((logs / f"{stock}.log").read_text(errors="replace"))
