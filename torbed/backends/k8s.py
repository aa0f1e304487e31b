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

Public API: ``run_scenario(scenario, scenario_path, run_root, console, ...) -> run_dir``,
``RunFailed``, ``Interrupted``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from .. import __version__, chart, constants, network, units
from ..scenario import Scenario
# One exception tree, signal handling and run.json/meta.json writing for both backends.
from .local import Interrupted, RunFailed, _on_signal, _write_json, utc_now  # noqa: F401 (re-exported)

CHART = constants.REPO_ROOT / "charts" / "torbed"
POLL_S = 1.0
# Waiting reasons that will not resolve by waiting longer.
FATAL_WAITING = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                 "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}


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


class Cluster:
    """The few API reads the backend needs, via the kubernetes client."""

    def __init__(self, namespace: str, context: str | None = None):
        try:
            from kubernetes import client, config
        except ImportError as e:  # pragma: no cover - a dependency of the package
            raise RunFailed(f"the kubernetes Python client is missing: {e}") from None
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
                config.load_incluster_config()
            else:
                config.load_kube_config(context=context)
        except Exception as e:  # the loaders raise several unrelated types
            raise RunFailed(f"no usable Kubernetes configuration (KUBECONFIG / ~/.kube/config): {e}") from None
        self.ns = namespace
        self.core = client.CoreV1Api()
        self.batch = client.BatchV1Api()
        self.custom = client.CustomObjectsApi()
        self.version = client.VersionApi()
        self.ApiException = client.exceptions.ApiException

    def server_version(self) -> str:
        try:
            return self.version.get_code().git_version
        except Exception as e:
            raise RunFailed(f"the Kubernetes API server is not reachable: {e}") from None

    def proxy_get(self, service: str, path: str, timeout: float = 10) -> tuple[int, bytes]:
        """GET through the API server's Service proxy (no port-forward, no exec)."""
        try:
            r = self.core.connect_get_namespaced_service_proxy_with_path(
                service, self.ns, path, _preload_content=False, _request_timeout=timeout)
            return r.status, r.data
        except self.ApiException as e:
            return e.status, (e.body or b"") if isinstance(e.body, bytes) else str(e.body or "").encode()
        except Exception as e:  # connection errors of urllib3
            return 0, str(e).encode()

    def pods(self, release: str) -> list:
        return self.core.list_namespaced_pod(self.ns, label_selector=f"app.kubernetes.io/instance={release}").items

    def jobs(self, release: str) -> list:
        return self.batch.list_namespaced_job(
            self.ns, label_selector=f"app.kubernetes.io/instance={release},app.kubernetes.io/component=client").items

    def configmap(self, name: str) -> dict:
        return self.core.read_namespaced_config_map(name, self.ns).data or {}

    def log(self, pod: str, container: str) -> str:
        try:
            return self.core.read_namespaced_pod_log(pod, self.ns, container=container, timestamps=True)
        except Exception as e:
            return f"(log unavailable: {e})\n"

    def delete_pod(self, pod: str) -> None:
        self.core.delete_namespaced_pod(pod, self.ns)

    def resume_podchaos(self, name: str) -> None:
        self.custom.patch_namespaced_custom_object(
            "chaos-mesh.org", "v1alpha1", self.ns, "podchaos", name,
            {"metadata": {"annotations": {"experiment.chaos-mesh.org/pause": "false"}}})


def _pod_problem(pod) -> str | None:
    """Why a pod will not get anywhere by waiting, or None."""
    for st in (pod.status.init_container_statuses or []) + (pod.status.container_statuses or []):
        w = st.state.waiting if st.state else None
        if w and w.reason in FATAL_WAITING:
            return f"pod {pod.metadata.name}, container {st.name}: {w.reason}: {w.message or ''}".strip()
        if w and w.reason == "CrashLoopBackOff" and (st.restart_count or 0) >= 3:
            return f"pod {pod.metadata.name}, container {st.name} keeps crashing ({st.restart_count} restarts)"
    if pod.status.phase == "Pending":
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return f"pod {pod.metadata.name} cannot be scheduled: {c.message}"
    return None


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

    def install(self, timeout_s: int) -> None:
        cmd = [self.helm, "install", self.name, str(CHART), "-n", self.cluster.ns, "-f", str(self.values),
               "--set", f"variant={self.variant}", "--set", f"repetition={self.rep}",
               "--timeout", f"{timeout_s}s"]
        for s in self.extra:
            cmd += ["--set", s]
        self.installed = True   # from here on, uninstall (a failed install leaves a release)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RunFailed(f"helm install {self.name} failed: {proc.stderr.strip() or proc.stdout.strip()}")

    def uninstall(self) -> str | None:
        if not self.installed:
            return None
        proc = subprocess.run([self.helm, "uninstall", self.name, "-n", self.cluster.ns, "--wait",
                               "--timeout", "180s"], capture_output=True, text=True)
        self.installed = False
        if proc.returncode != 0 and "not found" not in proc.stderr:
            return proc.stderr.strip()
        # helm returns once the owners are deleted; their pods terminate afterwards.
        deadline = time.time() + 120
        while self.cluster.pods(self.name):
            if time.time() > deadline:
                return f"pods of {self.name} still terminating after 120 s"
            time.sleep(1)
        return None


