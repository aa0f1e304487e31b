"""Fault injection on the Kubernetes backend: the scenario's faults applied at their times by
``torbed.fault_schedule.FaultRunner`` (the same schedule and faults.jsonl timeline as the local
backend) with actions that act on pods. Which path each kind takes (docs/faults.md):

One meaning per kind, as on the local backend (docs/faults.md "One meaning per kind"); the
mechanism used is in each apply record (``mechanism``):

- kill: SIGKILL to tor, and it stays down. torbed first marks the pod held
  (``/run/torbed/fault-hold``; the chart's tor container waits while it is there instead of
  starting tor), then sends SIGKILL through ``kubectl exec``, or, with Chaos Mesh (the chart's
  ``<release>-faults`` ConfigMap has the kill) and its chaos-daemon running, creates the
  chart's PodChaos container-kill (SIGKILL from chaos-daemon) at the fault's time and waits
  for Chaos Mesh's report of it (``chaos_status``: kept in the apply record, with Chaos
  Mesh's injection time). Without chaos-daemon the same SIGKILL is sent by torbed, and the
  record says why.
- restart: SIGTERM to tor through ``kubectl exec`` (Chaos Mesh has no SIGTERM action); with a
  duration the pod is held for it, then released; the kubelet starts the container again,
  after its crash back-off from the second exit of a container on (10 s, 20 s, 40 s ...:
  ``kubelet_backoff_s``; ``backoff.py`` refuses schedules that would meet it).
- cpu: the tor container's CPU limit lowered in place (the pod's ``resize`` subresource,
  InPlacePodVerticalScaling) and set back: a CFS quota as on the local backend, with or
  without Chaos Mesh (a StressChaos competes for CPU instead of capping it).
- link, either way: the shaper sidecar of every pod on a side of the fault changes its own
  tc tree (``python -m torbed.pods.shaper fault apply|undo`` through the API's exec into the
  ``shaper`` container; the shaper acknowledges once tc has changed): a rate fault an htb
  class per peer group, a partition the drop class, for the peers' addresses. Chaos Mesh's
  NetworkChaos needs chaos-daemon and sch_netem and would replace the root qdisc the shaper
  owns.
- pause, either way: SIGSTOP / SIGCONT to tor through ``kubectl exec`` (the chart shares the
  relay pods' process namespace when the scenario has a pause fault: tor is not the
  namespace's init then, which would ignore SIGSTOP sent from inside). Chaos Mesh has no
  kind for it that works without chaos-daemon (pod-failure replaces the container's image:
  tor exits, that is a kill and restart, not a pause).

Public API: ``make_runner(backend, rep, t_work, chaos) -> FaultRunner``,
``chaos_objects(cluster, release) -> {fault index: manifest} | None``,
``chaos_status(obj) -> dict`` (what Chaos Mesh reports it did with an object, and when).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import yaml

from ...errors import RunFailed
from ...fault_schedule import Action, FaultRunner
from ...pods.shaper import REPLY
from ...network import LOAD_GROUP
from ...scenario import fault_nodes
from .backoff import kubelet_backoff_s

GROUP, VERSION = "chaos-mesh.org", "v1alpha1"
RESIZE_TIMEOUT_S = 20.0
DAEMON_LABEL = "app.kubernetes.io/component=chaos-daemon"
# How long a created container-kill may take until Chaos Mesh reports it done (measured on the
# local 2-core cluster: about 1 s; its controller retries a failed injection with back-off).
CHAOS_INJECT_TIMEOUT_S = 20.0
# The tor processes of the pod (tor is PID 1 of its container, or a child of the pod's
# pause process when the pod shares its process namespace), signalled; prints their pids.
SIGNAL_TOR = ('%s p=; for d in /proc/[0-9]*; do [ "$(cat $d/comm 2>/dev/null)" = tor ] && p="$p ${d#/proc/}"; done; '
              '[ -n "$p" ] || { echo "no tor process in the container"; exit 0; }; kill -%s $p && echo "signalled:$p"')
# The chart's tor container waits while this exists instead of starting tor (kill, restart's downtime).
HOLD = "/run/torbed/fault-hold"
HOLD_ON = f"touch {HOLD} &&"
HOLD_WAIT_S = 60.0   # for the kubelet to start a held container again (its back-off is refused longer)
# The container's CFS quota in us (cgroup v1, else v2's cpu.max), "max" without a limit.
CPU_QUOTA = "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max"
SHAPER_FAULT = ["/opt/torbed/bin/python", "-m", "torbed.pods.shaper", "fault"]   # the chart's shaper image
EXEC_PARALLEL = 8   # pods changed at once by a link fault (each exec is a short Python start in the pod)


def chaos_objects(cluster, release: str) -> dict[int, dict] | None:
    """The Chaos Mesh manifests the chart rendered for this release's faults (its
    ``<release>-faults`` ConfigMap), by fault index; None when it has none (Chaos Mesh off)."""
    try:
        data = cluster.core.read_namespaced_config_map(f"{release}-faults", cluster.ns).data or {}
    except cluster.ApiException as e:
        if e.status == 404:
            return None
        raise RunFailed(f"Kubernetes API: read configmap {release}-faults: HTTP {e.status} {e.reason}") from None
    return {int(k.removeprefix("fault-").removesuffix(".yaml")): yaml.safe_load(v) for k, v in data.items()}


def chaos_daemon_problem(cluster) -> str | None:
    """Why no chaos-daemon runs in the cluster (None: one runs), looked up by Chaos Mesh's own
    label in every namespace; a ServiceAccount that may not list pods there gets the reason."""
    try:
        pods = cluster.core.list_pod_for_all_namespaces(label_selector=DAEMON_LABEL).items
    except cluster.ApiException as e:
        return f"chaos-daemon's pods could not be listed (HTTP {e.status} {e.reason})"
    except cluster.TransportError as e:
        return f"chaos-daemon's pods could not be listed ({e})"
    if not any(p.status.phase == "Running" for p in pods):
        return f"no chaos-daemon pod runs in the cluster (label {DAEMON_LABEL})"
    return None


def chaos_status(obj: dict) -> dict:
    """What Chaos Mesh reports it did with an object, from its status: per container record
    (``id``: namespace/pod/container) the phase and the events, each ``{operation: Apply |
    Recover, type: Succeeded | Failed, t: Unix s, message}`` (Chaos Mesh's timestamps have
    a resolution of 1 s); ``t_injected`` / ``t_recovered``: the last successful Apply /
    Recover of any record (None while there is none)."""
    recs = ((obj.get("status") or {}).get("experiment") or {}).get("containerRecords") or []
    out, last = [], {"Apply": None, "Recover": None}
    for r in recs:
        events = []
        for e in r.get("events") or []:
            t = _unix(e.get("timestamp"))
            events.append({"operation": e.get("operation"), "type": e.get("type"), "t": t,
                           **({"message": e["message"]} if e.get("message") else {})})
            if e.get("type") == "Succeeded" and e.get("operation") in last and t is not None:
                last[e["operation"]] = max(t, last[e["operation"]] or t)
        out.append({"id": r.get("id"), "phase": r.get("phase"), "events": events})
    return {"records": out, "t_injected": last["Apply"], "t_recovered": last["Recover"]}


def _unix(ts: str | None) -> float | None:
    """An RFC 3339 timestamp of the API (``2026-11-27T23:01:02Z``) as Unix seconds."""
    if not ts:
        return None
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def check_chaos_mesh(cluster, objects: dict[int, dict]) -> None:
    """Every Chaos Mesh kind the faults need is served by the cluster (its CRDs installed),
    checked before the workload starts rather than at the fault's time."""
    for plural in sorted({o["kind"].lower() for o in objects.values()}):
        try:
            cluster.custom.list_namespaced_custom_object(GROUP, VERSION, cluster.ns, plural, limit=1)
        except cluster.ApiException as e:
            why = "not served (Chaos Mesh's CRDs are not installed)" if e.status == 404 else f"HTTP {e.status} {e.reason}"
            raise RunFailed(f"chaosMesh.enabled: the faults need {GROUP}/{VERSION} {plural}: {why}") from None


