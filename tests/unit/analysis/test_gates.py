"""analysis/gates.py: the mechanism gates' verdicts (valid / invalid / flag) on constructed
records, and what the report does with them (invalid repetitions excluded, flags shown)."""

from __future__ import annotations

import json

import pytest

from torbed.analysis import gates
from torbed.analysis.report import report
from torbed.gates import THRESHOLDS

T0 = 1000.0          # workload start; warm-up 10 s, duration 60 s: window 1010 .. 1060
META = {"t_workload_start": T0, "warmup_s": 10.0, "duration_s": 60.0, "status": "ok"}
RATE = 2_000_000     # bits/s: 250,000 bytes = 1 s


def jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def shaper_records(backlog_bytes, link="exit0>middle0", delay_s=0.0, start=T0, n=70):
    recs = [{"type": "shaper_links", "shaper": "htb",
             "links": [{"link": link, "rate_bps": RATE, "delay_s": delay_s},
                       {"link": "guard0>bulk0", "rate_bps": 100_000_000, "delay_s": 0.0}]}]
    for i in range(n):
        b = backlog_bytes(i) if callable(backlog_bytes) else backlog_bytes
        recs.append({"type": "shaper", "t": start + i, "backlog": {link: b} if b else {}})
    return recs


def cell_records(wait_ms_per_cell, relay="middle0", start=T0, n=70):
    return [{"type": "cellstats", "relay": relay, "t": start + i + 0.5,
             "inbound": {"removed": {"relay": 100}, "time_ms": {"relay": 100 * wait_ms_per_cell}},
             "outbound": None} for i in range(n)]


def cpu_records(wait_frac=None, steal_per_s=0, target_thread_frac=None, others_ticks_per_s=0, n=70, start=T0):
    """Cumulative counters, hz 100, 2 CPUs (200 ticks a second). ``wait_frac``: {name: fraction
    of each second its main thread waited}; every process uses 10 ticks a second."""
    wait_frac = wait_frac or {}
    names = {"guard0": ("relay", "guard"), "middle0": ("relay", "middle"), "exit0": ("relay", "exit"),
             "bulk0": ("client", "bulk"), "bulk0.driver": ("driver", "bulk"), "auth0": ("authority", "authority"),
             "linkemu": ("shaper", None)}
    recs = []
    for i in range(n):
        procs = {name: {"role": role, "group": group, "ticks": 10 * i, "run_ns": int(0.1e9 * i),
                        "wait_ns": int(wait_frac.get(name, 0.001) * 1e9 * i), "slices": 100 * i}
                 for name, (role, group) in names.items()}
        ours = 10 * i * len(names)
        rec = {"type": "cpu", "t": start + i, "hz": 100, "procs": procs,
               "host": {"busy": ours + others_ticks_per_s * i, "total": 200 * i, "steal": steal_per_s * i,
                        "cpus": 2, "load1": 1.0}}
        if target_thread_frac is not None:
            rec["threads"] = {"middle0": {"1": int(100 * target_thread_frac * i), "2": i}}
        recs.append(rec)
    return recs


def transfers(completed=10, censored=2, stalled=0, failed=0, warmup=1):
    out = []
    for status, cause, k in (("ok", None, completed), ("cancelled", "run_ended", censored),
                             ("error", "stall", stalled), ("timeout", "timeout", failed)):
        out += [{"type": "transfer", "group": "web", "file": "small", "status": status, "warmup": False,
                 "error": {"cause": cause} if cause else None} for _ in range(k)]
    out += [{"type": "transfer", "group": "web", "file": "small", "status": "error", "warmup": True,
             "error": {"cause": "stall"}} for _ in range(warmup)]
    return out


