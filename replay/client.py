"""The client side of trace replay: the driver's ``replay`` workload (torbed.client.driver).

A client replays its share of a trace's flows (the backend assigns them: ``workload.flows``),
one thread per flow as in Torchestra's replayer. Flows with the same circuit key share a
circuit, each key its own (built before the workload starts, rebuilt if it dies). At the
flow's recorded start (plus the iteration's offset when the trace loops) the thread opens a
stream through Tor to the replay server, sends the hello, sends the flow's upstream packets
at their recorded times and receives the downstream chunks, recording each chunk's one-way
delay in cells.jsonl (``direction: "d"``) and one ``transfer`` record per flow replay
(workload ``replay``, file = the trace's name, size = downstream bytes) in transfers.jsonl.

Around the replay it measures its clock offset to the replay server (replay/clock.py): a
burst of exchanges once the circuits are built, one every ``clock.DURING_INTERVAL_S`` while
flows run and one after the last flow, all in clock.jsonl (``clock_output``) with the
client's own estimate at the end.

Workload config (made by the backends): ``trace`` (path), ``trace_name``, ``flows``
(ids), ``loop``, ``period_s`` (loop period), ``slack_s``, ``address``, ``port``,
``cells_output``, ``clock_output`` (optional: no clock exchanges without it).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

from ..records import RecordWriter
from . import clock, engine, wire
from .trace import DOWN, UP, Flow, read


# A flow whose stream tor could not open (the exit's END, a SOCKS refusal, a circuit that
# died before the stream attached) is opened again, with backoff, for up to OPEN_RETRY_S after
# its recorded start: on Kubernetes an exit can be up before the replay server's Service
# routes, and a trace's long flows (an SSH session) would otherwise be lost whole at the
# first refusal. Each refusal is kept in the flow's record (``open_errors``).
OPEN_RETRY_S = 20.0
OPEN_BACKOFF_S = 0.5
OPEN_BACKOFF_MAX_S = 4.0


def _transfer_error(driver) -> type:
    """The driver's TransferError class. The driver runs as ``python -m
    torbed.client.driver``, i.e. as module ``__main__``: importing torbed.client.driver here
    would give a second, different class that ``except`` would not match."""
    return sys.modules[type(driver).__module__].TransferError


def _key(flow: Flow) -> str:
    return flow.circuit if flow.circuit is not None else f"flow:{flow.id}"


def _flows(driver) -> list[Flow]:
    wl = driver.cfg["workload"]
    if "_flows" not in wl:
        trace = read(wl["trace"])
        wl["_flows"] = [trace.flow(f) for f in wl["flows"]]
        wl["_duration"] = trace.duration
    return wl["_flows"]


def prepare(driver) -> None:
    """Build every circuit the client's flows need before the workload starts (a few at a
    time: a relay log's connection has dozens of circuits)."""
    from concurrent.futures import ThreadPoolExecutor

    TransferError = _transfer_error(driver)

    def build(key: str) -> None:
        try:
            driver.get_circuit(key)
        except TransferError:
            pass   # retried (and recorded) when a flow needs it

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(build, sorted({_key(f) for f in _flows(driver)})))
    rec = _clock(driver)
    if rec is not None:
        rec.burst("before", clock.BURST_BEFORE)


def _clock(driver) -> "clock.Recorder | None":
    """The client's clock recorder (made on first use), or None without ``clock_output``."""
    cfg, wl = driver.cfg, driver.cfg["workload"]
    if not wl.get("clock_output"):
        return None
    if "_clock" not in wl:
        base = {"variant": cfg["variant"], "rep": cfg["rep"], "client": cfg["client"], "group": cfg["group"],
                "server": wl["server"], "address": wl["address"], "port": wl["port"]}
        wl["_clock"] = clock.Recorder(RecordWriter(wl["clock_output"]), base, clock.Probe(wl["address"], wl["port"]))
    return wl["_clock"]