class Ctx:
    """What the Kubernetes actions use: the API, the release, its Chaos Mesh manifests."""

    def __init__(self, cluster, plan, release: str, chaos: dict[int, dict] | None, meta: dict | None = None):
        self.cluster, self.plan, self.release, self.chaos = cluster, plan, release, chaos
        self.created: dict[str, str] = {}   # Chaos Mesh object name -> plural, until deleted
        self.meta = meta if meta is not None else {}   # the repetition's meta.json

    def pods(self, nodes: list[str]) -> list[str]:
        return [f"{self.release}-{self.plan.node(n).group}-{self.plan.node(n).index}" for n in nodes]

    def chaos_object(self, i: int) -> dict | None:
        return (self.chaos or {}).get(i)

    def create(self, obj: dict) -> str:
        plural, name = obj["kind"].lower(), obj["metadata"]["name"]
        self.cluster._call(f"create {plural} {name}", self.cluster.custom.create_namespaced_custom_object,
                           GROUP, VERSION, self.cluster.ns, plural, obj)
        self.created[name] = plural
        return f"Chaos Mesh {obj['kind']} {name} created"

    def delete(self, name: str) -> str:
        self._keep_status(name)
        plural = self.created.pop(name)
        try:
            self.cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, self.cluster.ns, plural, name)
        except self.cluster.ApiException as e:
            if e.status != 404:
                self.created[name] = plural
                raise RunFailed(f"Kubernetes API: delete {plural} {name}: HTTP {e.status} {e.reason}") from None
        except self.cluster.TransportError as e:
            self.created[name] = plural
            raise RunFailed(f"Kubernetes API: delete {plural} {name}: {e}") from None
        return f"{plural} {name} deleted"

    def _read(self, name: str) -> dict:
        return self.cluster._call(f"read {self.created[name]} {name}", self.cluster.custom.get_namespaced_custom_object,
                                  GROUP, VERSION, self.cluster.ns, self.created[name], name)

    def _keep_status(self, name: str) -> None:
        """meta.json ``chaos_objects``: what Chaos Mesh says it did with the object (the pods
        it injected, its events and their times), read before the object is deleted: a
        cluster whose CRDs exist but whose controller does not run accepts the object and
        does nothing."""
        try:
            obj = self._read(name)
        except RunFailed as e:
            self.meta.setdefault("chaos_objects", {})[name] = {"status": f"not readable: {e}"}
            return
        st = chaos_status(obj)
        injected = sorted(r["id"] for r in st["records"] if any(
            e["operation"] == "Apply" and e["type"] == "Succeeded" for e in r["events"]))
        self.meta.setdefault("chaos_objects", {})[name] = {"kind": obj["kind"], "injected": injected, **st}

    def wait_injected(self, name: str, want: int, timeout_s: float = CHAOS_INJECT_TIMEOUT_S) -> dict:
        """Wait until Chaos Mesh reports a successful injection into ``want`` containers of
        the object it was just given (``chaos_status``, plus ``t_seen``: when torbed read
        it). Raises RunFailed when they were not all injected within ``timeout_s`` (Chaos
        Mesh retries a failed injection meanwhile): the fault did not happen."""
        t0 = time.time()
        while True:
            st = chaos_status(self._read(name))
            done = [r for r in st["records"] if any(e["operation"] == "Apply" and e["type"] == "Succeeded"
                                                    for e in r["events"])]
            if len(done) >= want:
                return {"object": name, **st, "t_seen": time.time()}
            if time.time() - t0 > timeout_s:   # a failed injection is retried: wait for its retry too
                failed = [f"{r['id']}: {e.get('message', '')}" for r in st["records"] for e in r["events"]
                          if e["operation"] == "Apply" and e["type"] == "Failed"]
                why = "failed: " + "; ".join(failed) if failed else "was not reported (is its controller running?)"
                raise RunFailed(f"Chaos Mesh {self.created[name]} {name}: {len(done)} of {want} containers "
                                f"injected {timeout_s:.0f} s after it was created; the injection {why}")
            time.sleep(0.2)

    def cleanup(self) -> list[str]:
        """Delete the Chaos Mesh objects still there (one-shot kinds stay until now, so their
        status can be read during the run); returns what failed."""
        errors = []
        for name in list(self.created):
            try:
                self.delete(name)
            except RunFailed as e:
                errors.append(str(e))
        return errors

    def exec_tor(self, pod: str, script: str, what: str) -> str:
        """Run a bash script in the pod's tor container; its output."""
        from kubernetes.stream import stream
        try:
            return stream(self.cluster.core.connect_get_namespaced_pod_exec, pod, self.cluster.ns, container="tor",
                          command=["bash", "-c", script], stderr=True, stdin=False, stdout=True, tty=False,
                          _request_timeout=30)
        except (self.cluster.ApiException, *self.cluster.TransportError) as e:
            raise RunFailed(f"exec in {pod} ({what}): {e}") from None

    def exec_shaper(self, pod: str, argv: list[str], what: str) -> dict:
        """Run ``torbed.pods.shaper fault ...`` in the pod's shaper container; its JSON reply.
        Thread-safe: the client's exec swaps its ApiClient's request method while it runs,
        so each call has an ApiClient of its own."""
        from kubernetes import client
        from kubernetes.stream import stream
        try:
            with client.ApiClient() as api:
                out = stream(client.CoreV1Api(api).connect_get_namespaced_pod_exec, pod, self.cluster.ns,
                             container="shaper", command=argv, stderr=True, stdin=False, stdout=True, tty=False,
                             _request_timeout=60)
        except (self.cluster.ApiException, *self.cluster.TransportError) as e:
            raise RunFailed(f"exec in {pod} ({what}): {e}") from None
        reply = [line for line in out.splitlines() if line.startswith(REPLY)]
        try:
            return json.loads(reply[-1][len(REPLY):])
        except (IndexError, ValueError):
            raise RunFailed(f"{what} in {pod}: {out.strip()[-300:] or 'no answer from the shaper'}") from None

    def node_pods(self) -> dict[str, object]:
        """The running pod of each node (the plan's names: auth0, guard0, bulk1, load0 ...)."""
        out, load = {}, []
        for p in self.cluster.pods(self.release):
            if p.status.phase != "Running" or p.metadata.deletion_timestamp:
                continue
            labels, ann = p.metadata.labels or {}, p.metadata.annotations or {}
            comp = labels.get("app.kubernetes.io/component")
            group = "auth" if comp == "authority" else labels.get("torbed.io/group")
            if group is None:
                continue   # results, Prometheus: not nodes
            if comp == "load-worker":   # a Deployment: no pod is a given load node
                load.append(p)
            elif "batch.kubernetes.io/job-completion-index" in ann:
                out[f"{group}{ann['batch.kubernetes.io/job-completion-index']}"] = p
            elif "statefulset.kubernetes.io/pod-name" in labels:
                out[f"{group}{p.metadata.name.rsplit('-', 1)[1]}"] = p
            else:
                out[f"{group}0"] = p   # the Locust master
        for k, p in enumerate(sorted(load, key=lambda p: p.metadata.name)):
            out[f"{LOAD_GROUP}{k}"] = p
        return out

    def signal_tor(self, pod: str, sig: str, hold: bool = False) -> str:
        """Send ``sig`` (STOP, CONT, TERM, KILL) to tor in the pod's tor container, the pod
        first marked held when ``hold``; its pids."""
        out = self.exec_tor(pod, SIGNAL_TOR % (HOLD_ON if hold else "", sig), f"SIG{sig} to tor")
        if "signalled:" not in out:
            raise RunFailed(f"SIG{sig} to tor in {pod}: {out.strip()[-300:]}")
        return " ".join(out.split("signalled:", 1)[1].split()) or "?"

    def check_gone(self, pod: str, pids: str, sig: str, wait_s: float = 3.0) -> None:
        """Raise unless the tor processes ``pids`` of the pod ended (or became zombies) within
        ``wait_s`` of ``sig``: a signal sent from inside a PID namespace to its init is ignored
        without an error, so a tor that is its container's PID 1 would survive a "kill"."""
        script = ('for p in %s; do s=$(sed -n "s/^State:\\s*//p" /proc/$p/status 2>/dev/null); '
                  '[ -n "$s" ] && [ "${s#Z}" = "$s" ] && echo "alive:$p"; done; echo checked') % pids
        t0, out = time.time(), ""
        while time.time() - t0 < wait_s:
            try:
                out = self.exec_tor(pod, script, f"after {sig}")
            except RunFailed:
                return           # the container is gone with its tor: the kubelet is restarting it
            if "checked" in out and "alive:" not in out:
                return
            time.sleep(0.5)
        raise RunFailed(f"{sig} to tor in {pod}: tor (pid {pids}) still runs {wait_s:.0f} s later; a signal "
                        f"sent to its PID namespace's init from inside is ignored (the chart shares the pod's "
                        f"process namespace for kill faults: is the release from an older chart?) {out.strip()[-200:]}")

    def hold(self, pod: str, on: bool, wait_s: float = 0.0) -> float:
        """Mark the pod held (its tor container does not start tor) or release it; waits up to
        ``wait_s`` for a tor container that is not running yet (the kubelet starts it again
        after the signal: on a loaded node that took over 3 s). Returns how long it waited."""
        t0 = time.time()
        while True:
            try:
                out = self.exec_tor(pod, f"{'touch' if on else 'rm -f'} {HOLD} && echo held:{int(on)}", "fault hold")
                break
            except RunFailed as e:
                if "container not found" not in str(e) and "not running" not in str(e) or time.time() - t0 > wait_s:
                    raise
                time.sleep(0.5)
        if f"held:{int(on)}" not in out:
            raise RunFailed(f"pod {pod}: could not {'set' if on else 'remove'} {HOLD}: {out.strip()[-300:]}")
        return time.time() - t0

    def tor_exits(self, pod: str) -> dict:
        """The tor container's restarts so far and when it last exited (Unix s, or None)."""
        p = self.cluster._call(f"read pod {pod}", self.cluster.core.read_namespaced_pod, pod, self.cluster.ns)
        st = next((c for c in p.status.container_statuses or [] if c.name == "tor"), None)
        term = st.last_state.terminated if st is not None and st.last_state is not None else None
        return {"restarts": st.restart_count if st is not None else 0,
                "last_exit": term.finished_at.timestamp() if term is not None and term.finished_at else None}

    def daemon_problem(self) -> str | None:
        """Why Chaos Mesh's chaos-daemon cannot carry out a container-kill here (None: it runs)."""
        if not hasattr(self, "_daemon"):
            self._daemon = chaos_daemon_problem(self.cluster)
        return self._daemon

    def tor_cpu(self, pod: str) -> tuple[dict, dict]:
        """The tor container's resources as the spec asks and as the kubelet applied them."""
        p = self.cluster._call(f"read pod {pod}", self.cluster.core.read_namespaced_pod, pod, self.cluster.ns)
        spec = next(c for c in p.spec.containers if c.name == "tor").resources
        st = next((c for c in p.status.container_statuses or [] if c.name == "tor"), None)
        applied = st.resources if st is not None and st.resources is not None else None
        return ({"requests": dict(spec.requests or {}), "limits": dict(spec.limits or {})},
                {"requests": dict(applied.requests or {}), "limits": dict(applied.limits or {})} if applied else {})

    def resize(self, pod: str, resources: dict) -> float:
        """Set the tor container's CPU in place and wait until the container's cgroup has
        the new CFS quota (read inside the container: the API's container status may report
        the allocation before the kubelet has written the cgroup); returns how long it took."""
        t0 = time.time()
        self.cluster._call(f"resize pod {pod}", self.cluster.core.patch_namespaced_pod_resize, pod, self.cluster.ns,
                           {"spec": {"containers": [{"name": "tor", "resources": resources}]}})
        # The kubelet's CFS period is 100 ms: a limit of N millicores is a quota of N * 100 us.
        want = str(_millicores(resources["limits"]["cpu"]) * 100)
        while True:
            got = self.exec_tor(pod, CPU_QUOTA, "read the CPU quota").strip()
            if got == want:
                return time.time() - t0
            if time.time() - t0 > RESIZE_TIMEOUT_S:
                raise RunFailed(f"pod {pod}: the tor container's CFS quota is {got!r}, not {want} us per 100 ms, "
                                f"{RESIZE_TIMEOUT_S:.0f} s after the resize to {resources['limits']['cpu']} "
                                f"(status: {self.tor_cpu(pod)[1]})")
            time.sleep(0.2)