def run_scenario(scenario: Scenario, scenario_path: Path, run_root: Path, console, namespace: str = "default",
                 context: str | None = None, variants: list[str] | None = None,
                 extra_set: list[str] | None = None) -> Path:
    helm = helm_binary()
    cluster = Cluster(namespace, context)
    server_version = cluster.server_version()
    variants = variants or scenario.variants
    try:
        traces = chart.inline_traces(scenario)   # replay traces the client image lacks
    except (ValueError, OSError) as e:
        raise RunFailed(str(e)) from None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = run_root / f"{scenario.name}-{stamp}"
    run_dir.mkdir(parents=True)
    # The values file: the scenario as torbed decoded it (overrides such as --duration applied).
    values = run_dir / "values.yaml"
    values_data = scenario.model_dump(mode="json", exclude_none=True)
    if traces:
        values_data["replayTraces"] = {"inline": traces}
    values.write_text(yaml.safe_dump(values_data, sort_keys=False))
    run_json = {"schema": 1, "name": scenario.name, "scenario": scenario.model_dump(mode="json"),
                "seed": scenario.seed, "variants": variants,
                "baseline": scenario.baseline_variant if scenario.baseline_variant in variants else variants[0],
                "repetitions": scenario.repetitions, "backend": "k8s", "shaper": "htb (per pod)",
                "torbed_version": __version__, "tor_version": constants.TOR_VERSION,
                "host": {"kubernetes": server_version, "namespace": namespace, "context": context},
                "started": utc_now(), "finished": None, "status": "running", "source": str(scenario_path)}
    _write_json(run_dir / "run.json", run_json)
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    status = "failed"
    try:
        failures = 0
        for variant in variants:
            for rep in range(scenario.repetitions):
                meta = run_repetition(cluster, helm, scenario, values, run_dir, variant, rep, console,
                                      extra_set or [])
                failures += meta["status"] != "ok"
        status = "ok" if failures == 0 else "partial"
    except Interrupted:
        status = "interrupted"
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        run_json.update(finished=utc_now(), status=status)
        _write_json(run_dir / "run.json", run_json)
    return run_dir


