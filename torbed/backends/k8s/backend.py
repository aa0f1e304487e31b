"""The Kubernetes backend: ``torbed run SCENARIO --backend k8s``.

For each variant and repetition: ``helm install`` of charts/torbed with the scenario as
values (the pre-install hook makes the keys), then wait for evidence that the network is
ready (every client reports that its tor is bootstrapped and its consensus lists every relay
with the scenario's flags; the results service then fixes one workload start), watch the
client Jobs to completion (pods that fail or restart are recorded, and a pod that cannot
start fails the repetition with its reason), copy the records out of the results service
into the run directory (the local backend's layout, so ``torbed report`` works unchanged),
save every pod's log, and ``helm uninstall``. Ctrl-C, an error or a crash uninstalls what
was installed; records already copied are kept.

Talks to the cluster with the kubernetes client (current kubeconfig context, or in-cluster
config) and to Helm through its CLI (the chart's interface).

The engine (``torbed.engine``) runs the variants x repetitions loop, writes run.json and
meta.json and handles signals; this module brings one repetition up, measures it and tears
it down. An API error anywhere becomes ``KubernetesError`` (a RunFailed): the repetition
ends ``failed`` with the reason in meta.json.

Public API: ``K8sBackend`` (the engine's Backend), ``Cluster``, ``Release``, ``release_name``,
``fetch_records`` (``_fetch``: copy the results service's files), ``KubernetesError``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from . import backoff, chart, leftovers
from ... import constants, engine, network
from . import faults as k8s_faults
from ...pods import UNKNOWN_ARCH, bringup
from ...errors import InputError, RunFailed
from ...scenario import Scenario

CHART = chart.CHART_DIR
POLL_S = 1.0
INSTALL_POLL_S = 2.0
# The Chaos Mesh kinds the backend creates at fault times (k8s_faults) and sweeps at uninstall;
# the nightly runner's Role (charts/torbed/templates/nightly/rbac.yaml) grants exactly these.
CHAOS_PLURALS = ("podchaos", "stresschaos")
# Node labels that say what hardware a node is (recorded in meta.json "hardware").
HARDWARE_LABELS = ("torbed.io/", "kubernetes.io/arch", "node.kubernetes.io/instance-type",
                   "feature.node.kubernetes.io/cpu-model", "feature.node.kubernetes.io/cpu-hardware")
# Waiting reasons that will not resolve by waiting longer.
FATAL_WAITING = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}
# Waiting reasons the kubelet retries by itself: fatal when the message names a missing object
# (a Secret or ConfigMap that is not there will not appear), or once they have lasted
# CONFIG_GRACE_S. A busy kubelet reports "failed to sync secret cache: timed out waiting for
# the condition" for a Secret that exists and starts the container on its next sync (seen in
# an e2e run on the loaded 2-core machine; failing the repetition at once lost it).
RETRIED_WAITING = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
CONFIG_GRACE_S = 60.0


def helm_binary() -> str:
    """helm on PATH, else the pinned one `make tools` builds."""
    found = shutil.which("helm")
    if found:
        return found
    cached = constants.CACHE_DIR / "tools" / "bin" / "helm"
    if cached.exists():
        return str(cached)
    raise RunFailed("helm not found: put it on PATH or run `make tools` (builds the pinned helm)")


def release_name(scenario: str, variant: str, rep: int, run_id: str) -> str:
    """<= 30 characters, so the chart's names are not truncated (see its _helpers.tpl)."""
    slug = lambda s, n: re.sub(r"[^a-z0-9]", "", s.lower())[:n] or "x"  # noqa: E731
    return f"{slug(scenario, 10)}-{slug(variant, 8)}-{rep}-{run_id}"


class KubernetesError(RunFailed):
    """A Kubernetes API call failed (an HTTP error status or no connection)."""