def _millicores(q: str | None) -> int | None:
    if q is None:
        return None
    q = str(q)
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


class Kill(Action):
    """SIGKILL to tor and it stays down (the pod held), as on the local backend."""
    undoable = False

    def apply(self, ctx):
        self.pods = ctx.pods(self.nodes)
        obj = ctx.chaos_object(self.index)
        why = None if obj is None else ctx.daemon_problem()
        exits = {pod: ctx.tor_exits(pod) for pod in self.pods}
        chaos = {}
        if obj is not None and why is None:
            for pod in self.pods:
                ctx.hold(pod, True)
            t_create = time.time()
            how = ctx.create(obj) + " (container-kill: SIGKILL from chaos-daemon)"
            # The record says when Chaos Mesh reports the kill done, not only that it was asked.
            chaos = {"chaos_mesh": {**ctx.wait_injected(obj["metadata"]["name"], len(self.pods)),
                                    "t_created": t_create}}
            mechanism = "Chaos Mesh PodChaos container-kill (SIGKILL from chaos-daemon), pod held"
        else:
            self.pids = {pod: ctx.signal_tor(pod, "KILL", hold=True) for pod in self.pods}
            for pod, pids in self.pids.items():
                ctx.check_gone(pod, pids, "SIGKILL")
            how = "SIGKILL to tor (kubectl exec)"
            mechanism = "torbed: SIGKILL to tor (kubectl exec), pod held"
        self.mechanism = mechanism
        self.record = {"pods": self.pods, "how": how, "signal": "SIGKILL",
                       "note": "the pod is held: its tor container, started again by the kubelet, waits "
                               "instead of starting tor",
                       "tor_exits_before": exits, **chaos, **({"chaos_mesh_not_used": why} if why else {})}
        return f"{how}: {', '.join(self.pods)}"

    def undo(self, ctx, reason):
        return "nothing to undo (a killed tor stays down)"


