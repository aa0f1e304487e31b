"""Fidelity and speed of linkemu on this machine (part of ``make bench``).

    python -m torbed.bench.linkemu [--out runs/bench] [--quick]

Brings up a switch namespace running linkemu and ten node namespaces (as the local backend
does, without tor), sets link properties at runtime through the control socket, and measures
with small probes running in the node namespaces:

| figure | how | target |
|---|---|---|
| delay error | TCP connect time (SYN -> SYN/ACK, one RTT) through a link of 20 ms each way, minus the configured 40 ms: median and p99; probes at normal priority, probes at real-time priority (so the figure measures the emulator, not the probes' own wake-ups on a busy machine), and under 200 Mbit/s of background traffic | p99 <= 1 ms (real-time probes) |
| rate error | one bulk TCP transfer through a 1, 10 and 100 Mbit/s link: receiver goodput over the steady part versus the goodput the rate allows (rate x payload / frame bytes, the ratio counted by linkemu) | within 5% |
| jitter | one-way delays of UDP probes (CLOCK_MONOTONIC is shared by all namespaces) through 20 ms +- 5 ms normal jitter, probes 30 ms apart: mean, standard deviation, Kolmogorov-Smirnov test against N(20 ms, 5 ms); and reordering of probes 1 ms apart (must be none) | |
| loss | 1% random and 2% in bursts of 4 (Gilbert): loss at the receiver with a 95% interval, mean burst length | |
| throughput | 4 unshaped TCP flows between distinct pairs, linkemu pinned to CPU 0, probes to CPU 1: aggregate goodput and linkemu's CPU share; again with 1 ms delay on every link (every frame through the delay line) | >= 500 Mbit/s |

Also recorded: linkemu's own lateness histogram (how late scheduled frames left). Results are
printed and written to ``OUT/linkemu-<UTC stamp>.json``. Needs root (network namespaces).
Exit status 0 when it ran (targets met or not; the JSON says which), 1 when it could not run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import secrets
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

DELAY_S = 0.020
JITTER_S = 0.005
RATES_BPS = (1_000_000, 10_000_000, 100_000_000)
BENCH_PORT_TCP = 5001
BENCH_PORT_UDP = 5002
PROBE_RT_PRIORITY = 20


# ---------------------------------------------------------------------------------------
# Probes: run inside a node namespace (`python -m torbed.bench.linkemu probe KIND ...`),
# print one JSON document (or JSON lines for the sink) on stdout.

def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def probe_sink(addr: str, port: int) -> None:
    """Accept TCP connections forever; per connection with data, one JSON line: its tag (the
    first 8 bytes, hex), bytes and (time, cumulative bytes) samples every 50 ms."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(128)
    lock = threading.Lock()

    def serve(conn: socket.socket) -> None:
        n, samples, last, head = 0, [], 0.0, b""
        with conn:
            while True:
                try:
                    data = conn.recv(1 << 18)
                except OSError:
                    return
                if not data:
                    break
                if len(head) < 8:
                    head += data[:8 - len(head)]
                n += len(data)
                now = time.monotonic()
                if now - last >= 0.05:
                    samples.append((now, n))
                    last = now
        if n:
            samples.append((time.monotonic(), n))
            with lock:
                print(json.dumps({"tag": head.hex(), "bytes": n, "samples": samples}), flush=True)

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def probe_rtt(addr: str, port: int, count: int, interval: float) -> dict:
    rtts = []
    for _ in range(count):
        t0 = time.monotonic_ns()
        with socket.create_connection((addr, port), timeout=10):
            rtts.append((time.monotonic_ns() - t0) / 1e9)
        time.sleep(interval)
    return {"rtt_s": rtts}