def rep_dir(tmp_path, shaper=None, cells=None, cpu=None, xfers=None):
    d = tmp_path
    d.mkdir(parents=True, exist_ok=True)
    if shaper is not None:
        jsonl(d / "shaper.jsonl", shaper)
    jsonl(d / "cellstats.jsonl", cells if cells is not None else cell_records(20))
    if cpu is not None:
        jsonl(d / "cpu.jsonl", cpu)
    jsonl(d / "transfers.jsonl", xfers if xfers is not None else transfers())
    return d


# -- queueing ---------------------------------------------------------------------------

def test_a_full_fifo_is_flagged_with_its_figures(tmp_path):
    d = rep_dir(tmp_path, shaper=shaper_records(lambda i: 750_000 + 1000 * (i % 10)), cells=cell_records(20),
                cpu=cpu_records())
    g = gates.evaluate(d, META)
    q = g["queueing"]
    assert q["status"] == "flag" and g["valid"] and g["flags"] == [q["text"]]
    assert q["shaper"]["link"] == "exit0>middle0" and q["shaper"]["samples"] == 51   # 1010 .. 1060
    assert q["shaper"]["median_s"] == pytest.approx(3.0, abs=0.05)
    assert q["circuit_queues"]["relay"] == "middle0" and q["circuit_queues"]["median_s"] == pytest.approx(0.02)
    assert q["text"].startswith("shaper backlog dominates: median queueing in the shaper 3.0")
    assert "vs 20 ms in circuit queues (middle0" in q["text"]


def test_a_small_shaper_queue_or_larger_circuit_queues_are_not_flagged(tmp_path):
    small = gates.evaluate(rep_dir(tmp_path / "a", shaper=shaper_records(12_500), cpu=cpu_records()), META)
    assert small["queueing"]["status"] == "ok"          # 50 ms < shaper_backlog_min_s
    tor = gates.evaluate(rep_dir(tmp_path / "b", shaper=shaper_records(250_000), cells=cell_records(1500),
                                 cpu=cpu_records()), META)
    assert tor["queueing"]["status"] == "ok"            # 1 s in the shaper, 1.5 s in circuit queues
    assert tor["queueing"]["shaper"]["median_s"] == pytest.approx(1.0)


def test_the_longest_wait_wins_not_the_most_bytes(tmp_path):
    # guard0>bulk0 holds 100 kB at 100 Mbit/s (8 ms), exit0>middle0 50 kB at 2 Mbit/s (0.2 s).
    recs = shaper_records(50_000)
    for r in recs[1:]:
        r["backlog"]["guard0>bulk0"] = 100_000
    sh = gates.evaluate(rep_dir(tmp_path, shaper=recs, cpu=cpu_records()), META)["queueing"]["shaper"]
    assert sh["link"] == "exit0>middle0" and sh["median_s"] == pytest.approx(0.2)
    assert set(sh["backlogged_links"]) == {"exit0>middle0", "guard0>bulk0"}


def test_idle_links_tie_to_the_slowest_and_backlogged_links_are_listed(tmp_path):
    recs = shaper_records(lambda i: 3000 if i % 10 == 0 else 0)    # exit0>middle0: mostly empty
    g = gates.evaluate(rep_dir(tmp_path, shaper=recs, cpu=cpu_records()), META)
    sh = g["queueing"]["shaper"]
    assert sh["link"] == "exit0>middle0" and sh["median_bytes"] == 0
    assert sh["backlogged_links"] == {"exit0>middle0": {"median_bytes": 0.0, "p90_bytes": 3000.0,
                                                        "max_bytes": 3000.0}}


def test_a_kernel_send_queue_backlog_is_flagged_beside_the_shaper(tmp_path):
    # The shaper holds 50 ms, the exit's socket toward the middle 500 kB = 2 s at 2 Mbit/s.
    d = rep_dir(tmp_path, shaper=shaper_records(12_500), cells=cell_records(20), cpu=cpu_records())
    jsonl(d / "sockets.jsonl", [{"type": "sockets", "t": T0 + i, "send_q": {"exit0>middle0": 500_000,
                                                                            "exit0>www0": 10**6}}
                                for i in range(70)])
    q = gates.evaluate(d, META)["queueing"]
    assert q["status"] == "flag" and q["text"].startswith("kernel send-queue backlog dominates: ")
    assert q["sockets"]["link"] == "exit0>middle0" and q["sockets"]["median_s"] == pytest.approx(2.0)
    assert "in kernel send queues 2.00 s (exit0>middle0" in q["text"]      # exit0>www0: no rate known
    assert "shaper backlog dominates" not in q["text"]