class Restart(Action):
    """SIGTERM to tor (kubectl exec); with a duration the pod is held that long; the kubelet
    starts the container again (after its crash back-off: ``kubelet_backoff_s``)."""

    def apply(self, ctx):
        self.pods = ctx.pods(self.nodes)
        self.held = self.fault.duration is not None and self.fault.duration.seconds > 0
        exits = {pod: ctx.tor_exits(pod) for pod in self.pods}
        self.pids = {pod: ctx.signal_tor(pod, "TERM", hold=self.held) for pod in self.pods}
        t = time.time()
        backoff = {pod: kubelet_backoff_s(e["restarts"] + 1, None if e["last_exit"] is None else t - e["last_exit"])
                   for pod, e in exits.items()}
        self.mechanism = "torbed: SIGTERM to tor (kubectl exec)" + (", pod held for the downtime" if self.held else "") \
            + "; the kubelet starts the container again"
        how = "SIGTERM to tor (kubectl exec)" + (" and the pod held" if self.held else "")
        self.record = {"pods": self.pods, "how": how, "signal": "SIGTERM", "tor_exits_before": exits,
                       "kubelet_backoff_s": backoff}
        return f"{how}: {', '.join(self.pods)}; kubelet back-off " + \
            ", ".join(f"{p} {b:.0f} s" for p, b in backoff.items())

    def undo(self, ctx, reason):
        if not getattr(self, "held", False):
            return "nothing to undo (the kubelet starts tor again)"
        if reason != "duration":   # the run is over: as locally, not started again
            return f"not started again ({reason}): {', '.join(self.pods)} stay held"
        waited = {pod: ctx.hold(pod, False, wait_s=HOLD_WAIT_S) for pod in self.pods}
        self.held = False
        # The undo record's time is the release: later than planned when the kubelet had not
        # started the container again by then (the downtime then ran longer: recorded).
        return "hold released (tor starts again): " + ", ".join(
            p + (f" (its container started again only {w:.1f} s after the planned end)" if w >= 0.5 else "")
            for p, w in waited.items())