class Cluster:
    """The few API calls the backend needs, via the kubernetes client. Every call raises
    KubernetesError, never the client's own exception types."""

    def __init__(self, namespace: str, context: str | None = None):
        self.context = context   # helm is told too (Release), or it would use the current context
        try:
            from kubernetes import client, config
        except ImportError as e:  # pragma: no cover - a dependency of the package
            raise RunFailed(f"the kubernetes Python client is missing: {e}") from None
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
                config.load_incluster_config()
            else:
                # KUBECONFIG as it is now: the client reads it once, when first imported.
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None, context=context)
        except Exception as e:  # the loaders raise several unrelated types
            raise RunFailed(f"no usable Kubernetes configuration (KUBECONFIG / ~/.kube/config): {e}") from None
        self.ns = namespace
        self.core = client.CoreV1Api()
        self.batch = client.BatchV1Api()
        self.custom = client.CustomObjectsApi()
        self.version = client.VersionApi()
        self.ApiException = client.exceptions.ApiException
        import urllib3
        # No answer at all: connection refused or reset, timeouts (urllib3's errors, OSError).
        self.TransportError = (urllib3.exceptions.HTTPError, OSError)

    def server_version(self) -> str:
        try:
            return self.version.get_code().git_version
        except (self.ApiException, *self.TransportError) as e:
            raise RunFailed(f"the Kubernetes API server is not reachable: {e}") from None

    def proxy_get(self, service: str, path: str, timeout: float = 10) -> tuple[int, bytes]:
        """GET through the API server's Service proxy (no port-forward, no exec)."""
        try:
            r = self.core.connect_get_namespaced_service_proxy_with_path(
                service, self.ns, path, _preload_content=False, _request_timeout=timeout)
            return r.status, r.data
        except self.ApiException as e:
            return e.status, (e.body or b"") if isinstance(e.body, bytes) else str(e.body or "").encode()
        except self.TransportError as e:
            return 0, str(e).encode()

    def _call(self, what: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except self.ApiException as e:
            raise KubernetesError(f"Kubernetes API: {what}: HTTP {e.status} {e.reason}") from None
        except self.TransportError as e:
            raise KubernetesError(f"Kubernetes API: {what}: {type(e).__name__}: {e}") from None

    def pods(self, release: str) -> list:
        return self._call(f"list pods of {release}", self.core.list_namespaced_pod, self.ns,
                          label_selector=f"app.kubernetes.io/instance={release}").items

    def jobs(self, release: str) -> list:
        return self._call(f"list jobs of {release}", self.batch.list_namespaced_job, self.ns,
                          label_selector=f"app.kubernetes.io/instance={release},app.kubernetes.io/component=client").items

    def configmap(self, name: str) -> dict:
        return self._call(f"read configmap {name}", self.core.read_namespaced_config_map, name, self.ns).data or {}

    def log(self, pod: str, container: str) -> str:
        try:
            return self._call(f"log of {pod}/{container}", self.core.read_namespaced_pod_log, pod, self.ns,
                              container=container, timestamps=True)
        except KubernetesError as e:
            return f"(log unavailable: {e})\n"

    def sweep(self, release: str) -> list[str]:
        """Delete every object of the release's kinds that is still there (label
        app.kubernetes.io/instance=release); returns what was deleted, as kind/name."""
        from kubernetes import client
        rbac, apps = client.RbacAuthorizationV1Api(), client.AppsV1Api()
        sel = f"app.kubernetes.io/instance={release}"
        # Owners before pods, or a Deployment's ReplicaSet (the Locust pods) recreates them;
        # its ReplicaSets go with it (background propagation).
        kinds = [("deployment", apps.list_namespaced_deployment, apps.delete_namespaced_deployment),
                 ("job", self.batch.list_namespaced_job, self.batch.delete_namespaced_job),
                 ("secret", self.core.list_namespaced_secret, self.core.delete_namespaced_secret),
                 ("configmap", self.core.list_namespaced_config_map, self.core.delete_namespaced_config_map),
                 ("serviceaccount", self.core.list_namespaced_service_account,
                  self.core.delete_namespaced_service_account),
                 ("role", rbac.list_namespaced_role, rbac.delete_namespaced_role),
                 ("rolebinding", rbac.list_namespaced_role_binding, rbac.delete_namespaced_role_binding),
                 ("pod", self.core.list_namespaced_pod, self.core.delete_namespaced_pod)]
        gone = []
        for kind, lister, deleter in kinds:
            for obj in self._call(f"list {kind}s of {release}", lister, self.ns, label_selector=sel).items:
                if obj.metadata.deletion_timestamp:
                    continue
                try:
                    deleter(obj.metadata.name, self.ns, propagation_policy="Background")
                    gone.append(f"{kind}/{obj.metadata.name}")
                except self.ApiException as e:
                    if e.status != 404:
                        raise KubernetesError(f"Kubernetes API: delete {kind} {obj.metadata.name}: "
                                              f"HTTP {e.status} {e.reason}") from None
        # Chaos Mesh objects the backend created at fault times (not helm's): normally deleted
        # when the faults end; here if that failed. 404: Chaos Mesh's CRDs are not installed.
        for plural in CHAOS_PLURALS:
            try:
                items = self.custom.list_namespaced_custom_object("chaos-mesh.org", "v1alpha1", self.ns, plural,
                                                                  label_selector=sel)["items"]
            except self.ApiException as e:
                if e.status == 404:
                    continue
                raise KubernetesError(f"Kubernetes API: list {plural} of {release}: HTTP {e.status} {e.reason}") from None
            for obj in items:
                name = obj["metadata"]["name"]
                self._call(f"delete {plural} {name}", self.custom.delete_namespaced_custom_object,
                           "chaos-mesh.org", "v1alpha1", self.ns, plural, name)
                gone.append(f"{plural}/{name}")
        return gone

    def node_hardware(self, names: set[str]) -> dict[str, dict]:
        """What the API server knows of these nodes' hardware: architecture, OS, kernel,
        runtime, capacity and the labels that describe hardware (torbed.io/*, the
        architecture, instance type, Node Feature Discovery's CPU labels)."""
        out = {}
        for name in sorted(names):
            n = self._call(f"read node {name}", self.core.read_node, name)
            info, cap, labels = n.status.node_info, n.status.capacity or {}, n.metadata.labels or {}
            out[name] = {"arch": info.architecture, "os": info.os_image, "kernel": info.kernel_version,
                         "container_runtime": info.container_runtime_version, "kubelet": info.kubelet_version,
                         "cpus": cap.get("cpu"), "memory": cap.get("memory"),
                         "labels": {k: v for k, v in labels.items() if k.startswith(HARDWARE_LABELS)},
                         "taints": [f"{t.key}={t.value or ''}:{t.effect}" for t in n.spec.taints or []]}
        return out

    def delete_pod(self, pod: str) -> None:
        self._call(f"delete pod {pod}", self.core.delete_namespaced_pod, pod, self.ns)


def _pod_problem(pod, seen: dict | None = None, now: float | None = None) -> str | None:
    """Why a pod will not get anywhere by waiting, or None. ``seen`` (kept by the caller
    across polls) holds when each retried waiting reason was first seen, so a transient
    one is given CONFIG_GRACE_S before it fails the run; without it such a reason is fatal."""
    now = time.time() if now is None else now
    for st in (pod.status.init_container_statuses or []) + (pod.status.container_statuses or []):
        w = st.state.waiting if st.state else None
        where = f"pod {pod.metadata.name}, container {st.name}"
        if w and w.reason in FATAL_WAITING:
            return f"{where}: {w.reason}: {w.message or ''}".strip()
        if w and w.reason in RETRIED_WAITING:
            msg = w.message or ""
            if seen is None or "not found" in msg:
                return f"{where}: {w.reason}: {msg}".strip()
            first = seen.setdefault((pod.metadata.name, st.name, w.reason), now)
            if now - first >= CONFIG_GRACE_S:
                return f"{where}: {w.reason} for {now - first:.0f} s: {msg}".strip()
        if w and w.reason == "CrashLoopBackOff" and (st.restart_count or 0) >= 3:
            return f"{where} keeps crashing ({st.restart_count} restarts)"
    if pod.status.phase == "Pending":
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return f"pod {pod.metadata.name} cannot be scheduled: {c.message}"
    return None


IMAGE_WAITING = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}


