"""A client pod's driver container: wait for evidence that the network is ready, then run
the measurement driver for measure.duration, streaming its records to the results service.

Ready means what it means on the local backend: this client's tor is at Bootstrapped 100%,
its consensus lists every relay of the scenario with Running, Valid, Fast, Stable (+ Guard
/ Exit as the scenario says), and it knows every relay of its path.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import stem.control

from .. import constants, fileserver, workloads
from ..client import driver
from ..errors import EXIT_FAILED, EXIT_OK
from ..records import RecordWriter
from . import (Shipper, bringup, cpusample, env, fingerprints, load_scenario, log, node_name, plan, repetition, service_host, variant,
               write_hardware)
from .bringup import connect_control, wait_network, wait_start


def go_online(ctl: stem.control.Controller, p, node: str, url: str, t0: float, deadline: float) -> dict:
    """A tor started with DisableNetwork 1 (TORBED_START_OFFLINE) goes online once every
    relay has reported its consensus (the directory caches also every microdescriptor), or
    bringup.ONLINE_MARGIN_S before ``deadline`` at the latest: asked earlier, a cache answers
    404 and tor retries only after its 10 s periodic fetch (torbed.pods.bringup).
    Returns what the client record keeps: when it went online and how many caches were ready."""
    if ctl.get_conf("DisableNetwork", "0") != "1":
        return {}
    want = len(p.by_role("relay"))
    have, t_online = bringup.wait_for_caches(url, want, deadline - bringup.ONLINE_MARGIN_S)
    ctl.set_conf("DisableNetwork", "0")
    log(f"client {node}: network on after {t_online - t0:.1f} s ({have} of {want} directory caches ready)")
    return {"online_s": round(t_online - t0, 3), "caches_ready": have, "caches": want}


def replay_server_address(server_group: str, index: int, count: int, deadline: float) -> str:
    """The address of the replay server pod this client replays against: one pod for the
    replay stream and the clock exchanges alike (a ClusterIP could balance them onto two
    pods, i.e. two clocks). Pod addresses from the group's headless Service, sorted; client
    i takes number i mod the group's size, as on the local backend."""
    while True:
        try:
            found = sorted({ai[4][0] for ai in socket.getaddrinfo(service_host(f"{server_group}-pods"), None,
                                                                  socket.AF_INET, socket.SOCK_STREAM)},
                           key=lambda a: tuple(int(x) for x in a.split(".")))
        except socket.gaierror:
            found = []
        if len(found) >= count or (found and time.time() > deadline):
            return found[index % len(found)]
        if time.time() > deadline:
            raise SystemExit(f"no address for the replay server group {server_group}")
        time.sleep(1.0)


def replay_workload(s, p, group: str, node: str, server_group: str, out: Path) -> dict:
    """The driver's replay workload, built as the local backend builds it (torbed.workloads)."""
    from ..replay.trace import read as read_trace
    cg = s.clients[group]
    wl = cg.workload
    sg = s.servers[server_group]
    me = p.node(node)
    path = s.trace_path(wl.trace)
    trace = read_trace(path)
    flows = workloads.assign_flows(trace, wl, p.group_nodes(group))
    period = trace.duration + wl.gap.seconds
    address = replay_server_address(server_group, me.index, sg.count, time.time() + 60)
    # "server" is the group, as for HTTP workloads here (pod ordinals do not follow the sorted
    # addresses); the address names the pod.
    target = workloads.Target(server=server_group, address=address, ports={"replay": sg.replay.port})
    return workloads.workload_entry(wl, target, trace=path, flows=flows[node], period_s=period,
                                    offset_s=me.index * period / cg.count if wl.distribute == "each" else 0.0,
                                    cells_output=out / "cells.jsonl")


