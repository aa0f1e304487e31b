"""The mechanism gate's self-test in miniature (issue 36 items 1 and 7), with real tor.

One bottleneck (middle <-> exit at 2 Mbit/s) under bulk downloads with fixed SENDME windows
(cc_alg 0: each circuit keeps up to 1000 cells, ~0.5 MB, in flight) on the Vanilla scheduler
(ewma-66, as in Gopal & Heninger's Exp. 1), everything else at 100 Mbit/s:

- with the default 1000-frame FIFO (1.5 MB, 6 s at 2 Mbit/s) the FIFO stays nearly empty:
  the shaper sees MTU-sized frames (offloads off, shaping.ONE_FRAME_PER_SKB) and Linux's TCP
  small queues keep one connection's share of a local qdisc to a few frames, so the backlog
  waits in the exit's socket: the gate must flag the kernel send queue (until the veths'
  segmentation offload was turned off, 64 KB frames filled the FIFO to ~100-300 kB and the
  gate flagged the shaper: a testbed artifact);
- with ``queue: 50ms`` on the bottleneck (12.5 KB) the shaper never holds more than 50 ms
  and the flows still run at the link's rate (with 64 KB frames such a queue dropped whole
  frames and one flow got ~12 kB/s).

Both runs record meta.json ``gates`` and the report shows them. The CPU gate's verdict is
printed, not asserted: on a shared machine it is the machine's, not the code's.

Why not KIST: KIST writes to a socket only what TCP can send now, so the kernel never gets
enough to fill the FIFO and the backlog stays in tor. Seen here with kist and the default
FIFO: median 49 kB (0.19 s) in the shaper against 0.89 s in the exit's circuit queues, not
flagged, rightly. The Vanilla scheduler writes whatever the socket takes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import require_root
from tests.integration.helpers import namespaces, only_run_dir, records, run_torbed, small_scenario, write_scenario

# serial: the CPU gate's verdict and the bounds below (shaper median, goodput at 60% of the
# link) are about one network on the machine; a second network beside it starves these tors.
pytestmark = [pytest.mark.integration, pytest.mark.serial]


def bottleneck(name: str, queue: str | None) -> dict:
    pair = {"between": ["middle", "exit"], "rate": "2mbit", **({"queue": queue} if queue else {})}
    return small_scenario(name, **{
        "variants": ["ewma-66"],
        "network.consensus_params": {"cc_alg": 0},
        "links.pairs": [pair],
        "servers.www.files": {"small": "300KB", "bulk": "200MiB"},
        "clients": {"bulk": {"count": 3, "path": ["guard", "middle", "exit"],
                             "workload": {"kind": "bulk", "file": "bulk"}}},
        # 10 s of warm-up: the three circuits' windows (1000 cells each, 1.5 MB) fill the
        # 2 Mbit/s link's path in ~6 s; 35 s of window: 35 gate samples, 25 needed.
        "measure.warmup": "10s", "measure.duration": "35s", "measure.prometheus": {"enabled": False}})


def run_gates(tmp_path, name: str, queue: str | None) -> dict:
    out = tmp_path / name
    p = run_torbed(["run", str(write_scenario(tmp_path, bottleneck(name, queue))), "--out", str(out),
                    "--system-tor"], timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run_dir = only_run_dir(out)
    assert namespaces(run_dir) == []
    meta = json.loads((run_dir / "ewma-66" / "rep-0" / "meta.json").read_text())
    g = meta["gates"]
    print(f"\n{name}: valid={g['valid']} {g['invalid_reasons']}\n  queueing: {g['queueing']['status']}: "
          f"{g['queueing']['text']}\n  cpu: {g['cpu']['status']}: {g['cpu']['text']}\n"
          f"  completion: {g['completion']['status']}: {g['completion']['text']}")
    r = run_torbed(["report", str(run_dir)], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    report = (run_dir / "report" / "report.md").read_text()
    assert "## Mechanism gates" in report
    # the relays' send queues were read from /proc/PID/net/tcp of their tors, never by ss
    reader = meta["gate_sampling"]["socket_reader"]
    assert reader["proc"] >= 25 and reader["ss"] == 0, reader
    # ... from namespaces with a TCP hash of their own (the sysctl put back on the host after)
    assert meta["gate_sampling"]["tcp_hash_per_namespace"] == "private 2048 buckets", meta["gate_sampling"]
    assert Path("/proc/sys/net/ipv4/tcp_child_ehash_entries").read_text().strip() == "0"
    g["_rep"] = run_dir / "ewma-66" / "rep-0"
    return g


def goodput_bps(rep) -> float:
    """The bulk clients' bytes over the time from the first request to the last censoring."""
    recs = records(rep / "transfers.jsonl")
    t0 = min(r["t_request"] for r in recs)
    t1 = max(r.get("t_censor") or r.get("t_last_byte") or t0 for r in recs)
    return 8 * sum(r.get("bytes") or 0 for r in recs) / max(t1 - t0, 1e-9)


def test_a_full_fifo_is_flagged_and_a_small_queue_is_not(tmp_path):
    require_root()
    full = run_gates(tmp_path, "it-gate-fifo", None)
    small = run_gates(tmp_path, "it-gate-queue", "50ms")
    fq, sq = full["queueing"], small["queueing"]
    assert fq["shaper"]["shaper"] == "htb" and fq["shaper"]["samples"] >= 25     # 35 s window, 1 s apart
    # Where the backlog really is, named: the exit's socket toward the middle, not the FIFO.
    assert fq["status"] == "flag" and "kernel send-queue backlog dominates" in fq["text"], fq["text"]
    assert fq["shaper"]["median_s"] < 0.1, fq["shaper"]
    # The 50 ms queue: the shaper holds at most 12.5 KB (+ the frame being sent) and is not flagged.
    assert "shaper backlog dominates" not in sq["text"], sq["text"]
    assert sq["shaper"]["backlogged_links"]["exit0>middle0"]["max_bytes"] <= 12_500 + 1514, sq["shaper"]
    assert sq["shaper"]["median_s"] < 0.1, sq["shaper"]
    # ... and the small queue does not starve TCP: the link stays busy (2 Mbit/s).
    for g in (full, small):
        assert goodput_bps(g["_rep"]) >= 0.6 * 2e6, goodput_bps(g["_rep"])
    # The transfers ran in both (the bulk downloads are cut off by the window: censored, not failed).
    for g in (full, small):
        assert g["completion"]["status"] == "ok", g["completion"]
        assert g["cpu"]["status"] != "not measured", g["cpu"]