# How long after the end of the window a flow still running is cut off and recorded as
# censored (the driver's WINDOW_GRACE_S for its other workloads).
WINDOW_GRACE_S = 5.0

# A flow still short of downstream chunks at its own deadline (its recorded length plus the
# workload's ``timeout``) is behind its schedule, not broken, when data still arrived within
# BEHIND_PROGRESS_S of the cut, counted from its last chunk or, if later, from when the first
# missing chunk was due: its circuit carried it more slowly than the trace offered it (round
# robin giving a busy web circuit less than its load; Gopal & Heninger exp. 2's vanilla arm).
# It is censored (``cancelled``, cause ``behind_schedule``, ``t_censor``) like a flow the
# window's end cut off: how late it is belongs to the design under test, so it must not
# count as a failure. Silence for longer is a stall (cause ``stall``), a failure.
BEHIND_PROGRESS_S = 30.0
CENSORED_CAUSES = ("run_ended", "behind_schedule")


def replay_flow(driver, flow: Flow, iteration: int, stop: threading.Event, cells: RecordWriter) -> dict:
    """Replay one iteration of ``flow`` on its circuit; returns (and writes) its transfer
    record. A flow the end of the window cut off, or its own deadline while still moving
    (``shortfall``), is censored (``status: cancelled``, cause ``run_ended`` or
    ``behind_schedule``, ``t_censor``), not failed: the analysis keeps it as a time longer
    than ``t_censor - t_request``, as for bulk and fetch transfers."""
    TransferError = _transfer_error(driver)
    cfg, wl = driver.cfg, driver.cfg["workload"]
    rec = {"type": "transfer", "variant": cfg["variant"], "rep": cfg["rep"], "client": cfg["client"],
           "group": cfg["group"], "workload": "replay", "slot": 0, "seq": iteration, "server": wl["server"],
           "file": wl["trace_name"], "flow": flow.id, "iteration": iteration, "size": flow.bytes(DOWN),
           "circuit": None, "t_start": time.time(), "t_socks": None, "t_request": None, "t_first_byte": None,
           "t_last_byte": None, "bytes": 0, "chunks_down": 0, "chunks_up": 0, "status": "ok", "error": None,
           "open_errors": []}
    own_end = rec["t_start"] + (flow.end - flow.start) + wl["slack_s"]
    hard_end = min(cfg["t_end"] + WINDOW_GRACE_S, own_end)
    opened: dict = {}
    driver.metrics.transfer_started()
    try:
        sock, circ, state = _open(driver, flow, rec, hard_end, stop, opened)
        _exchange(driver, flow, iteration, sock, circ, state, rec, hard_end, stop, cells)
    except (TransferError, wire.WireError) as e:
        if isinstance(e, wire.WireError):
            e = TransferError("connection_error", f"replay stream: {e}")
        censored = e.cause in CENSORED_CAUSES
        rec["status"] = "cancelled" if censored else "timeout" if e.cause == "timeout" else "error"
        rec["error"] = {"cause": e.cause, "detail": e.detail}
        if censored:
            rec["t_censor"] = time.time()
    finally:
        if opened.get("sock") is not None:
            opened["sock"].close()
        if opened.get("port") is not None:
            with driver.lock:
                driver.pending.pop(opened["port"], None)
    return _finish(driver, rec)