def run_repetition(cluster: Cluster, helm: str, s: Scenario, values: Path, run_dir: Path, variant: str, rep: int,
                   console, extra_set: list[str]) -> dict:
    rep_dir = run_dir / variant / f"rep-{rep}"
    logs = rep_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(2)
    name = release_name(s.name, variant, rep, run_id)
    plan = network.plan(s, variant)
    meta = {"schema": 1, "variant": variant, "rep": rep, "run_id": name, "backend": "k8s",
            "release": name, "namespace": cluster.ns, "status": "running", "error": None,
            "t_start": time.time(), "t_ready": None, "ready_s": None, "t_workload_start": None, "t_end": None,
            "warmup_s": units.parse_duration(s.measure.warmup), "duration_s": units.parse_duration(s.measure.duration),
            "shaper": "htb (per pod)", "nodes": [], "faults": [], "pod_restarts": {}, "failed_pods": {}}
    _write_json(rep_dir / "meta.json", meta)
    console.rule(f"[bold]{s.name}[/bold] on Kubernetes: variant [cyan]{variant}[/cyan], "
                 f"repetition {rep + 1}/{s.repetitions} (release {name})")
    rel = Release(cluster, helm, name, values, variant, rep, extra_set, console)
    fn = name  # release names are <= 30 characters: the chart's fullname is the release name
    fetched: dict[str, int] = {}
    try:
        ready_timeout = units.parse_duration(s.measure.ready_timeout)
        with console.status("helm install (the keygen hook makes the keys)"):
            rel.install(timeout_s=int(ready_timeout) + 120)
        meta["t_installed"] = time.time()
        meta["install_s"] = round(meta["t_installed"] - meta["t_start"], 3)
        fprs = json.loads(cluster.configmap(f"{fn}-identities").get("fingerprints.json", "{}"))
        meta["nodes"] = [{**n.to_dict(), "address": None, "fingerprint": fprs.get(n.name)} for n in plan.nodes]
        _write_json(rep_dir / "meta.json", meta)

        # Ready = every client's evidence (see torbed.k8s.client), announced by the barrier.
        deadline = time.time() + ready_timeout + 60
        with console.status("waiting for the network (clients report their evidence)") as st:
            while True:
                code, body = cluster.proxy_get(f"{fn}-results:http", "start")
                if code == 200:
                    start = json.loads(body)
                    break
                pods = cluster.pods(name)
                for p in pods:
                    why = _pod_problem(p)
                    if why:
                        raise RunFailed(why)
                if time.time() > deadline:
                    raise RunFailed(f"network not ready after {s.measure.ready_timeout}: "
                                    + _fetch(cluster, fn, rep_dir, fetched, only="clients.jsonl"))
                ready = sum(1 for p in pods if p.status.phase == "Running")
                st.update(f"waiting for the network: {ready}/{len(pods)} pods running")
                time.sleep(POLL_S)
        meta["t_ready"] = start["t_all_ready"]
        meta["ready_s"] = round(meta["t_ready"] - meta["t_start"], 3)
        meta["t_workload_start"] = start["t_workload"]
        console.log(f"[green]ready[/green] {meta['ready_s']:.1f} s after helm install started "
                    f"({meta['install_s']:.1f} s install)")
        _write_json(rep_dir / "meta.json", meta)

        # Measure: faults on schedule; pods that fail or restart are recorded.
        t_work, duration = start["t_workload"], units.parse_duration(s.measure.duration)
        hard_end = t_work + duration + 300
        # Fault i of the scenario is PodChaos <release>-fault-i when the chart renders them.
        faults = sorted((units.parse_duration(f.at), i, f) for i, f in enumerate(s.faults))
        chaos_mesh = "chaosMesh.enabled=true" in extra_set
        with console.status("measuring") as st:
            while True:
                now = time.time()
                while faults and now >= t_work + faults[0][0]:
                    _, i, f = faults.pop(0)
                    targets = [n.name for n in plan.group_nodes(f.target)] or [f.target]
                    pods = [f"{fn}-{plan.node(t).group}-{plan.node(t).index}" for t in targets]
                    if chaos_mesh:
                        cluster.resume_podchaos(f"{fn}-fault-{i}")
                        how = f"Chaos Mesh PodChaos {fn}-fault-{i} resumed"
                    else:
                        for pod in pods:
                            cluster.delete_pod(pod)
                        how = "pod deleted"
                    meta["faults"].append({"at": f.at, "kind": f.kind, "target": f.target, "nodes": targets,
                                           "pods": pods, "t": now, "how": how,
                                           "note": "the StatefulSet recreates the pod with the same keys"})
                    console.log(f"fault: {how}: {', '.join(pods)}")
                jobs = cluster.jobs(name)
                done = [j for j in jobs if (j.status.succeeded or 0) + (j.status.failed or 0) >= (j.spec.completions or 1)]
                pods = cluster.pods(name)
                meta["pod_restarts"] = _restarts(pods)
                for p in pods:
                    if p.status.phase == "Failed":
                        meta["failed_pods"][p.metadata.name] = p.status.reason or "Failed"
                _fetch(cluster, fn, rep_dir, fetched)
                if jobs and len(done) == len(jobs):
                    break
                if now > hard_end:
                    raise RunFailed("client Jobs did not finish within the workload time + 300 s")
                left = max(0, t_work + duration - now)
                st.update(f"measuring: {left:.0f} s of workload left; {len(done)}/{len(jobs)} client groups done")
                time.sleep(POLL_S * 2)
        meta["t_end"] = time.time()
        failed = {j.metadata.name: j.status.failed for j in jobs if j.status.failed}
        if failed:
            meta["failed_jobs"] = failed
        meta["status"] = "ok" if not failed else "failed"
        if failed:
            meta["error"] = f"client Job(s) with failed pods: {failed}"
    except Interrupted as e:
        meta["status"], meta["error"] = "interrupted", f"interrupted by {e}"
        raise
    except RunFailed as e:
        meta["status"], meta["error"] = "failed", str(e)
        console.print(f"[red]failed[/red] {e}", highlight=False)
    finally:
        try:
            if rel.installed:
                if any(cg.workload.kind == "replay" for cg in s.clients.values()):
                    time.sleep(2.0)   # the replay servers' last cells: their shippers send every second
                _fetch(cluster, fn, rep_dir, fetched)
                _save_logs(cluster, name, logs)
        except Exception as e:  # never let collection keep a release installed
            meta.setdefault("collect_errors", []).append(str(e))
        err = rel.uninstall()
        if err:
            meta["uninstall_error"] = err
        meta["t_end"] = meta["t_end"] or time.time()
        meta["files"] = fetched
        _write_json(rep_dir / "meta.json", meta)
    return meta


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


def _save_logs(cluster: Cluster, release: str, logs: Path) -> None:
    for p in cluster.pods(release):
        for c in (p.spec.init_containers or []) + (p.spec.containers or []):
            (logs / f"{p.metadata.name}.{c.name}.log").write_text(cluster.log(p.metadata.name, c.name))
