"""The mtrelay variant with real tor: tor's own unit tests of the connection threads under
-Werror, then a network whose middle relay runs ``mtrelay-2`` (two connection threads own
the sockets and TLS of its relay connections) between stock relays, carrying sha256-checked
transfers: a lost, reordered or corrupted byte between the threads would break the relay
crypto of every later cell and fail the transfer or close the circuit.

A third test gives the middle a rate limit (``bandwidth:``, tor's BandwidthRate/Burst) and
checks that an mtrelay-2 middle, whose relay connections belong to its connection threads,
carries no more than the limit, as the stock middle of the same run does (README A.8).

Not exercised here: ThreadSanitizer (README A.10), load beyond a few circuits (that is the
throughput experiment, ``make bench``).
"""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from tests.conftest import require_root
from tests.integration.helpers import checked_build, only_run_dir, run_torbed, write_scenario
from torbed.analysis import torchestra as bench_torchestra
from torbed.variants import load_variant

pytestmark = pytest.mark.integration

# The patch's notice lines (connthreads.c).
THREADS_RUNNING = re.compile(r"RelayConnectionThreads: (\d+) connection threads running")
FIRST_CONN = re.compile(r"RelayConnectionThreads: connection thread (\d+) took over its first connection")
STOPPED = re.compile(r"RelayConnectionThreads: connection thread (\d+) stopped; it owned (\d+) connections, "
                     r"read (\d+) and wrote (\d+) bytes of cells")
OUR_TESTS = ("bytequeue_order", "bytequeue_two_threads", "one_thread_is_stock", "jobs_in_order",
             "handover_limit_arith", "handover_limit_bucket")


@pytest.fixture(autouse=True)
def _root():
    require_root()


def test_tor_unit_tests_with_our_patch_pass_under_werror(tmp_path):
    """build-tor.sh --check: tor and its unit tests built with --enable-fatal-warnings, our
    mtrelay/.. group run. Slow (a full build with tests), so the result is cached by the
    variant's content key: once per patch."""
    v = load_variant("mtrelay")
    info, log = checked_build("mtrelay", tmp_path)
    ours = re.findall(r"^mtrelay/(\S+): (?:\[forking\] )?OK", log, re.M)
    assert sorted(ours) == sorted(OUR_TESTS), log[-3000:]
    assert info["check"] is True
    assert "--enable-fatal-warnings" in info["configure_flags"]
    assert "mtrelay/.." in info["check_test_groups"]
    assert [x["file"] for x in info["patches"]] == [p.name for p in v.patches]


def test_middle_with_two_connection_threads_between_stock_relays(tmp_path):
    """Guard and exit run the unpatched build (variant kist), the middle mtrelay-2: both
    connection threads take over relay connections, bulk and fetch transfers through them
    all arrive sha256-checked, no circuit is closed for a protocol reason, and the
    threads carried (at least) every byte the clients received."""
    data = bench_torchestra.scenario("it-mtrelay-mixed", "25s", variant="kist", surge=1, light=2)
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


def _window_rates(recs: list[dict], window_s: float) -> list[float]:
    """Bytes written per second over every window of ``window_s`` seconds of consecutive
    relay_bw samples (the samples are 500 ms apart)."""
    out = []
    for i in range(len(recs)):
        n = dt = 0.0
        for r in recs[i:]:
            n += r["written"]
            dt += r["interval_s"]
            if dt >= window_s:
                out.append(n / dt)
                break
    return out


def test_rate_limited_middle_carries_no_more_than_its_limit(tmp_path):
    """A middle with BandwidthRate = BandwidthBurst = 1 MB/s (scenario ``bandwidth:``) on
    100 Mbit links, mtrelay-2 (its connection threads own the guard and exit connections), two
    bulk downloads through it: the middle's written bytes per 10 s window stay within the
    limit (+10%: the first window includes the 1 MB burst, a bucket may briefly go below zero)
    and the clients received no more than the limit allows over the run. Run with the patch
    before enforcement (README A.8), the mtrelay middle of this network carried 320-400 MB in
    46-47 s (7-9 MB/s) and this test failed: the limit is what binds. (Whether the limit also
    starves it, against the stock build: the experiment below.)"""
    _rate_limited_run(tmp_path, ["mtrelay-2"])


