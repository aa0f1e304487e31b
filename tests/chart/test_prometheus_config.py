"""The chart's two ways of being scraped agree, checked with Debian's real Prometheus:

- the in-chart Prometheus (prometheus.enabled): its generated prometheus.yml passes
  `promtool check config`, and every static target is the stable DNS name of a pod the chart
  renders (StatefulSet pods under their headless Service, Indexed Job pods under their
  group's), every such pod a target;
- the PodMonitors/ServiceMonitor's relabelings, run by a real Prometheus over the
  discovery labels those pods would have, give each target the same job, release, variant,
  group, node, role and rep as the in-chart Prometheus' static config (which are the local
  backend's labels the dashboards select by).

Debian's Prometheus has no kubernetes_sd, so the discovery labels are fed through file_sd.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
import yaml

from test_chart import CHART, CRD_APIS, K8S_SCENARIOS, REPO, kubeconform_ok, run, show
from torbed import constants

NAMESPACE, RELEASE, DOMAIN = "lab", "rel", "cluster.local"
COMPARED = ("job", "release", "variant", "group", "node", "role", "rep")


def render(tools, scenario, *extra) -> list[dict]:
    api_args = [a for api in CRD_APIS for a in ("--api-versions", api)]
    p = run(tools, tools["helm"], "template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(scenario),
            "--set", "prometheus.enabled=true", *extra, *api_args)
    assert p.returncode == 0, show(p)
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def prometheus_yml(docs) -> dict:
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == f"{RELEASE}-prometheus")
    return yaml.safe_load(cm["data"]["prometheus.yml"])


def pods(docs) -> list[dict]:
    """The pods the release's StatefulSets, Indexed Jobs and Deployments create: name, DNS
    name (none for a Deployment's), labels, annotations (as the controllers set them)."""
    out = []
    for d in docs:
        if d["kind"] == "StatefulSet":
            for i in range(d["spec"].get("replicas", 1)):
                name = f"{d['metadata']['name']}-{i}"
                out.append({"name": name, "dns": f"{name}.{d['spec']['serviceName']}", "kind": "StatefulSet",
                            "labels": d["spec"]["template"]["metadata"]["labels"], "annotations": {}})
        elif d["kind"] == "Job" and d["spec"].get("completionMode") == "Indexed":
            sub = d["spec"]["template"]["spec"].get("subdomain")
            for i in range(d["spec"]["completions"]):
                host = f"{d['metadata']['name']}-{i}"     # the Job controller's hostname
                out.append({"name": f"{host}-x7k2p", "dns": f"{host}.{sub}", "kind": "Job",
                            "labels": d["spec"]["template"]["metadata"]["labels"],
                            "annotations": {"batch.kubernetes.io/job-completion-index": str(i)}})
        elif d["kind"] == "Deployment":
            for _ in range(d["spec"].get("replicas", 1)):
                out.append({"name": f"{d['metadata']['name']}-7c9d8b6f5-q2w4e", "dns": None, "kind": "Deployment",
                            "labels": d["spec"]["template"]["metadata"]["labels"], "annotations": {}})
    return out


@pytest.mark.parametrize("scenario", K8S_SCENARIOS, ids=[s.stem for s in K8S_SCENARIOS])
def test_in_chart_prometheus_renders_validates_and_promtool_accepts_it(tools, scenario, tmp_path):
    kubeconform_ok(tools, scenario, ["--set", "prometheus.enabled=true"], [])
    docs = render(tools, scenario)
    cfg = prometheus_yml(docs)
    f = tmp_path / "prometheus.yml"
    f.write_text(yaml.safe_dump(cfg))
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: apt-get install prometheus (make setup)"
    p = subprocess.run([promtool, "check", "config", str(f)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr

    headless = {d["metadata"]["name"]: d for d in docs
                if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"}
    want = {}
    for pod in pods(docs):
        comp = pod["labels"]["app.kubernetes.io/component"]
        if comp not in ("relay", "client"):     # file servers export nothing
            continue
        svc = headless[pod["dns"].split(".", 1)[1]]       # the subdomain is a headless Service...
        assert svc["spec"]["selector"].items() <= pod["labels"].items(), pod   # ...selecting the pod
        host = f"{pod['dns']}.{NAMESPACE}.svc.{DOMAIN}"
        if comp == "relay":
            want[("tor", f"{host}:9035")] = pod
            want[("collector", f"{host}:9037")] = pod
        elif comp == "client":
            want[("driver", f"{host}:9036")] = pod
    got = {(j["job_name"], t) for j in cfg["scrape_configs"] if j["job_name"] in ("tor", "collector", "driver")
           for sc in j["static_configs"] for t in sc["targets"]}
    assert got == set(want), sorted(got ^ set(want))
    # The ports are the containers' (a port renamed in a template but not here would be missed).
    ports = {c["name"]: {p["containerPort"] for p in c.get("ports", [])} for d in docs
             if d["kind"] in ("StatefulSet", "Job") for c in d["spec"]["template"]["spec"]["containers"]}
    assert 9037 in ports["collector"] and 9036 in ports["driver"]


LOAD_VALUES = CHART / "tests" / "load" / "values-load.yaml"


def test_in_chart_prometheus_scrapes_the_locust_master_through_its_service(tools, tmp_path):
    """With load:, job locust has one target: the master's Service by its DNS name, on the
    Service port that leads to the master container's exporter port (9038); promtool accepts
    the config. Without load there is no such job (the parametrized test's scenarios)."""
    docs = render(tools, REPO / "scenarios" / "quickstart.yaml", "-f", str(LOAD_VALUES))
    cfg = prometheus_yml(docs)
    f = tmp_path / "prometheus.yml"
    f.write_text(yaml.safe_dump(cfg))
    p = subprocess.run([shutil.which("promtool") or "promtool", "check", "config", str(f)], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "locust"]
    ((target,),) = [sc["targets"] for sc in job["static_configs"]]
    host, port = target.rsplit(":", 1)
    svc_name, rest = host.split(".", 1)
    assert rest == f"{NAMESPACE}.svc.{DOMAIN}"
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == svc_name)
    (master,) = [pod for pod in pods(docs) if svc["spec"]["selector"].items() <= pod["labels"].items()]
    assert master["labels"]["app.kubernetes.io/component"] == "load-master"
    (sp,) = [sp for sp in svc["spec"]["ports"] if sp["port"] == int(port)]
    dep = next(d for d in docs if d["kind"] == "Deployment" and master["name"].startswith(d["metadata"]["name"] + "-"))
    cports = {cp["name"]: cp["containerPort"] for c in dep["spec"]["template"]["spec"]["containers"]
              for cp in c.get("ports", [])}
    assert cports[sp["targetPort"]] == constants.LOCUST_METRICS_PORT == int(port)
    assert job["static_configs"][0]["labels"]["node"] == "locust0" and job["honor_labels"] is True


def _sanitize(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _snake(rule: dict) -> dict:
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex",
            "replacement": "replacement", "action": "action"}
    return {keys[k]: v for k, v in rule.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_podmonitor_relabelings_give_the_in_chart_prometheus_labels(tools, tmp_path):
    """Run the PodMonitors' and the ServiceMonitor's relabelings in a real Prometheus over the
    discovery labels the release's pods would have; the resulting target labels must be the
    in-chart config's (a relay group with its own variant included)."""
    docs = render(tools, REPO / "scenarios" / "quickstart.yaml", "-f", str(LOAD_VALUES), "--set", "podMonitor.enabled=true",
                  "--set", "variant=ewma-66", "--set", "network.relays.middle.variant=kist", "--set", "repetition=4")
    static = {}
    for job in prometheus_yml(docs)["scrape_configs"]:
        for sc in job["static_configs"]:
            labels = dict(sc["labels"], job=job["job_name"])
            static[(job["job_name"], labels["node"])] = {k: labels.get(k, "") for k in COMPARED}

    def meta(pod_labels: dict, name: str, annotations: dict) -> dict:
        m = {f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in pod_labels.items()}
        m.update({f"__meta_kubernetes_pod_annotation_{_sanitize(k)}": v for k, v in annotations.items()})
        m["__meta_kubernetes_pod_name"] = name
        return m

    jobs = []
    for d in docs:
        if d["kind"] not in ("PodMonitor", "ServiceMonitor"):
            continue
        sel = d["spec"]["selector"]["matchLabels"]
        endpoints = d["spec"].get("podMetricsEndpoints") or d["spec"]["endpoints"]
        if d["kind"] == "PodMonitor":
            groups = [meta(p["labels"], p["name"], p["annotations"]) for p in pods(docs)
                      if sel.items() <= p["labels"].items()]
        else:   # the results Deployment's pod behind the Service
            dep = next(x for x in docs if x["kind"] == "Deployment"
                       and x["spec"]["selector"]["matchLabels"].items() >= sel.items())
            groups = [meta(dep["spec"]["template"]["metadata"]["labels"], f"{dep['metadata']['name']}-7c9d8b6f5-q2w4e", {})]
        for k, ep in enumerate(endpoints):
            sd = tmp_path / f"{d['metadata']['name']}-{k}.json"
            sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{9 + i}"], "labels": g} for i, g in enumerate(groups)]))
            jobs.append({"job_name": f"{d['metadata']['name']}-{k}", "honor_labels": ep.get("honorLabels", False),
                         "file_sd_configs": [{"files": [str(sd)]}],
                         "relabel_configs": [_snake(r) for r in ep["relabelings"]]})
    assert len(jobs) == 5       # relays: tor + collector; drivers; Locust master; results
    cfg = tmp_path / "prometheus.yml"
    # A long interval: nothing needs scraping, only the targets' labels are looked at.
    cfg.write_text(yaml.safe_dump({"global": {"scrape_interval": "1h"}, "scrape_configs": jobs}))
    port = _free_port()
    proc = subprocess.Popen([shutil.which("prometheus") or "prometheus", f"--config.file={cfg}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        want = {k: v for k, v in static.items() if k[0] != "prometheus"}
        deadline, got = time.time() + 30, {}
        while time.time() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=2) as r:
                    active = json.load(r)["data"]["activeTargets"]
                got = {(t["labels"]["job"], t["labels"]["node"]): {k: t["labels"].get(k, "") for k in COMPARED}
                       for t in active}
                if len(active) >= len(want):
                    break
            except OSError:
                pass
            time.sleep(0.3)
    finally:
        proc.terminate()
        proc.wait(10)
    assert got == want
    assert got[("tor", "middle0")]["variant"] == "kist" and got[("driver", "bulk1")]["variant"] == "ewma-66"
    assert got[("collector", "guard0")]["rep"] == "4"
    assert got[("locust", "locust0")]["role"] == "loadmaster" and got[("locust", "locust0")]["variant"] == "ewma-66"
