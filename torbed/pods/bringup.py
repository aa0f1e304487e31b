"""Bring-up on Kubernetes as on the local backend (torbed.backends.local): tor's download
back-off is cut short once there is something to download, and clients go online only once
the directory caches can answer them.

Every tor starts together with the others, asks the authorities for a consensus before the
first vote, gets 404s and backs off exponentially: in a link-fault e2e run the relays got the
first consensus 3-13 s after it existed, so the guards had nothing to give the clients,
whose microdescriptor fetches then failed and waited for tor's 10 s periodic retry.

- Relays (their collector sidecar, ``relay_nudge``): once an authority serves a consensus
  listing every relay with its flags, and this relay's tor has no consensus yet, SIGHUP (over
  the control port) makes tor reset its back-off and fetch the consensus at once.
  Every relay then reports to the results service (POST /cache/<pod>) as soon as it holds
  that consensus, a directory guard once it also holds every relay's microdescriptor. (A
  relay that opened channels before it knew its peers as relays did not greet them as a
  Torchestra peer: seen once, when clients went online as soon as the guard was ready.)
- Clients (their driver, ``wait_for_caches``) start tor with DisableNetwork 1 (torbed-node,
  TORBED_START_OFFLINE=1) and turn the network on once every relay has reported, or
  ONLINE_MARGIN_S before their ready deadline at the latest (a client bootstraps in a few
  seconds once the caches can answer; going online earlier, with a relay that does not
  know its peers yet, is a different experiment: a Torchestra exit counted every switch
  as a fallback when the clients went online after a fixed 20 s).

All of it is over before the workload starts; meta.json records it (``bootstrap``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
import urllib.error
import urllib.request

import stem
import stem.control

from .. import constants, readiness
from ..network import Plan
from . import log, results_post

ONLINE_MARGIN_S = 30.0
POLL_S = 0.5
HUP_SPACING_S = 3.0


def directory_caches(plan: Plan) -> list[str]:
    """The relays clients fetch microdescriptors from: the guards when there are any (the
    others run DirCache 0, torbed.torrc), else every relay."""
    relays = plan.by_role("relay")
    guards = [n.name for n in relays if n.guard]
    return guards or [n.name for n in relays]


def authority_consensus(urls: list[str], plan: Plan, fprs: dict[str, str], timeout: float = 2.0) -> str | None:
    """None once one of the authorities serves a consensus listing every relay with its
    flags, else what the last one lacked."""
    why = "no authority answered"
    for url in urls:
        try:
            with urllib.request.urlopen(f"{url}/tor/status-vote/current/consensus", timeout=timeout) as r:
                data = r.read()
        except (urllib.error.URLError, OSError) as e:
            why = f"{url}: {getattr(e, 'code', None) or type(e).__name__}"
            continue
        why, _ = readiness.consensus_problem(data, plan, fprs)
        if why is None:
            return None
    return why


def relay_nudge(connect, plan: Plan, fprs: dict[str, str], auth_urls: list[str], results_url: str,
                pod: str, is_cache: bool, deadline: float, stop: threading.Event) -> dict:
    """The relay side (see the module's docstring). ``connect()`` gives an authenticated
    controller of this pod's tor. Returns what it did (logged by the caller)."""
    everyone = [n.name for n in plan.by_role("relay")]
    done = {"hups": 0, "cache_reported": False}
    ctl = None
    last_hup = 0.0
    try:
        ctl = connect()
        while not stop.is_set() and time.time() < deadline:
            # A list: stem gives a generator, which is never falsy (until this was a list the
            # SIGHUP below never happened, in any run).
            statuses = list(ctl.get_network_statuses([]))
            own = readiness.flags_problem(plan, {e.fingerprint: set(e.flags) for e in statuses}, fprs)
            if own is not None:
                # A HUP makes tor fetch at once only while it has no consensus at all; with
                # one (an early one lacking relays) it fetches the next on its own schedule.
                if not statuses and time.time() - last_hup > HUP_SPACING_S \
                        and authority_consensus(auth_urls, plan, fprs) is None:
                    ctl.signal(stem.Signal.RELOAD)
                    last_hup = time.time()
                    done["hups"] += 1
            elif not is_cache or all(readiness.knows(ctl, fprs[name]) for name in everyone):
                # Not tor's bootstrap phase: a relay reaches 100 % only once it has built
                # circuits of its own, which has nothing to do with what it can serve.
                done["cache_reported"] = _post(f"{results_url}/cache/{pod}")
                if done["cache_reported"]:
                    break
            stop.wait(POLL_S)
    except (stem.ControllerError, stem.SocketError, OSError) as e:
        done["error"] = f"{type(e).__name__}: {e}"
    finally:
        if ctl is not None:
            ctl.close()
    return done


def wait_for_caches(results_url: str, want: int, deadline: float) -> tuple[int, float]:
    """Until ``want`` directory caches have reported or ``deadline``: (how many had, when)."""
    have = 0
    while True:
        try:
            with urllib.request.urlopen(f"{results_url}/caches", timeout=5) as r:
                have = len(json.loads(r.read()).get("caches") or [])
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if have >= want or time.time() >= deadline:
            return have, time.time()
        time.sleep(POLL_S)


def _post(url: str) -> bool:
    try:
        with urllib.request.urlopen(results_post(url), timeout=5) as r:
            r.read()
        return True
    except (urllib.error.URLError, OSError):
        return False


def start_relay_nudge(plan: Plan, fprs: dict[str, str], node: str, results_url: str, pod: str,
                      auth_urls: list[str], connect, timeout_s: float, stop: threading.Event) -> threading.Thread:
    caches = directory_caches(plan)

    def run():
        t0 = time.time()
        done = relay_nudge(connect, plan, fprs, auth_urls, results_url, pod, node in caches, t0 + timeout_s, stop)
        log(f"bring-up {node}: {done['hups']} SIGHUP(s) after the consensus appeared"
            + (("; reported ready" + (" (a directory cache)" if node in caches else "")) if done["cache_reported"] else "")
            + (f"; stopped: {done['error']}" if done.get("error") else "")
            + f" ({time.time() - t0:.1f} s)")

    th = threading.Thread(target=run, daemon=True, name="bring-up")
    th.start()
    return th


def connect_control(deadline: float) -> stem.control.Controller:
    """This pod's tor's control port (127.0.0.1), authenticated; retried until ``deadline``."""
    while True:
        try:
            ctl = stem.control.Controller.from_port("127.0.0.1", constants.CONTROL_PORT)
            ctl.authenticate()
            return ctl
        except (stem.SocketError, stem.connection.AuthenticationFailure, OSError):
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def wait_network(ctl: stem.control.Controller, p: Plan, fprs: dict[str, str], path_nodes: list[str],
                 deadline: float) -> str | None:
    """Wait until this client's (or load node's) tor is ready as on every backend
    (torbed.readiness; here it checks the flags in its own consensus). None once ready, else
    what was still missing at ``deadline``."""
    last_hup = 0.0
    while (why := readiness.client_problem(ctl, p, fprs, path_nodes, check_flags=True)) is not None:
        if why.startswith("no microdescriptor") and time.time() - last_hup > 5:
            # tor backs off after failed directory fetches (early on, its caches had
            # nothing to give); a HUP resets the back-off, as the local backend does.
            ctl.signal(stem.Signal.RELOAD)
            last_hup = time.time()
        if time.time() > deadline:
            return why
        time.sleep(0.5)
    return None


def wait_start(url: str, *, node: str | None = None, deadline: float | None = None,
               alive: Callable[[], bool] | None = None, interval: float = 0.2) -> float | None:
    """The start barrier: t_workload once the results service opens it (every client ready).
    ``node``: report this client ready first (POST /ready/<node>, retried with the polling; a
    Locust master is not a client and reports nothing). None when ``deadline`` passes or
    ``alive()`` turns false first."""
    reported = node is None
    while (deadline is None or time.time() < deadline) and (alive is None or alive()):
        try:
            if not reported:
                with urllib.request.urlopen(results_post(f"{url}/ready/{node}"), timeout=5) as r:
                    r.read()
                reported = True
            with urllib.request.urlopen(f"{url}/start", timeout=5) as r:
                if r.status == 200:
                    return float(json.loads(r.read())["t_workload"])
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            pass
        time.sleep(interval)
    return None
