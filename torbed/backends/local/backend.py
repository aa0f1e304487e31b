"""Local backend: the scenario's private Tor network in network namespaces on this machine.

One repetition (the engine, ``torbed.engine``, runs the variants x repetitions loop, writes
run.json/meta.json, handles signals and always calls ``teardown``):

- prepare: tor builds (cached), identity keys (cached per scenario), data directories;
- bring_up: namespaces and link shaping, layered torrcs, file/replay servers, every tor,
  then readiness by evidence (``torbed.readiness``): a consensus listing every relay with
  its flags, every client bootstrapped and knowing its path;
- measure: collectors and one measurement driver per client for measure.duration,
  faults on schedule, resource samples;
- teardown: stop every process, remove every namespace and the scratch directory.

A run whose torbed is killed with SIGKILL stops and cleans itself (torbed.backends.local.lifetime:
parent-death signals and a watchdog); ``torbed clean`` (``clean``) covers the rest.

Public API:

- ``LocalBackend(console, system_tor=False)``: the engine's ``Backend``
- ``preflight(scenario) -> shaper``; ``clean(console, force=False) -> dict`` (lifetime.clean)
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import stem
import stem.control

from . import emulator, faults, gatesample, lifetime, netns, prometheus, state, threadcaps, toruser
from ... import builds, constants, engine, load, readiness, shaping
from ...errors import RunFailed
from ...fileserver import prepare_files
from ...keys import node_keys
from ...network import LOAD_GROUP, LOAD_MASTER_GROUP, plan as make_plan
from ...records import RecordWriter
from ...replay.trace import read as read_trace
from ...scenario import Scenario
from .supervise import NodeFailed, Supervisor, tail
from .torenv import child_env, tor_env
from ...torrc import Identities, NodePaths, diff_max_age, render_fragments, render_node, voting_schedule
from ...variants import load_variant
from ...workloads import Target, assign_flows, driver_config, replay_traces, server_group, workload_entry


# Seconds from launching the processes to the first vote's valid-after time: tor takes
# ~1.5 s to start, relays upload descriptors ~1.1 s later, authorities vote ~2.4 s before
# valid-after (measured on a 2-core machine; a slower one gets the next interval, 10 s later).
VOTE_LEAD = 7
# With the fast bring-up (below) the torrc's schedule is only the fallback: a placeholder
# round late enough that torbed reaches the authorities first and moves the round earlier:
# VOTE_LEAD_FALLBACK seconds plus LAUNCH_S_PER_TOR for each tor after the launch starts,
# voted 4 s before. The placeholder interval is FAST_PLACEHOLDER_INTERVAL (the one these
# networks vote at after ready anyway), so the lead is not bound by the 10 s interval:
# before, 107 tors took 11-12 s to launch, torbed asked the authorities only afterwards, and
# the torrc's round (5 s after the launch) had voted already: the fast path fell back on
# every 100-relay run, and relays launched after that vote waited for a later round.
VOTE_LEAD_FALLBACK = 9
LAUNCH_S_PER_TOR = 0.25       # measured 0.05 (9 tors) to 0.11 s (107 tors) on a quiet 2-core machine

# Fast bring-up (networks of at most constants.LARGE_NETWORK_TORS tors; TORBED_FAST_BRINGUP=0
# turns it off), what each step saves measured on a quiet 2-core machine (issue 26):
# - tor launches its periodic events (descriptor upload, directory fetches) 1 s after its
#   start (mainloop.c initialize_periodic_events_cb); a controller subscribing to a per-second
#   event makes it rescan them at once (control_events.c), so torbed subscribes each relay to
#   BW and unsubscribes right away, once every authority listens: descriptors ~1 s earlier.
# - The first round is scheduled by torbed once the authorities listen, not at a time guessed
#   at launch: SETCONF TestingV3AuthInitialVotingInterval 5 and the voting offset. The SETCONF
#   reschedules the vote 1 s later (dirauth_periodic.c reschedule_dirvote); with an initial
#   interval of 5 s tor itself shortens the first round's vote and distribution delays to 1 s
#   each (voting_schedule.c: delays above half the interval become a quarter of it), so the
#   consensus is published 3 s after the SETCONF. A relay whose descriptor is not at every
#   authority shortly before the vote postpones the round by a second (another SETCONF)
#   instead of missing it. Later rounds use the consensus' 10 s interval and 2 s delays.
# - A client's consensus fetch waits for its once-a-second fetch timer after DisableNetwork
#   0; a reload (SIGHUP) fetches at once (main.c do_hup). __ReloadTorrcOnSIGHUP 0 keeps the
#   reload from reading the command line's DisableNetwork 1 again (and any later SIGHUP too).
# - A client builds its first circuit (Bootstrapped 100%) on its once-a-second timer after it
#   has enough directory information; torbed builds one along the client's path right away
#   (EXTENDCIRCUIT) and closes it once the client is ready.
FAST_INITIAL_VOTING_INTERVAL = 5
FAST_VOTE_S = FAST_DIST_S = 1       # what tor makes of the 2 s delays with a 5 s initial interval
FAST_POLL_S = 0.05
KICK_WORKERS = 8                    # relays kicked at once (_fast_first_round)

RESOURCE_INTERVAL = 30.0   # seconds between resources.jsonl samples
VOTING_INTERVAL_AFTER_READY = 60   # seconds; see _relax_voting
FAST_PLACEHOLDER_INTERVAL = VOTING_INTERVAL_AFTER_READY
POLL_S = 0.2               # readiness polling
# Authorities run as real-time tasks (SCHED_RR at this priority, below linkemu's) from their
# start until the network is ready, then as normal tasks again. Past a few hundred tors every
# bootstrapping tor is runnable at once: a normal-priority authority waited in the run queue
# nearly all the time (5.1 of every 5 s, for 0.2 s of CPU), its timers fired seconds late and
# votes from the other authorities sat 19 s in its DirPort's accept queue (1,287 connections
# deep), so rounds failed ("Bad valid-after time") and the herd of relays kept asking. nice -10
# did not help (each tor is its own session, so its own autogroup, and neither its nice nor
# the autogroup's changed the share); SCHED_RR drained the queue at once and the next rounds
# published. An authority needs little CPU (3 % of a core then), only promptly.
AUTHORITY_RT_PRIORITY = 1
# Longest wait for the directory caches before clients go online anyway (see bring_up).
CACHE_WAIT_S = 20.0
# ... times this for a held network (hundreds of caches fetching every descriptor on 2 cores).
# Every microdescriptor still counts. Tried at 750 tors (one run each): with 99 % counting as
# ready, clients went online 28 s sooner, but the run became ready 195 s after the last client
# bootstrapped (704 s after setup, against 516 s when waiting for all): likely clients that asked
# a cache lacking a path relay's microdescriptor, whose retry then waits out tor's back-off (a
# SIGHUP resets consensus downloads only, main.c do_hup).
HELD_CACHE_WAIT_FACTOR = 9
MEASURE_POLL_S = 0.5


def qemu_binary() -> str | None:
    """qemu-user for this machine's architecture (relay groups with ``cpu: qemu``)."""
    return shutil.which("qemu-x86_64-static") or shutil.which("qemu-x86_64")


def cpu_prefix(plan, node) -> list[str]:
    """The command prefix of a node's tor: qemu-user for relays of a ``cpu: qemu`` group.
    qemu-user runs each guest thread on a host thread of its own, so a multi-threaded
    relay's threads still run in parallel; its default CPU model has no AES-NI, so OpenSSL
    takes its software AES as on a Raspberry Pi."""
    if node.role == "relay" and plan.scenario.network.relays[node.group].cpu == "qemu":
        return [qemu_binary() or "qemu-x86_64-static"]
    return []


def preflight(scenario: Scenario) -> str:
    """Checks that need no network: privileges, tools, the kernel's shaping. Returns the shaper."""
    if os.geteuid() != 0:
        raise RunFailed("the local backend needs root, or run through `torbed` as a normal user "
                        "(it re-executes itself in a user namespace when unprivileged user "
                        "namespaces are enabled)")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            raise RunFailed(f"'{tool}' not found: apt-get install iproute2 (or `make setup`)")
    if any(g.cpu == "qemu" for g in scenario.network.relays.values()) and not qemu_binary():
        raise RunFailed("network.relays.*.cpu: qemu needs qemu-x86_64-static: apt-get install qemu-user-static")
    caps = shaping.probe_kernel()
    shaper = "none"
    for v in scenario.variants:
        shaper = shaping.choose_shaper(make_plan(scenario, v), caps)  # raises ShapingError
    return shaper