def test_netem_delay_line_is_not_counted_as_queueing(tmp_path):
    # 100 ms delay at 2 Mbit/s: 25,000 bytes are in flight in netem's queue, not queued.
    g = gates.evaluate(rep_dir(tmp_path, shaper=shaper_records(30_000, delay_s=0.1), cpu=cpu_records()), META)
    assert g["queueing"]["shaper"]["median_bytes"] == pytest.approx(5_000)
    assert g["queueing"]["status"] == "ok"


def test_no_samples_no_verdict(tmp_path):
    g = gates.evaluate(rep_dir(tmp_path / "a", cpu=cpu_records()), META)
    assert g["queueing"]["status"] == "not measured" and g["valid"]
    few = gates.evaluate(rep_dir(tmp_path / "b", shaper=shaper_records(10**6, n=13), cpu=cpu_records()), META)
    assert few["queueing"]["status"] == "not measured" and "3 samples in the window (fewer than 5 usable" in \
        few["queueing"]["text"]
    # Samples whose sender could not be read are missing, not zero.
    broken = shaper_records(10**6)
    for r in broken[1:]:
        r["backlog"], r["failed"] = {}, ["exit0"]
    failed = gates.evaluate(rep_dir(tmp_path / "e", shaper=broken, cpu=cpu_records()), META)
    assert failed["queueing"]["status"] == "not measured", failed["queueing"]
    assert "51 of them incomplete (fewer than 5 usable for 1 rate-limited link(s))" in failed["queueing"]["text"]
    half = shaper_records(750_000)
    for r in half[1::2]:
        r["backlog"], r["failed"] = {}, ["exit0"]
    h = gates.evaluate(rep_dir(tmp_path / "f", shaper=half, cpu=cpu_records()), META)
    assert h["queueing"]["status"] == "flag" and h["queueing"]["shaper"]["link_samples"] == 25
    none = gates.evaluate(rep_dir(tmp_path / "c", shaper=[{"type": "shaper_links", "shaper": "none", "links": []}],
                                  cpu=cpu_records()), META)
    assert none["queueing"]["status"] == "ok"
    k8s = gates.evaluate(rep_dir(tmp_path / "d"), META, not_measured="not measured on k8s")
    assert k8s["queueing"]["text"] == "shaper backlog and kernel send queues: not measured on k8s"
    assert k8s["cpu"]["text"] == "CPU: not measured on k8s" and k8s["valid"]
    cpu_only = gates.evaluate(rep_dir(tmp_path / "g"), META, not_measured={"cpu": "not measured on k8s"})
    assert cpu_only["cpu"]["text"] == "CPU: not measured on k8s"
    assert cpu_only["queueing"]["text"] == "shaper backlog not measured (no shaper.jsonl)"