class Pause(Action):
    def apply(self, ctx):
        self.pods = ctx.pods(self.nodes)
        self.stopped: list[str] = []
        self.pids = {}
        for pod in self.pods:
            self.pids[pod] = ctx.signal_tor(pod, "STOP")
            self.stopped.append(pod)
        self.mechanism = "torbed: SIGSTOP / SIGCONT to tor (kubectl exec)"
        self.record = {"pods": self.pods, "how": "SIGSTOP to tor (kubectl exec)", "signal": "SIGSTOP"}
        return "SIGSTOP tor in " + ", ".join(f"{p} (pid {self.pids[p]})" for p in self.pods)

    def undo(self, ctx, reason):
        done, errors = [], []
        for pod in self.stopped:
            try:
                ctx.signal_tor(pod, "CONT")
                done.append(pod)
            except RunFailed as e:
                errors.append(str(e))
        self.stopped = []
        if errors:
            raise RunFailed("; ".join(errors))
        return "SIGCONT tor in " + ", ".join(done)


class Cpu(Action):
    def apply(self, ctx):
        self.pods = ctx.pods(self.nodes)
        milli = max(1, round(self.fault.cpu.fraction * 1000))
        self.saved: dict[str, dict] = {}
        took = {}
        for pod in self.pods:
            spec, _ = ctx.tor_cpu(pod)
            if "cpu" not in spec["limits"]:
                raise RunFailed(f"pod {pod}: the tor container has no CPU limit to lower (the chart sets one "
                                "for groups a cpu fault targets)")
            req = _millicores(spec["requests"].get("cpu")) or 0
            new = {"limits": {"cpu": f"{milli}m"}, "requests": {"cpu": f"{min(req, milli)}m"}} if req else \
                {"limits": {"cpu": f"{milli}m"}}
            self.saved[pod] = {"limits": {"cpu": spec["limits"]["cpu"]},
                               **({"requests": {"cpu": spec["requests"]["cpu"]}} if req else {})}
            took[pod] = round(ctx.resize(pod, new), 3)
        how = f"in-place resize of the tor container's CPU limit to {milli}m"
        self.mechanism = f"torbed: CFS quota {milli * 100} us per 100 ms (in-place resize of the tor container's CPU limit)"
        self.record = {"pods": self.pods, "how": how, "resize_s": took,
                       "limits_before": {p: s["limits"]["cpu"] for p, s in self.saved.items()}}
        return f"{how}: " + ", ".join(f"{p} (applied after {t:.1f} s)" for p, t in took.items())

    def undo(self, ctx, reason):
        saved, self.saved = self.saved, {}
        for pod, res in saved.items():
            ctx.resize(pod, res)
        return "CPU limit set back: " + ", ".join(f"{p} {r['limits']['cpu']}" for p, r in saved.items())


