"""The measurement driver of one client node: stem on the control port, SOCKS for data.

Runs next to its tor (same network namespace locally, same pod on Kubernetes):
``python -m torbed.client.driver CONFIG.json``. It builds circuits along the scenario's
path (group names already resolved to candidate fingerprints in the config) or leaves path
selection to tor, attaches its own streams (``__LeaveStreamsUnattached``; STREAM NEW,
NEWRESOLVE and DETACHED handled), runs the workload and appends one JSON line per transfer
(schema: docs/records.md), flushed as written.

Failures are measurement outcomes, not crashes: a circuit that cannot be extended, a
detached stream, a SOCKS error, a timeout, a stall or a checksum mismatch become records with
a typed ``error.cause`` and the workload goes on until its end time. A stall is tgen's
"stallout": no byte received for the workload's ``stallout_s`` after the request or the last
read (cause ``stall``; the error also records ``silent_s``). After a timeout or a stall the
circuit is closed and the next transfer builds a new one (a circuit whose relay vanished
unannounced would otherwise time out every later transfer). A transfer of any kind still
running ``WINDOW_GRACE_S`` after the window's end (``t_end``) is cut there and recorded as
censored, not failed: ``status: cancelled``, cause ``run_ended``, ``t_censor``.

Public API: ``run(config) -> int`` (transfers recorded), ``main(argv)``; workload kinds are
registered in ``WORKLOADS`` (``bulk``, ``fetch``, and ``replay`` from torbed.replay.client,
which replays trace flows, many per client, each flow's circuit key on a circuit of its own).
A workload function may have a ``prepare(driver)`` attribute, run before the workload start
(replay builds its circuits there, so build time is not part of the measurement).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import stem
import stem.control
from python_socks import ProxyError, ProxyTimeoutError
from python_socks.sync import Proxy
from stem.control import EventType

from ..records import RecordWriter
from .metrics import DriverMetrics, NullMetrics

RECV = 1 << 16
# How long one recv() waits before the loop checks the deadline, the stall clock and the
# circuit/stream events again (shortened when a stall is due sooner).
RECV_WAIT = 1.0
# Body byte counts whose arrival time a transfer records (``progress``), besides each tenth of
# the file: the sizes tgen/onionperf report, including the ones tornettools computes goodput
# from (500 KiB -> 1 MiB, 4 -> 5 MiB, 9 -> 10 MiB).
PROGRESS_BYTES = (10240, 20480, 51200, 102400, 204800, 512000, 1048576, 2097152, 4194304, 5242880,
                  9437184, 10485760)


def progress_marks(size: int) -> list[int]:
    """The body byte counts at which a transfer of ``size`` bytes records its arrival time."""
    if not size or size <= 0:
        return []
    return sorted({b for b in PROGRESS_BYTES if b <= size} | {-(-size * k // 10) for k in range(1, 11)})


def think_config(think) -> dict | None:
    """The driver config's ``think`` entry from a scenario's ThinkTime (None: constant pause)."""
    if think is None:
        return None
    return {"distribution": think.distribution, "mean_s": think.mean.seconds,
            "min_s": think.min.seconds if think.min else None,
            "max_s": think.max.seconds if think.max else None}


class TransferError(Exception):
    """A transfer's typed failure: ``cause`` and ``detail`` become the record's ``error``,
    with any ``fields`` beside them (a stall's ``silent_s``)."""

    def __init__(self, cause: str, detail: str, **fields):
        super().__init__(f"{cause}: {detail}")
        self.cause = cause
        self.detail = detail
        self.fields = fields


@dataclass
class Circuit:
    id: str | None
    path: list[dict]
    build_s: float | None
    alive: bool = True


class _MeteredWriter:
    """A RecordWriter whose transfer records also update the exporter's series."""

    def __init__(self, writer: RecordWriter, metrics):
        self.writer, self.metrics = writer, metrics

    def write(self, rec: dict) -> None:
        self.writer.write(rec)
        if "status" in rec:
            self.metrics.transfer_done(rec)

    def close(self) -> None:
        self.writer.close()


class Driver:
    """One client: its controller connection, its circuit(s) and stream attachment."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.rng = random.Random(f"{cfg['seed']}:{cfg['client']}")
        # The exporter (config ``metrics``: {address, port}) sees every record the driver
        # writes, so transfers.jsonl and the live series count the same transfers.
        self.metrics = DriverMetrics(cfg) if cfg.get("metrics") else NullMetrics()
        self.writer = _MeteredWriter(RecordWriter(cfg["output"]), self.metrics)
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[str, threading.Event, dict]] = {}  # source port -> (circ, ev, state)
        self.streams: dict[str, int] = {}                                 # stream id -> source port
        self.circuits: dict[str, Circuit] = {}    # circuit key -> circuit ("" = the client's one)
        self.circ_locks: dict[str, threading.Lock] = {}
        self.circ_lock = threading.Lock()
        self.controller: stem.control.Controller | None = None
        # circuits.jsonl: this client tor's circuits and, for each, the circuit id it chose on
        # its channel to the guard (CELL_STATS OutboundQueue), which the guard's CELL_STATS
        # records carry as InboundQueue: how the analysis finds the client's circuits at every
        # hop (analysis/circuits.py, docs/records.md).
        self.circuit_log = RecordWriter(cfg.get("circuits_output") or os.path.join(
            os.path.dirname(str(cfg["output"])) or ".", "circuits.jsonl"))
        self._linked: set[tuple] = set()

    def _circuit_base(self) -> dict:
        return {"type": "client_circuit", "variant": self.cfg.get("variant"), "rep": self.cfg.get("rep"),
                "client": self.cfg.get("client"), "group": self.cfg.get("group"), "t": time.time()}

    # -- control port -------------------------------------------------------------------
    def connect(self) -> None:
        c = self.cfg["control"]
        if c.get("socket"):
            self.controller = stem.control.Controller.from_socket_file(c["socket"])
        else:
            self.controller = stem.control.Controller.from_port(c.get("address", "127.0.0.1"), c["port"])
        self.controller.authenticate()
        self.controller.add_event_listener(self._on_stream, EventType.STREAM)
        self.controller.add_event_listener(self._on_circ, EventType.CIRC)
        # Always subscribed: tor keeps per-cell entries for CELL_STATS until it emits them
        # (role-client.torrc sets TestingEnableCellStatsEvent, torbed/torrc.py).
        self.controller.add_event_listener(self._on_cellstats, EventType.CELL_STATS)
        if self.cfg.get("path"):
            self.controller.set_conf("__LeaveStreamsUnattached", "1")
            self.controller.set_conf("__DisablePredictedCircuits", "1")

    def wait_bootstrapped(self, deadline: float) -> None:
        while time.time() < deadline:
            phase = self.controller.get_info("status/bootstrap-phase", "")
            if "PROGRESS=100" in phase:
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.cfg['client']}: tor did not bootstrap: {phase}")

    @property
    def circuit(self) -> Circuit | None:
        """The client's (only) circuit of bulk and fetch workloads."""
        return self.circuits.get("")

    @circuit.setter
    def circuit(self, circ: Circuit | None) -> None:
        if circ is None:
            self.circuits.pop("", None)
        else:
            self.circuits[""] = circ

    def _on_cellstats(self, event) -> None:
        """An origin circuit's CELL_STATS: its channel (OutboundConn, this tor's channel id)
        and its circuit id on that channel (OutboundQueue), written once per pair."""
        if not event.id or event.outbound_queue is None:
            return
        key = (str(event.id), str(event.outbound_connection), str(event.outbound_queue))
        if key in self._linked:
            return
        self._linked.add(key)
        self.circuit_log.write({**self._circuit_base(), "event": "link", "id": key[0], "conn": key[1],
                                "queue": key[2]})

    def _on_circ(self, event) -> None:
        if event.status in ("BUILT", "FAILED", "CLOSED"):
            rec = {**self._circuit_base(), "event": event.status.lower(), "id": str(event.id),
                   "purpose": event.purpose, "build_flags": list(event.build_flags or ()),
                   "path": [fp for fp, _ in (event.path or ())]}
            if event.status != "BUILT":
                rec["reason"] = event.reason
            self.circuit_log.write(rec)
        if event.status not in ("FAILED", "CLOSED"):
            return
        for circ in list(self.circuits.values()):
            if circ.id != event.id:
                continue
            circ.alive = False
            # Streams waiting on this circuit will be DETACHED by tor; fail them fast.
            with self.lock:
                for port, (cid, ev, state) in list(self.pending.items()):
                    if cid == circ.id and not ev.is_set():
                        state["error"] = ("circuit_failed", f"circuit {cid} {event.status} ({event.reason})")
                        ev.set()

    def _on_stream(self, event) -> None:
        if self.cfg.get("debug"):
            print(f"STREAM {event.id} {event.status} circ={event.circ_id} src={event.source_address}:{event.source_port}"
                  f" purpose={event.purpose} reason={event.reason}", file=sys.stderr, flush=True)
        if event.status == "SUCCEEDED" and event.circ_id and event.purpose in (None, "USER") \
                and event.target_address == self.cfg.get("workload", {}).get("address"):
            # Which circuit carried the workload's streams, also when tor chose the path (no
            # fixed path: transfers.jsonl then names no circuit). Only streams to the
            # workload's server: bring-up probes through this tor are not the workload.
            self.circuit_log.write({**self._circuit_base(), "event": "stream", "id": str(event.circ_id),
                                    "stream": str(event.id), "target": f"{event.target_address}:{event.target_port}"})
        with self.lock:
            if event.status in ("NEW", "NEWRESOLVE") and event.source_port is not None:
                self.streams[event.id] = int(event.source_port)
            port = self.streams.get(event.id)
            entry = self.pending.get(port) if port is not None else None
            if event.status in ("CLOSED", "FAILED"):
                self.streams.pop(event.id, None)
        if entry is None:
            return
        cid, ev, state = entry
        if event.status in ("NEW", "NEWRESOLVE"):
            try:
                self.controller.attach_stream(event.id, cid)
            except stem.ControllerError as e:
                state["error"] = ("circuit_failed", f"attach to circuit {cid}: {e}")
                ev.set()
        elif event.status == "DETACHED":
            state["error"] = ("stream_detached", f"stream {event.id} detached ({event.reason} {event.remote_reason or ''})".strip())
            ev.set()
            # tor holds a detached stream for re-attachment; close it so SOCKS fails now.
            try:
                self.controller.close_stream(event.id)
            except stem.ControllerError:
                pass

    # -- circuits -----------------------------------------------------------------------
    def get_circuit(self, key: str = "", deadline: float | None = None) -> Circuit:
        """The circuit called ``key`` ("" = the client's one), (re)built along the configured
        path when needed. Different keys get different circuits (a replayed trace's flows on
        circuits of their own); without a fixed path tor chooses, and streams are isolated by
        SOCKS username = key (see ``socks_url``). A transfer passes its ``deadline``: a build
        still going then is the transfer's timeout (tor may finish that circuit later; it
        stays unused), not a wait of up to ``circuit_timeout``."""
        with self.circ_lock:
            lock = self.circ_locks.setdefault(key, threading.Lock())
        with lock:
            circ = self.circuits.get(key)
            if circ and circ.alive:
                return circ
            hops = self.cfg.get("path")
            if not hops:
                self.circuits[key] = Circuit(id=None, path=[], build_s=None)
                return self.circuits[key]
            chosen = [self.rng.choice(candidates) for candidates in hops]
            t0 = time.time()
            limit = self.cfg.get("circuit_timeout", 60)
            cut = deadline is not None and deadline - t0 < limit
            try:
                cid = self.controller.new_circuit([h["fingerprint"] for h in chosen], await_build=True,
                                                  timeout=max(0.5, deadline - t0) if cut else limit)
            except stem.Timeout as e:
                if not cut:
                    self.circuits.pop(key, None)
                    self.metrics.circuit_failed()
                    raise TransferError("circuit_failed", f"building {'-'.join(h['node'] for h in chosen)}: Timeout {e}")
                raise TransferError("timeout", f"building {'-'.join(h['node'] for h in chosen)}: "
                                               f"not built {time.time() - t0:.1f} s later")
            except stem.CircuitExtensionFailed as e:
                self.circuits.pop(key, None)
                self.metrics.circuit_failed()
                raise TransferError("circuit_failed", f"building {'-'.join(h['node'] for h in chosen)}: {e}")
            except stem.ControllerError as e:
                self.circuits.pop(key, None)
                self.metrics.circuit_failed()
                raise TransferError("circuit_failed", f"building {'-'.join(h['node'] for h in chosen)}: {type(e).__name__} {e}")
            self.circuits[key] = Circuit(id=cid, path=chosen, build_s=time.time() - t0)
            self.metrics.circuit_built(self.circuits[key].build_s)
            return self.circuits[key]

    def _retire(self, circ: Circuit) -> None:
        """A transfer timed out or stalled on ``circ``: build a new circuit for the next one. A relay
        that went away without the client hearing of it (no DESTROY reached it, e.g. a relay
        restarted under a stream carrying data) leaves a circuit that looks open and carries
        nothing; reusing it would time every later transfer out."""
        if circ.id is None or not circ.alive:
            return
        circ.alive = False
        try:
            self.controller.close_circuit(circ.id)
        except stem.ControllerError:
            pass   # already gone

    def socks_url(self, key: str = "") -> str:
        """SOCKS proxy URL; a non-empty key becomes the username, so tor (IsolateSOCKSAuth, on
        by default) keeps that key's streams on circuits of their own when it chooses paths."""
        auth = f"{key.replace(':', '_').replace('@', '_') or 'x'}:x@" if key else ""
        return f"socks5://{auth}127.0.0.1:{self.cfg['socks_port']}"

    # -- one transfer ---------------------------------------------------------------------
    def transfer(self, slot: int, seq: int, timeout: float) -> dict:
        """One HTTP GET of the workload's file, recorded. ``timeout`` shorter than the
        workload's ``timeout_s`` was cut by the end of the window (``window_timeout``): the
        transfer it ends is censored (``status: cancelled``, ``t_censor``), not failed."""
        wl = self.cfg["workload"]
        timeout_was_cut = timeout < wl["timeout_s"]
        rec = {"type": "transfer", "variant": self.cfg["variant"], "rep": self.cfg["rep"],
               "client": self.cfg["client"], "group": self.cfg["group"], "workload": wl["kind"],
               "slot": slot, "seq": seq, "server": wl["server"], "file": wl["file"], "size": wl["size"],
               "circuit": None, "t_start": time.time(), "t_socks": None, "t_request": None,
               "t_first_byte": None, "t_last_byte": None, "bytes": 0, "status": "ok", "error": None}
        deadline = rec["t_start"] + timeout
        self.metrics.transfer_started()
        sock = None
        port = None
        circ = None
        try:
            circ = self.get_circuit(deadline=deadline)
            if circ.id is not None:
                rec["circuit"] = {"id": circ.id, "path": circ.path, "build_s": circ.build_s}
            port, ev, state = self._reserve_port(circ.id)
            sock = self._connect(port, state, deadline)
            rec["t_socks"] = time.time()
            sock.settimeout(RECV_WAIT)
            sock.sendall(f"GET /{wl['file']} HTTP/1.1\r\nHost: {wl['address']}\r\nConnection: close\r\n\r\n".encode())
            rec["t_request"] = time.time()
            self._receive(sock, rec, deadline, state)
            if rec["bytes"] != wl["size"]:
                # tor closes the stream before its CIRC/STREAM event explains why: wait for it.
                ev.wait(1.0)
                raise TransferError(*(state.get("error") or
                                      ("connection_error", f"received {rec['bytes']} of {wl['size']} bytes")))
        except TransferError as e:
            self._failed(rec, e, circ, timeout_was_cut)
        finally:
            if sock is not None:
                sock.close()
            if port is not None:
                with self.lock:
                    self.pending.pop(port, None)
        return self._finish(rec)

    def _connect(self, port: int, state: dict, deadline: float) -> socket.socket:
        """A SOCKS connection to the workload's server from local ``port`` (reserved, so the
        STREAM events find the circuit to attach it to); SOCKS failures as TransferError,
        with the cause the stream/circuit events gave when they came first."""
        wl = self.cfg["workload"]
        proxy = Proxy.from_url(f"socks5://127.0.0.1:{self.cfg['socks_port']}")
        try:
            return proxy.connect(wl["address"], wl["port"], timeout=max(1.0, deadline - time.time()),
                                 local_addr=("127.0.0.1", port))
        except ProxyTimeoutError as e:
            raise TransferError(*(state.get("error") or ("timeout", f"SOCKS connect: {e}")))
        except ProxyError as e:
            raise TransferError(*(state.get("error") or ("socks_error", f"SOCKS reply: {e}")))
        except OSError as e:
            raise TransferError(*(state.get("error") or ("socks_error", f"SOCKS: {e}")))

    def _failed(self, rec: dict, e: TransferError, circ: Circuit | None, timeout_was_cut: bool) -> None:
        """Record ``e`` in ``rec``: a timeout the window's end imposed is a censored
        observation; any other timeout or a stall retires the circuit."""
        if e.cause == "timeout" and time.time() >= self.cfg["t_end"] and timeout_was_cut:
            # Not a failure: the measurement ended while this transfer ran.
            rec["status"], e = "cancelled", TransferError("run_ended", e.detail)
            # Right-censored, not failed: observed without finishing up to now
            # (analysis/survival.py keeps it as "time > t_censor - origin").
            rec["t_censor"] = time.time()
        else:
            rec["status"] = "timeout" if e.cause == "timeout" else "error"
            if e.cause in ("timeout", "stall") and circ is not None:
                self._retire(circ)
        rec["error"] = {"cause": e.cause, "detail": e.detail, **e.fields}

    def _finish(self, rec: dict) -> dict:
        """The derived times and the warm-up flag of a finished transfer; writes it."""
        t, r = rec, rec["t_request"]
        ok = rec["status"] == "ok"
        rec["ttfb_s"] = t["t_first_byte"] - r if t["t_first_byte"] and r else None
        rec["ttlb_s"] = t["t_last_byte"] - r if t["t_last_byte"] and r and ok else None
        rec["ttfb_stream_s"] = t["t_first_byte"] - t["t_start"] if t["t_first_byte"] else None
        rec["ttlb_stream_s"] = t["t_last_byte"] - t["t_start"] if t["t_last_byte"] and ok else None
        rec["warmup"] = rec["t_start"] < self.cfg["t_measure"]
        self.writer.write(rec)
        return rec

    def _reserve_port(self, circ_id: str | None) -> tuple[int, threading.Event, dict]:
        while True:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            with self.lock:
                if port not in self.pending:
                    ev, state = threading.Event(), {}
                    if circ_id is not None:
                        self.pending[port] = (circ_id, ev, state)
                    return port, ev, state

    def _receive(self, sock: socket.socket, rec: dict, deadline: float, state: dict) -> None:
        """Read the HTTP response of a request just sent on ``sock`` (whose timeout is
        RECV_WAIT) into ``rec``. Raises TransferError: ``timeout`` at ``deadline``, ``stall``
        when no byte (header or body) arrived for the workload's ``stallout_s`` since the
        request or the previous read (no ``stallout_s``: no stall check)."""
        wl = self.cfg["workload"]
        stallout = wl.get("stallout_s")
        header = b""
        body_hash = hashlib.sha256()
        body = 0
        in_body = False
        marks = progress_marks(wl["size"])
        rec["progress"] = []
        last_read = time.time()     # the stall clock: the request was just sent
        wait = RECV_WAIT
        while True:
            if state.get("error"):
                raise TransferError(*state["error"])
            now = time.time()
            if now > deadline:
                raise TransferError("timeout", f"after {rec['bytes']} of {wl['size']} bytes")
            if stallout is not None:
                wait = _stall_check(sock, rec, stallout, now - last_read, wait, wl["size"])
            try:
                data = sock.recv(RECV)
            except socket.timeout:
                continue
            except OSError as e:
                raise TransferError(*(state.get("error") or ("connection_error", str(e))))
            if not data:
                break
            now = time.time()
            last_read = now
            if wait != RECV_WAIT:
                wait = RECV_WAIT
                sock.settimeout(wait)
            if rec["t_first_byte"] is None:
                rec["t_first_byte"] = now
            if not in_body:
                header += data
                if b"\r\n\r\n" not in header:
                    continue
                head, _, data = header.partition(b"\r\n\r\n")
                status = head.split(b"\r\n", 1)[0].decode(errors="replace")
                if " 200 " not in status + " ":
                    raise TransferError("http_error", status)
                in_body = True
            if data:
                body += len(data)
                body_hash.update(data)
                rec["bytes"] = body
                rec["t_last_byte"] = now
                # Time the body reached each mark (at recv() granularity, as tgen records it).
                while marks and body >= marks[0]:
                    rec["progress"].append([marks.pop(0), now])
        if state.get("error"):
            raise TransferError(*state["error"])
        if body == wl["size"] and body_hash.hexdigest() != wl["sha256"]:
            raise TransferError("checksum_mismatch", f"sha256 {body_hash.hexdigest()} != {wl['sha256']}")


def _stall_check(sock: socket.socket, rec: dict, stallout: float, silent: float, wait: float, size: int) -> float:
    """Raise the ``stall`` TransferError when ``silent`` reached ``stallout``; else the recv
    wait to use (shortened to wake up when the stall is due, not up to RECV_WAIT later)."""
    if silent >= stallout:
        raise TransferError("stall", f"no byte for {silent:.1f} s (stallout {stallout:g} s) after "
                                     f"{rec['bytes']} of {size} body bytes", silent_s=round(silent, 3))
    if stallout - silent < wait:
        wait = max(0.01, stallout - silent)
        sock.settimeout(wait)
    return wait


# -- workloads ------------------------------------------------------------------------------

def _pause(driver: Driver, wl: dict) -> float:
    think = wl.get("think")
    if not think:
        return wl.get("pause_s", 0.0)
    if think["distribution"] == "constant":
        return think["mean_s"]
    if think["distribution"] == "exponential":
        return driver.rng.expovariate(1.0 / think["mean_s"]) if think["mean_s"] > 0 else 0.0
    return driver.rng.uniform(think["min_s"], think["max_s"])


def _sleep_until(t: float, stop: threading.Event) -> None:
    stop.wait(max(0.0, t - time.time()))


def run_bulk(driver: Driver, slot: int, stop: threading.Event) -> int:
    n = 0
    while not stop.is_set() and time.time() < driver.cfg["t_end"]:
        rec = driver.transfer(slot, n, _timeout(driver))
        n += 1
        if rec["status"] != "ok":
            _sleep_until(time.time() + 1.0, stop)   # back off after a failure, don't spin
    return n


def run_fetch(driver: Driver, slot: int, stop: threading.Event) -> int:
    wl = driver.cfg["workload"]
    n = 0
    while n < wl["repeat"] and not stop.is_set() and time.time() < driver.cfg["t_end"]:
        driver.transfer(slot, n, _timeout(driver))
        n += 1
        _sleep_until(time.time() + _pause(driver, wl), stop)
    return n


# How long after the end of the window a transfer still running is cut off (and recorded as
# censored at that moment): a grace for transfers about to finish, not a second window.
WINDOW_GRACE_S = 5.0


def _timeout(driver: Driver) -> float:
    """A transfer's timeout: the workload's, cut to end WINDOW_GRACE_S after the window for
    every kind (a 5 MiB fetch with a 60 s timeout once ran 118 s past a 35 s window, its time
    counted as if the window had gone on)."""
    wl = driver.cfg["workload"]
    return min(wl["timeout_s"], max(1.0, driver.cfg["t_end"] + WINDOW_GRACE_S - time.time()))


WORKLOADS: dict[str, Callable[[Driver, int, threading.Event], int]] = {
    "bulk": run_bulk,
    "fetch": run_fetch,
}


def _register_replay() -> None:
    from ..replay.client import run_replay
    WORKLOADS["replay"] = run_replay


_register_replay()


def run(cfg: dict, stop: threading.Event | None = None) -> int:
    stop = stop or threading.Event()
    driver = Driver(cfg)
    if cfg.get("metrics"):
        driver.metrics.serve(cfg["metrics"]["address"], cfg["metrics"]["port"])
    driver.connect()
    try:
        driver.wait_bootstrapped(time.time() + cfg.get("bootstrap_timeout", 120))
        work = WORKLOADS[cfg["workload"]["kind"]]
        if getattr(work, "prepare", None):
            work.prepare(driver)
        _sleep_until(cfg.get("t_workload", 0), stop)
        counts = [0] * cfg["workload"]["concurrency"]

        def slot_main(i: int) -> None:
            counts[i] = work(driver, i, stop)

        threads = [threading.Thread(target=slot_main, args=(i,), daemon=True)
                   for i in range(len(counts))]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)
        return sum(counts)
    finally:
        driver.controller.close()
        driver.writer.close()
        driver.circuit_log.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m torbed.client.driver CONFIG.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        cfg = json.load(f)
    stop = threading.Event()
    import signal
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    n = run(cfg, stop)
    print(f"{cfg['client']}: {n} transfers", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