def _image_problem(pod) -> str | None:
    """A container of the pod whose image the node cannot get, said so a user can act, or None."""
    for st in (pod.status.init_container_statuses or []) + (pod.status.container_statuses or []):
        w = st.state.waiting if st.state else None
        if not (w and w.reason in IMAGE_WAITING):
            continue
        node = pod.spec.node_name or "?"
        if w.reason == "ErrImageNeverPull" or "not present" in (w.message or ""):
            todo = ("the node does not have it and may not pull it: build and load it (`make images`, then "
                    "`hack/cluster/cluster.sh load-image IMAGE` for the local cluster, or `ctr -n k8s.io images import` on the "
                    "node), or push it to a registry and pass --set images.registry=REGISTRY")
        elif w.reason == "InvalidImageName":
            todo = "the image reference is malformed: check images.registry, images.tag and the repositories"
        else:
            todo = ("the node could not pull it: check that the registry (images.registry) has this tag, that "
                    "the node reaches the registry, and pull secrets if it is private (charts/torbed/README.md); "
                    "without a registry, load the image into the node (`make images`, `hack/cluster/cluster.sh load-image IMAGE`)")
        return (f"image {st.image} is not available on node {node} (pod {pod.metadata.name}, container "
                f"{st.name}: {w.reason}): {todo}")
    return None


def _bringup_breakdown(pods, meta: dict) -> dict:
    """Where bring-up time went, in consecutive parts (seconds): ``install_s`` helm install
    (the pre-install key hook, then creating the objects), ``containers_s`` from then until
    the last container of the release started (scheduling, image start, the shapers' startup
    probes that gate tor), ``readiness_s`` from then until every client was ready (tor
    bootstrap, the consensus listing every relay). From the API's container start times."""
    started = [st.state.running.started_at.timestamp() for p in pods
               for st in (p.status.init_container_statuses or []) + (p.status.container_statuses or [])
               if st.state and st.state.running and st.state.running.started_at]
    t_containers = max(started) if started else meta["t_installed"]
    t_containers = min(max(t_containers, meta["t_installed"]), meta["t_ready"])
    return {"install_s": round(meta["t_installed"] - meta["t_start"], 3),
            "containers_s": round(t_containers - meta["t_installed"], 3),
            "readiness_s": round(meta["t_ready"] - t_containers, 3)}


def _restarts(pods) -> dict[str, int]:
    out = {}
    for p in pods:
        n = sum(st.restart_count or 0 for st in (p.status.container_statuses or []) +
                (p.status.init_container_statuses or []))
        if n:
            out[p.metadata.name] = n
    return out


