"""What a release leaves to Kubernetes' garbage collector (the key hook ties its objects to
Helm's release record) and what meta.json records of the builds that ran (per pod digests,
tor versions). Canned API answers; the e2e tests run both on the local cluster."""

from __future__ import annotations

from types import SimpleNamespace as NS

from torbed.backends.k8s import backend
from torbed.pods import keygen


class FakeApi:
    def __init__(self, objects: dict[str, list[dict]]):
        self.objects, self.asked = objects, []

    def get(self, kind: str, name: str) -> dict | None:
        self.asked.append((kind, name))
        return next((o for o in self.objects.get(kind, []) if o["metadata"]["name"] == name), None)


def test_keys_are_tied_to_helms_record_of_the_first_revision():
    api = FakeApi({"secrets": [{"metadata": {"name": "sh.helm.release.v1.qs.v1", "uid": "u-1"}}]})
    assert keygen.release_owner(api, "qs") == [
        {"apiVersion": "v1", "kind": "Secret", "name": "sh.helm.release.v1.qs.v1", "uid": "u-1"}]
    assert api.asked == [("secrets", "sh.helm.release.v1.qs.v1")]
    # HELM_DRIVER=configmap keeps the record in a ConfigMap; sql/memory keep none here.
    api = FakeApi({"configmaps": [{"metadata": {"name": "sh.helm.release.v1.qs.v1", "uid": "u-2"}}]})
    assert keygen.release_owner(api, "qs")[0]["kind"] == "ConfigMap"
    assert keygen.release_owner(FakeApi({}), "qs") == []


def _status(name, image, image_id, running=True):
    return NS(name=name, image=image, image_id=image_id, state=NS(running=object() if running else None))


def _pod(name, node, containers, init=()):
    return NS(metadata=NS(name=name), spec=NS(node_name=node),
              status=NS(container_statuses=list(containers), init_container_statuses=list(init)))


def test_meta_records_each_pods_builds_and_warns_when_a_tag_is_two_builds(monkeypatch):
    relay = "docker.io/torbed/relay:vanilla-0.1.0"
    pods = [_pod("r-guard-0", "a", [_status("tor", relay, "sha256:aaa")], [_status("shaper", "c", "sha256:ccc")]),
            _pod("r-exit-0", "b", [_status("tor", relay, "sha256:bbb")]),
            _pod("r-results-x", "a", [_status("results", "c", "")])]
    monkeypatch.setattr(backend, "_tor_version", lambda pod, cluster: {"r-guard-0": "0.4.9.11",
                                                                        "r-exit-0": "0.4.8.1"}[pod])
    logged = []
    meta: dict = {}
    backend._record_provenance(NS(pods=lambda release: pods), "r", meta, NS(log=logged.append))
    assert meta["pods"]["r-guard-0"] == {"k8s_node": "a", "tor_version": "0.4.9.11", "containers": {
        "shaper": {"image": "c", "image_id": "sha256:ccc"}, "tor": {"image": relay, "image_id": "sha256:aaa"}}}
    assert "tor_version" not in meta["pods"]["r-results-x"]
    assert meta["pods"]["r-results-x"]["containers"]["results"]["image_id"] is None   # not started yet
    assert meta["images"][relay] == ["sha256:aaa", "sha256:bbb"]
    assert meta["tor_versions"] == ["0.4.8.1", "0.4.9.11"]
    assert len(logged) == 1 and relay in logged[0] and "several builds" in logged[0]


def test_the_version_line_of_tor():
    assert backend.TOR_VERSION_RE.search("Tor version 0.4.9.11.\nTor is running on Linux").group(1) == "0.4.9.11"
    assert backend.TOR_VERSION_RE.search("Tor version 0.4.9.0-alpha-dev (git-abc).").group(1) == "0.4.9.0-alpha-dev (git-abc)"