class LocalBackend:
    """The engine's Backend for network namespaces on this machine. Per-repetition state
    lives in ``rep.state``, a ``state.RepState`` (plan, run_id, scratch, topo, sup, paths, ids,
    builds, t0, ...)."""

    name = "local"
    unsupported = {"placement": "ignored: placement chooses Kubernetes nodes"}
    bringup_estimate_s = 30.0

    def __init__(self, console, system_tor: bool = False):
        self.console = console
        self.system_tor = system_tor
        self.shaper = "none"
        self.manifest: dict = {}
        self.tor_user: tuple = (None, "not chosen yet")     # toruser.choose(), in preflight

    @classmethod
    def from_options(cls, options, console) -> "LocalBackend":
        """From ``torbed.backends.local.Options``. Unprivileged (or TORBED_USERNS=1), this
        re-executes torbed in a user namespace first (never returns then)."""
        if os.geteuid() != 0 or (os.environ.get("TORBED_USERNS") == "1" and not os.environ.get("TORBED_IN_USERNS")):
            reexec_in_userns()
        return cls(console, system_tor=options.system_tor)

    # -- run -------------------------------------------------------------------------

    def preflight(self, scenario: Scenario) -> dict:
        self.shaper = preflight(scenario)
        self.tor_user = toruser.choose()      # a bad TORBED_TOR_UID: refused before anything starts
        if self.shaper == "linkemu":
            emulator.ensure_binary(self.console)
        stock = builds.ensure(None, self.console, self.system_tor)
        if any(f.kind == "cpu" for f in scenario.faults) and (why := faults.check_cpu_cgroups()):
            raise RunFailed(f"the scenario has cpu faults, but {why}")
        if any(g.cpu_per_thread for g in scenario.network.relays.values()) and (why := threadcaps.check()):
            raise RunFailed(f"network.relays.*.cpu_per_thread: per-thread CPU caps need a cpu cgroup per thread, but {why}")
        extra = {"shaper": self.shaper, "tor_version": stock.info.get("tor_version")}
        if scenario.measure.prometheus.enabled:
            extra["prometheus_version"] = prometheus.version(prometheus.binary())
        return extra

    def start_run(self, run: engine.Run) -> None:
        self.manifest = prepare_files(run.scenario)

    # -- one repetition ----------------------------------------------------------------

    def prepare(self, rep: engine.Repetition) -> None:
        st, meta = state.of(rep), rep.meta
        plan = st.plan = make_plan(rep.scenario, rep.variant)
        st.run_id = run_id = secrets.token_hex(3)
        st.scratch = scratch = Path(f"/tmp/torbed-{run_id}")
        lock = lifetime.RunLock(scratch)      # held until teardown's end (Supervisor.forget)
        st.topo = topo = netns.Topology(run_id, plan, switch="linkemu" if self.shaper == "linkemu" else "bridge")
        try:
            st.sup = Supervisor(run_id, {"namespaces": [topo.switch] + [topo.ns(n.name) for n in plan.nodes],
                                         "scratch": str(scratch),
                                         # absolute: `torbed clean` may run from elsewhere
                                         "run_dir": str(rep.dir.absolute())}, lock=lock)
        except BaseException:
            lock.release()
            raise
        st.tor_user, why_root = self.tor_user
        if st.tor_user is not None:
            os.chmod(scratch, 0o711)          # tor's uid passes through to its own directories
        meta.update(run_id=run_id, shaper=self.shaper, builds={}, authorities=[], nodes=[], unexpected_exits={},
                    tor_user=st.tor_user.describe() if st.tor_user else {"uid": os.geteuid(), "why": why_root})
        rep.write_meta()
        self.console.rule(f"[bold]{rep.scenario.name}[/bold]: variant [cyan]{rep.variant}[/cyan], "
                          f"repetition {rep.index + 1}/{rep.scenario.repetitions}")
        self._builds(rep)
        # Bring-up time counts from here: builds are cached work, not part of a network's start.
        meta["build_s"] = round(time.time() - meta["t_start"], 3)
        st.t0 = meta["t_setup"] = time.time()
        self._keys(rep)

    def _builds(self, rep: engine.Repetition) -> None:
        """One tor build per variant in use; stock for authorities and clients."""
        st = state.of(rep)
        variants = st.variants = {v: load_variant(v) for v in st.plan.variants_in_use()}
        stock = builds.ensure(None, self.console, self.system_tor)
        st.build = {n.name: builds.ensure(variants[n.variant], self.console, self.system_tor)
                       if n.variant else stock for n in st.plan.nodes}
        rep.meta["builds"] = {"stock": stock.describe(),
                              **{v: builds.ensure(var, None, self.system_tor).describe() for v, var in variants.items()}}
        st.stock = stock

    def _keys(self, rep: engine.Repetition) -> None:
        """Identity keys (tor-gencert, tor --list-fingerprint), in parallel, cached per scenario."""
        st, meta = state.of(rep), rep.meta
        plan, scratch = st.plan, st.scratch
        ids = st.ids = Identities()
        st.paths = self._node_paths(rep)
        key_cache = None if os.environ.get("TORBED_FRESH_KEYS") else constants.CACHE_DIR / "keys" / rep.scenario.name
        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = {n.name: pool.submit(node_keys, n, scratch / n.name, st.stock.tor_gencert,
                                           st.build[n.name].tor, key_cache)
                       for n in plan.nodes if n.role in ("authority", "relay")}
            sources: dict[str, int] = {}
            for name, fut in futures.items():
                fpr, auth, source = fut.result()
                ids.fingerprints[name] = fpr
                sources[source] = sources.get(source, 0) + 1
                if auth:
                    ids.authorities[name] = auth
                    meta["authorities"].append({"name": name, "v3ident": auth.v3ident, "cert_expires": auth.expires})
        meta["keys"] = sources
        for name, p in st.paths.items():
            toruser.own(Path(p.datadir), st.tor_user)
        self.console.log(f"keys for {len(futures)} relays and authorities: "
                         f"{', '.join(f'{n} {k}' for k, n in sorted(sources.items()))} "
                         f"({time.time() - st.t0:.1f} s)")

    @staticmethod
    def _node_paths(rep: engine.Repetition) -> dict[str, NodePaths]:
        """Each tor's data directory (made here), log and control socket. The notice log goes
        to tor's stdout, a file in the run directory opened by torbed (tor's uid may not
        reach the run directory: torbed.backends.local.toruser); an info log (TORBED_INFO_LOGS)
        is written under the scratch directory then and copied at teardown."""
        st = state.of(rep)
        info_dir = (st.scratch / "logs") if st.tor_user else rep.logs
        if os.environ.get("TORBED_INFO_LOGS"):
            info_dir.mkdir(exist_ok=True)
            toruser.own(info_dir, st.tor_user)
        paths: dict[str, NodePaths] = {}
        for n in st.plan.nodes:
            if not n.runs_tor:
                continue
            data = st.scratch / n.name
            paths[n.name] = NodePaths(datadir=str(data), log=str(rep.logs / f"{n.name}.log"), log_stdout=True,
                                      control_socket=str(data / "control"),
                                      extra_log=str(info_dir / f"{n.name}.info.log")
                                      if os.environ.get("TORBED_INFO_LOGS") else None)
            data.mkdir(mode=0o700, exist_ok=True)
        return paths

    def bring_up(self, rep: engine.Repetition) -> None:
        st = state.of(rep)
        self._network(rep)
        # Prometheus first, so its TSDB holds the bring-up too; it gets ready while the tors
        # start (waiting for it first cost the bring-up 0.2-0.3 s).
        launched = prometheus.launch(rep)
        torrc_dir = self._torrc(rep)
        self._start_servers(rep)
        # Every tor starts now, clients with their network off. Relays ask for a consensus
        # before it exists and back off (up to ~10 s); once it exists, SIGHUP makes tor reset
        # its download failures and fetch at once (main.c do_hup()), so nobody waits out the
        # back-off. Clients go online only once the directory caches hold the consensus and
        # every microdescriptor: a client that asks a cache too early gets a 404 for the
        # microdescriptors, and SIGHUP relaunches only consensus downloads, so it then waits
        # for tor's 10 s descriptor retry (the slow bring-up of issue 26).
        deadline = time.time() + rep.scenario.measure.ready_timeout.seconds
        boot = rep.meta["bootstrap"]
        fast = boot["fast_bringup"] is not None
        tors = self._launch_tors(rep, torrc_dir)
        phases = boot["phases_s"]
        phases["tors_started"] = round(time.time() - st.t0, 3)
        if fast:
            boot["fast_bringup"].update(_fast_first_round(rep, deadline))
        elif boot["held_first_round"] is not None:
            boot["held_first_round"].update(_held_first_round(rep, deadline))
        st.prometheus = prometheus.ready(rep, self.console, launched)
        rep.meta["consensus_flags"] = _wait_consensus(rep, deadline, FAST_POLL_S if fast else POLL_S)
        phases["consensus_seen"] = round(time.time() - st.t0, 3)
        self.console.log(f"consensus lists every relay ({time.time() - st.t0:.1f} s)")
        self._relays_fetch(rep, tors, deadline, fast)
        _clients_online(rep, reload=fast)
        if fast:
            # Stays so during the run: a later SIGHUP re-applies the options in force instead
            # of reading the torrc and command line (whose DisableNetwork 1 would go offline).
            boot["fast_bringup"]["clients_reload_torrc_on_sighup"] = False
        boot["clients_online_after_caches"] = True
        phases["clients_online"] = round(time.time() - st.t0, 3)
        kicked = _wait_clients(rep, deadline, kick=fast)
        if fast:
            boot["fast_bringup"]["client_circuits_started"] = kicked
        self._ready(rep, tors)

    def _launch_tors(self, rep: engine.Repetition, torrc_dir: Path) -> list:
        """Start every tor (authorities first, clients offline), their environment and
        scheduling recorded in meta.json ``bootstrap``. Returns the nodes that run tor."""
        st = state.of(rep)
        env = tor_env()
        boot = rep.meta["bootstrap"]
        boot["malloc_arena_max"] = env.get("MALLOC_ARENA_MAX")
        boot["malloc_mmap_threshold"] = env.get("MALLOC_MMAP_THRESHOLD_")
        # Variants with their own environment (mtrelay's malloc arenas): recorded per variant.
        variant_env = {v: var.env for v, var in st.variants.items() if var.env}
        if variant_env:
            boot["variant_env"] = variant_env
        tors = [n for n in st.plan.nodes if n.runs_tor]
        emulated = [n.name for n in tors if cpu_prefix(st.plan, n)]
        if emulated:
            boot["emulated_cpu"] = {"qemu": qemu_binary(), "nodes": emulated}
        if boot["held_first_round"] is not None:
            # Past a few hundred tors torbed itself starved: each tor is an autogroup of its own,
            # and a 300-tor run's torbed took 60 s to notice the consensus (parsing it took
            # seconds of a 1/300 share) and 200 more to ask 30 clients whether they were ready.
            # Its children (every tor) start as normal tasks again (SCHED_RESET_ON_FORK).
            boot["torbed_realtime_until_ready"] = _self_realtime(AUTHORITY_RT_PRIORITY)
        rt: int | None = AUTHORITY_RT_PRIORITY
        fast = boot["fast_bringup"] is not None
        # Authorities first (the plan's order): a relay uploads its descriptor once, when its
        # timers start (1 s after its own start, or at torbed's kick); an authority not yet
        # listening then would miss it until the relay's descriptor is dirty again, hours
        # later. (Relays first saved nothing measurable: 5.4-5.9 s either way under load.)
        user = st.tor_user.prefix() if st.tor_user else []
        for n in tors:
            offline = ["DisableNetwork", "1"] if n.role in ("client", "loadworker") else []
            own = variant_env.get(n.variant) if n.variant else None
            binary = toruser.reachable_binary(st.build[n.name].tor, st.scratch, st.tor_user)
            st.sup.start(n.name, netns.exec_prefix(st.topo.ns(n.name)) + user + cpu_prefix(st.plan, n) + [
                binary, "-f", str(torrc_dir / f"{n.name}.torrc"), *offline],
                rep.logs / f"{n.name}.log", env=tor_env(own) if own else env)
            if n.role == "authority" and rt is not None and not fast:
                # At once: launching 750 tors takes a minute, and the authorities vote meanwhile.
                rt = _set_realtime(st.sup, [n.name], AUTHORITY_RT_PRIORITY)
        if fast and rt is not None:
            # After the launch: a real-time authority generating its keys takes a core from
            # torbed, and launching the relays waited 130-220 ms behind each authority.
            rt = _set_realtime(st.sup, [n.name for n in tors if n.role == "authority"], AUTHORITY_RT_PRIORITY)
        boot["authority_realtime_until_ready"] = rt
        return tors

    def _relays_fetch(self, rep: engine.Repetition, tors: list, deadline: float, fast: bool) -> None:
        """SIGHUP the relays (they fetch the consensus at once) and wait for the directory
        caches to hold it and every microdescriptor (clients go online after)."""
        st = state.of(rep)
        boot = rep.meta["bootstrap"]
        held = boot["held_first_round"] is not None
        caches = set(directory_caches(st.plan, rep.meta["consensus_flags"]))
        # A held (large) network: the caches first (what the clients need), the other relays
        # once the caches are complete. At 750 tors most of the others had fetched on their
        # own timers by then; this order was not measured against all at once.
        relays = [n.name for n in tors if n.role == "relay"]
        later = [r for r in relays if held and r not in caches]
        for name in relays:
            if name not in later:
                st.sup.signal(name, signal.SIGHUP)
        why = _wait_caches(rep, min(deadline, time.time() + CACHE_WAIT_S * (HELD_CACHE_WAIT_FACTOR if held else 1)),
                           FAST_POLL_S if fast else POLL_S)
        boot["caches_ready_s"] = round(time.time() - st.t0, 3) if why is None else None
        if why is not None:
            boot["caches_not_ready"] = why   # clients go online anyway: the old, slower path
        for name in later:
            st.sup.signal(name, signal.SIGHUP)
        if held:
            boot["held_first_round"]["sighup_caches_first"] = len(relays) - len(later)
        self.console.log(f"directory caches {'ready' if why is None else 'not ready: ' + why} "
                         f"({time.time() - st.t0:.1f} s); clients online")

    def _ready(self, rep: engine.Repetition, tors: list) -> None:
        """The network is ready: slower voting, normal scheduling again, ready time recorded."""
        st = state.of(rep)
        boot = rep.meta["bootstrap"]
        _relax_voting(rep)
        if boot["authority_realtime_until_ready"] is not None:
            _set_realtime(st.sup, [n.name for n in tors if n.role == "authority"], None)
        if boot.get("torbed_realtime_until_ready") is not None:
            _self_realtime(None)
        rep.ready(st.t0)
        boot["traffic_to_ready"] = _bringup_traffic(rep)
        plan = st.plan
        self.console.log(f"[green]ready[/green] in {rep.meta['ready_s']:.1f} s (consensus with "
                         f"{len(plan.by_role('relay'))} relays, {len(plan.by_role('client'))} clients bootstrapped)")

    def _network(self, rep: engine.Repetition) -> None:
        """Namespaces and link shaping."""
        st = state.of(rep)
        plan, topo = st.plan, st.topo
        topo.create()
        if self.shaper == "linkemu":
            st.emulator = emulator.start(st.sup, topo, plan, st.scratch, rep.logs / "linkemu.log",
                                            stats_file=rep.dir / "linkemu.stats.json")
        elif self.shaper != "none":
            for n in plan.endpoints():     # a relay's second address: its eth1, shaped alike
                ns, dev = topo.device(n)
                # One MTU-sized frame per skb, as on a real link (linkemu turns offloads off for
                # the same reason): with the veth's segmentation offload TCP hands htb frames of
                # up to 64 KB, which a bounded queue drops whole (a 50 ms queue at 2 mbit is 12.5
                # KB: one flow got 12 kB/s) and a slow class sends in 250 ms lumps.
                p = subprocess.run(["ip", "-n", ns, "link", "set", "dev", dev,
                                    *shaping.ONE_FRAME_PER_SKB], capture_output=True, text=True)
                if p.returncode != 0:
                    raise RunFailed(f"ip link on {n.name}: {p.stderr.strip()}")
                batch = shaping.tc_batch(plan, n, dev=dev, netem=self.shaper == "htb+netem")
                p = subprocess.run(["tc", "-n", ns, "-batch", "-"], input=batch,
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    raise RunFailed(f"tc on {n.name}: {p.stderr.strip()}")
        self.console.log(f"network: {len(plan.nodes)} namespaces, shaper {self.shaper} "
                         f"({time.time() - st.t0:.1f} s)")

    def _torrc(self, rep: engine.Repetition) -> Path:
        """The layered torrcs. The voting schedule is shifted so the first vote falls
        VOTE_LEAD seconds after the relays start: they upload their descriptors within ~1 s,
        so the first consensus already lists them (instead of the next 10 s interval)."""
        st, meta = state.of(rep), rep.meta
        plan, ids = st.plan, st.ids
        # What tor reads is in the scratch directory (tor's uid may not reach the run
        # directory: toruser); the run directory keeps the same files as the record.
        torrc_dir, record = st.scratch / "torrc", rep.dir / "torrc"
        torrc_dir.mkdir(mode=0o755)
        record.mkdir(parents=True, exist_ok=True)

        def write(name: str, text: str) -> None:
            (torrc_dir / name).write_text(text)
            os.chmod(torrc_dir / name, 0o644)
            (record / name).write_text(text)

        t_launch = time.time() + 0.3
        interval, vote_delay, dist_delay = voting_schedule(plan)
        mode = first_round(plan)
        lead, torrc_schedule = torrc_first_round(plan, mode)
        voting_offset = int(t_launch + lead) % (torrc_schedule or (interval,))[0]
        # The slowest rounds this network will vote (after ready, or a held network's).
        diff_age = diff_max_age(max(interval, after_ready_interval(mode)))
        meta["bootstrap"] = {"voting_offset_s": voting_offset, "sighup_after_consensus": True,
                             # The fast bring-up's steps (see FAST_INITIAL_VOTING_INTERVAL); null: off.
                             "fast_bringup": {} if mode == "fast" else None,
                             # A large network's first round, held until every descriptor is in.
                             "held_first_round": {} if mode == "held" else None,
                             "voting_schedule_s": {"interval": interval, "vote_delay": vote_delay,
                                                   "dist_delay": dist_delay},
                             # Relays' MaxConsensusAgeForDiffs (constants.DIFF_ROUNDS_KEPT).
                             "consensus_diff_max_age_s": diff_age,
                             # Where the bring-up time goes (bring_up), from the setup's start.
                             "phases_s": {"network_ready": round(time.time() - st.t0, 3),
                                          "first_valid_after": round(int(t_launch + lead) - st.t0, 3)}}
        st.fallback_valid_after = int(t_launch + lead)
        for name, text in render_fragments(plan, ids, st.variants, voting_offset, torrc_schedule,
                                           diff_age).items():
            write(name, text)
        for n in plan.nodes:
            if n.runs_tor:
                text = render_node(n, plan, st.paths[n.name], str(torrc_dir))
                if n.role == "loadworker":
                    text += "".join(line + "\n" for line in load.torrc_lines(rep.scenario, plan, ids.fingerprints))
                write(f"{n.name}.torrc", text)
        meta["nodes"] = [{**n.to_dict(), "fingerprint": ids.fingerprints.get(n.name),
                          "build": st.build[n.name].key if n.runs_tor else None} for n in plan.nodes]
        rep.write_meta()
        return torrc_dir

    def _start_servers(self, rep: engine.Repetition) -> None:
        st = state.of(rep)
        sup, topo = st.sup, st.topo
        for n in st.plan.by_role("server"):
            if "http" in n.ports:
                sup.start(n.name, netns.exec_prefix(topo.ns(n.name)) + [
                    sys.executable, "-m", "torbed.fileserver", "--dir", self.manifest[n.group]["_dir"],
                    "--bind", n.address, "--port", str(n.ports["http"]),
                    "--log", str(rep.logs / f"{n.name}.http.log")],
                    rep.logs / f"{n.name}.stderr.log", env=child_env())
            if "replay" in n.ports:
                # The replay server writes upstream chunks' records to the same cells.jsonl
                # as the clients (O_APPEND, one write per line).
                traces = [f"--trace={name}={path}" for name, path in replay_traces(rep.scenario, n.group, rep.dir).items()]
                sup.start(f"{n.name}.replay", netns.exec_prefix(topo.ns(n.name)) + [
                    sys.executable, "-m", "torbed.replay.server", "--bind", n.address,
                    "--port", str(n.ports["replay"]), "--cells", str(rep.dir / "cells.jsonl"),
                    "--log", str(rep.logs / f"{n.name}.replay.log"), *traces],
                    rep.logs / f"{n.name}.replay.stderr.log", env=child_env())

    def measure(self, rep: engine.Repetition) -> None:
        st = state.of(rep)
        t_work = time.time() + 1.0
        rep.meta.update(t_workload_start=t_work)
        cfg_dir = rep.dir / "config"
        cfg_dir.mkdir(exist_ok=True)
        # A slow multi-core CPU (cpu_per_thread) from the workload's start: the bring-up runs uncapped.
        st.thread_caps = threadcaps.start_for(rep)
        # A within-run crossover (torbed/crossover.py): the first period's arm before any traffic.
        if rep.meta.get("crossover"):
            from ... import crossover
            st.crossover = crossover.Switcher(rep.scenario, rep.index, [n.name for n in st.plan.by_role("relay")],
                                              lambda name: _controller(st.paths[name].control_socket), rep.dir, t_work)
            first = st.crossover.first()
            self.console.log(f"crossover: relays on {first['arm']} ({first['took_s'] * 1000:.0f} ms); "
                             f"{len(st.crossover.periods)} periods of {rep.scenario.crossover.period.seconds:g} s")
        self._start_collector(rep, cfg_dir)
        drivers, longest = self._start_drivers(rep, cfg_dir, t_work)
        background = _Load(rep, cfg_dir, t_work, self.manifest) if rep.scenario.load else None
        # The mechanism gates' samples (shaper backlog, CPU), judged after the repetition.
        st.gate_sampler = gatesample.start(rep, self.shaper)
        rep.write_meta()
        t_end = t_work + rep.scenario.measure.duration.seconds
        hard_end = t_end + min(longest, 300) + 10
        try:
            _Watch(rep, drivers, t_work, t_end, hard_end, background).run()
        finally:
            if st.crossover is not None:
                st.crossover.close()
        self._stop_gate_sampler(rep)
        st.faults.finish("end")
        sup = st.sup
        sup.stop(drivers, grace=10)
        failed = {d: rc for d, rc in sup.exited(drivers).items() if rc not in (0, -signal.SIGTERM)}
        if background:
            failed.update(background.stop())
        sup.stop(["collector"], grace=10)
        rep.meta["t_end"] = time.time()
        self.console.log(f"measured {_count_lines(rep.dir / 'transfers.jsonl')} transfers "
                         f"in {rep.meta['t_end'] - t_work:.0f} s")
        if failed:
            raise RunFailed("measurement driver(s) failed: " + "; ".join(
                f"{d} exited {rc}: {tail(sup.log_of(d), 8)}" for d, rc in failed.items()))

    @staticmethod
    def _stop_gate_sampler(rep: engine.Repetition) -> None:
        st = state.of(rep)
        if st.gate_sampler is not None:
            sampler, st.gate_sampler = st.gate_sampler, None
            errors = sampler.stop()
            took = sampler.durations
            rep.meta["gate_sampling"].update(samples=len(took), sample_s_mean=round(sum(took) / len(took), 4)
                                             if took else None, sample_s_max=round(max(took, default=0.0), 4),
                                             sample_cpu_s_mean=round(sampler.cpu_s / len(took), 4) if took else None)
            if errors:
                rep.meta["gate_sampling"]["errors"] = errors

    def _start_collector(self, rep: engine.Repetition, cfg_dir: Path) -> None:
        """Collectors run in the switch namespace: they reach every relay's MetricsPort."""
        st, s = state.of(rep), rep.scenario
        cfg = {"variant": rep.variant, "rep": rep.index, "output": str(rep.dir),
               "collect": [c for c in s.measure.collect if c != "transfers"],
               "bw_interval_s": s.measure.bw_interval.seconds,
               "metrics_interval_s": s.measure.metrics_interval.seconds,
               "relays": [{"name": r.name, "group": r.group,
                           "control": {"socket": st.paths[r.name].control_socket},
                           "metrics_url": f"http://{r.address}:{r.ports['metrics']}/metrics"}
                          for r in st.plan.by_role("relay")]}
        if s.measure.prometheus.enabled:
            cfg["metrics_listen"] = ["127.0.0.1", constants.COLLECTOR_METRICS_PORT]
            if st.emulator:
                cfg["linkemu_socket"] = str(st.emulator.socket)
        (cfg_dir / "collector.json").write_text(json.dumps(cfg, indent=1))
        st.sup.start("collector", netns.exec_prefix(st.topo.switch) + [
            sys.executable, "-m", "torbed.collectors", str(cfg_dir / "collector.json")],
            rep.logs / "collector.log", env=child_env())

    def _start_drivers(self, rep: engine.Repetition, cfg_dir: Path, t_work: float) -> tuple[list[str], float]:
        """One measurement driver per client node, in the client's namespace. Returns the
        drivers' process names and the longest per-transfer timeout."""
        st, s = state.of(rep), rep.scenario
        plan = st.plan
        drivers, longest = [], 0.0
        replay_groups: dict[str, tuple[dict, float]] = {}
        for c in plan.by_role("client"):
            cg = s.clients[c.group]
            wl = cg.workload
            group = server_group(s, wl)
            server = plan.group_nodes(group)[c.index % s.servers[group].count]
            target = Target(server=server.name, address=server.address, ports=server.ports,
                            manifest=self.manifest.get(group, {}))
            extra = {}
            if wl.kind == "replay":
                if c.group not in replay_groups:
                    trace = read_trace(s.trace_path(wl.trace))
                    replay_groups[c.group] = (assign_flows(trace, wl, plan.group_nodes(c.group)),
                                              trace.duration + wl.gap.seconds)
                assigned, period = replay_groups[c.group]
                extra = {"trace": rep.dir / "traces" / s.trace_path(wl.trace).name, "flows": assigned[c.name],
                         "period_s": period,
                         # 'each': client i starts i/count of a period later, so the clients'
                         # copies of the trace do not burst in lockstep.
                         "offset_s": c.index * period / cg.count if wl.distribute == "each" else 0.0,
                         "cells_output": rep.dir / "cells.jsonl"}
            cfg = driver_config(s, plan, client=c.name, group=c.group, variant=rep.variant, rep=rep.index,
                                fingerprints=st.ids.fingerprints,
                                control={"socket": st.paths[c.name].control_socket},
                                socks_port=c.ports["socks"], output=rep.dir / "transfers.jsonl",
                                workload=workload_entry(wl, target, **extra), t_work=t_work,
                                debug=bool(os.environ.get("TORBED_DEBUG")))
            if s.measure.prometheus.enabled:
                cfg["metrics"] = {"address": c.address, "port": constants.DRIVER_METRICS_PORT}
            longest = max(longest, cfg["workload"]["timeout_s"])
            path = cfg_dir / f"{c.name}.driver.json"
            path.write_text(json.dumps(cfg, indent=1))
            name = f"{c.name}.driver"
            st.sup.start(name, netns.exec_prefix(st.topo.ns(c.name)) + [
                sys.executable, "-m", "torbed.client.driver", str(path)], rep.logs / f"{name}.log", env=child_env())
            drivers.append(name)
        return drivers, longest

    def teardown(self, rep: engine.Repetition) -> None:
        st = state.of(rep)
        if (rep.meta.get("bootstrap") or {}).get("torbed_realtime_until_ready") is not None:
            _self_realtime(None)    # a bring-up that failed before ready
        self._stop_gate_sampler(rep)     # a measurement cut short
        threadcaps.stop_all(rep, st.thread_caps)
        st.thread_caps = []
        if st.faults is not None:
            # First: a stopped tor would ignore the SIGTERM below; quotas and link changes go too.
            st.faults.finish("teardown")
        if st.prometheus is not None:
            st.prometheus.close()
        sup = st.sup
        if sup is not None:
            sup.stop_all()
            rep.meta["unexpected_exits"] = {k: v for k, v in sup.exited().items()
                                            if v not in (0, -signal.SIGTERM, -signal.SIGKILL)}
        if st.topo is not None:
            st.topo.destroy()
        if st.scratch is not None:
            for log in (st.scratch / "logs").glob("*.log"):     # info logs of an unprivileged tor
                shutil.copyfile(log, rep.logs / log.name)
            shutil.rmtree(st.scratch, ignore_errors=True)
        if sup is not None:
            sup.forget()


def reexec_in_userns() -> None:
    """Re-run this command as root of a new user + network + mount namespace, with a
    private /run (so `ip netns` works); everything we create dies with it."""
    if os.environ.get("TORBED_IN_USERNS"):
        raise RunFailed("still unprivileged inside the user namespace")
    unshare = shutil.which("unshare")
    if not unshare:
        raise RunFailed("not root and no `unshare` (util-linux) to make a user namespace")
    inner = ("mount -t tmpfs torbed /run && mkdir -p /run/netns /run/torbed && "
             'exec "$0" "$@"')
    os.environ["TORBED_IN_USERNS"] = "1"
    os.execv(unshare, [unshare, "--user", "--map-root-user", "--net", "--mount", "--fork", "--kill-child",
                       "sh", "-c", inner, sys.executable, "-m", "torbed.cli", *sys.argv[1:]])


# ---------------------------------------------------------------------------------------
# Readiness (the evidence itself is defined in torbed.readiness)

def _controller(sock: str | Path) -> stem.control.Controller:
    c = stem.control.Controller.from_socket_file(str(sock))
    c.authenticate()
    return c


def first_round(plan) -> str | None:
    """How torbed schedules this network's first voting round: "fast" (see
    FAST_INITIAL_VOTING_INTERVAL) up to constants.LARGE_NETWORK_TORS tors, "held" above
    (_held_first_round), None with TORBED_FAST_BRINGUP=0 (the torrc's schedule alone);
    TORBED_FAST_BRINGUP=held holds the first round whatever the size (tests, comparisons)."""
    switch = os.environ.get("TORBED_FAST_BRINGUP", "1")
    if switch == "0":
        return None
    if switch == "held":
        return "held"
    return "fast" if sum(1 for n in plan.nodes if n.runs_tor) <= constants.LARGE_NETWORK_TORS else "held"


def torrc_first_round(plan, mode: str | None) -> tuple[float, tuple[int, int, int] | None]:
    """The torrc's first round for ``mode`` (first_round): (seconds from the launch to its
    valid-after time, (interval, vote delay, distribution delay) when the torrc needs a
    placeholder schedule instead of voting_schedule's)."""
    _, vote_delay, dist_delay = voting_schedule(plan)
    # The first vote comes VOTE_LEAD - 4 s after the launch whatever the delays.
    longer_delays = vote_delay + dist_delay - constants.VOTE_DELAY - constants.DIST_DELAY
    if mode == "fast":
        # A placeholder round after the whole launch; torbed schedules the real one
        # (_fast_first_round) and sets the interval back then.
        tors = sum(1 for n in plan.nodes if n.runs_tor)
        lead = min(VOTE_LEAD_FALLBACK + LAUNCH_S_PER_TOR * tors, FAST_PLACEHOLDER_INTERVAL - 5) + longer_delays
        return lead, (FAST_PLACEHOLDER_INTERVAL, vote_delay, dist_delay)
    if mode == "held":
        # A placeholder round 10 minutes out; torbed schedules the real one (_held_first_round).
        return constants.HELD_ROUND_LEAD, (constants.HELD_ROUND_INTERVAL, vote_delay, dist_delay)
    return VOTE_LEAD + longer_delays, None


def fast_bringup(plan) -> bool:
    """Whether this network uses the fast bring-up."""
    return first_round(plan) == "fast"


def _try_controller(sock: str) -> stem.control.Controller | None:
    try:
        return _controller(sock)
    except (stem.SocketError, stem.ControllerError, OSError):
        return None    # not listening yet


def _control_oneshot(paths: NodePaths, commands: list[str], timeout: float = 5.0) -> bool:
    """Send ``commands`` over a tor's control socket (cookie authentication, then QUIT) with a
    plain socket: stem starts threads per connection, and at 100+ relays that cost most of
    the time the kick saves. True when tor answered 250 to each; False when it does not
    listen yet. Raises RunFailed when it refuses a command."""
    try:
        cookie = (Path(paths.datadir) / "control_auth_cookie").read_bytes().hex()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sk:
            sk.settimeout(timeout)
            sk.connect(paths.control_socket)
            sk.sendall("".join(f"{c}\r\n" for c in [f"AUTHENTICATE {cookie}", *commands, "QUIT"]).encode())
            data = b""
            while chunk := sk.recv(4096):
                data += chunk
    except OSError:
        return False
    replies = [ln for ln in data.decode(errors="replace").splitlines() if ln and not ln.startswith("650")]
    if len(replies) < len(commands) + 2 or not all(ln.startswith("250") for ln in replies):
        raise RunFailed(f"{paths.control_socket}: tor refused {commands}: {replies}")
    return True


def first_round_valid_after(now: float, previous: int = 0, delays: tuple[int, int] = (FAST_VOTE_S, FAST_DIST_S),
                            interval: int = FAST_INITIAL_VOTING_INTERVAL) -> int:
    """The valid-after time of a first round scheduled by a SETCONF at ``now``: the vote fires
    1 s later and must not be after valid-after - vote - distribution delay (whole seconds, as
    tor's schedule counts them). ``previous``: the one scheduled before, which this must
    differ from (a SETCONF that leaves the options as they were reschedules nothing)."""
    va = max(int(now) + 1 + sum(delays), previous + 1)
    if previous and (va - previous) % interval == 0:
        va += 1     # the same offset again: no reschedule
    return va


def _schedule_first_round(auths: list, previous: int, delays: tuple[int, int], interval: int,
                          extra: dict) -> tuple[float, int]:
    """SETCONF every authority's first round to the earliest valid-after time the
    rescheduled vote allows (first_round_valid_after), with ``extra`` options. Returns (the
    time of the SETCONFs, the valid-after time)."""
    now = time.time()
    if now % 1 > 0.95:
        # Keep every authority's reschedule inside one second (each SETCONF takes ms).
        time.sleep(1.005 - now % 1)
        now = time.time()
    valid_after = first_round_valid_after(now, previous, delays, interval)
    conf = {**extra, "TestingV3AuthVotingStartOffset": str(valid_after % interval)}
    for ctl in auths:
        ctl.set_options(conf)
    return now, valid_after


def _fast_first_round(rep: engine.Repetition, deadline: float) -> dict:
    """The fast bring-up's first round. As soon as every authority answers, schedule the
    first round for the earliest valid-after time the rescheduled vote allows (it fires 1 s
    after the SETCONF: valid-after = floor(now) + 1 + vote + distribution delay), then make
    every relay launch its periodic events now (SETEVENTS BW, then closing the connection), so
    it uploads its descriptor at once. When an authority still lacks a relay's descriptor
    shortly before the vote would fire, postpone the round by another SETCONF (the new
    reschedule replaces the pending one), so a slow relay delays the round instead of being
    left out of it. Returns what it did for meta.json; "fallback" says why the torrc's own
    schedule was left to run (torbed could not reach the authorities before it voted)."""
    return _FastRound(rep, deadline).run()


class _FastRound:
    """_fast_first_round's steps: the authorities' controllers, the round (scheduled, then
    postponed while descriptors are missing), the relays' kicks."""

    def __init__(self, rep: engine.Repetition, deadline: float):
        self.rep, self.deadline = rep, deadline
        st = state.of(rep)
        self.st, self.phases = st, rep.meta["bootstrap"]["phases_s"]
        self.names = list(st.sup.procs)
        self.auths: dict[str, stem.control.Controller | None] = {a.name: None for a in st.plan.by_role("authority")}
        self.relays = [r.name for r in st.plan.by_role("relay")]
        self.interval = rep.meta["bootstrap"]["voting_schedule_s"]["interval"]
        self.valid_after = 0
        self.fires = 0.0
        self.out: dict = {"postponed": 0}

    def run(self) -> dict:
        try:
            why = self._connect()
            if why:
                return {"fallback": why}
            self.phases["authorities_listening"] = round(time.time() - self.st.t0, 3)
            self.fires = self._schedule(first=True)
            # The authorities listen (tor opens its control port with its other listeners),
            # so the uploads the kick starts find them.
            self._kick_until_descriptors_in()
            t0 = self.st.t0
            self.phases["descriptors_in"] = self.out["descriptors_in_s"] = round(time.time() - t0, 3)
            self.phases["first_valid_after"] = round(self.valid_after - t0, 3)
            return {**self.out, "first_valid_after_s": round(self.valid_after - t0, 3),
                    "initial_voting_interval_s": FAST_INITIAL_VOTING_INTERVAL,
                    "voting_offset_s": self.valid_after % FAST_INITIAL_VOTING_INTERVAL,
                    "first_round_delays_s": [FAST_VOTE_S, FAST_DIST_S]}
        finally:
            for ctl in self.auths.values():
                if ctl is not None:
                    ctl.close()

    def _connect(self) -> str | None:
        """Controllers of every authority; why not, when they did not answer before the
        torrc's fallback round votes (the first SETCONF must come before it)."""
        fallback_vote = self.st.fallback_valid_after - constants.VOTE_DELAY - constants.DIST_DELAY
        while None in self.auths.values():
            self.st.sup.check(self.names)
            for a in self.auths:
                self.auths[a] = self.auths[a] or _try_controller(self.st.paths[a].control_socket)
            if time.time() > fallback_vote - 0.2:
                return "the authorities' control ports did not answer before the torrc's first vote"
            if None in self.auths.values():
                self.rep.status("waiting for the authorities to listen")
                time.sleep(FAST_POLL_S / 5)
        return None

    def _schedule(self, first: bool) -> float:
        """Reschedule every authority's first round; returns when its vote fires."""
        # The first SETCONF also sets the network's interval back from the placeholder's.
        extra = {"TestingV3AuthInitialVotingInterval": str(FAST_INITIAL_VOTING_INTERVAL),
                 "V3AuthVotingInterval": str(self.interval)} if first else {}
        now, self.valid_after = _schedule_first_round(list(self.auths.values()), self.valid_after,
                                                      (FAST_VOTE_S, FAST_DIST_S), FAST_INITIAL_VOTING_INTERVAL, extra)
        return now + 1.0

    def _postpone_if_due(self) -> None:
        if time.time() > self.fires - 0.15:
            self.fires = self._schedule(first=False)
            self.out["postponed"] += 1

    def _kick_until_descriptors_in(self) -> None:
        """Kick every relay and postpone the round until every authority holds every
        relay's descriptor. The kicks run beside the loop, several at once: one after
        another, 100 relays took 12 s (tors still starting answer late), and the first round
        voted meanwhile without being postponed, so most relays missed it (consensus with
        every relay 39-45 s after setup, against 27-40 s for the descriptors)."""
        pending = set(self.relays)
        missing = {a: set(self.relays) for a in self.auths}
        kicks: dict[str, Future] = {}
        pool = ThreadPoolExecutor(max_workers=KICK_WORKERS, thread_name_prefix="kick")
        try:
            while True:
                self.st.sup.check(self.names)
                self._kick(pending, kicks, pool)
                self._postpone_if_due()
                for a, ctl in self.auths.items():
                    fprs = self.st.ids.fingerprints
                    missing[a] = {r for r in missing[a] if not ctl.get_info(f"desc/id/{fprs[r]}", None)}
                    self._postpone_if_due()
                if not any(missing.values()):
                    return
                if time.time() > self.deadline:
                    a = sorted(a for a in missing if missing[a])[0]
                    raise NodeFailed(a, f"no descriptor of {sorted(missing[a])[0]} after "
                                        f"{self.rep.scenario.measure.ready_timeout}", Path(self.st.paths[a].log))
                self.rep.status(f"waiting for {sum(map(len, missing.values()))} relay descriptor(s) at the authorities")
                time.sleep(FAST_POLL_S / 5 if pending else FAST_POLL_S)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _kick(self, pending: set, kicks: dict, pool: ThreadPoolExecutor) -> None:
        """One pass over the relays not kicked yet: submit, collect, retry the ones not
        listening yet; records when the last one was kicked."""
        for name in sorted(pending):
            f = kicks.get(name)
            if f is None:
                kicks[name] = pool.submit(_control_oneshot, self.st.paths[name], ["SETEVENTS BW"])
            elif f.done():
                if f.result():          # raises RunFailed when tor refused
                    pending.discard(name)
                else:
                    del kicks[name]     # not listening yet: again on the next pass
        if not pending and "periodic_events_started_s" not in self.out:
            self.out["periodic_events_started_s"] = self.phases["periodic_events_started"] = \
                round(time.time() - self.st.t0, 3)


def _held_first_round(rep: engine.Repetition, deadline: float) -> dict:
    """A large network's first round (more than constants.LARGE_NETWORK_TORS tors): the torrc
    schedules a placeholder round 10 minutes out; once every authority holds every relay's
    descriptor, torbed schedules the real one (constants.LARGE_VOTING: 30 s interval, 6 + 6 s
    delays) at the earliest time the rescheduled vote allows. While the launch takes minutes,
    authorities publishing a consensus every round made every directory cache verify, diff
    and compress each one while the rest were still starting (a 750-tor run had 403 runnable
    tasks, and clients not yet started after 11 minutes). Returns what it did for meta.json;
    "fallback" says why the placeholder round was left to run."""
    st = state.of(rep)
    plan, ids, sup, paths, t0 = st.plan, st.ids, st.sup, st.paths, st.t0
    phases = rep.meta["bootstrap"]["phases_s"]
    _, vote_delay, dist_delay = constants.LARGE_VOTING
    interval = constants.HELD_VOTING_INTERVAL
    placeholder_vote = st.fallback_valid_after - vote_delay - dist_delay
    auths: dict[str, stem.control.Controller | None] = {a.name: None for a in plan.by_role("authority")}
    relays = plan.by_role("relay")
    names = list(sup.procs)
    try:
        missing = {a: {r.name for r in relays} for a in auths}
        while True:
            sup.check(names)
            for a in auths:
                auths[a] = auths[a] or _try_controller(paths[a].control_socket)
            for a, ctl in auths.items():
                if ctl is not None:
                    missing[a] = {r for r in missing[a] if not ctl.get_info(f"desc/id/{ids.fingerprints[r]}", None)}
            left = sum(map(len, missing.values()))
            if None not in auths.values() and not left:
                break
            if time.time() > min(deadline, placeholder_vote - 1.5):
                if None in auths.values():
                    return {"fallback": "the authorities' control ports did not answer"}
                a = sorted(a for a in missing if missing[a])[0]
                return {"fallback": f"{a} lacked the descriptor of {sorted(missing[a])[0]} ({left} missing in all)"}
            rep.status(f"holding the first round: {left} relay descriptor(s) not at every authority yet")
            time.sleep(1.0)
        now, valid_after = _schedule_first_round(
            list(auths.values()), 0, (vote_delay, dist_delay), interval,
            {"V3AuthVotingInterval": str(interval), "TestingV3AuthInitialVotingInterval": str(interval)})
        phases["descriptors_in"] = round(now - t0, 3)
        phases["first_valid_after"] = round(valid_after - t0, 3)
        return {"descriptors_in_s": round(now - t0, 3), "first_valid_after_s": round(valid_after - t0, 3),
                "placeholder_valid_after_s": round(st.fallback_valid_after - t0, 3),
                "voting_schedule_s": [interval, vote_delay, dist_delay]}
    finally:
        for ctl in auths.values():
            if ctl is not None:
                ctl.close()


def _wait_consensus(rep: engine.Repetition, deadline: float, poll: float = POLL_S) -> dict:
    """Until every authority has a consensus listing every relay with its expected flags.
    Returns the relays' flags in the accepted consensus."""
    st = state.of(rep)
    plan, ids, sup, paths = st.plan, st.ids, st.sup, st.paths
    names = list(sup.procs)
    pending = {a.name for a in plan.by_role("authority")}
    last: dict[str, str] = {}
    seen: dict[str, tuple] = {}     # authority -> (mtime, size) of the file last parsed
    accepted: dict = {}
    while pending:
        sup.check(names)
        for a in sorted(pending):
            path = Path(paths[a].datadir) / "cached-consensus"
            try:
                stat = path.stat()
                version = (stat.st_mtime_ns, stat.st_size)
            except OSError:
                version = None
            if version is not None and seen.get(a) == version:
                continue    # parsing a large consensus again costs a starved torbed seconds
            seen[a] = version
            why, flags = readiness.consensus_file_problem(path, plan, ids.fingerprints)
            last[a] = why or "ok"
            if why is None:
                pending.discard(a)
                accepted = flags
        if pending and time.time() > deadline:
            a = sorted(pending)[0]
            raise NodeFailed(a, f"no complete consensus after {rep.scenario.measure.ready_timeout}: {last[a]}",
                             Path(paths[a].log))
        if pending:
            rep.status(f"waiting for a consensus listing every relay: {'; '.join(sorted(set(last.values())))}")
            time.sleep(poll)
    return accepted


def after_ready_interval(mode: str | None) -> int:
    """The voting interval once the network is ready (see _relax_voting): a held network
    keeps its slow rounds (constants.HELD_VOTING_INTERVAL)."""
    return constants.HELD_VOTING_INTERVAL if mode == "held" else VOTING_INTERVAL_AFTER_READY


def _relax_voting(rep: engine.Repetition) -> None:
    """Once ready, authorities vote every VOTING_INTERVAL_AFTER_READY seconds instead of 10 (or 30),
    a held network every HELD_VOTING_INTERVAL: every consensus makes every relay and client
    fetch it (and caches compress it and diffs), load that belongs to bring-up, not to a
    scheduling experiment. Takes effect from the next vote; recorded in meta.json."""
    interval = after_ready_interval(first_round(rep.state.plan))
    for a in rep.state.plan.by_role("authority"):
        with _controller(rep.state.paths[a.name].control_socket) as ctl:
            ctl.set_options({"V3AuthVotingInterval": str(interval)})
    rep.meta.setdefault("bootstrap", {})["voting_interval_after_ready_s"] = interval


def _self_realtime(priority: int | None) -> int | None:
    """torbed's own thread SCHED_RR at ``priority`` (its children, processes and threads,
    start as normal tasks: SCHED_RESET_ON_FORK), or back to SCHED_OTHER (None). Returns
    ``priority``, or None where this process may not."""
    try:
        if priority is None:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        else:
            os.sched_setscheduler(0, os.SCHED_RR | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except PermissionError:
        return None
    return priority


def _set_realtime(sup: Supervisor, names: list[str], priority: int | None) -> int | None:
    """Every thread of these nodes' processes SCHED_RR at ``priority``, or back to SCHED_OTHER
    (None). The policy is per thread; threads inherit it from their creator. Returns
    ``priority``, or None where this process may not (CAP_SYS_NICE: not in a rootless run)."""
    policy, param = (os.SCHED_OTHER, os.sched_param(0)) if priority is None else (os.SCHED_RR, os.sched_param(priority))
    for name in names:
        pid = sup.procs[name][0].pid
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setscheduler(int(tid), policy, param)
        except PermissionError:
            return None
        except (FileNotFoundError, ProcessLookupError):
            pass    # a node that exited: the supervisor reports it
    return priority


# What the directory protocol fetched by the time the network was ready, per authority file.
DIRECTORY_FILES = ("cached-consensus", "cached-microdesc-consensus", "cached-microdescs", "cached-microdescs.new")


def _bringup_traffic(rep: engine.Repetition) -> dict:
    """Bytes sent and received from setup to ready, summed by role (before ready this is
    the directory protocol: descriptor uploads, votes, consensus and microdescriptor fetches,
    and the clients' bootstrap circuits), and the size of an authority's directory files."""
    st = state.of(rep)
    try:
        ports = st.topo.port_bytes()
    except (netns.NetnsError, ValueError, KeyError) as e:
        return {"error": str(e)}
    by_role: dict[str, dict] = {}
    for n in st.plan.nodes:
        if n.name in ports:
            r = by_role.setdefault(n.role, {"nodes": 0, "sent_bytes": 0, "received_bytes": 0})
            r["nodes"] += 1
            r["sent_bytes"] += ports[n.name]["sent"]
            r["received_bytes"] += ports[n.name]["received"]
    auth = Path(st.paths[st.plan.by_role("authority")[0].name].datadir)
    return {"by_role": by_role,
            "authority_files_bytes": {f: (auth / f).stat().st_size for f in DIRECTORY_FILES if (auth / f).exists()}}


def _microdescs_held(datadir: Path) -> int:
    """How many microdescriptors a tor's data directory holds (each starts "onion-key")."""
    n = 0
    for name in ("cached-microdescs", "cached-microdescs.new"):
        try:
            data = (datadir / name).read_bytes()
        except OSError:
            continue
        n += data.count(b"\nonion-key\n") + data.startswith(b"onion-key\n")
    return n


def _cache_problem(datadir: Path, relays: int) -> str | None:
    """What a directory cache still lacks before it can answer a client's bootstrap."""
    if not (datadir / "cached-microdesc-consensus").exists():
        return "no microdescriptor consensus"
    held = _microdescs_held(datadir)
    return None if held >= relays else f"{held} of {relays} microdescriptors"


def directory_caches(plan, flags: dict) -> list[str]:
    """The relays a client may ask for directory documents: directory guards (Guard and V2Dir
    in the consensus), or every V2Dir relay if none is a guard."""
    caches = [r.name for r in plan.by_role("relay") if "V2Dir" in flags.get(r.name, [])]
    return [c for c in caches if "Guard" in flags.get(c, [])] or caches


def _wait_caches(rep: engine.Repetition, until: float, poll: float = POLL_S) -> str | None:
    """Until every relay a client may ask for directory documents (a directory guard: Guard
    and V2Dir in the consensus; every V2Dir relay if none is a guard) holds the
    microdescriptor consensus and every relay's microdescriptor; returns None then, or what
    one still lacked at ``until``."""
    st = state.of(rep)
    plan, paths, sup = st.plan, st.paths, st.sup
    relays = plan.by_role("relay")
    caches = directory_caches(plan, rep.meta["consensus_flags"])
    names = list(sup.procs)
    total = len(caches)
    while True:
        sup.check(names)
        problems = {c: why for c in caches if (why := _cache_problem(Path(paths[c].datadir), len(relays)))}
        caches = sorted(problems)     # a complete cache stays complete: not read again
        if not problems:
            return None
        c = sorted(problems)[0]
        if time.time() >= until:
            return f"{c}: {problems[c]} ({len(problems)} of {total} caches)"
        rep.status(f"waiting for the directory caches: {c}: {problems[c]} ({len(problems)} left)")
        time.sleep(poll)


def _clients_online(rep: engine.Repetition, reload: bool = False) -> None:
    """DisableNetwork 0 on every client; ``reload``: and a reload (SIGHUP), which fetches the
    consensus at once instead of at the client's next once-a-second timer, with
    __ReloadTorrcOnSIGHUP 0 so the reload keeps the options set here (reading the command
    line again would turn the network off)."""
    plan, paths, sup = rep.state.plan, rep.state.paths, rep.state.sup
    conf = "SETCONF DisableNetwork=0" + (" __ReloadTorrcOnSIGHUP=0" if reload else "")

    def online(name: str) -> None:
        if not _control_oneshot(paths[name], [conf], timeout=60):
            raise NodeFailed(name, "its control port does not answer", Path(paths[name].log))
        if reload:
            sup.signal(name, signal.SIGHUP)

    clients = [c.name for c in plan.by_role("client") + plan.by_role("loadworker")]  # load nodes' tors are clients too
    # In parallel: a busy machine schedules each client tor late (see _wait_clients).
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(online, clients))


def _relay_has_consensus(datadir: str) -> bool:
    return any((Path(datadir) / f).exists() for f in ("cached-consensus", "cached-microdesc-consensus"))


def _wait_clients(rep: engine.Repetition, deadline: float, kick: bool = False) -> int:
    """Until every client is at Bootstrapped 100% and knows every relay of its path, and
    every relay has a consensus (relays read consensus parameters from it). The flags were
    checked in the authorities' consensus, so clients are not asked again. ``kick``: a client
    with enough directory information and its path relays' descriptors gets a circuit along
    its path at once (closed again when it is ready) instead of waiting for tor's
    once-a-second circuit timer. Returns how many such circuits were started."""
    st = state.of(rep)
    plan, sup = st.plan, st.sup
    names = list(sup.procs)
    check = _ClientCheck(st, kick)
    last: dict[str, str] = {}
    pending = {c.name for c in plan.by_role("client") + plan.by_role("loadworker")} | \
        {r.name for r in plan.by_role("relay")}
    # When the last client and the last relay were seen ready, and when the check's controllers
    # were closed (phases_s): two 750-tor runs became ready ~205 s after their last client
    # logged Bootstrapped 100%, and nothing recorded where that time went.
    phases, t0 = rep.meta["bootstrap"]["phases_s"], st.t0

    def mark(phase: str, done: bool) -> None:
        if done and phase not in phases:
            phases[phase] = round(time.time() - t0, 3)

    pool = ThreadPoolExecutor(max_workers=16)
    try:
        while pending:
            mark("clients_ready_seen", not any(plan.node(c).role != "relay" for c in pending))
            mark("relays_consensus_seen", not any(plan.node(c).role == "relay" for c in pending))
            sup.check(names)
            _check_pending(st, pending, last, check, pool)
            if pending and time.time() > deadline:
                c = sorted(pending)[0]
                raise NodeFailed(c, f"not ready after {rep.scenario.measure.ready_timeout}: {last.get(c)}",
                                 Path(st.paths[c].log))
            if pending:
                rep.status(f"waiting for {len(pending)} client(s) to bootstrap and relays to fetch the consensus")
                time.sleep(FAST_POLL_S if kick else POLL_S)
        check.close_kicked_circuits()
        mark("clients_ready_seen", True)
        mark("relays_consensus_seen", True)
    finally:
        pool.shutdown()
        check.close()
    mark("client_controllers_closed", True)
    return len(check.kicked)


def _check_pending(st: state.RepState, pending: set, last: dict, check: "_ClientCheck",
                   pool: ThreadPoolExecutor) -> None:
    """One pass of _wait_clients: relays by their data directory, clients by their control
    port; the ready ones leave ``pending``, the others' reasons go to ``last``."""
    plan = st.plan
    for c in sorted(pending):
        if plan.node(c).role == "relay":
            if _relay_has_consensus(st.paths[c].datadir):
                pending.discard(c)
            else:
                last[c] = "no consensus yet"
    clients = sorted(c for c in pending if plan.node(c).role != "relay")
    # Asked in parallel: past a few hundred tors each busy client answers its control
    # port only when it is scheduled (each tor is an autogroup of its own), and 150
    # clients asked one after another took minutes.
    for c, why in (pool.map(check, clients) if len(clients) > 4 else map(check, clients)):
        if why is None:
            pending.discard(c)
        else:
            last[c] = why


class _ClientCheck:
    """Whether a client is ready (``check(name) -> (name, what it lacks or None)``), over
    controllers kept open between passes; with ``kick``, its circuit once it can build one."""

    def __init__(self, st: state.RepState, kick: bool):
        self.st, self.kick = st, kick
        self.ctls: dict[str, stem.control.Controller] = {}
        self.kicked: dict[str, str] = {}     # client -> circuit id

    def __call__(self, c: str) -> tuple[str, str | None]:
        st = self.st
        fprs = st.ids.fingerprints
        try:
            ctl = self.ctls.get(c) or _controller(st.paths[c].control_socket)
            self.ctls[c] = ctl
            path = [r.name for r in readiness.path_relays(st.plan, c)]
            why = readiness.client_problem(ctl, st.plan, fprs, path, check_flags=False)
            if why is not None and self.kick and c not in self.kicked \
                    and ctl.get_info("status/enough-dir-info", "0") == "1" \
                    and all(readiness.knows(ctl, fprs[r]) for r in path):
                self.kicked[c] = ctl.extend_circuit("0", [fprs[r] for r in path] or None)
            return c, why
        except (stem.SocketError, stem.ControllerError, OSError) as e:
            return c, f"control port: {e}"

    def close_kicked_circuits(self) -> None:
        for c, cid in self.kicked.items():
            try:
                self.ctls[c].close_circuit(cid)
            except (stem.ControllerError, stem.SocketError):
                pass    # it failed or tor closed it: the client bootstrapped all the same

    def close(self) -> None:
        for ctl in self.ctls.values():
            ctl.close()


# ---------------------------------------------------------------------------------------
# Measurement

def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(1 for _ in f)


class ResourceSampler:
    """Per-node RSS and CPU time of the tor processes, from /proc, as JSON lines
    (resources.jsonl): at readiness, every RESOURCE_INTERVAL seconds, and at the end.
    ``extra()``: further supervised processes to sample, as (process name, role, group)
    (the Locust processes of a background load: what the load itself costs)."""

    def __init__(self, sup: Supervisor, nodes: list, path: Path, variant: str, rep: int, extra=lambda: []):
        self.sup, self.nodes, self.variant, self.rep, self.extra = sup, nodes, variant, rep, extra
        self.writer = RecordWriter(path)
        self.next_t = time.time() + RESOURCE_INTERVAL
        self.ticks = os.sysconf("SC_CLK_TCK")

    def _proc(self, pid: int) -> tuple[int, int, float] | None:
        """(RSS, peak RSS since start (VmHWM), CPU seconds) of a process."""
        try:
            status = {k: int(v.split()[0]) * 1024 for k, _, v in
                      (line.partition(":") for line in open(f"/proc/{pid}/status")) if k in ("VmRSS", "VmHWM")}
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            return status["VmRSS"], status["VmHWM"], (int(fields[11]) + int(fields[12])) / self.ticks
        except (OSError, KeyError, IndexError, ValueError):
            return None

    def sample(self, label: str) -> None:
        now = time.time()
        for name, role, group in [(n.name, n.role, n.group) for n in self.nodes] + list(self.extra()):
            proc = self.sup.procs.get(name)
            got = self._proc(proc[0].pid) if proc and proc[0].poll() is None else None
            if got:
                self.writer.write({"type": "resources", "variant": self.variant, "rep": self.rep, "node": name,
                                   "role": role, "group": group, "t": now, "label": label,
                                   "rss_bytes": got[0], "rss_peak_bytes": got[1], "cpu_s": got[2]})

    def maybe_sample(self, now: float) -> None:
        if now >= self.next_t:
            self.sample("periodic")
            self.next_t = now + RESOURCE_INTERVAL


class _Load:
    """Background load (torbed.load): a Locust worker beside each load node's tor from the
    start of the workload, the headless master from load.start until load.stop. Records:
    load.jsonl (the master's statistics) and locust/ (Locust's own CSV files)."""

    def __init__(self, rep: engine.Repetition, cfg_dir: Path, t_work: float, manifest: dict):
        self.rep, self.t_work = rep, t_work
        st, s = state.of(rep), rep.scenario
        self.plan, self.sup, self.topo = st.plan, st.sup, st.topo
        self.t_start = t_work + s.load.start.seconds
        self.t_stop = t_work + (s.load.stop or s.measure.duration).seconds
        cfg = load.locust_config(s, self.plan, manifest[s.load_server()], variant=rep.variant, rep=rep.index,
                                 output=rep.dir / "load.jsonl", metrics=True)
        self.cfg_path = cfg_dir / "locust.json"
        self.cfg_path.write_text(json.dumps(cfg, indent=1))
        (rep.dir / "locust").mkdir(exist_ok=True)
        self.workers = []
        for n in self.plan.by_role("loadworker"):
            name = f"{n.name}.locust"
            self.sup.start(name, netns.exec_prefix(self.topo.ns(n.name)) + load.worker_argv(self.plan),
                           rep.logs / f"{name}.log", env=self._env(n.name))
            self.workers.append(name)
        self.master = None
        self.resources: ResourceSampler | None = None
        self.sampled = False
        rep.meta["load"] = {"t_start": None, "t_stop": None, "workers": self.workers}

    def processes(self) -> list[tuple[str, str, str]]:
        """The Locust processes running now, for resources.jsonl: (name, role, group)."""
        return [(w, "locust-worker", LOAD_GROUP) for w in self.workers] + \
            ([(self.master, "locust-master", LOAD_MASTER_GROUP)] if self.master else [])

    def _env(self, node: str) -> dict:
        return {**child_env(), "TORBED_LOAD_CONFIG": str(self.cfg_path), "TORBED_LOAD_NODE": node}

    def tick(self, now: float) -> None:
        """Start the master when load.start comes; fail the repetition if a Locust process
        ends before load.stop (its variant would be measured without the load it claims)."""
        self._check(now)
        if self.resources and not self.sampled and now >= self.t_stop - 1.5:
            # Locust ends itself at load.stop: its cost is sampled just before.
            self.resources.sample("load-end")
            self.sampled = True
        if self.master is None and now >= self.t_start:
            master = self.plan.by_role("loadmaster")[0]
            self.master = f"{master.name}.locust"
            self.sup.start(self.master, netns.exec_prefix(self.topo.ns(master.name)) + load.master_argv(
                self.rep.scenario, self.plan, run_time_s=self.t_stop - now, csv_prefix=self.rep.dir / "locust" / "stats"),
                self.rep.logs / f"{self.master}.log", env=self._env(master.name))
            self.rep.meta["load"]["t_start"] = now
            self.rep.console.log(f"background load: {self.rep.scenario.load.users} Locust users on "
                                 f"{len(self.workers)} worker(s) until +{self.t_stop - self.t_work:.0f} s")
            self.rep.write_meta()

    def _check(self, now: float) -> None:
        if now >= self.t_stop - 2:   # the master ends the load itself at load.stop, the workers with it
            return
        names = self.workers + ([self.master] if self.master else [])
        for name, rc in self.sup.exited(names).items():
            raise RunFailed(f"{name} exited ({rc}) while the background load was due to run:\n"
                            + tail(self.sup.log_of(name), 8))

    def stop(self) -> dict[str, int]:
        """Stop the master (it writes its last statistics) and then the workers. Returns the
        Locust processes that failed: {name: exit status}."""
        names = ([self.master] if self.master else [])
        self.sup.stop(names, grace=10)
        self.sup.stop(self.workers, grace=10)
        self.rep.meta["load"]["t_stop"] = time.time()
        return {n: rc for n, rc in self.sup.exited(names + self.workers).items() if rc not in (0, -signal.SIGTERM)}


# Fault kinds: torbed.backends.local.faults (one action class per kind). See docs/extending.md.
FAULTS = faults.FAULTS


class _Watch:
    """The measurement window: faults on schedule, resource samples, nodes that die, until
    every driver is done (or ``hard_end``)."""

    def __init__(self, rep: engine.Repetition, drivers: list[str], t_work: float, t_end: float, hard_end: float,
                 background: "_Load | None" = None):
        self.rep, self.drivers, self.t_work, self.t_end, self.hard_end = rep, drivers, t_work, t_end, hard_end
        self.background = background
        st = self.st = state.of(rep)
        self.plan, self.sup = st.plan, st.sup
        self.tors = [n for n in self.plan.nodes if n.runs_tor]
        self.faults = st.faults = faults.make_runner(rep, t_work, st.emulator)
        self.resources = ResourceSampler(self.sup, self.tors, rep.dir / "resources.jsonl", rep.variant, rep.index,
                                         extra=background.processes if background else lambda: [])
        if background:
            background.resources = self.resources

    def run(self) -> None:
        self.resources.sample("ready")
        while True:
            now = time.time()
            self.resources.maybe_sample(now)
            next_fault = self.faults.tick(now)
            if self.st.crossover is not None:
                nxt = self.st.crossover.tick(now)
                next_fault = min(t for t in (next_fault, nxt) if t is not None) if (next_fault or nxt) else None
            if self.background:
                self.background.tick(now)
            running = [d for d in self.drivers if self.sup.procs[d][0].poll() is None]
            if not running or now > self.hard_end:
                break
            self._unexpected_exits()
            self.rep.status(f"measuring: {_count_lines(self.rep.dir / 'transfers.jsonl')} transfers recorded, "
                            f"{len(running)} client(s) active, {max(0.0, self.t_end - now):.0f} s left")
            # Wake for a fault's time rather than up to a poll interval after it.
            time.sleep(max(0.01, min(MEASURE_POLL_S, (next_fault or 1e18) - time.time())))
        self.resources.sample("end")

    def _unexpected_exits(self) -> None:
        exits = self.rep.meta["unexpected_exits"]
        for name, rc in self.sup.exited([n.name for n in self.tors]).items():
            if name not in exits:
                exits[name] = rc
                self.rep.console.log(f"[yellow]{name} exited unexpectedly ({rc})[/yellow]; the run goes on\n"
                                     + tail(self.sup.log_of(name), 5))


# ``torbed clean`` (what a killed run left): torbed.backends.local.lifetime.
clean = lifetime.clean