class Release:
    """One helm release = one repetition of one variant."""

    def __init__(self, cluster: Cluster, helm: str, name: str, values: Path, variant: str, rep: int,
                 extra_set: list[str], console):
        self.cluster, self.helm, self.name = cluster, helm, name
        self.values, self.variant, self.rep, self.extra = values, variant, rep, extra_set
        self.console = console
        self.installed = False
        self.hooks_broken = False   # a hook's pod cannot start: uninstall without hooks

    def _context(self) -> list[str]:
        ctx = getattr(self.cluster, "context", None)
        return ["--kube-context", ctx] if ctx else []

    def install(self, timeout_s: int) -> None:
        """helm install, watching the release's pods meanwhile: a pod whose image the node
        cannot get (the pre-install key hook's first of all) fails the install within
        seconds, naming image, node and what to do, instead of after helm's timeout."""
        cmd = [self.helm, "install", self.name, str(CHART), "-n", self.cluster.ns, *self._context(), "-f", str(self.values),
               "--set", f"variant={self.variant}", "--set", f"repetition={self.rep}",
               # The chart's pull-check pods are for plain helm: this watch names image and node
               # as soon as the kubelet fails a pull, without a pod per image (seconds per install).
               "--set", "images.pullCheckSeconds=0",
               "--timeout", f"{timeout_s}s"]
        for s in self.extra:
            cmd += ["--set", s]
        self.installed = True   # from here on, uninstall (a failed install leaves a release)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen: dict = {}
        try:
            while True:
                try:
                    out, err = proc.communicate(timeout=INSTALL_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                for pod in self.cluster.pods(self.name):
                    why = _image_problem(pod) or _pod_problem(pod, seen)
                    if why:
                        self.hooks_broken = True
                        raise RunFailed(f"helm install {self.name} stopped: {why}")
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
        if proc.returncode != 0:
            raise RunFailed(f"helm install {self.name} failed: {err.strip() or out.strip()}")

    def uninstall(self) -> str | None:
        """helm uninstall, then delete whatever of the release is left (hook Jobs and RBAC of
        an install stopped half-way, keys the pre-delete hook could not remove): nothing stays."""
        if not self.installed:
            return None
        cmd = [self.helm, "uninstall", self.name, "-n", self.cluster.ns, *self._context(), "--wait", "--timeout", "180s"]
        if self.hooks_broken:
            cmd.append("--no-hooks")   # hooks need the image the node lacks (no pre-delete hook now; an older chart had one)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        self.installed = False
        problems = []
        if proc.returncode != 0 and "not found" not in proc.stderr:
            problems.append(proc.stderr.strip())
        try:
            swept = self.cluster.sweep(self.name)
        except RunFailed as e:   # still wait for the pods below, and say what could not be swept
            problems.append(f"sweep of {self.name}: {e}")
            swept = []
        if swept:
            self.console.log(f"removed what helm left of {self.name}: {', '.join(swept)}")
        # helm returns once the owners are deleted; their pods terminate afterwards.
        deadline = time.time() + 120
        while self.cluster.pods(self.name):
            if time.time() > deadline:
                problems.append(f"pods of {self.name} still terminating after 120 s")
                break
            time.sleep(1)
        return "; ".join(problems) or None


class K8sBackend:
    """The engine's Backend on Kubernetes: one helm release per repetition. Per-repetition
    state in ``rep.state``: release (``Release``), name, plan, fetched ({file: size})."""

    name = "k8s"
    # The mechanism gates (torbed.gates) are sampled by the pods themselves: each shaper
    # sidecar its htb backlog and a relay pod's send queues (torbed.pods.shaper), the relay
    # pod's collector and the client pod's driver their pod's processes' CPU
    # (torbed.pods.cpusample). Transfer completion is judged as locally.
    unsupported = {
        "links.delay": "needs sch_netem on the cluster's nodes (the pods' shaper uses tc netem)",
        "faults.link.netem": "a link fault's delay, jitter or loss needs sch_netem on the cluster's nodes "
                             "(the shaper sidecar carries out rate and partition with htb alone)",
        "faults.link.node": "a link fault naming one node of a server group of several pods or of the load "
                            "nodes: their pods have no address of their own in the cluster's DNS (a Service "
                            "balances across them); name the whole group",
        "cpu": "network.relays.*.cpu (qemu) and cpu_per_thread emulate a slow CPU on the local backend only "
               "(on Kubernetes, "
               "place the group on a slow node instead: placement)",
        "crossover": "a within-run crossover switches the relays through their control ports on the local "
                     "backend only",
        "second_address": "a relay's second address on a link of its own is a second veth in its network "
                          "namespace, on the local backend only (a pod has one address)",
    }
    bringup_estimate_s = 60.0

    def __init__(self, console, scenario_path: Path | None = None, namespace: str = "default",
                 context: str | None = None, extra_set: list[str] | None = None):
        self.console, self.scenario_path = console, scenario_path
        self.namespace, self.context, self.extra_set = namespace, context, extra_set or []
        self.values: Path | None = None
        self.traces: dict = {}

    @classmethod
    def from_options(cls, options, console, scenario_path: Path | None = None) -> "K8sBackend":
        """From ``torbed.backends.k8s.Options``."""
        return cls(console, scenario_path, namespace=options.namespace, context=options.context,
                   extra_set=options.extra_set)

    def preflight(self, scenario: Scenario) -> dict:
        where = f"{self.scenario_path}: " if self.scenario_path else ""   # the file the errors name
        for i, f in enumerate(scenario.faults):
            if f"faults.{f.kind}" in self.unsupported:
                raise InputError(f"{where}faults[{i}].kind: {f.kind} {self.unsupported[f'faults.{f.kind}']}; "
                                 "run it with --backend local")
            if f.kind == "link":
                for field in ("delay", "jitter", "loss"):
                    if getattr(f, field) is not None:
                        raise InputError(f"{where}faults[{i}].{field}: {self.unsupported['faults.link.netem']}; "
                                         "run it with --backend local")
                for field, name in engine.link_node_names(scenario, f):
                    raise InputError(f"{where}faults[{i}].{field}: {name}: {self.unsupported['faults.link.node']}")
        for field, why in backoff.problems(scenario):   # the kubelet's crash back-off
            raise InputError(f"{where}{field}: {why}")
        if any(g.cpu != "native" or g.cpu_per_thread is not None for g in scenario.network.relays.values()):
            raise InputError(f"{where}{self.unsupported['cpu']}; run it with --backend local")
        if scenario.crossover is not None:
            raise InputError(f"{where}crossover: {self.unsupported['crossover']}; run it with --backend local")
        for name, g in scenario.network.relays.items():
            if g.second_address:
                raise InputError(f"{where}network.relays.{name}.second_address: {self.unsupported['second_address']}; "
                                 "run it with --backend local")
        self.helm = helm_binary()
        self.cluster = Cluster(self.namespace, self.context)
        server_version = self.cluster.server_version()
        try:
            self.traces = chart.inline_traces(scenario)   # replay traces the client image lacks
        except (ValueError, OSError) as e:
            raise RunFailed(str(e)) from None
        image_tags = content_tags(self.extra_set)
        self.extra_set = [*self.extra_set, *(f"images.tags.{k}={v}" for k, v in image_tags["tags"].items())]
        return {"shaper": "htb (per pod)", "tor_version": constants.TOR_VERSION,
                "host": {"kubernetes": server_version, "namespace": self.namespace, "context": self.context},
                "image_tags": image_tags}

    def _write_values(self, path: Path, scenario: Scenario) -> Path:
        """The values file: the scenario as torbed decoded it (overrides such as --duration
        applied), the replay traces the client image lacks inline."""
        values = scenario.model_dump(mode="json", exclude_none=True)
        if self.traces:
            values["replayTraces"] = {"inline": self.traces}
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        return path

    def values_for(self, rep: engine.Repetition) -> Path:
        """The values file repetition ``rep`` installs. With a network sampled anew per block
        (scenario.samples), block k's release is sample k mod n's network (its relay rates,
        weights and links: Scenario.for_block), one file per sample (values-sample-<i>.yaml)
        without `samples:` (the chart deploys one network per release and refuses the list);
        otherwise the run's values.yaml."""
        samples = rep.run.scenario.samples
        if not samples:
            return self.values
        return self._write_values(rep.run.run_dir / f"values-sample-{rep.index % len(samples)}.yaml",
                                  rep.scenario.model_copy(update={"samples": []}))

    def start_run(self, run: engine.Run) -> None:
        self.values = self._write_values(run.run_dir / "values.yaml", run.scenario)
        # Grafana dashboards once for the whole run, not per release: the chart's per-release
        # ConfigMaps went with each repetition's uninstall, so the run's dashboards came and
        # went between repetitions and were gone when one looked at the run afterwards.
        # A claim before anything is created (leftovers.py): if this torbed is killed, `torbed
        # clean` uninstalls the release it names and removes the dashboards.
        settings = _set_values(self.extra_set, "dashboards.")
        self.dashboards: list[str] = []
        self.claim = leftovers.write_claim(run.run_dir.name, self.cluster.ns, self.context, run.run_dir)
        # Inside a pod (the nightly runner: read-only root) no `torbed clean` outlives it to use one.
        if self.claim is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            self.console.log(f"[yellow]warning[/yellow]: cannot write under {leftovers.claim_dir()}: if this run is "
                             f"killed, `torbed clean` will not find its release (helm uninstall it) or its dashboards "
                             f"(kubectl delete configmap -l {leftovers.selector(leftovers.run_label(run.run_dir.name))})")
        if settings.get("enabled", "true") != "false":
            self.extra_set = ["dashboards.enabled=false", *self.extra_set]
            self.dashboards = create_run_dashboards(self.cluster, run.run_dir.name, settings)
            run.info.setdefault("k8s", {})["dashboards"] = self.dashboards

    def finish_run(self, run: engine.Run) -> None:
        """Remove the run's dashboards (engine: after the last repetition, also when it failed),
        then their claim; one not deleted keeps the claim, for `torbed clean`."""
        kept = 0
        for name in getattr(self, "dashboards", []):
            try:
                self.cluster.core.delete_namespaced_config_map(name, self.cluster.ns)
            except self.cluster.ApiException as e:
                if e.status != 404:
                    kept += 1
                    self.console.log(f"[yellow]warning[/yellow]: dashboard ConfigMap {name} not deleted: HTTP {e.status}")
            except self.cluster.TransportError as e:
                kept += 1
                self.console.log(f"[yellow]warning[/yellow]: dashboard ConfigMap {name} not deleted: {e}")
        self.dashboards = []
        if not kept and not getattr(self, "release_left", False):
            leftovers.remove_claim(getattr(self, "claim", None))
        self.claim = None

    def prepare(self, rep: engine.Repetition) -> None:
        s, st = rep.scenario, rep.state
        st["name"] = name = release_name(s.name, rep.variant, rep.index, secrets.token_hex(2))
        st["plan"] = network.plan(s, rep.variant)
        st["fetched"] = {}
        st["release"] = Release(self.cluster, self.helm, name, self.values_for(rep), rep.variant, rep.index,
                                self.extra_set, self.console)
        leftovers.set_release(getattr(self, "claim", None), name, rep.dir)
        rep.meta.update(run_id=name, release=name, namespace=self.cluster.ns, shaper="htb (per pod)", nodes=[],
                        pod_restarts={}, failed_pods={})
        self.console.rule(f"[bold]{s.name}[/bold] on Kubernetes: variant [cyan]{rep.variant}[/cyan], "
                          f"repetition {rep.index + 1}/{s.repetitions} (release {name})")

    def bring_up(self, rep: engine.Repetition) -> None:
        s, st, meta = rep.scenario, rep.state, rep.meta
        name = st["name"]   # <= 30 characters: the chart's fullname is the release name
        ready_timeout = s.measure.ready_timeout.seconds
        rep.status("helm install (the keygen hook makes the keys)")
        st["release"].install(timeout_s=int(ready_timeout) + 120)
        meta["t_installed"] = time.time()
        meta["install_s"] = round(meta["t_installed"] - meta["t_start"], 3)
        identities = self.cluster.configmap(f"{name}-identities")
        fprs = json.loads(identities.get("fingerprints.json", "{}"))
        try:
            sched = json.loads(identities.get("schedule.json", "{}"))
        except ValueError:
            sched = {}
        meta["nodes"] = [{**n.to_dict(), "address": None, "fingerprint": fprs.get(n.name)} for n in st["plan"].nodes]
        # What the pods do to come up fast (torbed.pods.bringup), as the local backend records its own.
        meta["bootstrap"] = {"sighup_after_consensus": True, "clients_offline_until_caches": True,
                             "cache_wait_max_s": max(0.0, ready_timeout - bringup.ONLINE_MARGIN_S),
                             "directory_caches": bringup.directory_caches(st["plan"]),
                             "shapers_use_announced_addresses": True,
                             # The authorities' first vote aligned with the pods' start (torbed.pods.keygen).
                             "voting_offset_s": sched.get("voting_offset_s"), "vote_lead_s": sched.get("vote_lead_s"),
                             "t_keys_stored": sched.get("t_hook")}
        rep.write_meta()
        start = self._wait_start(rep, time.time() + ready_timeout + 60)
        meta["t_ready"] = start["t_all_ready"]
        meta["ready_s"] = round(meta["t_ready"] - meta["t_start"], 3)
        meta["t_workload_start"] = start["t_workload"]
        meta["bringup"] = _bringup_breakdown(self.cluster.pods(name), meta)
        _record_provenance(self.cluster, name, meta, self.console)
        # Relays that had reported holding the consensus by the start: fewer than all means the
        # clients went online at their deadline, not because the network was ready (a relay
        # without a consensus opened a channel per circuit, and Torchestra saw nothing heavy).
        code, body = self.cluster.proxy_get(f"{name}-results:http", "caches")
        relays = len(st["plan"].by_role("relay"))
        try:
            ready_relays = len(json.loads(body).get("caches") or []) if code == 200 else None
        except (ValueError, AttributeError):
            ready_relays = None
        meta["bootstrap"]["relays_ready_at_start"] = ready_relays
        if ready_relays is not None and ready_relays < relays:
            self.console.log(f"[yellow]warning[/yellow]: only {ready_relays} of {relays} relays held the complete "
                             "consensus when the clients went online (meta.json bootstrap.relays_ready_at_start)")
        # Chaos Mesh is in use when the chart rendered the faults' objects (from the values
        # helm merged, whatever set them); checked now, not at the first fault's time.
        st["chaos"] = k8s_faults.chaos_objects(self.cluster, name) if s.faults else None
        if st["chaos"]:
            k8s_faults.check_chaos_mesh(self.cluster, st["chaos"])
        meta["chaos_mesh"] = st["chaos"] is not None
        b = meta["bringup"]
        self.console.log(f"[green]ready[/green] {meta['ready_s']:.1f} s after helm install started: "
                         f"{b['install_s']:.1f} s helm install (key hook), then "
                         f"{b['containers_s']:.1f} s until every container ran, "
                         f"{b['readiness_s']:.1f} s until every client was ready")

    def _wait_start(self, rep: engine.Repetition, deadline: float) -> dict:
        """Ready = every client's evidence (see torbed.pods.client), announced by the
        results service's start barrier. A pod that cannot start fails at once."""
        name = rep.state["name"]
        seen: dict = {}
        while True:
            code, body = self.cluster.proxy_get(f"{name}-results:http", "start")
            if code == 200:
                return json.loads(body)
            pods = self.cluster.pods(name)
            for p in pods:
                why = _pod_problem(p, seen)
                if why:
                    raise RunFailed(why)
            if time.time() > deadline:
                raise RunFailed(f"network not ready after {rep.scenario.measure.ready_timeout}: "
                                + _fetch(self.cluster, name, rep.dir, rep.state["fetched"], only="clients.jsonl"))
            running = sum(1 for p in pods if p.status.phase == "Running")
            rep.status(f"waiting for the network: {running}/{len(pods)} pods running")
            time.sleep(POLL_S)

    def measure(self, rep: engine.Repetition) -> None:
        """Until every client Job is done: faults on schedule; pods that fail or restart
        are recorded; records are copied out as they grow."""
        s, st, meta = rep.scenario, rep.state, rep.meta
        name = st["name"]
        t_work, duration = meta["t_workload_start"], s.measure.duration.seconds
        hard_end = t_work + duration + 300
        faults = st["faults"] = k8s_faults.make_runner(self, rep, t_work, st.get("chaos")) if s.faults else None
        background = _Load(self.cluster, rep) if s.load else None
        t_due = None
        while True:
            now = time.time()
            if faults:
                t_due = faults.tick(now)
            jobs = self.cluster.jobs(name)
            done = [j for j in jobs if (j.status.succeeded or 0) + (j.status.failed or 0) >= (j.spec.completions or 1)]
            pods = self.cluster.pods(name)
            meta["pod_restarts"] = _restarts(pods)
            if background:
                background.tick(now, pods)
            for p in pods:
                if p.status.phase == "Failed":
                    meta["failed_pods"][p.metadata.name] = p.status.reason or "Failed"
            _fetch(self.cluster, name, rep.dir, st["fetched"])
            if jobs and len(done) == len(jobs):
                break
            if now > hard_end:
                raise RunFailed("client Jobs did not finish within the workload time + 300 s")
            rep.status(f"measuring: {max(0, t_work + duration - now):.0f} s of workload left; "
                       f"{len(done)}/{len(jobs)} client groups done")
            # Wake for the next fault event rather than at the next poll (its time is recorded).
            time.sleep(max(0.05, min(POLL_S * 2, (t_due or float("inf")) - time.time())))
        if faults:
            faults.finish("end")
        meta["t_end"] = time.time()
        failed = {j.metadata.name: j.status.failed for j in jobs if j.status.failed}
        if failed:
            meta["failed_jobs"] = failed
            raise RunFailed(f"client Job(s) with failed pods: {failed}")

    def teardown(self, rep: engine.Repetition) -> None:
        """Copy what the release measured and its logs, then uninstall it. Anything that
        fails here is recorded in meta.json; the uninstall is attempted regardless."""
        st, meta = rep.state, rep.meta
        rel = st.get("release")
        if rel is None:
            return
        if st.get("faults") is not None:
            st["faults"].finish("teardown")   # before anything is collected or uninstalled
        try:
            if rel.installed:
                if any(cg.workload.kind == "replay" for cg in rep.run.scenario.clients.values()):
                    time.sleep(2.0)   # the replay servers' last cells: their shippers send every second
                if rep.scenario.load is not None:
                    # Wait for the 'end' record only where the users ran to load.stop (not
                    # after a Ctrl-C or a failure before it: those keep their periodic records).
                    s, ld = rep.scenario, meta.get("load") or {}
                    t_stop = (meta.get("t_workload_start") or float("inf")) + (s.load.stop or s.measure.duration).seconds
                    ended = ld.get("t_start") is not None and time.time() >= t_stop - 1
                    _collect_load(self.cluster, st["name"], rep.dir, st["fetched"], wait_s=20.0 if ended else 0.0)
                _fetch(self.cluster, st["name"], rep.dir, st["fetched"])
                _save_logs(self.cluster, st["name"], rep.logs)
                _record_hardware(self.cluster, st["name"], rep)
        except (RunFailed, OSError, ValueError) as e:   # ValueError: a garbled answer (JSON)
            meta.setdefault("collect_errors", []).append(str(e))
        finally:   # never let collection keep a release installed
            meta["files"] = st["fetched"]
            try:
                err = rel.uninstall()
            except RunFailed as e:
                err = str(e)
            if err:
                meta["uninstall_error"] = err
                self.release_left = True   # the claim stays: `torbed clean` tries again
            else:
                leftovers.release_gone(getattr(self, "claim", None), rel.name)


class _Load:
    """Background load on Kubernetes (charts/torbed templates/load/, torbed.pods.locust): the
    Locust master starts the users at load.start and Locust stops them at load.stop by
    themselves; the backend watches. meta.json ``load``: when the master's state was first
    seen spawning/running (t_start) and stopped again (t_stop), the most users seen, the
    worker pods. A Locust pod that restarts or fails while the load is due to run fails the
    repetition, as a Locust process that exits does on the local backend (the variant would
    be measured with less load than the scenario says)."""

    def __init__(self, cluster: Cluster, rep: engine.Repetition):
        self.cluster, self.rep = cluster, rep
        s, t_work = rep.scenario, rep.meta["t_workload_start"]
        self.name = rep.state["name"]
        self.t_start = t_work + s.load.start.seconds
        self.t_stop = t_work + (s.load.stop or s.measure.duration).seconds
        self.loaded = False
        rep.meta["load"] = {"t_start": None, "t_stop": None, "workers": [], "users_max": 0, "state": None}

    def tick(self, now: float, pods: list) -> None:
        meta = self.rep.meta["load"]
        mine = [p for p in pods if (p.metadata.labels or {}).get("app.kubernetes.io/component")
                in ("load-master", "load-worker")]
        meta["workers"] = sorted({*meta["workers"], *(p.metadata.name for p in mine if
                                  p.metadata.labels.get("app.kubernetes.io/component") == "load-worker")})
        if self.t_start - 5 <= now < self.t_stop - 2:
            for p in mine:
                restarts = sum(st.restart_count or 0 for st in (p.status.container_statuses or []) +
                               (p.status.init_container_statuses or []))
                if restarts or p.status.phase in ("Failed", "Succeeded"):
                    raise RunFailed(f"Locust pod {p.metadata.name} {'restarted' if restarts else p.status.phase.lower()} "
                                    f"while the background load was due to run")
        code, body = self.cluster.proxy_get(f"{self.name}-locust:web", "stats/requests", timeout=5)
        if code != 200:
            return
        try:
            stats = json.loads(body)
        except ValueError:
            return
        state = stats.get("state")
        if state != meta["state"]:
            self.rep.console.log(f"background load: Locust {state}, {stats.get('user_count', 0)} users")
        meta["state"] = state
        meta["users_max"] = max(meta["users_max"], int(stats.get("user_count") or 0))
        if state in ("spawning", "running") and meta["t_start"] is None:
            meta["t_start"] = now
        if state == "stopped" and meta["t_start"] is not None and meta["t_stop"] is None:
            meta["t_stop"] = now


# Locust's own CSV files, as the local master writes them with --csv <run>/locust/stats
# --csv-full-history: file name -> the master's web UI path that serves the same table.
LOCUST_CSV = {"stats_stats.csv": "stats/requests/csv", "stats_stats_history.csv": "stats/requests_full_history/csv",
              "stats_failures.csv": "stats/failures/csv", "stats_exceptions.csv": "exceptions/csv"}


def _collect_load(cluster: Cluster, release: str, rep_dir: Path, fetched: dict[str, int],
                  wait_s: float = 20.0) -> None:
    """Locust's statistics into the repetition directory, as the local backend leaves them:
    load.jsonl complete (the master writes its 'end' record when the users have stopped and the
    workers' final reports are in, at most 7 s later, and ships it within a second: wait for
    it, bounded) and locust/stats_*.csv from the master."""
    deadline = time.time() + wait_s
    while True:
        _fetch(cluster, release, rep_dir, fetched, only="load.jsonl")
        path = rep_dir / "load.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        try:
            if lines and json.loads(lines[-1]).get("label") == "end":
                break
        except ValueError:
            pass
        if time.time() > deadline:
            break
        time.sleep(1.0)
    out = rep_dir / "locust"
    out.mkdir(exist_ok=True)
    for name, web_path in LOCUST_CSV.items():
        code, data = cluster.proxy_get(f"{release}-locust:web", web_path, timeout=30)
        if code == 200:
            (out / name).write_bytes(data)


def _fetch(cluster: Cluster, fn: str, rep_dir: Path, fetched: dict[str, int], only: str | None = None) -> str:
    """Copy the results service's files into the repetition directory (whole files: they are
    small and append-only). Returns a short description for error messages."""
    code, body = cluster.proxy_get(f"{fn}-results:http", "files")
    if code != 200:
        return f"results service not reachable (HTTP {code})"
    sizes = json.loads(body)
    for name, size in sizes.items():
        if only and name != only:
            continue
        if fetched.get(name) == size:
            continue
        code, data = cluster.proxy_get(f"{fn}-results:http", f"files/{name}", timeout=60)
        if code == 200:
            with tempfile.NamedTemporaryFile(dir=rep_dir, delete=False) as tmp:
                tmp.write(data)
            os.replace(tmp.name, rep_dir / name)
            fetched[name] = len(data)
    if only and (rep_dir / only).exists():
        lines = [json.loads(x) for x in (rep_dir / only).read_text().splitlines() if x.strip()]
        not_ready = [f"{r['client']}: {r.get('why')}" for r in lines if r.get("event") == "not_ready"]
        ready = [r["client"] for r in lines if r.get("event") == "ready"]
        return "; ".join(not_ready) or f"{len(ready)} client(s) ready"
    return f"{len(sizes)} file(s)"


def _record_hardware(cluster: Cluster, release: str, rep: engine.Repetition) -> None:
    """meta.json: ``hardware`` {Kubernetes node: what the API says, plus the CPU model the
    release's pods saw there and which torbed nodes ran on it}; each node entry gets
    ``k8s_node``. Pods report themselves in hardware.jsonl (relays' collectors, clients);
    the API's pod list places the rest (authorities, servers)."""
    placed: dict[str, str] = {}
    cpu: dict[str, str] = {}
    machine: dict[str, str] = {}
    tor_said: set[str] = set()
    tor_unknown: set[str] = set()
    path = rep.dir / "hardware.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("k8s_node"):
            placed[r["node"]] = r["k8s_node"]
            if r.get("cpu_model"):
                cpu[r["k8s_node"]] = r["cpu_model"]
            # A relay's record carries its tor's architecture; the collector's own (``arch``)
            # says nothing about tor, which may run under qemu-user beside it. Clients' and
            # Locust's records describe the process that did the work.
            if "tor_arch" in r:
                if r["tor_arch"] and r["tor_arch"] != UNKNOWN_ARCH:
                    machine[r["k8s_node"]] = r["tor_arch"]
                    tor_said.add(r["k8s_node"])
                else:
                    tor_unknown.add(r["k8s_node"])
            elif r.get("arch"):
                machine.setdefault(r["k8s_node"], r["arch"])
    # A node whose relay never said what its tor ran as: unknown, not a guess from whatever
    # else ran there (a client beside it may run natively while the relay is emulated).
    for name in tor_unknown - tor_said:
        machine[name] = UNKNOWN_ARCH
    pods = {p.metadata.name: p.spec.node_name for p in cluster.pods(release) if p.spec.node_name}
    for n in rep.meta.get("nodes") or []:
        k8s_node = placed.get(n["name"]) or next((v for pod, v in pods.items() if _pod_is(pod, release, n)), None)
        n["k8s_node"] = k8s_node
    names = {n["k8s_node"] for n in rep.meta.get("nodes") or [] if n.get("k8s_node")}
    try:
        hw = cluster.node_hardware(names)
    except KubernetesError as e:   # nodes are cluster-scoped: a namespaced runner may not read them
        hw = {name: {"node_status": f"not readable: {e}"} for name in names}
    for name, h in hw.items():
        h["cpu_model"] = cpu.get(name)
        # The architecture the pods' code ran as (uname -m; a relay's tor where it said) beside
        # the kubelet's: an arm64 image run by qemu-user on an amd64 machine (the local
        # cluster's emulated Pi) says aarch64 under an amd64 kubelet, and its timings are an
        # emulator's, not the hardware's.
        h["pod_arch"] = machine.get(name)
        h["emulated"] = (None if machine.get(name) in (None, UNKNOWN_ARCH) or not h.get("arch")
                         else constants.MACHINE_ARCH.get(machine[name], machine[name]) != h["arch"])
        h["ran"] = sorted(n["name"] for n in rep.meta["nodes"] if n.get("k8s_node") == name)
    rep.meta["hardware"] = hw


def content_tags(sets: list[str]) -> dict:
    """The chart's images.tags a release installs with: each image's content tag (a hash of
    what it is built from, torbed.images.content_tag), so a node never runs an image built
    from other sources under a reused tag; none when the user chose images (any --set
    images.*: a registry, a tag) or no checkout is here to hash (a wheel install, the nightly
    runner). {"tags": {key: tag}, "source": why these}."""
    from ... import images
    if any(k.startswith("images.") for k, _, _ in (x.partition("=") for x in sets)):
        return {"tags": {}, "source": "the chart's tags, with the --set images.* given"}
    if not images.content_tags_available():
        return {"tags": {}, "source": "the chart's tags: no checkout here to compute content tags from"}
    try:
        tags = images.chart_tags()
    except images.ImageError as e:
        return {"tags": {}, "source": f"the chart's tags: content tags not computed ({e})"}
    return {"tags": tags, "source": "content tags of this checkout's build inputs (python -m torbed.images "
                                    "--content-tags; make images tags every image with its own)"}


def _set_values(sets: list[str], prefix: str) -> dict[str, str]:
    """The KEY=VALUE --set values under ``prefix`` ("dashboards."), by the rest of the key."""
    return {k[len(prefix):]: v for k, _, v in (s.partition("=") for s in sets) if k.startswith(prefix)}


def run_dashboards(run_id: str, settings: dict[str, str] | None = None) -> list[dict]:
    """ConfigMaps of torbed's Grafana dashboards (the chart's generated files) for one run,
    labelled as the chart labels them (dashboards.label/labelValue/folder, overridable with
    --set) and with torbed.io/run, for Grafana's dashboard sidecar."""
    settings = settings or {}
    run_label = leftovers.run_label(run_id)
    out = []
    for path in sorted((CHART / "files" / "grafana" / "dashboards").glob("*.json")):
        name = f"torbed-run-{run_label.lower()}"[:63 - len(path.stem) - 1].rstrip("-.") + f"-{path.stem}"
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name,
                                 "labels": {"app.kubernetes.io/name": "torbed", "app.kubernetes.io/managed-by": "torbed",
                                            "torbed.io/run": run_label,
                                            settings.get("label", "grafana_dashboard"): settings.get("labelValue", "1")},
                                 "annotations": {"grafana_folder": settings.get("folder", "torbed")}},
                    "data": {path.name: path.read_text()}})
    return out