def test_samples_of_one_sender_each_are_not_zeros_for_the_others(tmp_path):
    """Kubernetes: every pod's shaper sidecar writes its own record each second. A link's
    series is its sender's records only; another pod's record is not a sample of an empty
    queue (else ten pods would put a link's median at zero)."""
    recs = [{"type": "shaper_links", "shaper": "htb",
             "links": [{"link": "exit0>middle", "rate_bps": RATE, "delay_s": 0.0}]},
            {"type": "shaper_links", "shaper": "htb", "links": []}]
    socks = []
    for i in range(70):
        recs.append({"type": "shaper", "t": T0 + i, "backlog": {"exit0>middle": 750_000}, "senders": ["exit0"]})
        socks.append({"type": "sockets", "t": T0 + i, "send_q": {"exit0>middle": 500_000}, "senders": ["exit0"]})
        for other in ("guard0", "middle0", "web0"):
            recs.append({"type": "shaper", "t": T0 + i + 0.1, "backlog": {}, "senders": [other]})
            socks.append({"type": "sockets", "t": T0 + i + 0.1, "send_q": {}, "senders": [other]})
    d = rep_dir(tmp_path, shaper=recs, cells=cell_records(20), cpu=cpu_records())
    jsonl(d / "sockets.jsonl", socks)
    q = gates.evaluate(d, META)["queueing"]
    assert q["shaper"]["link"] == "exit0>middle" and q["shaper"]["link_samples"] == 51
    assert q["shaper"]["median_s"] == pytest.approx(3.0) and q["sockets"]["median_s"] == pytest.approx(2.0)
    assert q["status"] == "flag" and "shaper backlog dominates" in q["text"]
    # A network without a rate-limited link: headers without links, samples of no sender.
    bare = [{"type": "shaper_links", "shaper": "htb", "links": []}] + \
        [{"type": "shaper", "t": T0 + i, "backlog": {}, "senders": []} for i in range(70)]
    ok = gates.evaluate(rep_dir(tmp_path / "bare", shaper=bare, cpu=cpu_records()), META)["queueing"]
    assert ok["status"] == "ok" and ok["text"] == "no rate-limited link: no shaper queue"


# -- CPU --------------------------------------------------------------------------------

def test_cpu_valid_and_starved(tmp_path):
    ok = gates.evaluate(rep_dir(tmp_path / "a", cpu=cpu_records()), META)
    assert ok["cpu"]["status"] == "ok" and ok["valid"]
    p = ok["cpu"]["processes"]["middle0"]
    assert p["cpu_cores"] == pytest.approx(0.1) and p["wait_fraction"] == pytest.approx(0.001, rel=0.05)
    assert ok["cpu"]["host"]["others_busy_fraction"] == pytest.approx(0.0, abs=1e-9)
    bad = gates.evaluate(rep_dir(tmp_path / "b", cpu=cpu_records({"exit0": 0.25, "bulk0.driver": 0.12})), META)
    assert not bad["valid"] and bad["cpu"]["status"] == "invalid"
    assert bad["cpu"]["starved"] == ["exit0", "bulk0.driver"]
    assert "CPU-starved: 2 process(es)" in bad["invalid_reasons"][0] and "exit0 25%" in bad["invalid_reasons"][0]
    # An authority waiting is recorded, not gated: it is not on the measured path.
    auth = gates.evaluate(rep_dir(tmp_path / "c", cpu=cpu_records({"auth0": 0.5})), META)
    assert auth["valid"] and auth["cpu"]["processes"]["auth0"]["wait_fraction"] == pytest.approx(0.5)


def test_steal_invalidates_and_other_load_flags(tmp_path):
    steal = gates.evaluate(rep_dir(tmp_path / "a", cpu=cpu_records(steal_per_s=20)), META)   # 10 %
    assert not steal["valid"] and "steal 10.0%" in steal["invalid_reasons"][0]
    busy = gates.evaluate(rep_dir(tmp_path / "b", cpu=cpu_records(others_ticks_per_s=60)), META)  # 30 %
    assert busy["valid"] and busy["cpu"]["status"] == "flag"
    assert busy["flags"] == ["other processes used 30% of the machine's CPU (flag at 20%)"]