@pytest.mark.experiment
def test_rate_limited_mtrelay_is_not_starved_against_stock(tmp_path):
    """The same network, stock build (arm kist) and mtrelay-2: both within the limit, and the
    mtrelay middle is not starved by it (at least 60% of it, and of the stock middle's rate)."""
    seen, limit = _rate_limited_run(tmp_path, ["kist", "mtrelay-2"])
    assert seen["mtrelay-2"]["median_10s_Bps"] >= 0.6 * limit, seen
    assert seen["mtrelay-2"]["median_10s_Bps"] >= 0.6 * seen["kist"]["median_10s_Bps"], seen


def _rate_limited_run(tmp_path, arms: list[str]) -> tuple[dict, int]:
    """The network of the rate-limit tests, one repetition per arm: per arm what the clients
    received and the middle's 10 s window rates; every limit check of both tests applied."""
    from torbed.units import parse_rate

    data = bench_torchestra.scenario("it-mtrelay-ratelimit", "25s", variant="kist", surge=0, light=0, bulk=2)
    data["variants"] = arms
    relays = data["network"]["relays"]
    relays["guard"]["variant"] = relays["exit"]["variant"] = "kist"
    relays["middle"]["bandwidth"] = "1MB/s"
    limit = parse_rate("1MB/s") // 8
    data["links"] = {"default": {"rate": "100mbit"}}
    data["measure"]["collect"] = ["transfers", "relay_bw"]
    out = tmp_path / "runs"
    p = run_torbed(["run", str(write_scenario(tmp_path, data)), "--out", str(out)], timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run = only_run_dir(out)
    seen = {}
    for arm in arms:
        rep = run / arm / "rep-0"
        assert f"BandwidthRate {limit} bytes" in (rep / "torrc" / "middle0.torrc").read_text()
        meta = json.loads((rep / "meta.json").read_text())
        transfers = [json.loads(x) for x in (rep / "transfers.jsonl").read_text().splitlines() if x.strip()]
        failed = [t for t in transfers if t.get("status") not in ("ok", "cancelled")]
        assert not failed, failed[:3]
        # Everything the clients received crossed the middle while the workload ran: at most
        # the limit over that time, plus the burst. (Independent of tor's own counting.)
        got = sum(t.get("bytes") or 0 for t in transfers)
        span = meta["t_end"] - meta["t_workload_start"]
        seen[arm] = {"client_bytes": got, "span_s": round(span, 1)}
        assert got <= limit * span + limit, (arm, seen[arm])
        recs = [json.loads(x) for x in (rep / "relay_bw.jsonl").read_text().splitlines() if x.strip()]
        mid = sorted((r for r in recs if r["relay"] == "middle0"), key=lambda r: r["t"])
        assert len(mid) > 40, f"{arm}: too few relay_bw samples ({len(mid)})"
        rates = _window_rates(mid, 10.0)
        seen[arm].update(max_10s_Bps=round(max(rates)), median_10s_Bps=round(sorted(rates)[len(rates) // 2]))
        print(arm, json.dumps(seen[arm]))
        assert max(rates) <= 1.10 * limit, (arm, seen[arm])
    if "mtrelay-2" not in arms:
        return seen, limit
    middle = (run / "mtrelay-2" / "rep-0" / "logs" / "middle0.log").read_text(errors="replace")
    # The cell bytes the connection threads wrote, by their own count, over the middle's
    # whole life (bootstrap included: a lenient bound).
    stamps = re.findall(r"^(\w{3} +\d+ \d\d:\d\d:\d\d\.\d+) \[", middle, re.M)
    def when(stamp: str) -> datetime:   # tor's log stamps have no year
        return datetime.strptime(f"2000 {stamp}", "%Y %b %d %H:%M:%S.%f")
    life = when(stamps[-1]) - when(stamps[0])
    written = sum(int(m.group(4)) for m in STOPPED.finditer(middle))
    assert 0 < written <= limit * life.total_seconds() + limit, (written, life)
    assert sorted(m.group(1) for m in FIRST_CONN.finditer(middle)) == ["0", "1"]
    return seen, limit
