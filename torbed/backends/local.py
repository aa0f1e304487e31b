"""Local backend: the scenario's private Tor network in network namespaces on this machine.

For every variant and repetition: generate keys and layered torrcs, create the namespaces
and shape the links, start authorities, relays, the file servers and clients (each tor in
its node's namespace), wait for readiness by evidence, run the collectors and the
measurement drivers for the scenario's duration (injecting faults on schedule), then stop
everything and remove every namespace, whatever happened (success, failure, Ctrl-C,
SIGTERM). A run killed with SIGKILL is cleaned by ``torbed clean``.

Readiness (the same definition as the Kubernetes backend): every authority has a consensus
listing every relay as Running and Valid, with Guard on guard groups and Exit on exit
groups; every client reports Bootstrapped 100% and knows every relay of its path.

Public API:

- ``run_scenario(scenario, run_root, console, system_tor=False, variants=None) -> Path``
- ``run_repetition(ctx, variant, rep) -> dict``  (meta.json content)
- ``clean(console, force=False) -> int`` removes leftovers; returns how many namespaces
- ``RunFailed``, ``Interrupted``
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import stem
import stem.control
from stem.descriptor.networkstatus import NetworkStatusDocumentV3

from .. import __version__, builds, constants, emulator, netns, shaping, units
from ..fileserver import generate_files
from ..keys import make_authority_keys, make_relay_identity, read_certificate
from ..network import Node, Plan, plan as make_plan
from ..client.driver import think_config
from ..records import RecordWriter
from ..replay.trace import read as read_trace
from ..scenario import Scenario
from ..supervise import NodeFailed, Supervisor, owner_alive, read_states, tail
from ..torrc import Identities, NodePaths, render_fragments, render_node
from ..variants import load_variant


# Seconds from launching the processes to the first vote's valid-after time: tor takes
# ~1.5 s to start, relays upload descriptors ~1.1 s later, authorities vote ~2.4 s before
# valid-after (measured on a 2-core machine; a slower one gets the next interval, 10 s later).
VOTE_LEAD = 7


# Flags every relay must have in the consensus before the network counts as ready
# (Fast and Stable: clients select guards and path nodes only among them).
EXPECTED_FLAGS = {"Running", "Valid", "Fast", "Stable"}

RESOURCE_INTERVAL = 30.0   # seconds between resources.jsonl samples
VOTING_INTERVAL_AFTER_READY = 60   # seconds; see _relax_voting


class RunFailed(RuntimeError):
    pass


class Interrupted(BaseException):
    """SIGTERM or SIGINT during a run (BaseException: cleanup code must not swallow it)."""


def _on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


@dataclass
class Context:
    scenario: Scenario
    run_dir: Path
    console: object
    system_tor: bool = False
    manifest: dict = field(default_factory=dict)
    shaper: str = "none"


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def host_info() -> dict:
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {"hostname": socket.gethostname(), "kernel": platform.release(), "arch": platform.machine(),
            "cpus": os.cpu_count(), "memory_bytes": mem, "python": platform.python_version()}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------------------------------

def preflight(scenario: Scenario) -> str:
    """Checks that need no network: privileges, tools, the kernel's shaping. Returns the shaper."""
    if os.geteuid() != 0:
        raise RunFailed("the local backend needs root, or run through `torbed` as a normal user "
                        "(it re-executes itself in a user namespace when unprivileged user "
                        "namespaces are enabled)")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            raise RunFailed(f"'{tool}' not found: apt-get install iproute2 (or `make setup`)")
    caps = shaping.probe_kernel()
    shaper = "none"
    for v in scenario.variants:
        shaper = shaping.choose_shaper(make_plan(scenario, v), caps)  # raises ShapingError
    return shaper


def run_scenario(scenario: Scenario, run_root: Path, console, system_tor: bool = False,
                 variants: list[str] | None = None) -> Path:
    shaper = preflight(scenario)
    if shaper == "linkemu":
        try:
            emulator.ensure_binary(console)
        except emulator.EmulatorError as e:
            raise RunFailed(str(e)) from None
    variants = variants or scenario.variants
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = run_root / f"{scenario.name}-{stamp}"
    run_dir.mkdir(parents=True)
    ctx = Context(scenario=scenario, run_dir=run_dir, console=console, system_tor=system_tor, shaper=shaper)
    stock = builds.ensure(None, console, system_tor)
    run_json = {"schema": 1, "name": scenario.name, "scenario": scenario.model_dump(mode="json"),
                "seed": scenario.seed, "variants": variants, "baseline": scenario.baseline_variant
                if scenario.baseline_variant in variants else variants[0],
                "repetitions": scenario.repetitions, "backend": "local", "shaper": shaper,
                "torbed_version": __version__, "tor_version": stock.info.get("tor_version"),
                "host": host_info(), "started": utc_now(), "finished": None, "status": "running"}
    _write_json(run_dir / "run.json", run_json)
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    status = "failed"
    try:
        ctx.manifest = prepare_files(scenario)
        failures = 0
        for variant in variants:
            for rep in range(scenario.repetitions):
                meta = run_repetition(ctx, variant, rep)
                if meta["status"] != "ok":
                    failures += 1
        status = "ok" if failures == 0 else "partial"
    except Interrupted:
        status = "interrupted"
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        run_json.update(finished=utc_now(), status=status)
        _write_json(run_dir / "run.json", run_json)
        latest = run_root / f"{scenario.name}-latest"
        if latest.is_symlink() or not latest.exists():
            latest.unlink(missing_ok=True)
            latest.symlink_to(run_dir.name)
    return run_dir