def test_cpu_bound_needs_a_saturated_target_and_exempts_it(tmp_path):
    mech = {"kind": "cpu-bound", "target": "middle"}
    sat = gates.evaluate(rep_dir(tmp_path / "a", cpu=cpu_records({"middle0": 0.4}, target_thread_frac=0.95)),
                         META, mech)
    assert sat["valid"], sat["invalid_reasons"]       # the target waiting is its job here
    assert sat["cpu"]["target"]["saturation"]["middle0"] == pytest.approx(0.95)
    idle = gates.evaluate(rep_dir(tmp_path / "b", cpu=cpu_records(target_thread_frac=0.3)), META, mech)
    assert not idle["valid"] and "CPU-bound target not saturated: middle0" in idle["invalid_reasons"][0]
    # Judged on its busiest 30 s (the throughput metric's window): a target climbing to
    # saturation, 40% of a core for the first 20 s of the window and 95% after, passes although
    # its window average (about 73%) would not.
    climb = cpu_records(target_thread_frac=0.0)
    acc = 0
    for r in climb:
        acc += 0 if r["t"] <= T0 else (40 if r["t"] <= 1030 else 95)
        r["threads"] = {"middle0": {"1": acc}}
    got = gates.evaluate(rep_dir(tmp_path / "d", cpu=climb), META, mech)
    assert got["valid"] and got["cpu"]["target"]["saturation"]["middle0"] == pytest.approx(0.95)
    # With a per-thread CPU cap (engler-goldberg-2021-slowcores: 20% of a core per thread) a
    # thread at its cap is saturated: 19% of a core is 95% of the cap; 10% is half of it.
    capped = {**mech, "thread_cap": 0.2}
    at_cap = gates.evaluate(rep_dir(tmp_path / "e", cpu=cpu_records(target_thread_frac=0.19)), META, capped)
    assert at_cap["valid"] and at_cap["cpu"]["target"]["saturation"]["middle0"] == pytest.approx(0.95)
    assert at_cap["cpu"]["target"]["thread_cap"] == 0.2
    half = gates.evaluate(rep_dir(tmp_path / "f", cpu=cpu_records(target_thread_frac=0.1)), META, capped)
    assert not half["valid"] and "middle0 busiest thread at 50% of its 20% cap" in half["invalid_reasons"][0]
    assert not gates.evaluate(rep_dir(tmp_path / "g", cpu=cpu_records(target_thread_frac=0.19)), META, mech)["valid"]
    # Queueing experiments gate the same relay's starvation.
    q = gates.evaluate(rep_dir(tmp_path / "c", cpu=cpu_records({"middle0": 0.4})), META)
    assert not q["valid"] and q["cpu"]["starved"] == ["middle0"]


def test_a_process_restarted_in_the_window_is_counted_over_both_lives(tmp_path):
    """A relay restarted at second 30 (a fault) gets a new pid whose counters start at zero.
    Its first life ran long before the window (large counters) and waited little; its second
    waits 40% of each second: the gate sees the second life's wait, and the step between the
    lives is not a (negative) sample."""
    recs = cpu_records()
    for i, r in enumerate(recs):
        m = r["procs"]["middle0"]
        if i < 30:
            m.update(pid=100, ticks=10**6 + 10 * i, wait_ns=10**12 + int(0.001e9 * i), slices=10**5 + 100 * i)
        else:
            k = i - 30
            m.update(pid=200, ticks=10 * k, wait_ns=int(0.4e9 * k), slices=100 * k)
    g = gates.evaluate(rep_dir(tmp_path, cpu=recs), META)
    p = g["cpu"]["processes"]["middle0"]
    assert p["lives"] == 2
    # The window (1010 .. 1060) has 50 one-second steps; the one from pid 100 to pid 200 is lost.
    assert p["cpu_cores"] == pytest.approx(10 * 49 / 100 / 50)
    assert p["wait_fraction"] == pytest.approx((0.001 * 19 + 0.4 * 30) / 50, rel=0.01)
    assert not g["valid"] and g["cpu"]["starved"] == ["middle0"]