def _open(driver, flow: Flow, rec: dict, hard_end: float, stop: threading.Event, opened: dict):
    """Open the flow's stream on its circuit, again with backoff after a refusal (each kept
    in ``rec["open_errors"]``) until OPEN_RETRY_S after its start. Returns (sock, circuit,
    event state); ``opened`` holds the socket and reserved port for the caller to release."""
    from python_socks import ProxyError, ProxyTimeoutError
    from python_socks.sync import Proxy

    TransferError = _transfer_error(driver)
    cfg, wl = driver.cfg, driver.cfg["workload"]
    key = _key(flow)
    retry_until = min(cfg["t_end"], rec["t_start"] + wl.get("open_retry_s", OPEN_RETRY_S))
    backoff = OPEN_BACKOFF_S
    while True:
        try:
            circ = driver.get_circuit(key)
        except TransferError as e:
            err = e
        else:
            if circ.id is not None:
                rec["circuit"] = {"id": circ.id, "path": circ.path, "build_s": circ.build_s, "key": key}
            port, ev, state = driver._reserve_port(circ.id)
            opened["port"] = port
            proxy = Proxy.from_url(driver.socks_url(key))
            try:
                opened["sock"] = proxy.connect(wl["address"], wl["port"], timeout=max(1.0, hard_end - time.time()),
                                               local_addr=("127.0.0.1", port))
                return opened["sock"], circ, state
            except ProxyTimeoutError as e:
                raise TransferError(*(state.get("error") or ("timeout", f"SOCKS connect: {e}")))
            except (ProxyError, OSError) as e:
                err = TransferError(*(state.get("error") or ("socks_error", f"SOCKS: {e}")))
            with driver.lock:
                driver.pending.pop(port, None)
            opened["port"] = None
        # The stream never opened, so nothing of the flow was sent: opening it again
        # loses no data and shifts the whole flow by the wait, which t_start keeps.
        if stop.is_set() or time.time() + backoff >= retry_until:
            raise err
        rec["open_errors"].append({"t": time.time(), "cause": err.cause, "detail": err.detail})
        stop.wait(backoff)
        backoff = min(2 * backoff, OPEN_BACKOFF_MAX_S)


def _exchange(driver, flow: Flow, iteration: int, sock, circ, state: dict, rec: dict, hard_end: float,
              stop: threading.Event, cells: RecordWriter) -> None:
    """The hello, the upstream packets at their times and the downstream chunks until
    ``hard_end``, into ``rec``. Raises TransferError: ``run_ended`` when the flow was still
    running at the window's end (or a stop), ``behind_schedule`` or ``stall`` at its own
    deadline (``shortfall``), else a connection error."""
    TransferError = _transfer_error(driver)
    cfg, wl = driver.cfg, driver.cfg["workload"]
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rec["t_socks"] = time.time()
    hello = {"trace": wl["trace_name"], "flow": flow.id, "iteration": iteration, "client": cfg["client"],
             "group": cfg["group"], "variant": cfg["variant"], "rep": cfg["rep"],
             "circuit": circ.id, "t_measure": cfg["t_measure"], "slack_s": wl["slack_s"]}
    sock.sendall(json.dumps(hello).encode() + b"\n")
    epoch = rec["t_request"] = time.time()
    base = {"variant": cfg["variant"], "rep": cfg["rep"], "client": cfg["client"], "group": cfg["group"],
            "trace": wl["trace_name"], "flow": flow.id, "iteration": iteration, "circuit": circ.id,
            "direction": DOWN}
    recorder = engine.CellRecorder(cells, base, cfg["t_measure"])
    up = [p for p in flow.packets if p.direction == UP]
    up_result: dict = {}

    def upstream() -> None:
        try:
            up_result["sent"] = engine.send_packets(sock, up, epoch, flow.start, stop, deadline=hard_end)
        except OSError as e:
            up_result["error"] = str(e)

    sender = threading.Thread(target=upstream, daemon=True)
    sender.start()
    expected_down = sum(len(wire.chunk_sizes(p.size)) for p in flow.packets if p.direction == DOWN)
    n, first, last, eof = engine.receive_chunks(sock, recorder, hard_end, expected_down, stop)
    sender.join(max(0.0, hard_end - time.time()))
    rec["chunks_down"] = n
    rec["chunks_up"] = (up_result.get("sent") or (0, 0))[0]
    rec["bytes"] = min(rec["size"], n * wire.CHUNK) if n < expected_down else rec["size"]
    rec["t_first_byte"], rec["t_last_byte"] = first, last
    if n < expected_down:
        if state.get("error"):
            raise TransferError(*state["error"])
        if time.time() >= cfg["t_end"] or stop.is_set():
            raise TransferError("run_ended", f"{n} of {expected_down} chunks when the run ended")
        if eof:
            raise TransferError("connection_error", f"received {n} of {expected_down} downstream chunks")
        raise TransferError(*shortfall(flow, n, expected_down, epoch, last, time.time()))
    if "error" in up_result:
        raise TransferError("connection_error", f"upstream: {up_result['error']}")


