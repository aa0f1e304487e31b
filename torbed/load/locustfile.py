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
  stats_interval_s while a test runs and once when it stops: cumulative counts and bytes, current requests/s
  and failures/s, response-time percentiles over Locust's current window (10 s) and over
  the whole run so far.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time

import gevent
from locust import HttpUser, events, task
from locust.runners import WorkerRunner

CFG = json.load(open(os.environ["TORBED_LOAD_CONFIG"]))
NODE = os.environ.get("TORBED_LOAD_NODE", "load")
_ids = itertools.count()
PERCENTILES = (0.5, 0.9, 0.95, 0.99)


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


@events.init.add_listener
def _stats_writer(environment, **_):
    if isinstance(environment.runner, WorkerRunner):
        return
    state = {"greenlet": None}

    def loop():
        while True:
            gevent.sleep(CFG["stats_interval_s"])
            _write(_record(environment, "periodic"))

    # Records while users run: from the test's start (a headless master's spawn, the
    # Kubernetes master's /swarm) to its stop (--run-time, /stop), one 'end' record then;
    # a master that stays up afterwards (Kubernetes: its web UI) writes nothing while idle.
    @events.test_start.add_listener
    def _start(environment, **_):
        if state["greenlet"] is None or state["greenlet"].dead:
            state["greenlet"] = gevent.spawn(loop)

    def _final(environment, **_):
        # Locust fires 'test_stop' and then 'quitting' (more than once on a master): one
        # 'end' record per test.
        greenlet = state["greenlet"]
        if greenlet is None or greenlet.dead:
            return
        greenlet.kill(block=True)
        _write(_record(environment, "end"))

    events.test_stop.add_listener(_final)
    events.quitting.add_listener(_final)