def per_pod(recs: list[dict], offset: float = 0.0) -> list[dict]:
    """The local samples split as Kubernetes pods write them: one record per pod (its node
    as ``source``) holding that pod's processes, the node's host counters in each."""
    out = []
    pods = {"guard0": ["guard0"], "middle0": ["middle0"], "exit0": ["exit0"], "bulk0": ["bulk0", "bulk0.driver"]}
    for r in recs:
        for k, (pod, names) in enumerate(pods.items()):
            out.append({**r, "t": r["t"] + offset + 0.01 * k, "source": pod,
                        "procs": {n: r["procs"][n] for n in names},
                        **({"threads": r["threads"]} if pod == "middle0" and "threads" in r else {})})
    return sorted(out, key=lambda r: r["t"])


def test_cpu_samples_of_one_pod_each_are_judged_per_pod(tmp_path):
    """Kubernetes: each pod samples its own processes. Each pod's first and last samples in
    the window give its processes' figures (the interleaved records of other pods are not
    edges of this one's); starvation and a CPU-bound target are judged as locally; the CPU
    of "other processes" is not judged (a pod sees the rest of the run as others)."""
    ok = gates.evaluate(rep_dir(tmp_path / "a", cpu=per_pod(cpu_records())), META)
    c = ok["cpu"]
    assert ok["valid"] and c["status"] == "ok" and set(c["processes"]) == {"guard0", "middle0", "exit0", "bulk0",
                                                                          "bulk0.driver"}
    assert c["processes"]["middle0"]["cpu_cores"] == pytest.approx(0.1)
    assert c["host"]["others_busy_fraction"] is None and c["host"]["samplers"] == 4
    assert "4 pods sampled their own processes (other processes not judged)" in c["text"]
    bad = gates.evaluate(rep_dir(tmp_path / "b", cpu=per_pod(cpu_records({"exit0": 0.25, "bulk0.driver": 0.12}))),
                         META)
    assert not bad["valid"] and bad["cpu"]["starved"] == ["exit0", "bulk0.driver"]
    mech = {"kind": "cpu-bound", "target": "middle"}
    sat = gates.evaluate(rep_dir(tmp_path / "c", cpu=per_pod(cpu_records({"middle0": 0.4}, target_thread_frac=0.95))),
                         META, mech)
    assert sat["valid"] and sat["cpu"]["target"]["saturation"]["middle0"] == pytest.approx(0.95)
    steal = gates.evaluate(rep_dir(tmp_path / "d", cpu=per_pod(cpu_records(steal_per_s=20))), META)
    assert not steal["valid"] and "steal 10.0%" in steal["invalid_reasons"][0]
    # A pod with too few samples in the window is left out; none with enough: not measured.
    few = [r for r in per_pod(cpu_records()) if r["source"] != "exit0" or r["t"] < T0 + 12]
    f = gates.evaluate(rep_dir(tmp_path / "e", cpu=few), META)["cpu"]
    assert "exit0" not in f["processes"] and "guard0" in f["processes"]
    none = gates.evaluate(rep_dir(tmp_path / "f", cpu=per_pod(cpu_records(n=13))), META)["cpu"]
    assert none["status"] == "not measured" and "from any one pod" in none["text"]


# -- completion -------------------------------------------------------------------------

def test_completion(tmp_path):
    ok = gates.evaluate(rep_dir(tmp_path / "a", cpu=cpu_records(), xfers=transfers(18, 5, 1, 1)), META)
    c = ok["completion"]
    assert ok["valid"] and c["counts"] == {"completed": 18, "censored": 5, "stalled": 1, "failed": 1}
    assert c["failed_fraction"] == pytest.approx(2 / 25)
    bad = gates.evaluate(rep_dir(tmp_path / "b", cpu=cpu_records(), xfers=transfers(8, 0, 2, 1)), META)
    assert not bad["valid"] and bad["invalid_reasons"] == ["27% of 11 transfers stalled or failed (limit 10%)"]
    # Long bulk downloads that all began in the warm-up are what the window measured.
    bulk = [{"type": "transfer", "group": "bulk", "file": "big", "status": "cancelled", "warmup": True,
             "error": {"cause": "run_ended"}}] * 3
    g = gates.evaluate(rep_dir(tmp_path / "c", cpu=cpu_records(), xfers=bulk), META)
    assert g["valid"] and g["completion"]["counts"]["censored"] == 3
    none = gates.evaluate(rep_dir(tmp_path / "d", cpu=cpu_records(), xfers=[]), META)
    assert not none["valid"] and none["invalid_reasons"] == ["no transfer started"]