def probe_source(addr: str, port: int, seconds: float, nbytes: int | None, tag: str) -> dict:
    chunk = b"\0" * (1 << 18)
    t0 = time.monotonic()
    with socket.create_connection((addr, port), timeout=30) as s:
        s.sendall(bytes.fromhex(tag))
        sent = 8
        while (nbytes is None and time.monotonic() - t0 < seconds) or (nbytes is not None and sent < nbytes):
            k = s.send(chunk if nbytes is None else chunk[:min(len(chunk), nbytes - sent)])
            sent += k
    return {"sent": sent, "seconds": time.monotonic() - t0}


def probe_udp_recv(addr: str, port: int, count: int, timeout: float) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((addr, port))
    s.settimeout(timeout)
    got = []
    print("ready", file=sys.stderr, flush=True)
    try:
        while len(got) < count:
            data = s.recv(2048)
            got.append((*struct.unpack("!QQ", data[:16]), time.monotonic_ns()))
    except socket.timeout:
        pass
    return {"recv": got}


def probe_udp_send(addr: str, port: int, count: int, interval: float) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    pad = b"\0" * 184
    t0 = time.monotonic()
    for seq in range(count):
        wait = t0 + seq * interval - time.monotonic()
        if wait > 0.0002:
            time.sleep(wait)
        s.sendto(struct.pack("!QQ", seq, time.monotonic_ns()) + pad, (addr, port))
    return {"sent": count}


