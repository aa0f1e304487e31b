"""torbed's Locust users: background load through a tor client's SOCKS port.

Run by Locust (``locust -f torbed/load/locustfile.py``), never imported by torbed itself
(Locust monkey-patches the standard library with gevent on import). Configuration is one
JSON file named by TORBED_LOAD_CONFIG (``torbed.load.locust_config``); TORBED_LOAD_NODE
names the load node a worker runs on, so SOCKS credentials are unique across workers.

- Every user has its own SOCKS credentials (``<node>-<n>``): tor's IsolateSOCKSAuth puts
  each user's streams on its own circuits, so users do not share one circuit.
- socks5h: the exit, not the load node, resolves and connects (servers are addresses here).
- Each iteration picks one request of the mix by weight (weights are connection shares),
  downloads the whole body, checks its size, then pauses for that request's think time.
- The master (or a stand-alone Locust) appends its statistics to load.jsonl every
  stats_interval_s while a test runs (until its stop begins) and once when it stops: cumulative counts and bytes, current requests/s
  and failures/s, response-time percentiles over Locust's current window (10 s) and over
  the whole run so far. The 'end' record is written once the workers' final reports are
  in (every request the master ever counted), or at the latest when Locust quits.
- The master also serves those statistics to Prometheus (``torbed.load.metrics``) at the
  config's ``metrics`` address and port, when it names one (the local backend's does).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import random
import time
from pathlib import Path

import gevent
from locust import HttpUser, events, task
from locust.runners import MasterRunner, WorkerRunner

CFG = json.load(open(os.environ["TORBED_LOAD_CONFIG"]))
NODE = os.environ.get("TORBED_LOAD_NODE", "load")
_ids = itertools.count()
PERCENTILES = (0.5, 0.9, 0.95, 0.99)
# How long a master's end record waits for the workers' final reports after a stop: a
# worker reports every 3 s (Locust's WORKER_REPORT_INTERVAL), so two intervals and a margin.
END_WAIT_S = 7.0


def _think(rng: random.Random, think: dict | None) -> float:
    if not think:
        return 0.0
    if think["distribution"] == "constant":
        return think["mean_s"]
    if think["distribution"] == "exponential":
        return rng.expovariate(1.0 / think["mean_s"]) if think["mean_s"] > 0 else 0.0
    return rng.uniform(think["min_s"], think["max_s"])


class TorUser(HttpUser):
    host = CFG["servers"][0]
    # Pauses are per request kind (the mix's think times), taken in the task itself.
    wait_time = staticmethod(lambda: 0)  # noqa: E731

    def on_start(self):
        n = next(_ids)
        self.rng = random.Random(f"{CFG['seed']}:{NODE}:{n}")
        self.base = CFG["servers"][n % len(CFG["servers"])]
        proxy = f"socks5h://{NODE}-{n}:torbed@127.0.0.1:{CFG['socks_port']}"
        self.client.proxies = {"http": proxy, "https": proxy}
        self.client.trust_env = False   # never an environment proxy: the network is private
        self.requests = CFG["requests"]
        self.weights = [r["weight"] for r in self.requests]

    @task
    def fetch(self):
        r = self.rng.choices(self.requests, self.weights)[0]
        with self.client.get(f"{self.base}/{r['file']}", name=r["name"], timeout=CFG["timeout_s"],
                             catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}")
            elif len(resp.content) != r["size"]:
                resp.failure(f"short body: {len(resp.content)} of {r['size']} bytes")
        pause = _think(self.rng, r.get("think"))
        if pause:
            gevent.sleep(pause)


def _record(environment, label: str) -> dict:
    runner, stats = environment.runner, environment.runner.stats
    entries = {name: stats.entries[(name, "GET")] for name in sorted({n for n, _ in stats.entries})}

    def one(e) -> dict:
        return {"requests": e.num_requests, "failures": e.num_failures,
                "bytes": e.total_content_length, "rps": round(e.current_rps, 3),
                "fail_per_s": round(e.current_fail_per_sec, 3),
                # Over Locust's current window (10 s) ...
                **{f"p{int(q * 100)}_ms": e.get_current_response_time_percentile(q) for q in PERCENTILES},
                # ... and over every request so far.
                **{f"p{int(q * 100)}_ms_all": e.get_response_time_percentile(q) if e.num_requests else None
                   for q in PERCENTILES}}

    return {"type": "load", "variant": CFG["variant"], "rep": CFG["rep"], "t": time.time(), "label": label,
            "users": runner.user_count, "total": one(stats.total),
            "by_name": {name: one(e) for name, e in entries.items()}}


def _write(line: dict) -> None:
    # One write per line, O_APPEND: nothing half-written survives a crash.
    with open(CFG["stats_output"], "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
        f.flush()


def _metrics_module():
    # By path, beside this file: Locust's own venv (the locust image's) has no torbed.
    spec = importlib.util.spec_from_file_location("torbed_load_metrics", Path(__file__).with_name("metrics.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@events.init.add_listener
def _stats_writer(environment, **_):
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        return
    if CFG.get("metrics"):
        m = CFG["metrics"]
        _metrics_module().serve(runner, CFG["variant"], m["address"], m["port"], m["buckets"])
    w = _StatsWriter(environment)
    events.test_start.add_listener(w.start)
    events.test_stopping.add_listener(w.stopping)
    events.worker_report.add_listener(w.report)
    events.test_stop.add_listener(w.stop)
    events.quitting.add_listener(w.quitting)


class _StatsWriter:
    """Records while users run: from the test's start (a headless master's spawn, the
    Kubernetes master's /swarm) to its stop (--run-time, /stop), one 'end' record then;
    a master that stays up afterwards (Kubernetes: its web UI) writes nothing while idle.

    A master's test_stop is not the end of its statistics: with --run-time Locust fires it
    before telling the workers to quit, and a worker sends the requests of its last
    interval only then (or, after a /stop, in its next report). So the 'end' record waits
    until every worker connected at the stop has reported with no user left running (its
    statistics are then final), for at most END_WAIT_S, and is written at 'quitting' in any
    case -- after the master's window for the workers' final reports."""

    def __init__(self, environment):
        self.environment = environment
        self.runner = environment.runner
        self.greenlet = None    # the periodic records' loop while a test runs
        self.end = None         # from the stop on: {"final": workers done, "written", "waiter"}

    def _loop(self):
        while True:
            gevent.sleep(CFG["stats_interval_s"])
            # From the stop on (test_stopping) the users are stopping: only the 'end' record.
            # A master waits for its workers' users to stop before test_stop, seconds on a
            # loaded machine, and a worker's regular report can bring its last interval in
            # then: a periodic record there was the end record's counts under another label.
            if self.end is None:
                _write(_record(self.environment, "periodic"))

    def _running(self) -> bool:
        return self.greenlet is not None and not self.greenlet.dead

    def start(self, environment, **_):
        if not self._running():
            self.greenlet = gevent.spawn(self._loop)
            self.end = None

    def stopping(self, environment, **_):
        if self._running() and self.end is None:
            self.end = {"final": set(), "written": False, "waiter": None}

    def report(self, client_id, data, **_):
        if self.end is not None and data.get("user_count") == 0:
            self.end["final"].add(client_id)

    def _pending(self) -> set:
        # Workers that left (quit, missed heartbeats) are not waited for.
        if not isinstance(self.runner, MasterRunner):
            return set()
        return {c.id for c in self.runner.clients.all} - self.end["final"]

    def _write_end(self):
        end = self.end
        if end is None or end["written"]:
            return
        end["written"] = True
        _write(_record(self.environment, "end"))

    def _wait_then_write(self):
        deadline = time.monotonic() + END_WAIT_S
        while self._pending() and time.monotonic() < deadline:
            gevent.sleep(0.1)
        self._write_end()

    def stop(self, environment, **_):
        if not self._running():
            return
        self.greenlet.kill(block=True)
        if self.end is None:   # (a stop without test_stopping: none in Locust 2.47)
            self.end = {"final": set(), "written": False, "waiter": None}
        self.end["waiter"] = gevent.spawn(self._wait_then_write)

    def quitting(self, environment, **_):
        if self._running() and isinstance(self.runner, MasterRunner):
            # SIGTERM while users run: Locust fires 'quitting' before it tells the workers
            # to quit; quit them now, so their final reports (quit() waits 0.5 s for them)
            # are in the end record.
            self.runner.quit()
        if self._running():   # stand-alone Locust: no stop came
            self.greenlet.kill(block=True)
            self.end = self.end or {"final": set(), "written": False, "waiter": None}
        end = self.end
        if end is not None and not end["written"]:
            if end["waiter"] is not None:
                end["waiter"].kill(block=True)
            self._write_end()