def test_thresholds_are_recorded_and_overridable(tmp_path):
    d = rep_dir(tmp_path, cpu=cpu_records({"exit0": 0.05}))
    assert gates.evaluate(d, META)["thresholds"] == THRESHOLDS
    strict = gates.evaluate(d, META, thresholds={"max_runqueue_wait_fraction": 0.04})
    assert not strict["valid"] and strict["thresholds"]["max_runqueue_wait_fraction"] == 0.04


# -- the report -------------------------------------------------------------------------

def make_run(root, judged):
    """Two variants x 3 repetitions; ``judged``: {(variant, rep): gates kwargs or None}."""
    root.mkdir(parents=True)
    (root / "run.json").write_text(json.dumps({"schema": 1, "name": "g", "scenario": {"name": "g"}, "seed": 1,
                                               "variants": ["a", "b"], "baseline": "a", "repetitions": 3}))
    for v, base in (("a", 10.0), ("b", 12.0)):
        for k in range(3):
            d = root / v / f"rep-{k}"
            d.mkdir(parents=True)
            xf = [{"type": "transfer", "group": "web", "file": "small", "size": 1000, "status": "ok",
                   "warmup": False, "t_start": T0 + 20 + i, "t_request": T0 + 20.5 + i,
                   "t_first_byte": T0 + 21 + i, "t_last_byte": T0 + 21 + i + base + k * 0.1 + i * 0.01,
                   "ttfb_s": 0.5, "ttlb_s": base + k * 0.1 + i * 0.01, "ttfb_stream_s": 1.0,
                   "ttlb_stream_s": base + 0.5, "error": None} for i in range(8)]
            jsonl(d / "transfers.jsonl", xf)
            for f in ("cellstats.jsonl", "relay_bw.jsonl"):
                (d / f).write_text("")
            meta = {"schema": 1, "variant": v, "rep": k, **META, "error": None}
            spec = judged.get((v, k))
            if spec is not None:
                sub = root / "scratch" / f"{v}{k}"
                g = gates.evaluate(rep_dir(sub, xfers=xf, **spec), META)
                meta["gates"] = g
            (d / "meta.json").write_text(json.dumps(meta))
    return root


def test_report_excludes_invalid_repetitions_and_warns_of_shaper_backlog(tmp_path):
    good = {"cpu": cpu_records(), "shaper": shaper_records(12_500)}
    judged = {(v, k): good for v in "ab" for k in range(3)}
    judged[("b", 1)] = {"cpu": cpu_records({"exit0": 0.3}), "shaper": shaper_records(12_500)}
    judged[("b", 2)] = {"cpu": cpu_records(), "shaper": shaper_records(750_000)}
    judged[("a", 2)] = None                       # no gates recorded
    run_dir = make_run(tmp_path / "r", judged)
    report(run_dir)
    s = json.loads((run_dir / "report" / "summary.json").read_text())
    g = s["gates"]
    assert [(r["variant"], r["rep"], r["valid"], r["queueing"]) for r in g["rows"]] == [
        ("a", 0, True, "ok"), ("a", 1, True, "ok"), ("b", 0, True, "ok"), ("b", 1, False, "ok"),
        ("b", 2, True, "flag")]
    assert len(g["excluded"]) == 1 and g["excluded"][0].startswith("variant b rep 1: CPU-starved")
    assert g["unjudged"] == ["variant a rep 2: no gates recorded"]
    assert g["warnings"] == ["variant b: the queueing was outside tor's circuit queues (the shaper) in 1 of 3 "
                             "repetition(s) (rep 2). No circuit scheduler acts there: comparisons involving b "
                             "measure that queue as much as the scheduler."]
    rep = {(r["variant"], r["rep"]): r for r in s["repetitions"]}
    assert rep[("b", 1)]["status"] == "invalid" and rep[("b", 1)]["error"].startswith("mechanism gate: CPU-starved")
    m = s["metrics"]["ttlb_s/web:small"]["variants"]["b"]
    assert set(m["per_rep"]) == {"0", "1", "2"} and m["per_rep"]["1"]["n"] == 0     # no data from the invalid one
    assert m["n"] == 16
    md = (run_dir / "report" / "report.md").read_text()
    assert md.count("Warning (mechanism gate, queueing)") == 2          # headline and comparisons
    assert "## Mechanism gates" in md and "INVALID" in md
    assert md.index("Warning (mechanism gate") < md.index("## Run")


