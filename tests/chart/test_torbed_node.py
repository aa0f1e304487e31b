"""The chart's pods start tor with torbed-node (images/common/torbed-node). Here it runs on
the host against what the chart and the keygen hook really produce: the ConfigMap data of
`helm template` and the keys of torbed.pods.keygen, with the authorities' Service names
resolved through NSS (a private /etc/hosts in a mount namespace), and the torrc it writes
must pass `tor --verify-config` with the real tor, for every role."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_chart import tool_env  # noqa: E402 (tests/chart is on sys.path under pytest)

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "images" / "common" / "torbed-node"
SCENARIO = REPO / "scenarios" / "quickstart.yaml"
VARIANT = "ewma-66"   # config-only: the stock tor on this machine accepts its torrc


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    bin_dir, env = tool_env()
    root = tmp_path_factory.mktemp("release")
    out = subprocess.run([str(Path(bin_dir) / "helm"), "template", "tb", str(REPO / "charts" / "torbed"),
                          "-f", str(SCENARIO), "--set", f"variant={VARIANT}", "--namespace", "lab",
                          "--set", "load.workers=1"],   # background load: its load nodes' tor too
                         capture_output=True, text=True, env=env, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    cm = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    etc = root / "etc"
    (etc / "torrc").mkdir(parents=True)
    for name, text in cm["tb-torrc"].items():
        (etc / "torrc" / name).write_text(text)
    scenario_json = cm["tb-scenario"]["scenario.json"]
    # What the keygen hook would store, made by its own code.
    sys.path.insert(0, str(REPO))
    from torbed.pods import keygen
    import os
    old = {k: os.environ.get(k) for k in ("TORBED_SCENARIO_JSON", "TORBED_VARIANT")}
    os.environ.update(TORBED_SCENARIO_JSON=scenario_json, TORBED_VARIANT=VARIANT)
    try:
        secret, identities = keygen.make(root / "keygen")
        keygen.schedule(identities, 1795540000.0)     # the authorities' voting offset, as the hook adds it
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    (etc / "keys").mkdir()
    for name, b64 in secret.items():
        (etc / "keys" / name).write_bytes(base64.b64decode(b64))
    (etc / "identities").mkdir()
    for name, text in identities.items():
        (etc / "identities" / name).write_text(text)
    hosts = root / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(
        f"127.77.0.{10 + i} tb-auth-{i}.lab.svc.cluster.local\n" for i in range(3)))
    # Pods carry the statefulset/job env the chart renders; take TORBED_FRAGMENTS from there.
    frags = {}
    for d in docs:
        if d["kind"] in ("StatefulSet", "Job", "Deployment") and "template" in d.get("spec", {}):
            spec = d["spec"]["template"]["spec"]
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                e = {x["name"]: x.get("value") for x in c.get("env", [])}
                if c["name"] == "tor":
                    frags[e["TORBED_GROUP"]] = e["TORBED_FRAGMENTS"]
    return {"root": root, "etc": etc, "hosts": hosts, "fprs": json.loads(identities["fingerprints.json"]),
            "frags": frags}


def run_node(rel, role, group, pod, index=None, verify=True, extra_env=None):
    data = rel["root"] / f"data-{pod}"
    run = rel["root"] / f"run-{pod}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TORBED_ROLE": role, "TORBED_GROUP": group,
           "TORBED_FRAGMENTS": rel["frags"][group], "TORBED_RELEASE": "tb", "TORBED_NAMESPACE": "lab",
           "POD_NAME": pod, "POD_IP": "10.244.0.7", "TORBED_ETC": str(rel["etc"]),
           "TORBED_DATA": str(data), "TORBED_RUN": str(run), "TORBED_VERIFY": "1" if verify else "0",
           "TORBED_RESOLVE_TIMEOUT": "3"}
    if index is not None:
        env["TORBED_INDEX"] = str(index)
    env.update(extra_env or {})
    # NSS resolution of the Service names, as in a pod, from a private /etc/hosts.
    cmd = ["unshare", "--mount", "--", "sh", "-c", f'mount --bind "{rel["hosts"]}" /etc/hosts && exec "{NODE}"']
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    torrc = (run / "torrc").read_text() if (run / "torrc").exists() else ""
    dirauth = run / "dirauthorities.torrc"
    return proc, torrc + (dirauth.read_text() if dirauth.exists() else ""), data


@pytest.mark.integration
@pytest.mark.parametrize("role,group,pod,index,nick", [
    ("authority", "authority", "tb-auth-1", None, "auth1"),
    ("relay", "middle", "tb-middle-0", None, "middle0"),
    ("relay", "exit", "tb-exit-0", None, "exit0"),
    ("client", "bulk", "tb-bulk-1-x7f2q", 1, "bulk1"),
    ("loadworker", "load", "tb-load-7d9f8c6b5-x7f2q", None, "loadx7f2q"),
])
def test_torrc_of_every_role_passes_tor_verify_config(release, role, group, pod, index, nick):
    proc, torrc, data = run_node(release, role, group, pod, index)
    assert proc.returncode == 0, proc.stdout + proc.stderr + torrc
    assert f"Nickname {nick}\n" in torrc
    for i in range(3):
        assert f"127.77.0.{10 + i}:7000 {release['fprs'][f'auth{i}']}" in torrc
    if role == "authority":
        assert "Address 127.77.0.11\n" in torrc            # its own Service's address
        assert "vote.torrc" in torrc
        # The keygen hook's voting offset overrides common.torrc's 0 in the tor that runs.
        offset = json.loads((release["etc"] / "identities" / "schedule.json").read_text())["voting_offset_s"]
        dump = subprocess.run(["tor", "--dump-config", "short", "-f", str(release["root"] / f"run-{pod}" / "torrc"),
                               "--defaults-torrc", "/dev/null"], capture_output=True, text=True, timeout=60)
        assert f"TestingV3AuthVotingStartOffset {offset}\n" in dump.stdout, dump.stdout[-3000:] + dump.stderr
    if role == "relay":
        assert "Address 10.244.0.7\n" in torrc and f"%include {release['etc']}/torrc/group-{group}.torrc\n" in torrc
    if role == "loadworker":
        # Each Locust user's own SOCKS credentials get their own circuits; the Python side
        # (torbed.pods.locust) names the node as torbed-node does.
        assert "SocksPort 127.0.0.1:9050 IsolateSOCKSAuth\n" in torrc
        import os
        from unittest import mock
        from torbed.pods import locust
        with mock.patch.dict(os.environ, {"POD_NAME": pod}):
            assert locust.node() == nick
    elif role != "client":
        # Its identity is the one the keygen hook published.
        key = (data / "keys" / "secret_id_key").read_bytes()
        assert key == (release["etc"] / "keys" / f"{nick}.secret_id_key").read_bytes()


@pytest.mark.integration
def test_client_can_start_offline(release):
    """The chart's client Jobs start tor with its network off; the driver turns it on once
    the directory guards can answer (torbed.pods.bringup)."""
    proc, torrc, _ = run_node(release, "client", "bulk", "tb-bulk-0-x7f2q", 0, extra_env={"TORBED_START_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr + torrc
    assert "DisableNetwork 1\n" in torrc
    proc, torrc, _ = run_node(release, "client", "bulk", "tb-bulk-0-x7f2q", 0)
    assert proc.returncode == 0 and "DisableNetwork" not in torrc


@pytest.mark.integration
def test_unresolvable_authority_fails_with_a_clear_message(release, tmp_path):
    rel = dict(release, hosts=tmp_path / "hosts")
    rel["hosts"].write_text("127.0.0.1 localhost\n")
    proc, _, _ = run_node(rel, "relay", "middle", "tb-middle-0")
    assert proc.returncode == 2
    assert "cannot resolve tb-auth-0.lab.svc.cluster.local" in proc.stderr


@pytest.mark.integration
def test_relay_waits_for_the_authorities_and_says_which_one_is_missing(release):
    """Without TORBED_VERIFY a relay starts tor only once every authority's DirPort accepts
    connections (its one descriptor upload would be lost otherwise); none listens here."""
    proc, _, _ = run_node(release, "relay", "middle", "tb-middle-0", verify=False)
    assert proc.returncode == 2
    assert "authority 127.77.0.10:7000 not accepting connections after 3s" in proc.stderr