def shortfall(flow: Flow, n: int, expected: int, epoch: float, last: float | None, now: float) -> tuple[str, str]:
    """(cause, detail) of a flow cut at its own deadline with ``n`` of ``expected`` downstream
    chunks: ``behind_schedule`` when data arrived within BEHIND_PROGRESS_S of ``now``, counted
    from the last chunk (``last``) or, if later, from when chunk ``n`` was due (the server
    sends packet p at ``epoch + p.t - flow.start``); else ``stall``."""
    due, seen = None, 0
    for p in flow.packets:
        if p.direction != DOWN:
            continue
        seen += len(wire.chunk_sizes(p.size))
        if seen > n:
            due = epoch + p.t - flow.start
            break
    since = max(t for t in (last, due, epoch) if t is not None)
    silent = now - since
    what = f"received {n} of {expected} downstream chunks at the flow's deadline"
    if silent < BEHIND_PROGRESS_S:
        return "behind_schedule", f"{what}, the last {silent:.1f} s ago: behind its schedule, still moving"
    return "stall", f"{what}: none for {silent:.1f} s while data was due"


def _finish(driver, r: dict) -> dict:
    """The derived times and the warm-up flag of a flow's record; writes it."""
    ok = r["status"] == "ok"
    r["ttfb_s"] = r["t_first_byte"] - r["t_request"] if r["t_first_byte"] and r["t_request"] else None
    r["ttlb_s"] = r["t_last_byte"] - r["t_request"] if r["t_last_byte"] and r["t_request"] and ok else None
    r["ttfb_stream_s"] = r["t_first_byte"] - r["t_start"] if r["t_first_byte"] else None
    r["ttlb_stream_s"] = r["t_last_byte"] - r["t_start"] if r["t_last_byte"] and ok else None
    r["warmup"] = r["t_start"] < driver.cfg["t_measure"]
    driver.writer.write(r)
    return r


def run_replay(driver, slot: int, stop: threading.Event) -> int:
    """Replay the client's flows until the end of the measurement (looping when asked)."""
    cfg, wl = driver.cfg, driver.cfg["workload"]
    flows = _flows(driver)
    cells = RecordWriter(wl["cells_output"])
    t0 = cfg["t_workload"]
    period = wl["period_s"]
    counts = [0] * len(flows)

    def one(i: int, flow: Flow) -> None:
        k = 0
        while not stop.is_set():
            start = t0 + wl.get("offset_s", 0.0) + k * period + flow.start
            if start >= cfg["t_end"]:
                return
            engine._sleep_until(start, stop)
            if stop.is_set():
                return
            replay_flow(driver, flow, k, stop, cells)
            counts[i] += 1
            k += 1
            if not wl["loop"]:
                return

    clk = _clock(driver)
    flows_done = threading.Event()
    during = clk.run_during(flows_done) if clk else None
    threads = [threading.Thread(target=one, args=(i, f), daemon=True) for i, f in enumerate(flows)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.5)
    finally:
        cells.close()
        if clk is not None:
            flows_done.set()
            during.join(5.0)
            # Even when stopped early: the after-burst takes well under a second and closes
            # the bracket the delays are corrected within.
            clk.burst("after", clock.BURST_AFTER)
            clk.finish()
            clk.writer.close()
            clk.probe.close()
    return sum(counts)


run_replay.prepare = prepare   # type: ignore[attr-defined]
