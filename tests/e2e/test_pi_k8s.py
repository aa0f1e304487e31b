"""Two nodes: the local cluster's own and an emulated Raspberry Pi (`hack/cluster/cluster.sh add-pi`:
a second kubelet, containerd and kube-proxy in their own network namespace with their own pod
CIDR, routes between the nodes, labelled torbed.io/hardware=rpi and tainted NoSchedule; its
images are the arm64 builds of `make images-arm64`, run by qemu-user).

scenarios/hardware-comparison.yaml puts one middle relay on the Pi and the rest of the network
on the main node. One `torbed run` of it (the module's fixture, CI time: issue 44), looked at
from outside while it runs: the Pi's relay carries checksum-verified transfers, its link toward
the guard is shaped across the nodes, its egress outside the release is dropped, no NAT lies
between the nodes; meta.json and the report say which hardware each relay ran on and compare
the two middles' paths. Timings under qemu
are an emulator's, not a Pi's: the test checks what runs where and that it works, not speed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, exec_in, leftovers, listening_outside, records, torbed_run, wait_running

pytestmark = pytest.mark.e2e
SCENARIO = REPO / "scenarios" / "hardware-comparison.yaml"
PI = "torbed-pi"
CLUSTER = ["bash", str(REPO / "hack" / "cluster" / "cluster.sh")]


def kube_nodes() -> list:
    from kubernetes import client
    return client.CoreV1Api().list_node().items


def _pi_leftovers() -> list[str]:
    """What of the Pi node still exists on this machine."""
    found = []
    if Path("/run/netns/torbed-pi").exists():
        found.append("netns torbed-pi")
    if subprocess.run(["ip", "link", "show", "tbpi-host"], capture_output=True).returncode == 0:
        found.append("link tbpi-host")
    found += [str(p) for p in Path("/sys/fs/cgroup").glob("*/torbed-pi")]
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    found += [line.strip() for line in ps.splitlines() if "containerd-pi.toml" in line or "kubelet-pi.yaml" in line
              or "kube-proxy-pi.yaml" in line]
    rules = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True).stdout
    found += [r for r in rules.splitlines() if "CNI-TORBED-NODES" in r]
    return found


@pytest.fixture(scope="module")
def pi(cluster, images):
    if not cluster["local"]:
        pytest.skip("the emulated Pi is a node of hack/cluster/cluster.sh's cluster; KUBECONFIG names another one")
    t0 = time.time()
    # The relay image (tor, the thing on trial) in its arm64 build; the client image (the
    # relay pod's collector and shaper sidecars) stays amd64: qemu-user cannot run tc's
    # rtnetlink requests ("Cannot talk to rtnetlink: Operation not supported").
    b = subprocess.run([sys.executable, "-m", "torbed.images", "--platform", "linux/arm64",
                        "--images", "relay", "--variants", "vanilla"], capture_output=True, text=True, cwd=REPO)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    # The relay under its chart tag and its content tag (what a run installs with): the Pi's
    # containerd stores each without -arm64, where the amd64 nodes have theirs.
    tags = sorted({t for t in re.findall(r"(torbed/[a-z]+:[a-z0-9.-]+-arm64)", b.stdout)})
    assert len(tags) == 2 and "torbed/relay:vanilla-0.1.0-arm64" in tags, b.stdout
    assert any(re.fullmatch(r"torbed/relay:vanilla-0\.1\.0-[0-9a-f]{12}-arm64", t) for t in tags), b.stdout
    tags += [t for t in images if t.startswith("torbed/client:")]
    t_images = time.time() - t0
    add = subprocess.run([*CLUSTER, "add-pi"], capture_output=True, text=True)
    try:
        assert add.returncode == 0, add.stdout[-3000:] + add.stderr[-3000:]
        ld = subprocess.run([*CLUSTER, "load-image", "--node", "pi", *tags], capture_output=True, text=True)
        assert ld.returncode == 0, ld.stdout[-3000:] + ld.stderr[-3000:]
        print(f"arm64 images {t_images:.0f} s; {add.stderr.strip().splitlines()[-1]}; {ld.stderr.strip()}")
        yield {"tags": tags}
    finally:
        rm = subprocess.run([*CLUSTER, "remove-pi"], capture_output=True, text=True)
    # `remove-pi` leaves nothing: checked at teardown, whatever order the tests ran in (it
    # failing shows as an error of this module's last test).
    assert rm.returncode == 0, rm.stdout[-3000:] + rm.stderr[-3000:]
    assert _pi_leftovers() == []
    assert PI not in {n.metadata.name for n in kube_nodes()}


def test_the_pi_node_is_labelled_tainted_and_routed_like_a_joined_pi(kube, pi):
    node = kube.CoreV1Api().read_node(PI)
    labels = node.metadata.labels
    assert labels["torbed.io/hardware"] == "rpi", labels
    assert [(t.key, t.value, t.effect) for t in node.spec.taints or []] == [("torbed.io/hardware", "rpi", "NoSchedule")]
    main = [n for n in kube.CoreV1Api().list_node().items if n.metadata.name != PI]
    assert len(main) == 1 and main[0].spec.pod_cidr != node.spec.pod_cidr, (main[0].spec.pod_cidr, node.spec.pod_cidr)
    # The host routes the Pi's pod CIDR to the Pi's address.
    route = subprocess.run(["ip", "route", "show", node.spec.pod_cidr], capture_output=True, text=True).stdout
    ip = next(a.address for a in node.status.addresses if a.type == "InternalIP")
    assert f"via {ip}" in route, route


def _classes_toward(kube, pod: str, hexip: str) -> tuple[str | None, dict[str, str]]:
    """(the htb class the pod's shaper filters ``hexip`` into, {class id: `tc -s class show` text})."""
    filters = exec_in(kube, pod, "shaper", "tc filter show dev eth0")
    flowid, last = None, None
    for line in filters.splitlines():
        m = re.search(r"flowid (\S+)", line)
        if m:
            last = m.group(1)
        if f"match {hexip}/ffffffff at 16" in line:
            flowid = last
    out, cur = {}, None
    for line in exec_in(kube, pod, "shaper", "tc -s class show dev eth0").splitlines():
        m = re.match(r"class htb (\S+) ", line)
        if m:
            cur = m.group(1)
            out[cur] = ""
        if cur:
            out[cur] += line + "\n"
    return flowid, out


class PiWatch:
    """Looks at the hardware-comparison release while `torbed run` measures it: once the Pi's
    relay (group midarm) and guard0 are ready, where every pod runs, the Pi tor's
    architecture, its egress to an address outside the release and to guard0's ORPort across
    the nodes, guard0's shaper class toward it and the bytes that class sent, and the Pi
    relay's channels (ss). What it saw goes to ``seen``; the tests below judge it. A step that
    raised ends the watch with ``error`` (the steps after it are then missing)."""

    def __init__(self, kube, listener):
        self.kube, self.listener = kube, listener
        self.seen: dict = {}
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _ready(self, group: str):
        pods = self.kube.CoreV1Api().list_namespaced_pod(
            "default", label_selector=f"app.kubernetes.io/component=relay,torbed.io/group={group}").items
        return next((p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
                     and all(c.ready for c in p.status.container_statuses or [])), None)

    def _run(self):
        try:
            deadline = time.time() + 600
            while not self._ready("midarm") and time.time() < deadline:
                time.sleep(2)
            rel = self._ready("midarm").metadata.labels["app.kubernetes.io/instance"]
            for pod in ("guard-0", "guard-1", "exit-0", "exit-1"):
                wait_running(self.kube, f"{rel}-{pod}")
            self._look(rel)
        except Exception as e:   # judged by the tests: the steps after this one are missing
            self.error = repr(e)

    def _look(self, rel: str):
        seen, kube = self.seen, self.kube
        seen["release"] = rel
        pods = {x.metadata.name: x for x in kube.CoreV1Api().list_namespaced_pod(
            "default", label_selector=f"app.kubernetes.io/instance={rel}").items}
        seen["nodes"] = {n: x.spec.node_name for n, x in pods.items()}
        mid = f"{rel}-midarm-0"
        seen["uname"] = exec_in(kube, mid, "tor", "uname -m").strip()
        # Isolation on the Pi: the outside address is dropped, the guard on the other node is
        # reachable on its ORPort (pod to pod across the nodes, not NATed).
        host, port, accepted = self.listener
        n = len(accepted)
        seen["outside"] = exec_in(kube, mid, "tor", f'timeout 5 bash -c "exec 3<>/dev/tcp/{host}/{port}" '
                                                    f'&& echo CONNECTED || echo BLOCKED').strip()
        seen["outside_accepted"] = len(accepted) - n
        guard_ip = pods[f"{rel}-guard-0"].status.pod_ip
        seen["guard_orport"] = exec_in(kube, mid, "tor", f'timeout 5 bash -c "exec 3<>/dev/tcp/{guard_ip}/5000" '
                                                         f'&& echo CONNECTED || echo BLOCKED').strip()
        # Shaping across the nodes: the class guard0's shaper sends the Pi relay's address into,
        # and the bytes it sent (polled until 100 kB: the workload's circuits through the Pi).
        midarm_ip = pods[mid].status.pod_ip
        hexip = "".join(f"{int(o):02x}" for o in midarm_ip.split("."))
        flowid, classes = _classes_toward(kube, f"{rel}-guard-0", hexip)
        seen["class"] = (midarm_ip, flowid, classes.get(flowid, ""))
        deadline, sent = time.time() + 90, 0
        while time.time() < deadline and sent < 100_000:
            time.sleep(3)
            sent = int(re.search(r"Sent (\d+) bytes", _classes_toward(kube, f"{rel}-guard-0", hexip)[1][flowid]).group(1))
        seen["class_sent"] = sent
        # The peers of the Pi relay's ORPort, and its channels in either direction (which side
        # opened the guard <-> Pi channel depends on which relay extended a circuit first).
        seen["release_ips"] = {x.status.pod_ip for n, x in pods.items() if n != mid}
        seen["guard_ips"] = {pods[f"{rel}-guard-{i}"].status.pod_ip for i in range(2)}
        seen["incoming"] = exec_in(kube, mid, "shaper", "ss -Htn state established '( sport = :5000 )'")
        either = "ss -Htn state established '( sport = :5000 or dport = :5000 )'"
        seen["both"] = exec_in(kube, mid, "shaper", either)
        # The exits' channel with the Pi relay, either direction too: the Pi relay's extends run
        # under qemu-user (ntor handshakes emulated), so it may come some seconds after the
        # guard's first 100 kB: polled, not read once.
        deadline, exits = time.time() + 90, ""
        while time.time() < deadline:
            exits = "".join(exec_in(kube, f"{rel}-exit-{i}", "shaper", either) for i in range(2))
            if f"{midarm_ip}:" in exits:
                break
            time.sleep(3)
        seen["exits"] = exits

    def close(self):
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def comparison(kube, pi, tmp_path_factory):
    """One `torbed run` of scenarios/hardware-comparison.yaml across the main node and the Pi,
    watched while it runs (PiWatch): {'p', 'run_dir', 'watch', 'tmp'}."""
    tmp = tmp_path_factory.mktemp("hardware")
    with listening_outside() as listener:
        watch = PiWatch(kube, listener)
        p, run_dir = torbed_run(tmp, SCENARIO, "--repetitions", "1", "--duration", "60s")
        watch.close()
    return {"p": p, "run_dir": run_dir, "watch": watch, "tmp": tmp}


def _seen(comparison, *keys):
    w = comparison["watch"]
    missing = [k for k in keys if k not in w.seen]
    assert not missing, f"not seen while the run went on: {missing}; watch error: {w.error}"
    return [w.seen[k] for k in keys]


def test_the_pi_relay_runs_on_the_pi_as_arm64_and_the_rest_on_the_main_node(comparison):
    rel, nodes, uname = _seen(comparison, "release", "nodes", "uname")
    assert nodes[f"{rel}-midarm-0"] == PI
    assert all(v != PI for n, v in nodes.items() if n != f"{rel}-midarm-0"), nodes
    assert uname == "aarch64", uname   # the arm64 build, run by qemu-user


def test_the_pi_relays_egress_leaves_the_release_only_to_its_peers(comparison):
    outside, accepted, orport = _seen(comparison, "outside", "outside_accepted", "guard_orport")
    assert outside == "BLOCKED" and accepted == 0, (outside, accepted)
    assert orport == "CONNECTED", orport


def test_the_link_to_the_pi_is_shaped_across_the_nodes_and_carries_the_traffic(comparison):
    """guard0's shaper sends what goes to the Pi relay's pod address through its 8 Mbit/s
    class (the scenario's guard-midarm link), and traffic to the Pi goes through it."""
    (midarm_ip, flowid, cls), sent = _seen(comparison, "class", "class_sent")
    assert flowid and "rate 8Mbit" in cls, (midarm_ip, flowid, cls)
    assert sent >= 100_000, sent


def test_no_nat_between_the_nodes_either_way(comparison):
    """Every peer of the Pi relay's ORPort is the pod address of a pod of this release on the
    other node (a NAT would show a node address); it has a channel with a guard and with an
    exit (either direction: an exit that first reached the Pi relay holds the one it opened)."""
    rel, release_ips, guards, incoming, both, exits, (midarm_ip, _, _) = _seen(
        comparison, "release", "release_ips", "guard_ips", "incoming", "both", "exits", "class")
    peers = {line.split()[-1].rsplit(":", 1)[0] for line in incoming.splitlines() if line.strip()}
    assert peers and peers <= release_ips, (peers, release_ips, incoming)
    assert any(f"{g}:" in both for g in guards), (guards, both)
    assert f"{midarm_ip}:" in exits, (midarm_ip, exits)


def _report(run_dir: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "torbed.cli", "report", str(run_dir), "--json"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return (run_dir / "report" / "report.md").read_text()


def test_hardware_comparison_runs_across_the_main_node_and_the_pi_and_the_report_compares_them(kube, comparison):
    p, run_dir, tmp_path = comparison["p"], comparison["run_dir"], comparison["tmp"]
    assert p.returncode == 0 and run_dir, p.stdout[-4000:] + p.stderr[-4000:]
    rep = run_dir / "vanilla" / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    assert meta["status"] == "ok", meta
    assert leftovers(kube, meta["release"]) == []
    where = {n["name"]: n.get("k8s_node") for n in meta["nodes"]}
    assert where["midarm0"] == PI and all(v != PI for k, v in where.items() if k != "midarm0"), where
    hw = meta["hardware"][PI]
    assert hw["labels"].get("torbed.io/hardware") == "rpi" and "midarm0" in hw["ran"], hw
    assert hw["pod_arch"] == "aarch64" and hw["emulated"] is True, hw
    main = next(h for name, h in meta["hardware"].items() if name != PI)
    assert main["pod_arch"] == "x86_64" and main["emulated"] is False, main
    transfers = records(rep / "transfers.jsonl")
    ok = {t["client"] for t in transfers if t["status"] == "ok"}
    assert {"bulkarm0", "bulkarm1", "webarm0", "bulkamd0", "bulkamd1", "webamd0"} <= ok, sorted(ok)
    assert not [t for t in transfers if (t.get("error") or {}).get("cause") == "checksum"]
    bw = {r["relay"] for r in records(rep / "relay_bw.jsonl")}
    assert {"midarm0", "midamd0"} <= bw, bw
    md = _report(run_dir)
    assert PI in md and "emulated" in md, md[:3000]
    # The CPU gate (torbed.pods.cpusample): every relay and client pod sampled its processes.
    # On this 2-core machine the emulated Pi's qemu-user tor and the guard beside it can wait
    # for a CPU (seen: 21% and 14% of the window), and the gate then rejects the repetition:
    # the report withholds every statistic of it and says why. The comparison itself is then
    # checked on the same records with the gate's verdict set aside (a copy whose meta.json
    # has no gates: "not judged, used as they are").
    gates = json.loads((rep / "meta.json").read_text())["gates"]
    assert {"midarm0", "midamd0", "guard0", "webarm0.driver"} <= set(gates["cpu"]["processes"]), gates["cpu"]
    print(f"mechanism gates on this machine: valid {gates['valid']} {gates['invalid_reasons']}")
    if not gates["valid"]:
        assert "excluded from every statistic below" in md and gates["invalid_reasons"][0] in md
        ungated = tmp_path / "ungated"
        shutil.copytree(run_dir, ungated, symlinks=True, ignore=shutil.ignore_patterns("report"))
        for meta_file in ungated.glob("*/rep-*/meta.json"):
            m = json.loads(meta_file.read_text())
            m.pop("gates", None)
            meta_file.write_text(json.dumps(m))
        _report(ungated)
        run_dir = ungated
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    by_hw = summary["by_hardware"]
    print(json.dumps(by_hw, indent=1)[:3000])
    assert set(by_hw["hardware"]) == {"amd64", "arm64/rpi (emulated)"}, by_hw["hardware"]
    assert by_hw["client_groups"]["webarm"] == "amd64 + arm64/rpi (emulated)", by_hw["client_groups"]
    ttlb = [c for c in by_hw["comparisons"] if c["metric"] == "ttlb_s" and c["file"] == "bulk"]
    assert ttlb and len(ttlb[0]["arms"]) == 2, by_hw["comparisons"]