def test_keep_gate_invalid_uses_every_repetition_and_says_so(tmp_path):
    """`torbed report --keep-gate-invalid`: the rejected repetition's data are in the
    statistics, listed as kept (not excluded) in the warnings the report leads with."""
    judged = {(v, k): {"cpu": cpu_records(), "shaper": shaper_records(12_500)} for v in "ab" for k in range(3)}
    judged[("b", 1)] = {"cpu": cpu_records({"exit0": 0.3}), "shaper": shaper_records(12_500)}
    run_dir = make_run(tmp_path / "r", judged)
    from torbed import cli
    assert cli.main(["report", str(run_dir), "--keep-gate-invalid"]) == 0
    s = json.loads((run_dir / "report" / "summary.json").read_text())
    g = s["gates"]
    assert g["excluded"] == [] and len(g["kept_invalid"]) == 1 and g["kept_invalid"][0].startswith("variant b rep 1")
    m = s["metrics"]["ttlb_s/web:small"]["variants"]["b"]
    assert m["per_rep"]["1"]["n"] == 8 and m["n"] == 24
    assert "invalid but KEPT in every statistic" in (run_dir / "report" / "report.md").read_text()
    report(run_dir)                                       # without the flag: excluded again
    s = json.loads((run_dir / "report" / "summary.json").read_text())
    assert s["gates"]["kept_invalid"] == [] and s["metrics"]["ttlb_s/web:small"]["variants"]["b"]["n"] == 16


def test_a_run_without_gates_keeps_its_summary(tmp_path):
    run_dir = make_run(tmp_path / "r", {})
    report(run_dir)
    s = json.loads((run_dir / "report" / "summary.json").read_text())
    assert "gates" not in s and "Mechanism gates" not in (run_dir / "report" / "report.md").read_text()


def test_compare_aa_and_the_sequential_rule_exclude_what_the_report_excludes(tmp_path, monkeypatch):
    from torbed import sequential
    from torbed.analysis.aa import aa_analyse
    from torbed.analysis.compare import compare_runs
    judged = {(v, k): {"cpu": cpu_records(), "shaper": shaper_records(12_500)} for v in "ab" for k in range(3)}
    judged[("b", 1)] = {"cpu": cpu_records({"exit0": 0.3}), "shaper": shaper_records(12_500)}
    run_dir = make_run(tmp_path / "r", judged)
    seen = []
    real = gates.exclude_invalid

    def spy(run, keep=False):
        out = real(run, keep)
        seen.append(sorted((r.variant, r.index) for r in run.reps if r.status == gates.INVALID))
        return out
    monkeypatch.setattr(gates, "exclude_invalid", spy)
    sequential.evaluate(run_dir, 3, "ttlb_s/web:small", "a", "b")
    compare_runs(run_dir, run_dir)
    aa_analyse(run_dir, "b")
    assert seen == [[("b", 1)]] * 4