def link_sides(plan, fault) -> list[tuple[list[str], list[str]]]:
    """(nodes, their peers) per side of a link fault: whose pods change their egress, and
    toward which nodes. ``between: [a, b]``: a's nodes toward b's and b's toward a's;
    ``target: x``: x's nodes toward every other node and every other node toward x's."""
    s = plan.scenario
    if fault.between is not None:
        a, b = (fault_nodes(s, side) for side in fault.between)
        return [(a, b), (b, a)]
    mine = fault_nodes(s, fault.target)
    others = [n.name for n in plan.nodes if n.name not in mine]
    return [(mine, others), (others, mine)]


def peer_args(plan, nodes: list[str]) -> list[str]:
    """Nodes as the shaper's peers: a whole group by its name (its Service records), the
    rest one by one (their pods' own records)."""
    want, out = set(nodes), []
    groups: dict[str, list[str]] = {}
    for n in plan.nodes:
        groups.setdefault(n.group, []).append(n.name)
    for g, members in groups.items():
        if set(members) <= want:
            out.append(g)
        else:
            out += [m for m in members if m in want]
    return out


class Link(Action):
    done: dict[str, dict] = {}   # pods whose shaper has (or may have) the fault: what undo visits

    def apply(self, ctx):
        f = self.fault
        self.done = {}
        pods = ctx.node_pods()
        todo: dict[str, dict] = {}   # pod -> {"uid", "nodes", "peers"}
        self.skipped: list[str] = []
        for nodes, peers in link_sides(ctx.plan, f):
            args = peer_args(ctx.plan, peers)
            for n in nodes:
                p = pods.get(n)
                if p is None:
                    self.skipped.append(n)   # not running now (a finished client): sends nothing
                    continue
                e = todo.setdefault(p.metadata.name, {"uid": p.metadata.uid, "nodes": [], "peers": []})
                e["nodes"].append(n)
                e["peers"] += [a for a in args if a not in e["peers"]]
        what = ["--partition"] if f.partition else ["--rate-bps", str(f.rate.bps)]
        errors = []

        def one(pod):
            e = todo[pod]
            argv = [*SHAPER_FAULT, "apply", "--id", str(self.index), *sum((["--peer", a] for a in e["peers"]), []), *what]
            return pod, ctx.exec_shaper(pod, argv, f"link fault {self.index}")

        with ThreadPoolExecutor(max_workers=EXEC_PARALLEL) as pool:
            for fut in [pool.submit(one, pod) for pod in sorted(todo)]:
                try:
                    pod, reply = fut.result()
                except RunFailed as e:
                    errors.append(str(e))
                    continue
                self.done[pod] = {**todo[pod], "classes": reply["classes"], "addresses": reply["addresses"],
                                  "took_s": reply["took_s"]}
        # Pods that failed may still have the request: undo visits them too.
        for pod in todo:
            self.done.setdefault(pod, {**todo[pod], "error": True})
        if errors:
            raise RunFailed("; ".join(errors))
        self.pods = sorted(self.done)
        desc = "partition (drop class)" if f.partition else f"rate {f.rate}"
        how = f"shaper sidecar: {desc} on the pods' egress toward the fault's peers (kubectl exec)"
        self.mechanism = f"shaper sidecar: htb {desc}"
        self.record = {"pods": self.pods, "how": how, "skipped": self.skipped,
                       "shaper": {p: {k: v for k, v in d.items() if k != "uid"} for p, d in self.done.items()}}
        return f"{how}: {len(self.done)} pods" + (f"; not running: {', '.join(self.skipped)}" if self.skipped else "")

    def undo(self, ctx, reason):
        done, self.done = self.done, {}
        current = {p.metadata.name: p for p in ctx.node_pods().values()}
        gone = sorted(p for p, d in done.items() if p not in current or current[p].metadata.uid != d["uid"])
        errors, undone = [], []

        def one(pod):
            return pod, ctx.exec_shaper(pod, [*SHAPER_FAULT, "undo", "--id", str(self.index)],
                                        f"undo of link fault {self.index}")

        with ThreadPoolExecutor(max_workers=EXEC_PARALLEL) as pool:
            for fut in [pool.submit(one, pod) for pod in sorted(set(done) - set(gone))]:
                try:
                    undone.append(fut.result()[0])
                except RunFailed as e:
                    errors.append(str(e))
        if errors:
            raise RunFailed("; ".join(errors))
        # A recreated pod starts with an empty state directory: its shaper never had the fault.
        return f"shaper sidecar: fault removed in {len(undone)} pods" + \
            (f"; ended or recreated since: {', '.join(gone)}" if gone else "")


KINDS = {"kill": Kill, "restart": Restart, "pause": Pause, "cpu": Cpu, "link": Link}


def make_runner(backend, rep, t_work: float, chaos: dict[int, dict] | None) -> FaultRunner:
    ctx = Ctx(backend.cluster, rep.state["plan"], rep.state["name"], chaos, rep.meta)
    return FaultRunner(rep, t_work, ctx, KINDS)
