"""Two nodes: the local cluster's own and an emulated Raspberry Pi (`hack/cluster/cluster.sh add-pi`:
a second kubelet, containerd and kube-proxy in their own network namespace with their own pod
CIDR, routes between the nodes, labelled torbed.io/hardware=rpi and tainted NoSchedule; its
images are the arm64 builds of `make images-arm64`, run by qemu-user).

scenarios/hardware-comparison.yaml puts one middle relay on the Pi and the rest of the network
on the main node: the Pi's relay carries checksum-verified transfers, its link toward the guard
is shaped across the nodes, its egress outside the release is dropped, meta.json and the report
say which hardware each relay ran on and compare the two middles' paths. Timings under qemu
are an emulator's, not a Pi's: the test checks what runs where and that it works, not speed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ISOLATE, REPO, exec_in, records, torbed_run, uninstall, wait_running

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


def test_a_relay_group_on_the_emulated_pi_carries_traffic_shaped_and_isolated_across_nodes(
        kube, helm, pi, outside_listener, tmp_path):
    host, port, accepted = outside_listener
    rel = "pi"
    p = subprocess.run([helm["bin"], "install", rel, str(REPO / "charts" / "torbed"), "-f", str(SCENARIO),
                        "--set", ISOLATE, "--set", "measure.duration=30s", "--timeout", "300s"],
                       capture_output=True, text=True, env=helm["env"])
    try:
        assert p.returncode == 0, p.stderr
        wait_running(kube, f"{rel}-midarm-0")
        wait_running(kube, f"{rel}-guard-0")
        pods = {x.metadata.name: x for x in kube.CoreV1Api().list_namespaced_pod(
            "default", label_selector=f"app.kubernetes.io/instance={rel}").items}
        assert pods[f"{rel}-midarm-0"].spec.node_name == PI
        assert all(x.spec.node_name != PI for n, x in pods.items() if n != f"{rel}-midarm-0"), \
            {n: x.spec.node_name for n, x in pods.items()}
        # The Pi's tor is the arm64 build, run by qemu-user.
        out = exec_in(kube, f"{rel}-midarm-0", "tor", "uname -m")
        assert out.strip() == "aarch64", out
        # Isolation on the Pi: the outside address is dropped, the guard on the other node is
        # reachable on its ORPort (pod to pod across the nodes, not NATed).
        probe = f'timeout 5 bash -c "exec 3<>/dev/tcp/{host}/{port}" && echo CONNECTED || echo BLOCKED'
        n = len(accepted)
        out = exec_in(kube, f"{rel}-midarm-0", "tor", probe)
        assert "BLOCKED" in out and len(accepted) == n, out
        guard_ip = pods[f"{rel}-guard-0"].status.pod_ip
        out = exec_in(kube, f"{rel}-midarm-0", "tor",
                    f'timeout 5 bash -c "exec 3<>/dev/tcp/{guard_ip}/5000" && echo CONNECTED || echo BLOCKED')
        assert "CONNECTED" in out, out
        # Shaping across the nodes: the guard's shaper sends what goes to the Pi relay's pod
        # address through its 8 Mbit/s class (the scenario's guard-midarm link)...
        midarm_ip = pods[f"{rel}-midarm-0"].status.pod_ip
        hexip = "".join(f"{int(o):02x}" for o in midarm_ip.split("."))
        flowid, classes = _classes_toward(kube, f"{rel}-guard-0", hexip)
        assert flowid and "rate 8Mbit" in classes.get(flowid, ""), (midarm_ip, flowid, classes)
        # ...and traffic to the Pi goes through it.
        deadline = time.time() + 90
        sent = 0
        while time.time() < deadline and sent < 100_000:
            time.sleep(3)
            sent = int(re.search(r"Sent (\d+) bytes", _classes_toward(kube, f"{rel}-guard-0", hexip)[1][flowid]).group(1))
        assert sent >= 100_000, sent
        # No NAT between the nodes, either way. Every peer of the Pi relay's ORPort is the pod
        # address of a pod of this release on the other node (a NAT would show a node address).
        # Which side opened the guard <-> Pi channel depends on which relay extended a circuit
        # first (a guard can be a middle hop too), so the channel to a guard is looked for in
        # either direction, with the guard's own pod address.
        incoming = "ss -Htn state established '( sport = :5000 )'"
        guards = {pods[f"{rel}-guard-{i}"].status.pod_ip for i in range(2)}
        release_ips = {x.status.pod_ip for n, x in pods.items() if n != f"{rel}-midarm-0"}
        seen = exec_in(kube, f"{rel}-midarm-0", "shaper", incoming)
        peers = {line.split()[-1].rsplit(":", 1)[0] for line in seen.splitlines() if line.strip()}
        assert peers and peers <= release_ips, (peers, release_ips, seen)
        both = exec_in(kube, f"{rel}-midarm-0", "shaper",
                     "ss -Htn state established '( sport = :5000 or dport = :5000 )'")
        assert any(f"{g}:" in both for g in guards), (guards, both)
        # The exits' channel with the Pi relay, either direction too: an exit that first reached
        # the Pi relay itself (as a middle of another circuit, or for its own directory
        # fetches) holds the channel it opened, and tor then reuses it for extends from the Pi.
        # The Pi relay's extends run under qemu-user (ntor handshakes emulated), so its channel
        # to an exit may come some seconds after the guard's first 100 kB: polled, not read once.
        either = "ss -Htn state established '( sport = :5000 or dport = :5000 )'"
        deadline, seen = time.time() + 90, ""
        while time.time() < deadline:
            seen = "".join(exec_in(kube, f"{rel}-exit-{i}", "shaper", either) for i in range(2))
            if f"{midarm_ip}:" in seen:
                break
            time.sleep(3)
        assert f"{midarm_ip}:" in seen, (midarm_ip, seen)
    finally:
        left = uninstall(kube, helm, rel)
    assert left == []


def _report(run_dir: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "torbed.cli", "report", str(run_dir), "--json"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return (run_dir / "report" / "report.md").read_text()


def test_hardware_comparison_runs_across_the_main_node_and_the_pi_and_the_report_compares_them(kube, pi, tmp_path):
    p, run_dir = torbed_run(tmp_path, SCENARIO, "--repetitions", "1", "--duration", "60s")
    assert p.returncode == 0 and run_dir, p.stdout[-4000:] + p.stderr[-4000:]
    rep = run_dir / "vanilla" / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    assert meta["status"] == "ok", meta
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