def main(argv: list[str] | None = None) -> int:
    s = load_scenario()
    group = env("TORBED_GROUP")
    node = node_name(group)
    p = plan(s)
    cg = s.clients[group]
    fprs = fingerprints()
    out = Path("/tmp/results")
    out.mkdir(parents=True, exist_ok=True)
    shipper = Shipper(out, env("TORBED_RESULTS_URL")).start()
    cpu = cpusample.start(out, node, group, "client")   # the CPU gate's samples of this pod's processes
    events = RecordWriter(out / "clients.jsonl")
    write_hardware(out, node, group)
    rc = EXIT_FAILED
    try:
        t0 = time.time()
        deadline = t0 + s.measure.ready_timeout.seconds
        ctl = connect_control(deadline)
        online = go_online(ctl, p, node, env("TORBED_RESULTS_URL"), t0, deadline)
        path_nodes = [r.name for g in (cg.path or []) for r in p.group_nodes(g)]
        why = wait_network(ctl, p, fprs, path_nodes, deadline)
        if why is not None:
            log(f"client {node}: network not ready after {s.measure.ready_timeout}: {why}")
            events.write({"client": node, "event": "not_ready", "why": why, "t": time.time(),
                          "variant": variant(), "rep": repetition()})
            return EXIT_FAILED
        ctl.close()
        t_ready = time.time()
        log(f"client {node}: network ready after {t_ready - t0:.1f} s; waiting for the other clients")
        t_work = wait_start(env("TORBED_RESULTS_URL"), node=node, deadline=deadline)
        if t_work is None:
            log(f"client {node}: not every client was ready within {s.measure.ready_timeout}")
            events.write({"client": node, "event": "not_ready", "why": "start barrier timed out",
                          "t": time.time(), "variant": variant(), "rep": repetition()})
            return EXIT_FAILED
        server_group, server_ip, workload = _workload(s, p, group, node, out)
        cfg = workloads.driver_config(
            s, p, client=node, group=group, variant=variant(), rep=repetition(), fingerprints=fprs,
            control={"address": "127.0.0.1", "port": constants.CONTROL_PORT}, socks_port=constants.SOCKS_PORT,
            output=out / "transfers.jsonl", workload=workload, t_work=t_work)
        # The driver's exporter, on the pod address (the chart's scrape annotations and
        # client PodMonitor point at it).
        cfg["metrics"] = {"address": os.environ.get("POD_IP") or "0.0.0.0", "port": constants.DRIVER_METRICS_PORT}
        events.write({"client": node, "event": "ready", "t": t_ready, "ready_s": t_ready - t0,
                      "t_workload": t_work, "t_measure": cfg["t_measure"], "t_end": cfg["t_end"],
                      "server": server_group, "server_address": server_ip, "address": os.environ.get("POD_IP"),
                      **online, "variant": variant(), "rep": repetition()})
        n = driver.run(cfg)
        log(f"client {node}: {n} transfers recorded")
        events.write({"client": node, "event": "done", "t": time.time(), "transfers": n,
                      "variant": variant(), "rep": repetition()})
        rc = EXIT_OK
    finally:
        events.close()
        _stop_sampler(cpu, node)
        if not shipper.stop():
            log(f"client {node}: some records could not be delivered to the results service")
            rc = EXIT_FAILED
    return rc


def _stop_sampler(sampler, node: str) -> None:
    for e in sampler.stop():
        log(f"client {node}: cpu samples: {e}")


def _workload(s, p, group: str, node: str, out: Path) -> tuple[str, str, dict]:
    """(server group, server address, the driver's workload entry) of this client's group."""
    wl = s.clients[group].workload
    server_group = workloads.server_group(s, wl)
    if wl.kind == "replay":
        workload = replay_workload(s, p, group, node, server_group, out)
        return server_group, workload["address"], workload
    sg = s.servers[server_group]
    server_ip = socket.gethostbyname(service_host(server_group))
    with tempfile.TemporaryDirectory(prefix="torbed-files-") as tmp:
        manifest = fileserver.generate_files(Path(tmp), {wl.file: sg.files[wl.file].bytes}, s.seed)
    target = workloads.Target(server=server_group, address=server_ip, ports={"http": sg.port}, manifest=manifest)
    return server_group, server_ip, workloads.workload_entry(wl, target)

if __name__ == "__main__":
    sys.exit(main())