def create_run_dashboards(cluster: Cluster, run_id: str, settings: dict[str, str]) -> list[str]:
    """Create (or replace) the run's dashboard ConfigMaps; their names."""
    names = []
    for cm in run_dashboards(run_id, settings):
        name = cm["metadata"]["name"]
        try:
            cluster.core.create_namespaced_config_map(cluster.ns, cm)
        except cluster.ApiException as e:
            if e.status != 409:
                raise KubernetesError(f"Kubernetes API: create configmap {name}: HTTP {e.status} {e.reason}") from None
            cluster.core.replace_namespaced_config_map(name, cluster.ns, cm)
        names.append(name)
    return names


TOR_VERSION_RE = re.compile(r"^Tor version (.+?)\.?$", re.M)   # "0.4.9.11", "0.4.9.0-alpha-dev (git-abc)"


def _tor_version(pod: str, cluster: Cluster) -> str | None:
    """What ``tor --version`` says in the pod's tor container (the binary that runs there)."""
    from kubernetes import client
    from kubernetes.stream import stream
    try:
        with client.ApiClient() as api:   # exec swaps its ApiClient's request method: one of its own
            out = stream(client.CoreV1Api(api).connect_get_namespaced_pod_exec, pod, cluster.ns, container="tor",
                         command=["tor", "--version"], stderr=True, stdin=False, stdout=True, tty=False,
                         _request_timeout=30)
    except (cluster.ApiException, *cluster.TransportError) as e:
        return f"unknown ({type(e).__name__})"
    m = TOR_VERSION_RE.search(out or "")
    return m.group(1) if m else f"unknown ({(out or '').strip()[:80]!r})"


