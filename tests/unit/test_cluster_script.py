"""hack/cluster/cluster.sh's process helpers, sourced without running a command.

The cold-machine failure "etcd exited while waiting for etcd healthy" came from reading a
daemon's /proc/PID/cmdline before the forked shell had exec'd it: `start` must return only
once the recorded pid is the daemon itself, so the liveness check cannot call it dead.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _harness(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    # Everything but the last line (`main "$@"`), then the test's own commands.
    script = (ROOT / "hack/cluster/cluster.sh").read_text().rsplit("\nmain \"$@\"", 1)[0]
    script = script.replace('HERE=$(cd "$(dirname "$0")" && pwd)', f"HERE={ROOT / 'hack' / 'cluster'}", 1)
    slow = tmp_path / "slow-exec.sh"
    # Stands in for a daemon whose exec is slow on a cold machine: until it execs, its
    # command line is this script's, not the daemon's.
    slow.write_text("sleep 0.6\nexec sleep 4321\n")
    harness = tmp_path / "harness.sh"
    harness.write_text(script + textwrap.dedent(f"""
        PIDS={tmp_path}/pids LOGS={tmp_path}/logs
        bin_of() {{ echo "sleep 4321"; }}
        {body}
        """))
    return subprocess.run(["bash", str(harness)], capture_output=True, text=True, timeout=30)


def test_start_returns_once_the_daemon_has_execd(tmp_path):
    p = _harness(tmp_path, f"""
        start fake bash {tmp_path}/slow-exec.sh
        if pid=$(pid_of fake); then echo "alive $pid"; else echo dead; fi
        kill "$(cat $PIDS/fake.pid)"
        """)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("alive "), p.stdout + p.stderr


def test_start_returns_at_once_when_the_command_dies(tmp_path):
    p = _harness(tmp_path, """
        SECONDS=0
        start fake false
        echo "took $SECONDS"
        pid_of fake || echo gone
        """)
    assert p.returncode == 0, p.stderr
    assert "gone" in p.stdout
    # It noticed the exit instead of waiting out its 5 s for an exec that never comes (that
    # path logs "has not exec'd"); the time is only a loose bound: on a loaded machine each of
    # the loop's probes forks, and `SECONDS` counts whole seconds (it took 3 once in CI).
    assert "has not exec'd" not in p.stderr, p.stderr
    took = int(p.stdout.split("took ")[1].split()[0])
    assert took < 5, p.stdout


def test_the_pi_node_gets_its_own_runtime_state_cgroups_and_labels(tmp_path):
    # The Pi's configuration is derived from the main node's: none of its runtime paths may
    # stay the main node's (two containerds on one root or socket corrupt each other's state,
    # two kubelets on one pod log directory delete each other's logs).
    p = _harness(tmp_path, f"""
        STATE={tmp_path}/state RUN={tmp_path}/run CONF={tmp_path}/state/config PKI={tmp_path}/state/pki
        CTRD_SOCK=$RUN/containerd/containerd.sock
        . {ROOT}/hack/cluster/pi.sh
        mkdir -p $PKI && for f in ca kubelet-client-pi kube-proxy; do echo x > $PKI/$f.crt; echo x > $PKI/$f.key; done
        write_configs node0 10.0.0.5
        pi_configs 10.0.0.5
        echo "---containerd"; cat $CONF/containerd-pi.toml
        echo "---kubelet"; cat $CONF/kubelet-pi.yaml
        echo "---proxy"; cat $CONF/kube-proxy-pi.yaml
        echo "---kubeconfig"; cat $STATE/kubeconfigs/kubelet-pi
        echo "---cni"; cni_conflist $STATE/pi/cni/net.d 10.244.1.0/24 $STATE/pi/cni/ipam; cat $STATE/pi/cni/net.d/10-torbed.conflist
        """)
    assert p.returncode == 0, p.stderr
    parts = dict(s.split("\n", 1) for s in p.stdout.split("---")[1:])
    ctrd, kubelet, proxy, kcfg, cni = (parts[k] for k in ("containerd", "kubelet", "proxy", "kubeconfig", "cni"))
    state, run = f"{tmp_path}/state", f"{tmp_path}/run"
    assert f'root = "{state}/pi/containerd/root"' in ctrd and f'state = "{run}/pi/containerd/state"' in ctrd
    assert f'address = "{run}/pi/containerd/containerd.sock"' in ctrd
    assert f'conf_dir = "{state}/pi/cni/net.d"' in ctrd and f"{state}/containerd/" not in ctrd
    assert f"unix://{run}/pi/containerd/containerd.sock" in kubelet and "kubelet-serving-pi.crt" in kubelet
    assert "cgroupRoot: /torbed-pi" in kubelet and f'podLogsDir: "{state}/pi/pod-logs"' in kubelet
    assert "{key: torbed.io/hardware, value: rpi, effect: NoSchedule}" in kubelet
    assert 'hostnameOverride: "torbed-pi"' in proxy and "kubeconfigs/kube-proxy-pi" in proxy
    assert "server: https://10.0.0.5:6443" in kcfg
    assert '"subnet": "10.244.1.0/24"' in cni and '"ipMasq": false' in cni and f"{state}/pi/cni/ipam" in cni


def test_a_component_that_exits_while_awaited_leaves_its_log_tail_in_the_error(tmp_path):
    # CI keeps only the output: the reason a daemon died must be in it, from its latest start
    # only (the log file keeps earlier starts' lines too).
    p = _harness(tmp_path, """
        mkdir -p $LOGS && printf 'an earlier start said this\\n' > $LOGS/fake.log
        TIMEOUT=20
        start fake bash -c 'echo "cannot preallocate the WAL: no space left on device"; exit 1'
        wait_for "fake healthy" $LOGS/fake.log fake false
        """)
    assert p.returncode == 1
    assert "fake exited while waiting for fake healthy" in p.stderr, p.stderr
    assert "  | cannot preallocate the WAL: no space left on device" in p.stderr, p.stderr
    assert "an earlier start said this" not in p.stderr, p.stderr


def test_load_image_drops_other_builds_of_each_content_tag_it_loads(tmp_path):
    # The image store survives `down`; without this it holds every build since the cluster was
    # made. Only other digests of the same image (and architecture suffix) go.
    store = ["docker.io/torbed/relay:vanilla-0.1.0-aaaaaaaaaaaa", "docker.io/torbed/relay:vanilla-0.1.0-bbbbbbbbbbbb",
             "docker.io/torbed/relay:vanilla-0.1.0-cccccccccccc-arm64", "docker.io/torbed/relay:ewma-0.1.0-dddddddddddd",
             "docker.io/torbed/relay:vanilla-0.1.0", "registry.k8s.io/pause:3.10"]
    p = _harness(tmp_path, f"""
        STATE={tmp_path}/state; mkdir -p $STATE/loaded $LOGS
        touch $STATE/loaded/torbed_relay_vanilla-0.1.0-aaaaaaaaaaaa $STATE/loaded/torbed_relay_ewma-0.1.0-dddddddddddd
        ctr_() {{ if [ "$1 $2" = "images ls" ]; then printf '%s\\n' {' '.join(store)}; else echo "ctr $*"; fi; }}
        drop_superseded torbed/relay:vanilla-0.1.0-bbbbbbbbbbbb torbed/relay:vanilla-0.1.0
        cat $LOGS/images.log; ls $STATE/loaded
        """)
    assert p.returncode == 0, p.stderr
    assert "ctr images rm docker.io/torbed/relay:vanilla-0.1.0-aaaaaaaaaaaa\n" in p.stdout, p.stdout
    assert p.stdout.count("ctr ") == 1          # not the arm64 build, not ewma, not the plain tag
    assert "torbed_relay_vanilla-0.1.0-aaaaaaaaaaaa" not in p.stdout and "torbed_relay_ewma" in p.stdout


def test_a_short_disk_empties_the_image_store_before_refusing(tmp_path):
    p = _harness(tmp_path, f"""
        STATE={tmp_path}/state; mkdir -p $STATE/containerd/root/io.containerd $STATE/loaded
        MIN_FREE_MB=1 check_disk && echo "enough: kept $(ls $STATE/containerd/root)"
        MIN_FREE_MB=999999999 check_disk
        """)
    assert p.returncode == 1
    assert "enough: kept io.containerd" in p.stdout, p.stdout
    assert "emptying the cluster's image store" in p.stderr and "not enough disk space" in p.stderr, p.stderr
    assert not (tmp_path / "state" / "containerd" / "root").exists() and not (tmp_path / "state" / "loaded").exists()