def trace_name(path: Path) -> str:
    """A trace's name in records: its file name without .gz / .jsonl / .trace."""
    name = path.name
    for suffix in (".gz", ".jsonl", ".trace"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    return name


def replay_traces(scenario: Scenario, server_group: str, rep_dir: Path) -> dict[str, Path]:
    """Traces of the replay workloads served by ``server_group``: {name: path}. Each is
    copied into the repetition's directory (traces/), so a run keeps what it replayed."""
    out = {}
    for cg in scenario.clients.values():
        wl = cg.workload
        if wl.kind != "replay" or (wl.server or next(iter(scenario.servers))) != server_group:
            continue
        src = scenario.trace_path(wl.trace)
        dst = rep_dir / "traces" / src.name
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        out[trace_name(src)] = dst
    return out


def assign_flows(trace, wl, clients: list[Node]) -> dict[str, list[str]]:
    """Which flows each client of a group replays: ``each``: all; ``split``: whole circuit
    keys (flows sharing a circuit stay on one client) dealt round-robin in order of first
    appearance, so every client gets a similar share."""
    flows = [f for f in trace.flows if not wl.flows or f.id in wl.flows]
    if wl.distribute == "each":
        return {c.name: [f.id for f in flows] for c in clients}
    keys: list[str] = []
    by_key: dict[str, list[str]] = {}
    for f in sorted(flows, key=lambda f: f.start):
        k = f.circuit if f.circuit is not None else f"flow:{f.id}"
        if k not in by_key:
            keys.append(k)
            by_key[k] = []
        by_key[k].append(f.id)
    out = {c.name: [] for c in clients}
    for i, k in enumerate(keys):
        out[clients[i % len(clients)].name] += by_key[k]
    return out


def files_key(group: str, files: dict[str, int], seed: int) -> str:
    import hashlib
    h = hashlib.sha256(json.dumps([seed, sorted(files.items())]).encode()).hexdigest()[:12]
    return f"{group}-{h}"


def prepare_files(scenario: Scenario) -> dict[str, dict]:
    """Generate (or reuse from the cache: content is deterministic) every server group's files.
    Returns {group: manifest}; files live in CACHE_DIR/files/<files_key>/."""
    manifests = {}
    for g, sg in scenario.servers.items():
        if not sg.files:
            continue   # a replay-only server
        files = {name: units.parse_size(size) for name, size in sg.files.items()}
        d = constants.CACHE_DIR / "files" / files_key(g, files, scenario.seed)
        m = d / "manifest.json"
        if m.exists():
            manifests[g] = json.loads(m.read_text())
        else:
            tmp = d.with_name(d.name + f".tmp{os.getpid()}")
            manifests[g] = generate_files(tmp, files, scenario.seed)
            shutil.rmtree(d, ignore_errors=True)
            tmp.rename(d)
        manifests[g]["_dir"] = str(d)
    return manifests


# ---------------------------------------------------------------------------------------

def _consensus_ok(path: Path, plan: Plan, ids: Identities) -> tuple[bool, str, dict]:
    """Whether the consensus at ``path`` lists every relay with its expected flags:
    (ok, why not, {relay: flags})."""
    try:
        doc = NetworkStatusDocumentV3(path.read_bytes(), validate=False)
    except (OSError, ValueError) as e:
        return False, f"no consensus yet ({type(e).__name__})", {}
    entries = {e.fingerprint: e for e in doc.routers.values()}
    flags = {n.name: sorted(entries[ids.fingerprints[n.name]].flags)
             for n in plan.by_role("relay") if ids.fingerprints[n.name] in entries}
    for n in plan.by_role("relay"):
        if n.name not in flags:
            return False, f"{n.name} not in the consensus yet", flags
        want = EXPECTED_FLAGS | ({"Guard"} if n.guard else set()) | ({"Exit"} if n.exit else set())
        if not want <= set(flags[n.name]):
            return False, f"{n.name} has flags {flags[n.name]}, waiting for {sorted(want)}", flags
    return True, "ok", flags


def _controller(sock: Path) -> stem.control.Controller:
    c = stem.control.Controller.from_socket_file(str(sock))
    c.authenticate()
    return c


def run_repetition(ctx: Context, variant: str, rep: int) -> dict:
    s, console = ctx.scenario, ctx.console
    plan = make_plan(s, variant)
    rep_dir = ctx.run_dir / variant / f"rep-{rep}"
    logs, torrc_dir = rep_dir / "logs", rep_dir / "torrc"
    for d in (logs, torrc_dir):
        d.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(3)
    scratch = Path(f"/tmp/torbed-{run_id}")
    scratch.mkdir(mode=0o700)
    topo = netns.Topology(run_id, plan, switch="linkemu" if ctx.shaper == "linkemu" else "bridge")
    sup = Supervisor(run_id, {"namespaces": [topo.switch] + [topo.ns(n.name) for n in plan.nodes],
                              "scratch": str(scratch), "run_dir": str(rep_dir)})
    meta = {"schema": 1, "variant": variant, "rep": rep, "run_id": run_id, "status": "running", "error": None,
            "t_start": time.time(), "t_ready": None, "ready_s": None, "t_workload_start": None,
            "t_end": None, "warmup_s": units.parse_duration(s.measure.warmup),
            "duration_s": units.parse_duration(s.measure.duration), "shaper": ctx.shaper,
            "builds": {}, "authorities": [], "nodes": [], "faults": [], "unexpected_exits": {}}
    _write_json(rep_dir / "meta.json", meta)
    t0 = meta["t_start"]
    console.rule(f"[bold]{s.name}[/bold]: variant [cyan]{variant}[/cyan], repetition {rep + 1}/{s.repetitions}")
    try:
        # Binaries: one build per variant in use; stock for authorities and clients.
        variants = {v: load_variant(v) for v in plan.variants_in_use()}
        stock = builds.ensure(None, console, ctx.system_tor)
        node_build = {}
        for n in plan.nodes:
            node_build[n.name] = builds.ensure(variants[n.variant], console, ctx.system_tor) if n.variant else stock
        meta["builds"] = {"stock": stock.describe(),
                          **{v: builds.ensure(var, None, ctx.system_tor).describe() for v, var in variants.items()}}
        # Bring-up time counts from here: builds are cached work, not part of a network's start.
        meta["build_s"] = round(time.time() - t0, 3)
        t0 = meta["t_setup"] = time.time()

        # Keys (tor-gencert, tor --list-fingerprint), generated in parallel.
        ids = Identities()
        paths: dict[str, NodePaths] = {}
        for n in plan.nodes:
            if n.role == "server":
                continue
            data = scratch / n.name
            paths[n.name] = NodePaths(datadir=str(data), log=str(logs / f"{n.name}.log"),
                                      control_socket=str(data / "control"),
                                      extra_log=str(logs / f"{n.name}.info.log") if os.environ.get("TORBED_INFO_LOGS") else None)
            data.mkdir(mode=0o700, exist_ok=True)
        key_cache = None if os.environ.get("TORBED_FRESH_KEYS") else constants.CACHE_DIR / "keys" / s.name
        with ThreadPoolExecutor(max_workers=8) as pool:
            fprs = {n.name: pool.submit(node_keys, n, scratch / n.name, stock.tor_gencert, node_build[n.name].tor,
                                        key_cache)
                    for n in plan.nodes if n.role in ("authority", "relay")}
            sources = {}
            for name, fut in fprs.items():
                fpr, auth, source = fut.result()
                ids.fingerprints[name] = fpr
                sources[source] = sources.get(source, 0) + 1
                if auth:
                    ids.authorities[name] = auth
                    meta["authorities"].append({"name": name, "v3ident": auth.v3ident, "cert_expires": auth.expires})
        meta["keys"] = sources
        console.log(f"keys for {len(fprs)} relays and authorities: "
                    f"{', '.join(f'{n} {k}' for k, n in sorted(sources.items()))} ({time.time() - t0:.1f} s)")

        # Namespaces and shaping.
        topo.create()
        if ctx.shaper == "linkemu":
            emulator.start(sup, topo, plan, scratch, logs / "linkemu.log", stats_file=rep_dir / "linkemu.stats.json")
        elif ctx.shaper != "none":
            for n in plan.nodes:
                batch = shaping.tc_batch(plan, n, netem=ctx.shaper == "htb+netem")
                p = subprocess.run(["tc", "-n", topo.ns(n.name), "-batch", "-"], input=batch,
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    raise RunFailed(f"tc on {n.name}: {p.stderr.strip()}")
        console.log(f"network: {len(plan.nodes)} namespaces, shaper {ctx.shaper} ({time.time() - t0:.1f} s)")

        # torrc. The voting schedule is shifted so the first vote falls VOTE_LEAD seconds
        # after the relays start: they upload their descriptors within ~1 s, so the first
        # consensus already lists them (instead of waiting for the next 10 s interval).
        t_launch = time.time() + 0.3
        voting_offset = int(t_launch + VOTE_LEAD) % constants.VOTING_INTERVAL
        meta["bootstrap"] = {"voting_offset_s": voting_offset, "sighup_after_consensus": True}
        for name, text in render_fragments(plan, ids, variants, voting_offset).items():
            (torrc_dir / name).write_text(text)
        for n in plan.nodes:
            if n.role != "server":
                (torrc_dir / f"{n.name}.torrc").write_text(render_node(n, plan, paths[n.name], str(torrc_dir)))
        meta["nodes"] = [{**n.to_dict(), "fingerprint": ids.fingerprints.get(n.name),
                          "build": node_build[n.name].key if n.role != "server" else None} for n in plan.nodes]
        _write_json(rep_dir / "meta.json", meta)

        # Processes.
        tors = [n for n in plan.nodes if n.role != "server"]
        for n in plan.by_role("server"):
            if "http" in n.ports:
                sup.start(n.name, netns.exec_prefix(topo.ns(n.name)) + [
                    sys.executable, "-m", "torbed.fileserver", "--dir", ctx.manifest[n.group]["_dir"],
                    "--bind", n.address, "--port", str(n.ports["http"]), "--log", str(logs / f"{n.name}.http.log")],
                    logs / f"{n.name}.stderr.log", env=_child_env())
            if "replay" in n.ports:
                # The replay server writes upstream chunks' records to the same cells.jsonl
                # as the clients (O_APPEND, one write per line).
                traces = [f"--trace={name}={path}" for name, path in replay_traces(s, n.group, rep_dir).items()]
                sup.start(f"{n.name}.replay", netns.exec_prefix(topo.ns(n.name)) + [
                    sys.executable, "-m", "torbed.replay.server", "--bind", n.address, "--port", str(n.ports["replay"]),
                    "--cells", str(rep_dir / "cells.jsonl"), "--log", str(logs / f"{n.name}.replay.log"), *traces],
                    logs / f"{n.name}.replay.stderr.log", env=_child_env())
        # Every tor starts now. Relays and clients ask for a consensus before it exists and
        # back off (up to ~10 s); once it exists, SIGHUP makes tor reset its download
        # failures and fetch at once (main.c do_hup()), so nobody waits out the back-off.
        deadline = time.time() + units.parse_duration(s.measure.ready_timeout)
        tor_env = _tor_env()
        meta["bootstrap"]["malloc_arena_max"] = tor_env.get("MALLOC_ARENA_MAX")
        meta["bootstrap"]["malloc_mmap_threshold"] = tor_env.get("MALLOC_MMAP_THRESHOLD_")
        for n in tors:
            sup.start(n.name, netns.exec_prefix(topo.ns(n.name)) + [
                node_build[n.name].tor, "-f", str(torrc_dir / f"{n.name}.torrc")], logs / f"{n.name}.stdout.log",
                env=tor_env)
        consensus_flags = _wait_consensus(ctx, plan, ids, sup, paths, deadline)
        console.log(f"consensus lists every relay ({time.time() - t0:.1f} s)")
        meta["consensus_flags"] = consensus_flags
        for n in tors:
            if n.role != "authority":
                sup.signal(n.name, signal.SIGHUP)
        _wait_clients(ctx, plan, ids, sup, paths, deadline)
        _relax_voting(plan, paths, meta)
        meta["t_ready"] = time.time()
        meta["ready_s"] = round(meta["t_ready"] - t0, 3)
        console.log(f"[green]ready[/green] in {meta['ready_s']:.1f} s "
                    f"(consensus with {len(plan.by_role('relay'))} relays, {len(plan.by_role('client'))} clients bootstrapped)")
        _write_json(rep_dir / "meta.json", meta)

        _measure(ctx, plan, ids, sup, topo, paths, rep_dir, logs, variant, rep, meta)
        meta["status"] = "ok"
    except Interrupted as e:
        meta["status"], meta["error"] = "interrupted", f"interrupted by {e}"
        raise
    except (RunFailed, NodeFailed, shaping.ShapingError, builds.BuildError, netns.NetnsError,
            emulator.EmulatorError, OSError) as e:
        meta["status"], meta["error"] = "failed", str(e)
        console.print(f"[red]repetition failed[/red]: {e}", highlight=False)
    except Exception as e:  # noqa: BLE001 - recorded, then re-raised after cleanup
        meta["status"], meta["error"] = "failed", f"{type(e).__name__}: {e}"
        raise
    finally:
        # Cleanup must not be interrupted half-way by a second Ctrl-C.
        old = {sg: signal.signal(sg, signal.SIG_IGN) for sg in (signal.SIGINT, signal.SIGTERM)}
        try:
            sup.stop_all()
            meta["unexpected_exits"] = {k: v for k, v in sup.exited().items()
                                        if v not in (0, -signal.SIGTERM, -signal.SIGKILL)}
            topo.destroy()
            shutil.rmtree(scratch, ignore_errors=True)
            sup.forget()
            meta["t_end"] = meta["t_end"] or time.time()
            _write_json(rep_dir / "meta.json", meta)
        finally:
            for sg, h in old.items():
                signal.signal(sg, h)
    return meta


KEY_FILES = ("keys", "fingerprint", "fingerprint-ed25519")


def node_keys(node: Node, datadir: Path, tor_gencert: str, tor: str, cache: Path | None):
    """Identity keys of an authority or relay: from the per-scenario key cache when present
    (same fingerprints run after run; certificates within 30 days of expiry are remade),
    else generated with tor's tools and stored in the cache. Returns (fingerprint,
    AuthorityKeys or None, "cached" | "generated")."""
    entry = cache / f"{node.name}-{node.address}" if cache else None
    if entry and (entry / "done").exists():
        try:
            auth = read_certificate(entry / "keys" / "authority_certificate") if node.role == "authority" else None
            fresh = auth is None or dt.datetime.fromisoformat(auth.expires.rstrip("Z")) > \
                dt.datetime.utcnow() + dt.timedelta(days=30)
            if fresh:
                for f in KEY_FILES:
                    src = entry / f
                    if src.is_dir():
                        shutil.copytree(src, datadir / f, dirs_exist_ok=True)
                    elif src.exists():
                        shutil.copy2(src, datadir / f)
                if auth:
                    auth = read_certificate(datadir / "keys" / "authority_certificate")
                fpr = (datadir / "fingerprint").read_text().split()[1]
                return fpr, auth, "cached"
        except (OSError, IndexError, ValueError):
            pass  # a damaged cache entry is regenerated below
    auth = make_authority_keys(datadir, node.address, node.ports["dir"], tor_gencert) if node.role == "authority" else None
    fpr = make_relay_identity(datadir, node.nickname, tor)
    if entry:
        tmp = entry.with_name(entry.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in KEY_FILES:
            src = datadir / f
            if src.is_dir():
                shutil.copytree(src, tmp / f)
            elif src.exists():
                shutil.copy2(src, tmp / f)
        (tmp / "done").write_text("")
        shutil.rmtree(entry, ignore_errors=True)
        tmp.rename(entry)
    return fpr, auth, "generated"


# glibc malloc settings for tor, by environment variable: (torbed override, default).
# Neither changes what tor does, only how freed memory goes back to the kernel; see _tor_env.
TOR_MALLOC_ENV = {"MALLOC_ARENA_MAX": ("TORBED_MALLOC_ARENA_MAX", "1"),
                  "MALLOC_MMAP_THRESHOLD_": ("TORBED_MALLOC_MMAP_THRESHOLD", "131072")}


def _tor_env() -> dict:
    """tor's environment, with two glibc malloc settings (each overridable by its TORBED_
    variable; empty leaves glibc's default). Directory caches (guards) and authorities
    compress every new consensus and each consensus diff with lzma (preset 6: 12.5 + 16.3 + 64 MiB
    of encoder state) and zstd (level 9: 16.7 MiB) in worker threads, several times per
    consensus; tor's own data is ~3 MiB.

    - MALLOC_MMAP_THRESHOLD_=131072 (128 KiB, glibc's initial value, now fixed): glibc
      otherwise raises its mmap threshold to the size of the first such buffer it frees, so
      later ones come from the heap, and freed heap is kept (holes below live chunks; a top
      below the equally raised trim threshold). Measured on a 100-relay network: guards
      held 45-85 MiB, of which 71 MiB free heap (malloc_info; malloc_trim brought one from 85
      to 14 MiB); with the fixed threshold 17-30 MiB. Allocations below 128 KiB (cells,
      buffers, circuits) are served as before.
    - MALLOC_ARENA_MAX=1: each worker thread otherwise keeps its own arena: 70 MiB RSS per
      guard instead of 41 MiB (before the threshold was fixed).

    Cell processing is single-threaded and never allocates 128 KiB at once, so this changes
    memory, not scheduling; a multi-threaded relay variant should set its own arena count."""
    env = dict(os.environ)
    for var, (override, default) in TOR_MALLOC_ENV.items():
        value = os.environ.get(override, default)
        if value:
            env[var] = value
        else:
            env.pop(var, None)
    return env


def _child_env() -> dict:
    env = dict(os.environ)
    root = str(constants.REPO_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _wait_consensus(ctx: Context, plan: Plan, ids: Identities, sup: Supervisor, paths: dict,
                    deadline: float) -> dict:
    """Until every authority has a consensus listing every relay with its expected flags.
    Returns the relays' flags in the accepted consensus."""
    names = list(sup.procs)
    pending = {a.name for a in plan.by_role("authority")}
    last: dict[str, str] = {}
    accepted: dict = {}
    with ctx.console.status("waiting for a consensus listing every relay") as status:
        while pending:
            sup.check(names)
            for a in sorted(pending):
                ok, why, flags = _consensus_ok(Path(paths[a].datadir) / "cached-consensus", plan, ids)
                last[a] = why
                if ok:
                    pending.discard(a)
                    accepted = flags
            if pending and time.time() > deadline:
                a = sorted(pending)[0]
                raise NodeFailed(a, f"no complete consensus after {ctx.scenario.measure.ready_timeout}: {last[a]}",
                                 Path(paths[a].log))
            if pending:
                status.update(f"waiting for a consensus listing every relay: {'; '.join(sorted(set(last.values())))}")
                time.sleep(0.2)
    return accepted


def _relax_voting(plan: Plan, paths: dict, meta: dict) -> None:
    """Once ready, authorities vote every VOTING_INTERVAL_AFTER_READY seconds instead of 10:
    every consensus makes every relay and client fetch it (and caches recompress diffs),
    load that belongs to bring-up, not to a scheduling experiment. Takes effect from the
    next vote; recorded in meta.json."""
    for a in plan.by_role("authority"):
        with _controller(Path(paths[a.name].control_socket)) as ctl:
            ctl.set_options({"V3AuthVotingInterval": str(VOTING_INTERVAL_AFTER_READY)})
    meta.setdefault("bootstrap", {})["voting_interval_after_ready_s"] = VOTING_INTERVAL_AFTER_READY


def _relay_has_consensus(datadir: str) -> bool:
    return any((Path(datadir) / f).exists() for f in ("cached-consensus", "cached-microdesc-consensus"))


def _wait_clients(ctx: Context, plan: Plan, ids: Identities, sup: Supervisor, paths: dict,
                  deadline: float) -> None:
    """Until every client is at Bootstrapped 100% and knows every relay of its path, and
    every relay has a consensus (relays read consensus parameters from it)."""
    names = list(sup.procs)
    ctls: dict[str, stem.control.Controller] = {}
    last: dict[str, str] = {}
    pending = {c.name for c in plan.by_role("client")} | {r.name for r in plan.by_role("relay")}
    try:
        with ctx.console.status("waiting for clients to bootstrap") as status:
            while pending:
                sup.check(names)
                for c in sorted(pending):
                    if plan.node(c).role == "relay":
                        if _relay_has_consensus(paths[c].datadir):
                            pending.discard(c)
                        else:
                            last[c] = "no consensus yet"
                        continue
                    try:
                        ctl = ctls.get(c) or _controller(Path(paths[c].control_socket))
                        ctls[c] = ctl
                        phase = ctl.get_info("status/bootstrap-phase", "")
                        last[c] = phase
                        if "PROGRESS=100" not in phase:
                            continue
                        missing = [n for n in _path_relays(plan, c) if not _knows(ctl, ids.fingerprints[n.name])]
                        if missing:
                            last[c] = f"its consensus lacks {', '.join(m.name for m in missing)}"
                            continue
                        pending.discard(c)
                    except (stem.SocketError, stem.ControllerError, OSError) as e:
                        last[c] = f"control port: {e}"
                if pending and time.time() > deadline:
                    c = sorted(pending)[0]
                    raise NodeFailed(c, f"not ready after {ctx.scenario.measure.ready_timeout}: {last.get(c)}",
                                     Path(paths[c].log))
                if pending:
                    status.update(f"waiting for {len(pending)} client(s) to bootstrap and relays to fetch the consensus")
                    time.sleep(0.2)
    finally:
        for ctl in ctls.values():
            ctl.close()


def _path_relays(plan: Plan, client: str) -> list[Node]:
    node = plan.node(client)
    path = plan.scenario.clients[node.group].path or []
    return [r for g in path for r in plan.group_nodes(g)]


def _knows(ctl: stem.control.Controller, fpr: str) -> bool:
    """The client can extend a circuit to this relay: it has its consensus entry and its
    microdescriptor (with only the former, EXTENDCIRCUIT fails with "No descriptor")."""
    try:
        return bool(ctl.get_info(f"ns/id/{fpr}", "")) and bool(ctl.get_info(f"md/id/{fpr}", ""))
    except stem.ControllerError:
        return False


class ResourceSampler:
    """Per-node RSS and CPU time of the tor processes, from /proc, as JSON lines
    (resources.jsonl): at readiness, every RESOURCE_INTERVAL seconds, and at the end."""

    def __init__(self, sup: Supervisor, nodes: list[Node], path: Path, variant: str, rep: int):
        self.sup, self.nodes, self.variant, self.rep = sup, nodes, variant, rep
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
        for n in self.nodes:
            proc = self.sup.procs.get(n.name)
            got = self._proc(proc[0].pid) if proc and proc[0].poll() is None else None
            if got:
                self.writer.write({"type": "resources", "variant": self.variant, "rep": self.rep, "node": n.name,
                                   "role": n.role, "group": n.group, "t": now, "label": label,
                                   "rss_bytes": got[0], "rss_peak_bytes": got[1], "cpu_s": got[2]})

    def maybe_sample(self, now: float) -> None:
        if now >= self.next_t:
            self.sample("periodic")
            self.next_t = now + RESOURCE_INTERVAL


def _measure(ctx: Context, plan: Plan, ids: Identities, sup: Supervisor, topo: netns.Topology,
             paths: dict, rep_dir: Path, logs: Path, variant: str, rep: int, meta: dict) -> None:
    s, console = ctx.scenario, ctx.console
    warmup = units.parse_duration(s.measure.warmup)
    duration = units.parse_duration(s.measure.duration)
    t_work = time.time() + 1.0
    t_end = t_work + duration
    meta.update(t_workload_start=t_work)
    cfg_dir = rep_dir / "config"
    cfg_dir.mkdir(exist_ok=True)

    # Collectors (switch namespace: they reach every relay's MetricsPort).
    relays = plan.by_role("relay")
    collect = [c for c in s.measure.collect if c != "transfers"]
    collector_cfg = {
        "variant": variant, "rep": rep, "output": str(rep_dir), "collect": collect,
        "bw_interval_s": units.parse_duration(s.measure.bw_interval),
        "metrics_interval_s": units.parse_duration(s.measure.metrics_interval),
        "relays": [{"name": r.name, "group": r.group, "control": {"socket": paths[r.name].control_socket},
                    "metrics_url": f"http://{r.address}:{r.ports['metrics']}/metrics"} for r in relays]}
    (cfg_dir / "collector.json").write_text(json.dumps(collector_cfg, indent=1))
    sup.start("collector", netns.exec_prefix(topo.switch) + [sys.executable, "-m", "torbed.collectors",
                                                            str(cfg_dir / "collector.json")],
              logs / "collector.log", env=_child_env())

    # Drivers, one per client node, in the client's namespace.
    drivers = []
    assignments: dict[str, dict[str, list[str]]] = {}
    periods: dict[str, float] = {}
    for c in plan.by_role("client"):
        cg = s.clients[c.group]
        wl = cg.workload
        server_group = wl.server or next(iter(s.servers))
        server = plan.group_nodes(server_group)[c.index % s.servers[server_group].count]
        if wl.kind == "replay":
            if c.group not in assignments:
                trace = read_trace(s.trace_path(wl.trace))
                assignments[c.group] = assign_flows(trace, wl, plan.group_nodes(c.group))
                periods[c.group] = trace.duration + units.parse_duration(wl.gap)
            period = periods[c.group]
            src = s.trace_path(wl.trace)
            workload = {"kind": "replay", "server": server.name, "address": server.address,
                        "port": server.ports["replay"], "trace": str(rep_dir / "traces" / src.name),
                        "trace_name": trace_name(src), "flows": assignments[c.group][c.name],
                        "loop": wl.loop, "period_s": period,
                        # 'each': client i starts i/count of a period later, so the clients'
                        # copies of the trace do not burst in lockstep.
                        "offset_s": c.index * period / cg.count if wl.distribute == "each" else 0.0, "slack_s": units.parse_duration(wl.timeout),
                        "timeout_s": units.parse_duration(wl.timeout), "concurrency": 1,
                        "cells_output": str(rep_dir / "cells.jsonl"), "clock_output": str(rep_dir / "clock.jsonl")}
        else:
            workload = None
            entry = ctx.manifest[server_group][wl.file]
        think = think_config(getattr(wl, "think", None))
        cfg = {
            "client": c.name, "group": c.group, "variant": variant, "rep": rep, "seed": s.seed + rep,
            "control": {"socket": paths[c.name].control_socket}, "socks_port": c.ports["socks"],
            "output": str(rep_dir / "transfers.jsonl"),
            "path": [[{"node": r.name, "fingerprint": ids.fingerprints[r.name]} for r in plan.group_nodes(g)]
                     for g in (cg.path or [])],
            "workload": workload or {
                "kind": wl.kind, "server": server.name, "address": server.address,
                "port": server.ports["http"], "file": wl.file, "size": entry["size"],
                "sha256": entry["sha256"], "concurrency": wl.concurrency,
                "repeat": getattr(wl, "repeat", None),
                "pause_s": units.parse_duration(getattr(wl, "pause", "0s")), "think": think,
                "timeout_s": units.parse_duration(wl.timeout) if wl.timeout
                else constants.transfer_timeout(entry["size"])},
            "t_workload": t_work, "t_measure": t_work + warmup, "t_end": t_end,
            "debug": bool(os.environ.get("TORBED_DEBUG")),
        }
        path = cfg_dir / f"{c.name}.driver.json"
        path.write_text(json.dumps(cfg, indent=1))
        name = f"{c.name}.driver"
        sup.start(name, netns.exec_prefix(topo.ns(c.name)) + [sys.executable, "-m", "torbed.client.driver", str(path)],
                  logs / f"{name}.log", env=_child_env())
        drivers.append(name)
    _write_json(rep_dir / "meta.json", meta)

    faults = sorted(((units.parse_duration(f.at), f) for f in s.faults), key=lambda x: x[0])
    tor_names = [n.name for n in plan.nodes if n.role != "server"]
    longest = max(json.loads((cfg_dir / f"{d}.json").read_text())["workload"]["timeout_s"] for d in drivers)
    hard_end = t_end + min(longest, 300) + 10
    transfers = rep_dir / "transfers.jsonl"
    resources = ResourceSampler(sup, [n for n in plan.nodes if n.role != "server"], rep_dir / "resources.jsonl",
                                variant, rep)
    resources.sample("ready")
    with console.status("measuring") as status:
        while True:
            now = time.time()
            resources.maybe_sample(now)
            while faults and now >= t_work + faults[0][0]:
                at, f = faults.pop(0)
                targets = [n.name for n in plan.group_nodes(f.target)] or [f.target]
                for t in targets:
                    sup.kill(t)
                meta["faults"].append({"at": f.at, "kind": f.kind, "target": f.target, "nodes": targets, "t": now})
                console.log(f"fault: {f.kind} {', '.join(targets)} at +{at:.0f} s")
                _write_json(rep_dir / "meta.json", meta)
            running = [d for d in drivers if sup.procs[d][0].poll() is None]
            if not running or now > hard_end:
                break
            for name, rc in sup.exited(tor_names).items():
                if name not in meta["unexpected_exits"]:
                    meta["unexpected_exits"][name] = rc
                    console.log(f"[yellow]{name} exited unexpectedly ({rc})[/yellow]; the run goes on\n"
                                + tail(sup.log_of(name), 5))
            n = sum(1 for _ in open(transfers)) if transfers.exists() else 0
            left = max(0.0, t_end - now)
            status.update(f"measuring: {n} transfers recorded, {len(running)} client(s) active, {left:.0f} s left")
            time.sleep(0.5)
    resources.sample("end")
    sup.stop(drivers, grace=10)
    failed = {d: rc for d, rc in sup.exited(drivers).items() if rc not in (0, -signal.SIGTERM)}
    sup.stop(["collector"], grace=10)
    meta["t_end"] = time.time()
    n = sum(1 for _ in open(transfers)) if transfers.exists() else 0
    console.log(f"measured {n} transfers in {meta['t_end'] - t_work:.0f} s")
    if failed:
        raise RunFailed("measurement driver(s) failed: " + "; ".join(
            f"{d} exited {rc}: {tail(sup.log_of(d), 8)}" for d, rc in failed.items()))


# ---------------------------------------------------------------------------------------

def clean(console, force: bool = False) -> int:
    """Remove namespaces, processes and scratch directories of runs whose torbed is gone."""
    removed = 0
    live_ns: set[str] = set()
    for st in read_states():
        if owner_alive(st) and not force:
            live_ns.update(st.get("namespaces", []))
            continue
        for name, pid in (st.get("pids") or {}).items():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for ns in st.get("namespaces", []):
            if ns in netns.list_namespaces(ns):
                netns.delete_namespace(ns)
                removed += 1
        if st.get("scratch"):
            shutil.rmtree(st["scratch"], ignore_errors=True)
        Path(st["_file"]).unlink(missing_ok=True)
        console.log(f"cleaned run {st.get('run_id')} ({st.get('run_dir', '?')})")
    for ns in netns.list_namespaces():
        if ns not in live_ns:
            n = netns.kill_namespace_processes(ns)
            netns.delete_namespace(ns)
            removed += 1
            console.log(f"removed namespace {ns}" + (f" and {n} process(es)" if n else ""))
    for d in Path("/tmp").glob("torbed-*"):
        if d.is_dir() and not any(str(d) in str(st.get("scratch")) for st in read_states()):
            shutil.rmtree(d, ignore_errors=True)
    return removed