def _record_provenance(cluster: Cluster, release: str, meta: dict, console=None) -> None:
    """meta.json ``pods``: per pod, each container's image reference (the spec's; the status's
    own name for it as ``image_reported`` where that differs) and the digest the kubelet ran
    (status imageID), and the version its tor container's tor reports;
    ``images``: each reference with the digests it resolved to. Tags are rebuilt in place and
    pulled IfNotPresent, so one reference can be two builds on two nodes: warned about here,
    and visible in the record either way."""
    pods: dict[str, dict] = {}
    digests: dict[str, set[str]] = {}
    for p in cluster.pods(release):
        st = p.status
        # The reference the pod asked for (the spec's): the status reports one of the image's
        # tags, which for an image under several tags (its content tag and the chart's
        # default) need not be that one.
        asked = {c.name: c.image for c in (p.spec.init_containers or []) + (p.spec.containers or [])}
        containers = {}
        for c in (st.init_container_statuses or []) + (st.container_statuses or []):
            ref = asked.get(c.name) or c.image
            containers[c.name] = {"image": ref, "image_id": c.image_id or None,
                                  **({"image_reported": c.image} if c.image and not c.image.endswith(ref) else {})}
            if c.image_id:
                digests.setdefault(ref, set()).add(c.image_id)
        entry = {"k8s_node": p.spec.node_name, "containers": containers}
        if "tor" in containers and any(c.name == "tor" and c.state and c.state.running
                                       for c in st.container_statuses or []):
            entry["tor_version"] = _tor_version(p.metadata.name, cluster)
        pods[p.metadata.name] = entry
    meta["pods"] = pods
    meta["images"] = {ref: sorted(ids) for ref, ids in sorted(digests.items())}
    versions = sorted({e["tor_version"] for e in pods.values() if e.get("tor_version")})
    meta["tor_versions"] = versions
    split = {ref: ids for ref, ids in meta["images"].items() if len(ids) > 1}
    if console is not None and split:
        console.log("[yellow]warning[/yellow]: one image reference, several builds across nodes: "
                    + "; ".join(f"{ref}: {', '.join(ids)}" for ref, ids in split.items())
                    + " (meta.json images; reload the images or use a registry with a new tag)")


def _pod_is(pod: str, release: str, node: dict) -> bool:
    """Whether a StatefulSet pod <release>-<group>-<i> is this torbed node (<group><i>)."""
    m = re.fullmatch(rf"{re.escape(release)}-(.+)-(\d+)", pod)
    return bool(m) and f"{m.group(1)}{m.group(2)}" == node["name"]


def _save_logs(cluster: Cluster, release: str, logs: Path) -> None:
    for p in cluster.pods(release):
        for c in (p.spec.init_containers or []) + (p.spec.containers or []):
            (logs / f"{p.metadata.name}.{c.name}.log").write_text(cluster.log(p.metadata.name, c.name))


fetch_records = _fetch
