"""Which hardware a run ran on: the CPU model (provenance.cpu_model), Kubernetes pod
placement (backends.k8s._pod_is) and the report's hardware table from meta.json."""

from __future__ import annotations

import json

from torbed.backends.k8s.backend import _pod_is
from torbed.provenance import cpu_model, host_info

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz
flags\t\t: fpu aes
"""
# A Raspberry Pi 3B+ under a 64-bit kernel: no "model name", the board in "Model".
PI = """processor\t: 0
BogoMIPS\t: 38.40
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU part\t: 0xd03

Revision\t: a020d3
Model\t\t: Raspberry Pi 3 Model B Plus Rev 1.3
"""


def test_cpu_model_of_a_server_and_of_a_pi():
    assert cpu_model(X86) == "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz"
    assert cpu_model(PI) == "Raspberry Pi 3 Model B Plus Rev 1.3"
    assert cpu_model("processor\t: 0\n") is None


def test_this_host_records_its_cpu_model():
    assert host_info()["cpu_model"] == cpu_model()


def test_statefulset_pods_map_to_their_torbed_nodes():
    assert _pod_is("rel-middle-0", "rel", {"name": "middle0"})
    assert _pod_is("rel-auth-2", "rel", {"name": "auth2"})
    assert not _pod_is("rel-middle-1", "rel", {"name": "middle0"})
    assert not _pod_is("other-middle-0", "rel", {"name": "middle0"})


def test_the_report_lists_the_kubernetes_nodes_and_what_ran_there(tmp_path):
    from torbed.analysis.report import report
    run = tmp_path / "run"
    rep = run / "vanilla" / "rep-0"
    rep.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({
        "name": "hw", "variants": ["vanilla"], "baseline": "vanilla", "repetitions": 1, "seed": 1,
        "backend": "k8s", "status": "ok", "scenario": {"name": "hw"}}))
    hw = {"pi-1": {"arch": "arm64", "cpu_model": "Raspberry Pi 3 Model B Plus Rev 1.3", "cpus": "4",
                   "memory": "944Mi", "labels": {"torbed.io/hardware": "rpi"}, "ran": ["middle0"]},
          "server": {"arch": "amd64", "cpu_model": "Intel Xeon", "cpus": "2", "memory": "24Gi", "labels": {},
                     "ran": ["auth0", "guard0"]}}
    (rep / "meta.json").write_text(json.dumps({"status": "ok", "hardware": hw, "nodes": []}))
    (rep / "transfers.jsonl").write_text("")
    summary = report(run)
    assert summary["run"]["hardware"]["pi-1"]["ran"] == ["middle0"]
    text = (run / "report" / "report.md").read_text()
    assert "Raspberry Pi 3 Model B Plus Rev 1.3" in text and "torbed.io/hardware=rpi" in text
    assert "auth0, guard0" in text


class _Cluster:
    """The two things _record_hardware asks the API: the release's pods and the nodes."""

    def __init__(self, kubelet_arch: dict[str, str]):
        self.kubelet_arch = kubelet_arch

    def pods(self, release):
        return []

    def node_hardware(self, names):
        return {n: {"arch": self.kubelet_arch[n], "labels": {}} for n in names}


def _hardware(tmp_path, records: list[dict]) -> dict:
    from types import SimpleNamespace

    from torbed.backends.k8s.backend import _record_hardware
    (tmp_path / "hardware.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rep = SimpleNamespace(dir=tmp_path, meta={"nodes": [{"name": r["node"]} for r in records]})
    _record_hardware(_Cluster({"main": "amd64", "pi": "amd64"}), "rel", rep)
    return rep.meta["hardware"]


def test_an_emulated_relay_is_recorded_by_its_tors_architecture(tmp_path):
    hw = _hardware(tmp_path, [
        {"node": "midarm0", "k8s_node": "pi", "arch": "x86_64", "tor_arch": "aarch64"},
        {"node": "web0", "k8s_node": "main", "arch": "x86_64"},
    ])
    assert hw["pi"]["pod_arch"] == "aarch64" and hw["pi"]["emulated"] is True
    assert hw["main"]["pod_arch"] == "x86_64" and hw["main"]["emulated"] is False


def test_a_relay_whose_tor_never_said_is_unknown_not_the_collectors_architecture(tmp_path):
    # The collector sidecar runs natively (x86_64) beside an arm64 tor under qemu that had not
    # written its architecture yet; a native client on the same node is no answer for tor either.
    hw = _hardware(tmp_path, [
        {"node": "midarm0", "k8s_node": "pi", "arch": "x86_64", "tor_arch": "unknown"},
        {"node": "webarm0", "k8s_node": "pi", "arch": "x86_64"},
    ])
    assert hw["pi"]["pod_arch"] == "unknown" and hw["pi"]["emulated"] is None


def test_the_collector_waits_for_tors_answer_and_says_unknown_without_one(tmp_path, monkeypatch):
    import threading
    import time

    from torbed.pods import write_hardware
    monkeypatch.setenv("NODE_NAME", "pi")
    monkeypatch.setenv("TORBED_VARIANT", "vanilla")
    machine = tmp_path / "machine"
    t = threading.Thread(target=write_hardware, args=(tmp_path, "midarm0", "midarm", machine))
    t.start()
    time.sleep(0.5)
    assert not (tmp_path / "hardware.jsonl").exists(), "wrote before tor said"
    machine.write_text("aarch64\n")
    t.join(timeout=10)
    assert json.loads((tmp_path / "hardware.jsonl").read_text())["tor_arch"] == "aarch64"
    (tmp_path / "hardware.jsonl").unlink()
    write_hardware(tmp_path, "midarm0", "midarm", tmp_path / "never", wait_s=0.3)
    assert json.loads((tmp_path / "hardware.jsonl").read_text())["tor_arch"] == "unknown"