def probe_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench_linkemu probe")
    p.add_argument("kind", choices=["sink", "rtt", "source", "udp-recv", "udp-send"])
    p.add_argument("addr")
    p.add_argument("port", type=int)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--interval", type=float, default=0.0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--bytes", type=int, default=None)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--cpu", type=int, default=None)
    p.add_argument("--tag", default="00" * 8, help="8 bytes (hex) a source sends first; the sink records them")
    a = p.parse_args(argv)
    _pin(a.cpu)
    if a.kind == "sink":
        probe_sink(a.addr, a.port)
        return 0
    result = {"rtt": lambda: probe_rtt(a.addr, a.port, a.count, a.interval),
              "source": lambda: probe_source(a.addr, a.port, a.seconds, a.bytes, a.tag),
              "udp-recv": lambda: probe_udp_recv(a.addr, a.port, a.count, a.timeout),
              "udp-send": lambda: probe_udp_send(a.addr, a.port, a.count, a.interval)}[a.kind]()
    print(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------
# The benchmark (runs in the caller's namespace, drives probes in node namespaces).

def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def steady_goodput(record: dict, skip_s: float) -> float:
    """Bits per second between skip_s after the first sample and the last sample."""
    samples = record["samples"]
    t_first = samples[0][0]
    start = next(((t, n) for t, n in samples if t >= t_first + skip_s), samples[0])
    end = samples[-1]
    if end[0] - start[0] <= 0:
        return float("nan")
    return (end[1] - start[1]) * 8 / (end[0] - start[0])


class Bench:
    def __init__(self, quick: bool, console):
        from ..backends.local import emulator, netns, supervise
        from .. import network, scenario
        self.em_mod, self.netns = emulator, netns
        self.console = console
        self.quick = quick
        self.seed = secrets.randbelow(2**31)  # fresh loss/jitter draws each run; recorded
        data = {"apiVersion": "torbed/v1", "name": "bench-linkemu", "variants": ["kist"], "seed": self.seed,
                "network": {"authorities": 1, "relays": {"n": {"count": 10, "exit": True}}},
                "links": {"emulator": "linkemu"},
                "servers": {"www": {"files": {"f": "1KB"}}},
                "clients": {"c": {"workload": {"kind": "fetch", "file": "f"}}}}
        self.plan = network.plan(scenario.parse(data, "bench"), "kist")
        self.nodes = self.plan.group_nodes("n")
        self.run_id = "b" + secrets.token_hex(2)
        self.scratch = Path(f"/tmp/torbed-{self.run_id}")
        self.scratch.mkdir(mode=0o700)
        self.topo = netns.Topology(self.run_id, self.plan, switch="linkemu")
        self.sup = supervise.Supervisor(self.run_id, {"namespaces": [self.topo.switch] + [
            self.topo.ns(n.name) for n in self.plan.nodes], "scratch": str(self.scratch), "run_dir": str(self.scratch)})
        self.em = None
        self.sinks: dict[str, Path] = {}

    # -- plumbing ------------------------------------------------------------------------
    def start(self) -> None:
        self.topo.create()
        self.em = self.em_mod.start(self.sup, self.topo, self.plan, self.scratch, self.scratch / "linkemu.log",
                                    stats_file=self.scratch / "linkemu.stats.json", console=self.console)
        self.em_pid = self.sup.procs["linkemu"][0].pid

    def stop(self) -> None:
        self.sup.stop_all()
        self.topo.destroy()
        self.sup.forget()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _argv(self, node, kind: str, *args: str, rt: bool = False) -> list[str]:
        prefix = self.netns.exec_prefix(self.topo.ns(node.name))
        if rt:
            prefix += ["chrt", "-f", str(PROBE_RT_PRIORITY)]
        return prefix + [sys.executable, "-m", "torbed.bench.linkemu", "probe", kind, *args]

    def _env(self) -> dict:
        from .. import resources
        env = dict(os.environ)
        env["PYTHONPATH"] = str(resources.package_parent()) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def probe(self, node, kind: str, *args: str, rt: bool = False, timeout: float = 300) -> dict:
        p = subprocess.run(self._argv(node, kind, *args, rt=rt), capture_output=True, text=True, timeout=timeout,
                           env=self._env())
        if p.returncode != 0:
            raise RuntimeError(f"probe {kind} in {node.name} failed: {p.stderr.strip()[-2000:]}")
        return json.loads(p.stdout)

    def spawn(self, node, kind: str, *args: str, rt: bool = False) -> subprocess.Popen:
        return subprocess.Popen(self._argv(node, kind, *args, rt=rt), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self._env())

    def sink(self, node, cpu: int | None = None) -> None:
        if node.name in self.sinks:
            return
        log = self.scratch / f"sink-{node.name}.log"
        args = [node.address, str(BENCH_PORT_TCP)] + (["--cpu", str(cpu)] if cpu is not None else [])
        self.sup.start(f"sink-{node.name}", self._argv(node, "sink", *args), log, env=self._env())
        self.sinks[node.name] = log
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                subprocess.run(self.netns.exec_prefix(self.topo.ns(node.name)) + [
                    sys.executable, "-c", f"import socket; socket.create_connection(('{node.address}', {BENCH_PORT_TCP}), 1)"],
                    check=True, capture_output=True, timeout=10)
                return
            except subprocess.CalledProcessError:
                time.sleep(0.1)
        raise RuntimeError(f"sink in {node.name} did not start: {self.sup.log_of('sink-' + node.name)}")

    def sink_record(self, node, tag: str, timeout: float = 30) -> dict:
        """The sink's record of the transfer that began with ``tag``."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in self.sinks[node.name].read_text().splitlines():
                if line.startswith("{"):
                    rec = json.loads(line)
                    if rec["tag"] == tag:
                        return rec
            time.sleep(0.1)
        raise RuntimeError(f"sink in {node.name}: no record of transfer {tag}")

    def set(self, a, b, props: dict, symmetric: bool = True) -> None:
        self.em.set_link(a.name, b.name, props, symmetric=symmetric)

    def link_stats(self, a, b) -> dict:
        for link in self.em.stats()["links"]:
            if link["src"] == a.name and link["dst"] == b.name:
                return link
        return {"frames_in": 0, "bytes_in": 0, "lost": 0, "queue_drops": 0, "frames_out": 0, "bytes_out": 0}

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.em_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log(self, msg: str) -> None:
        self.console.log(msg)

    # -- measurements ---------------------------------------------------------------------
    def delay(self, count: int, rt: bool, background: bool = False) -> dict:
        a, b = self.nodes[0], self.nodes[1]
        self.sink(b)
        self.set(a, b, {"delay_s": DELAY_S})
        bg = []
        if background:
            # 4 flows of 50 Mbit/s between other pairs: 200 Mbit/s through the same loop,
            # lasting a little longer than the probes (they end by themselves: a killed
            # source would leave an orphaned socket still sending).
            seconds = count * (2 * DELAY_S + 0.015) + 3
            for k in range(4):
                src, dst = self.nodes[2 + 2 * k], self.nodes[3 + 2 * k]
                self.sink(dst)
                self.set(src, dst, {"rate_bps": 50_000_000})
                bg.append(self.spawn(src, "source", dst.address, str(BENCH_PORT_TCP), "--seconds", f"{seconds:.1f}"))
            time.sleep(1.0)
        try:
            rtts = self.probe(a, "rtt", b.address, str(BENCH_PORT_TCP), "--count", str(count), "--interval", "0.01",
                              rt=rt)["rtt_s"]
        finally:
            for p in bg:
                p.communicate(timeout=600)
        self.set(a, b, {})
        if background:
            for k in range(4):
                self.set(self.nodes[2 + 2 * k], self.nodes[3 + 2 * k], {})
        err = [(r - 2 * DELAY_S) * 1e3 for r in rtts]
        return {"configured_rtt_ms": 2 * DELAY_S * 1e3, "samples": len(err), "probes_realtime": rt,
                "background_mbit": 200 if background else 0,
                "error_ms": {"median": quantile(err, 0.5), "p90": quantile(err, 0.9), "p99": quantile(err, 0.99),
                             "max": max(err), "min": min(err)}}

    def baseline_rtt(self, count: int) -> dict:
        a, b = self.nodes[0], self.nodes[1]
        self.sink(b)
        rtts = self.probe(a, "rtt", b.address, str(BENCH_PORT_TCP), "--count", str(count), "--interval", "0.01",
                          rt=True)["rtt_s"]
        return {"median_ms": quantile(rtts, 0.5) * 1e3, "p99_ms": quantile(rtts, 0.99) * 1e3}

    def rate(self, rate_bps: int, seconds: float) -> dict:
        a, b = self.nodes[0], self.nodes[1]
        self.sink(b)
        self.set(a, b, {"rate_bps": rate_bps})
        s0 = self.link_stats(a, b)
        nbytes = int(rate_bps / 8 * seconds)
        tag = secrets.token_hex(8)
        self.probe(a, "source", b.address, str(BENCH_PORT_TCP), "--bytes", str(nbytes), "--tag", tag,
                   timeout=seconds * 4 + 60)
        rec = self.sink_record(b, tag)
        s1 = self.link_stats(a, b)
        self.set(a, b, {})
        frame_bytes = s1["bytes_out"] - s0["bytes_out"]
        overhead = frame_bytes / rec["bytes"]
        goodput = steady_goodput(rec, skip_s=min(2.0, seconds / 4))
        expected = rate_bps / overhead
        return {"rate_mbit": rate_bps / 1e6, "payload_bytes": rec["bytes"], "frame_bytes_per_payload_byte": overhead,
                "goodput_mbit": goodput / 1e6, "expected_goodput_mbit": expected / 1e6,
                "error_pct": (goodput / expected - 1) * 100,
                "queue_drops": s1["queue_drops"] - s0["queue_drops"]}

    def _udp(self, a, b, count: int, interval: float) -> list[tuple[int, int, int]]:
        recv = self.spawn(b, "udp-recv", b.address, str(BENCH_PORT_UDP), "--count", str(count), "--timeout", "3", rt=True)
        recv.stderr.readline()  # "ready"
        self.probe(a, "udp-send", b.address, str(BENCH_PORT_UDP), "--count", str(count), "--interval", str(interval),
                   rt=True, timeout=count * interval + 60)
        out, err = recv.communicate(timeout=count * interval + 60)
        if recv.returncode != 0:
            raise RuntimeError(f"udp-recv failed: {err[-2000:]}")
        return json.loads(out)["recv"]

    def jitter(self, count: int) -> dict:
        from scipy import stats
        a, b = self.nodes[4], self.nodes[5]
        self.set(a, b, {"delay_s": DELAY_S, "jitter_s": JITTER_S, "jitter_dist": "normal"}, symmetric=False)
        got = self._udp(a, b, count, 0.030)
        one_way = [(r - s) / 1e9 for _, s, r in got]
        ks = stats.kstest(one_way, "norm", args=(DELAY_S, JITTER_S))
        # Dense probes: jitter far larger than the spacing must still not reorder.
        dense = self._udp(a, b, count, 0.001)
        seqs = [q for q, _, _ in dense]
        reordered = sum(1 for x, y in zip(seqs, seqs[1:]) if y < x)
        self.set(a, b, {}, symmetric=False)
        return {"configured_ms": {"delay": DELAY_S * 1e3, "jitter_sd": JITTER_S * 1e3, "distribution": "normal"},
                "samples": len(one_way), "mean_ms": statistics.fmean(one_way) * 1e3,
                "sd_ms": statistics.stdev(one_way) * 1e3, "p1_ms": quantile(one_way, 0.01) * 1e3,
                "p99_ms": quantile(one_way, 0.99) * 1e3, "ks_statistic": float(ks.statistic),
                "ks_pvalue": float(ks.pvalue), "dense_probes": len(seqs), "dense_reordered": reordered}

    def loss(self, count: int) -> dict:
        a, b = self.nodes[6], self.nodes[7]
        out = {}
        for name, props, expect in (("random_1pct", {"loss": 0.01}, 0.01),
                                    ("gilbert_2pct_burst4", {"loss": 0.02, "loss_burst": 4.0}, 0.02)):
            self.set(a, b, props, symmetric=False)
            s0 = self.link_stats(a, b)
            got = self._udp(a, b, count, 0.0001)
            s1 = self.link_stats(a, b)
            self.set(a, b, {}, symmetric=False)
            seen = {q for q, _, _ in got}
            missing = [q for q in range(count) if q not in seen]
            rate = len(missing) / count
            runs = sum(1 for i, q in enumerate(missing) if i == 0 or missing[i - 1] != q - 1)
            half = 1.96 * math.sqrt(expect * (1 - expect) / count)
            if "burst" in name:
                # Bursty losses are not independent: widen by the burst length (clustered sampling).
                half *= math.sqrt(2 * 4 - 1)
            burst = props.get("loss_burst", 1.0)
            out[name] = {"configured": expect, "configured_burst": burst, "sent": count,
                         "lost_at_receiver": len(missing), "lost_by_linkemu": s1["lost"] - s0["lost"],
                         "loss_rate": rate, "interval95": [expect - half, expect + half],
                         "within_interval": abs(rate - expect) <= half,
                         "mean_burst": len(missing) / runs if runs else 0.0,
                         # burst lengths are geometric: sd sqrt(b (b - 1))
                         "mean_burst_halfwidth95": 1.96 * math.sqrt(burst * (burst - 1) / runs) if runs else None}
        return out

    def throughput(self, seconds: float, delay_s: float) -> dict:
        pairs = [(self.nodes[2 * k], self.nodes[2 * k + 1]) for k in range(4)]
        os.sched_setaffinity(self.em_pid, {0})
        for src, dst in pairs:
            self.sink(dst, cpu=1)
            self.set(src, dst, {"delay_s": delay_s} if delay_s else {})
        tags = [secrets.token_hex(8) for _ in pairs]
        stats0, cpu0, t0 = self.em.stats(), self.cpu_seconds(), time.monotonic()
        procs = [self.spawn(src, "source", dst.address, str(BENCH_PORT_TCP), "--seconds", str(seconds), "--cpu", "1",
                            "--tag", tag) for (src, dst), tag in zip(pairs, tags)]
        for p in procs:
            p.communicate(timeout=seconds + 60)
        cpu1, t1, stats1 = self.cpu_seconds(), time.monotonic(), self.em.stats()
        flows = [self.sink_record(dst, tag) for (_, dst), tag in zip(pairs, tags)]
        os.sched_setaffinity(self.em_pid, set(range(os.cpu_count() or 1)))
        for src, dst in pairs:
            self.set(src, dst, {})
        goodputs = [steady_goodput(f, skip_s=1.0) for f in flows]
        frames = sum(p["tx_frames"] for p in stats1["ports"]) - sum(p["tx_frames"] for p in stats0["ports"])
        return {"flows": len(flows), "delay_ms": delay_s * 1e3, "aggregate_goodput_mbit": sum(goodputs) / 1e6,
                "per_flow_mbit": [g / 1e6 for g in goodputs], "frames_per_s": frames / (t1 - t0),
                "linkemu_cpu_share": (cpu1 - cpu0) / (t1 - t0)}


def git_commit() -> str | None:
    from .. import resources
    p = subprocess.run(["git", "-C", str(resources.ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or None


def _terminate(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run(out_dir: Path, quick: bool, console) -> dict:
    from ..provenance import host_info
    from .results import bench_run
    n_rtt, n_udp, n_loss, rate_s, tput_s = (100, 200, 10000, 4.0, 4.0) if quick else (500, 600, 50000, 10.0, 8.0)
    bench = Bench(quick, console)
    results: dict = {}
    started = dt.datetime.now(dt.timezone.utc)
    load = os.getloadavg()
    about = bench_run("linkemu", ["--quick"] if quick else [], quick)
    old = signal.signal(signal.SIGTERM, _terminate)
    try:
        bench.start()
        console.log("linkemu up: 10 node namespaces + control port")
        results["baseline_rtt_unshaped"] = bench.baseline_rtt(n_rtt // 2)
        console.log(f"delay: {n_rtt} TCP connects through 20 ms each way (normal-priority probes)")
        results["delay"] = bench.delay(n_rtt, rt=False)
        console.log("delay: again with real-time probes")
        results["delay_rt"] = bench.delay(n_rtt, rt=True)
        console.log("delay: real-time probes, 200 Mbit/s of background traffic")
        results["delay_rt_loaded"] = bench.delay(n_rtt, rt=True, background=True)
        results["linkemu_lateness_delay_tests"] = bench.em.stats()["lateness"]
        results["rate"] = []
        for r in RATES_BPS:
            console.log(f"rate: bulk TCP through {r / 1e6:g} Mbit/s")
            results["rate"].append(bench.rate(r, rate_s))
        console.log("jitter: UDP one-way delays")
        results["jitter"] = bench.jitter(n_udp)
        console.log("loss: random and bursty")
        results["loss"] = bench.loss(n_loss)
        console.log("throughput: 4 flows, unshaped (linkemu on CPU 0)")
        results["throughput_unshaped"] = bench.throughput(tput_s, 0.0)
        console.log("throughput: 4 flows, 1 ms delay on every link")
        results["throughput_delay_line"] = bench.throughput(tput_s, 0.001)
        results["linkemu_lateness_all"] = bench.em.stats()["lateness"]
    finally:
        signal.signal(signal.SIGTERM, old)
        bench.stop()
    delay_p99 = results["delay_rt"]["error_ms"]["p99"]
    worst_rate = max(abs(r["error_pct"]) for r in results["rate"])
    tput = results["throughput_unshaped"]["aggregate_goodput_mbit"]
    targets = {
        "delay_p99_error_ms": {"value": delay_p99, "target": "<= 1.0", "met": abs(delay_p99) <= 1.0},
        "rate_error_pct": {"value": worst_rate, "target": "<= 5 (1-100 Mbit/s)", "met": worst_rate <= 5.0},
        "aggregate_mbit_one_core": {"value": tput, "target": ">= 500", "met": tput >= 500},
    }
    from ..backends.local import emulator
    doc = {"schema": 1, "bench": "linkemu", "quick": quick, "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
           "finished": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": git_commit(),
           "linkemu": str(emulator.binary_path()), "seed": bench.seed, "host": host_info(), "load_before": load,
           "results": results, "targets": targets,
           "bench_run": {**about, "started": started.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"linkemu-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    doc["path"] = str(path)
    return doc


def print_summary(doc: dict, out) -> None:
    from rich.table import Table
    r = doc["results"]
    t = Table(title=f"linkemu on {doc['host']['hostname']} ({doc['host']['cpus']} cpus, load {doc['load_before'][0]:.2f})")
    for col in ("figure", "value", "target"):
        t.add_column(col)
    b = r["baseline_rtt_unshaped"]
    t.add_row("RTT through linkemu, unshaped", f"median {b['median_ms']:.3f} ms, p99 {b['p99_ms']:.3f} ms", "")
    for key, label in (("delay", "normal-priority probes"), ("delay_rt", "real-time probes"),
                       ("delay_rt_loaded", "real-time probes, 200 Mbit/s background")):
        e = r[key]["error_ms"]
        t.add_row(f"delay error at 2 x 20 ms ({label})", f"median {e['median']:.3f} ms, p99 {e['p99']:.3f} ms, "
                  f"max {e['max']:.3f} ms", "p99 <= 1 ms" if key == "delay_rt" else "")
    for x in r["rate"]:
        t.add_row(f"rate {x['rate_mbit']:g} Mbit/s (bulk TCP)",
                  f"goodput {x['goodput_mbit']:.3f} of {x['expected_goodput_mbit']:.3f} Mbit/s: {x['error_pct']:+.2f}%",
                  "within 5%")
    j = r["jitter"]
    t.add_row("jitter 20 ms +- 5 ms normal (one-way)",
              f"mean {j['mean_ms']:.2f} ms, sd {j['sd_ms']:.2f} ms, KS D={j['ks_statistic']:.3f} "
              f"p={j['ks_pvalue']:.2f}; reordered {j['dense_reordered']} of {j['dense_probes']}", "")
    for name, x in r["loss"].items():
        t.add_row(f"loss {name}", f"{x['loss_rate'] * 100:.2f}% (95% interval {x['interval95'][0] * 100:.2f}-"
                  f"{x['interval95'][1] * 100:.2f}%), mean burst {x['mean_burst']:.2f}"
                  + (f" (configured {x['configured_burst']:g} +- {x['mean_burst_halfwidth95']:.2f})"
                     if x["configured_burst"] > 1 else ""), "")
    for key, label in (("throughput_unshaped", "unshaped"), ("throughput_delay_line", "1 ms delay")):
        x = r[key]
        t.add_row(f"aggregate throughput, 4 flows, {label}",
                  f"{x['aggregate_goodput_mbit']:.0f} Mbit/s, {x['frames_per_s'] / 1000:.0f} kframes/s, "
                  f"linkemu CPU {x['linkemu_cpu_share'] * 100:.0f}%", ">= 500 Mbit/s" if key == "throughput_unshaped" else "")
    out.print(t)
    met = [f"{k}: {'met' if v['met'] else 'NOT met'}" for k, v in doc["targets"].items()]
    out.print("targets: " + "; ".join(met))
    out.print(f"results: {doc['path']}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "probe":
        return probe_main(argv[1:])
    from rich.console import Console
    p = argparse.ArgumentParser(prog="python -m torbed.bench.linkemu", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="runs/bench", help="directory for the results JSON")
    p.add_argument("--quick", action="store_true", help="fewer samples and shorter transfers (about 1 min)")
    a = p.parse_args(argv)
    console, out = Console(stderr=True), Console()
    if os.geteuid() != 0:
        console.print("[red]error[/red] the linkemu benchmark needs root (network namespaces)")
        return 1
    try:
        doc = run(Path(a.out), a.quick, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: namespaces and processes removed")
        return 130
    except Exception as e:  # noqa: BLE001 - reported as the benchmark's failure
        console.print(f"[red]benchmark failed[/red]: {type(e).__name__}: {e}", highlight=False)
        return 1
    print_summary(doc, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
