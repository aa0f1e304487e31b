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


def _pod(name, node, containers, init=(), asked=None):
    """A pod whose spec asks for each container's status image, or for ``asked[name]``."""
    asked = asked or {}
    spec = lambda cs: [NS(name=c.name, image=asked.get(c.name, c.image.removeprefix("docker.io/"))) for c in cs]  # noqa: E731
    return NS(metadata=NS(name=name), spec=NS(node_name=node, containers=spec(containers), init_containers=spec(init)),
              status=NS(container_statuses=list(containers), init_container_statuses=list(init)))


def test_meta_records_each_pods_builds_and_warns_when_a_tag_is_two_builds(monkeypatch):
    relay = "torbed/relay:vanilla-0.1.0"
    pods = [_pod("r-guard-0", "a", [_status("tor", "docker.io/" + relay, "sha256:aaa")], [_status("shaper", "c", "sha256:ccc")]),
            _pod("r-exit-0", "b", [_status("tor", "docker.io/" + relay, "sha256:bbb")]),
            _pod("r-results-x", "a", [_status("results", "c", "")]),
            # Asked for under its content tag; the runtime names the image by its other tag.
            _pod("r-middle-0", "a", [_status("tor", "docker.io/" + relay, "sha256:aaa")],
                 asked={"tor": relay + "-0123456789ab"})]
    monkeypatch.setattr(backend, "_tor_version", lambda pod, cluster: {"r-guard-0": "0.4.9.11", "r-middle-0": "0.4.9.11",
                                                                        "r-exit-0": "0.4.8.1"}[pod])
    logged = []
    meta: dict = {}
    backend._record_provenance(NS(pods=lambda release: pods), "r", meta, NS(log=logged.append))
    assert meta["pods"]["r-guard-0"] == {"k8s_node": "a", "tor_version": "0.4.9.11", "containers": {
        "shaper": {"image": "c", "image_id": "sha256:ccc"}, "tor": {"image": relay, "image_id": "sha256:aaa"}}}
    assert "tor_version" not in meta["pods"]["r-results-x"]
    assert meta["pods"]["r-results-x"]["containers"]["results"]["image_id"] is None   # not started yet
    assert meta["images"][relay] == ["sha256:aaa", "sha256:bbb"]
    assert meta["pods"]["r-middle-0"]["containers"]["tor"] == {
        "image": relay + "-0123456789ab", "image_id": "sha256:aaa", "image_reported": "docker.io/" + relay}
    assert meta["images"][relay + "-0123456789ab"] == ["sha256:aaa"]
    assert meta["tor_versions"] == ["0.4.8.1", "0.4.9.11"]
    assert len(logged) == 1 and relay in logged[0] and "several builds" in logged[0]


def test_the_version_line_of_tor():
    assert backend.TOR_VERSION_RE.search("Tor version 0.4.9.11.\nTor is running on Linux").group(1) == "0.4.9.11"
    assert backend.TOR_VERSION_RE.search("Tor version 0.4.9.0-alpha-dev (git-abc).").group(1) == "0.4.9.0-alpha-dev (git-abc)"


def test_a_runs_dashboards_are_one_configmap_each_labelled_for_grafanas_sidecar():
    cms = backend.run_dashboards("quickstart-20261126T233000Z")
    assert [c["metadata"]["name"] for c in cms] == [
        "torbed-run-quickstart-20261126t233000z-torbed-clients", "torbed-run-quickstart-20261126t233000z-torbed-emulator",
        "torbed-run-quickstart-20261126t233000z-torbed-network"]
    labels = cms[0]["metadata"]["labels"]
    assert labels["grafana_dashboard"] == "1" and labels["torbed.io/run"] == "quickstart-20261126T233000Z"
    assert cms[0]["metadata"]["annotations"] == {"grafana_folder": "torbed"}
    [(key, text)] = cms[0]["data"].items()
    assert key == "torbed-clients.json" and text.lstrip().startswith("{")
    # the chart's dashboards.* settings, as --set passes them; names stay within 63 characters
    cms = backend.run_dashboards("x" * 100, backend._set_values(
        ["dashboards.label=dash", "dashboards.labelValue=yes", "variant=v"], "dashboards."))
    assert all(len(c["metadata"]["name"]) <= 63 and c["metadata"]["labels"]["dash"] == "yes" for c in cms)


def test_dashboards_live_for_the_run_not_the_release(tmp_path, monkeypatch):
    from torbed import constants
    monkeypatch.setattr(constants, "STATE_DIR", tmp_path / "state")
    claim = tmp_path / "state" / "k8s" / "qs-1.json"
    made, deleted = [], []
    core = NS(create_namespaced_config_map=lambda ns, cm: made.append(cm["metadata"]["name"]),
              delete_namespaced_config_map=lambda name, ns: deleted.append(name))
    b = backend.K8sBackend.__new__(backend.K8sBackend)
    b.cluster = NS(core=core, ns="default", ApiException=Exception, TransportError=(OSError,))
    b.extra_set, b.traces, b.console, b.context = ["images.tag=t"], None, NS(log=print), None
    run = NS(run_dir=tmp_path / "qs-1", scenario=NS(model_dump=lambda **kw: {"name": "qs"}), info={})
    (tmp_path / "qs-1").mkdir()
    b.start_run(run)
    assert len(made) == 3 and run.info["k8s"]["dashboards"] == made
    assert b.extra_set == ["dashboards.enabled=false", "images.tag=t"]   # releases ship none of their own
    assert claim.exists()                 # for `torbed clean`, should this torbed be killed now
    b.finish_run(run)
    assert deleted == made and not claim.exists()
    # --set dashboards.enabled=false: none at all
    made.clear()
    b.extra_set = ["dashboards.enabled=false"]
    b.start_run(run)
    assert made == [] and b.extra_set == ["dashboards.enabled=false"]


def test_a_failed_deletion_keeps_the_claim_for_torbed_clean(tmp_path, monkeypatch):
    from torbed import constants
    monkeypatch.setattr(constants, "STATE_DIR", tmp_path / "state")

    class Refused(Exception):
        status = 403

    def refuse(name, ns):
        raise Refused()
    core = NS(create_namespaced_config_map=lambda ns, cm: None, delete_namespaced_config_map=refuse)
    b = backend.K8sBackend.__new__(backend.K8sBackend)
    b.cluster = NS(core=core, ns="default", ApiException=Refused, TransportError=(OSError,))
    b.extra_set, b.traces, b.console, b.context = [], None, NS(log=lambda *a: None), None
    run = NS(run_dir=tmp_path / "qs-2", scenario=NS(model_dump=lambda **kw: {"name": "qs"}), info={})
    (tmp_path / "qs-2").mkdir()
    b.start_run(run)
    b.finish_run(run)
    assert (tmp_path / "state" / "k8s" / "qs-2.json").exists()
