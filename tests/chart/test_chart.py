"""The Helm chart (charts/torbed): every scenario x variant lints, renders, and the rendered
manifests validate offline against Kubernetes 1.33 and the CRDs we use (PodMonitor,
ServiceMonitor, Chaos Mesh); the chart's helm-unittest suites pass; invalid scenarios are
refused by the values schema with the offending field named.

Tools and schemas come from `make tools` (hack/chart/k8s-tools.sh), cached under
${TORBED_CACHE:-~/.cache/torbed}/tools. TORBED_CHART points the suite at another chart.
"""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = Path(os.environ.get("TORBED_CHART", REPO / "charts" / "torbed"))
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))
TIMEOUT = 180
BUILD_HINT = "run `make tools` (hack/chart/k8s-tools.sh) to build them"

# kubeconform's layouts (see hack/chart/openapi2jsonschema.py).
K8S_TEMPLATE = "{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json"
CRD_TEMPLATE = "{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"


# Features the chart refuses (only the local backend carries them out, or, for samples, only
# `torbed run`, which installs a release per block; _validate.tpl): the scenarios that use
# them are checked to be refused (test_what_only_the_local_backend_does_...), not rendered.
LOCAL_ONLY = {"cpu", "samples", "second_address", "crossover"}


def local_only(path: Path) -> set[str]:
    from torbed import engine, scenario
    return LOCAL_ONLY & set(engine.features_used(scenario.load(path)))


# The shipped scenarios the chart deploys (the others are checked to be refused).
K8S_SCENARIOS = [p for p in SCENARIOS if not local_only(p)]


def scenario_variants():
    cases = []
    for path in SCENARIOS:
        if local_only(path):
            continue
        with open(path) as f:
            variants = (yaml.safe_load(f) or {}).get("variants") or []
        for v in variants:
            cases.append(pytest.param(path, v, id=f"{path.stem}-{v}"))
    return cases


def tool_env():
    """Locations from `hack/chart/k8s-tools.sh --env` (it knows the pinned versions). TORBED_*
    variables already set win, so a runner can point elsewhere; HELM_PLUGINS is always ours
    (a user's own HELM_PLUGINS would not hold this helm-unittest)."""
    out = subprocess.run(["bash", str(REPO / "hack" / "chart" / "k8s-tools.sh"), "--env"],
                         check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.fullmatch(r'export (\w+)="(.*)"', line.strip())
        if m:
            found[m.group(1)] = m.group(2)
    bin_dir = found["PATH"].split(":")[0]
    env = dict(os.environ)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["HELM_PLUGINS"] = found["HELM_PLUGINS"]
    for key in ("TORBED_KUBE_VERSION", "TORBED_K8S_SCHEMAS", "TORBED_CRD_SCHEMAS"):
        env[key] = os.environ.get(key) or found[key]
    # helm must not read or write the user's helm config/cache/repositories.
    for key in ("HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME"):
        env.pop(key, None)
    return bin_dir, env


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    bin_dir, env = tool_env()
    home = tmp_path_factory.mktemp("helm-home")
    env.update(HELM_CONFIG_HOME=str(home / "config"), HELM_CACHE_HOME=str(home / "cache"),
               HELM_DATA_HOME=str(home / "data"))
    missing = [p for p in (Path(bin_dir) / "helm", Path(bin_dir) / "kubeconform",
                           Path(env["HELM_PLUGINS"]) / "unittest" / "plugin.yaml",
                           Path(env["TORBED_K8S_SCHEMAS"]) / f"v{env['TORBED_KUBE_VERSION']}-standalone-strict",
                           Path(env["TORBED_CRD_SCHEMAS"]) / "monitoring.coreos.com")
               if not p.exists()]
    if missing:
        pytest.fail("chart tools missing: " + ", ".join(map(str, missing)) + f"; {BUILD_HINT}",
                    pytrace=False)
    if not (CHART / "Chart.yaml").is_file():
        pytest.fail(f"no chart at {CHART} (Chart.yaml missing)", pytrace=False)
    return {"helm": str(Path(bin_dir) / "helm"), "kubeconform": str(Path(bin_dir) / "kubeconform"),
            "env": env}


def run(tools, *args, stdin=None):
    return subprocess.run(list(args), input=stdin, capture_output=True, text=True,
                          env=tools["env"], timeout=TIMEOUT)


def show(proc, limit=20000):
    """The command and its output for an assertion message (a whole rendering can be long)."""
    out = proc.stdout if len(proc.stdout) <= limit else proc.stdout[:limit] + "\n[... cut]"
    return f"$ {' '.join(proc.args)}\n--- stdout\n{out}\n--- stderr\n{proc.stderr}"


@pytest.mark.parametrize("scenario, variant", scenario_variants())
def test_lint(tools, scenario, variant):
    p = run(tools, tools["helm"], "lint", str(CHART), "-f", str(scenario), "--set", f"variant={variant}")
    assert p.returncode == 0, show(p)


# `helm template` has no cluster: resources the chart renders only when the cluster serves
# their API (PodMonitor, Chaos Mesh) appear only when those APIs are declared, so both ways.
CRD_APIS = ["monitoring.coreos.com/v1", "monitoring.coreos.com/v1/PodMonitor",
            "monitoring.coreos.com/v1/ServiceMonitor", "chaos-mesh.org/v1alpha1"]


@pytest.mark.parametrize("apis", [pytest.param([], id="no-crds"), pytest.param(CRD_APIS, id="crds")])
@pytest.mark.parametrize("scenario, variant", scenario_variants())
def test_template_validates(tools, scenario, variant, apis):
    kubeconform_ok(tools, scenario, ["--set", f"variant={variant}"], apis)


def test_chaos_mesh_faults_validate(tools, tmp_path):
    """The scenario's faults as Chaos Mesh objects (chaosMesh.enabled): one ConfigMap holding a
    manifest per fault whose Chaos Mesh action means what the kind means on every backend
    (kill: container-kill, SIGKILL; not restart, cpu, pause: torbed does them itself), each
    valid against Chaos Mesh's CRD schema, strictly."""
    data = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    data["faults"] = [{"at": "20s", "kind": "kill", "target": "middle0"},
                      {"at": "40s", "kind": "kill", "target": "guard"},
                      {"at": "50s", "kind": "pause", "target": "exit0", "duration": "5s"},
                      {"at": "60s", "kind": "restart", "target": "middle"},
                      {"at": "70s", "kind": "cpu", "target": "exit0", "cpu": "10%", "duration": "10s"}]
    f = tmp_path / "faults.yaml"
    f.write_text(yaml.safe_dump(data))
    found = kubeconform_ok(tools, f, ["--set", "chaosMesh.enabled=true"], CRD_APIS)
    assert found == 1 + kubeconform_ok(tools, f, [], CRD_APIS)   # the faults ConfigMap
    objs = chaos_manifests(tools, f)
    assert [(o["kind"], o["spec"].get("action"), o["spec"].get("containerNames")) for o in objs] == [
        ("PodChaos", "container-kill", ["tor"])] * 2
    env = tools["env"]
    k = run(tools, tools["kubeconform"], "-strict", "-summary",
            "-schema-location", f"{env['TORBED_CRD_SCHEMAS']}/{CRD_TEMPLATE}", "-",
            stdin=yaml.safe_dump_all(objs))
    assert k.returncode == 0 and "Valid: 2, Invalid: 0, Errors: 0" in k.stdout, show(k)


def chaos_manifests(tools, values: Path) -> list[dict]:
    """The Chaos Mesh objects the chart keeps in its <release>-faults ConfigMap."""
    t = run(tools, tools["helm"], "template", "t", str(CHART), "-f", str(values), "--set", "chaosMesh.enabled=true",
            "--show-only", "templates/chaos/configmap-faults.yaml")
    assert t.returncode == 0, show(t)
    cm = yaml.safe_load(t.stdout)
    return [yaml.safe_load(cm["data"][k]) for k in sorted(cm["data"], key=lambda k: int(k[6:-5]))]


def test_chaos_mesh_controller_manifests_validate(tools):
    """hack/cluster/chaos-mesh.sh's manifests for Chaos Mesh's controller-manager (e2e runs them:
    tests/e2e/test_faults_k8s.py) against the Kubernetes schemas, strictly."""
    m = run(tools, "bash", str(REPO / "hack" / "cluster" / "chaos-mesh.sh"), "manifests")
    assert m.returncode == 0, show(m)
    env = tools["env"]
    k = run(tools, tools["kubeconform"], "-strict", "-summary", "-kubernetes-version", env["TORBED_KUBE_VERSION"],
            "-schema-location", f"{env['TORBED_K8S_SCHEMAS']}/{K8S_TEMPLATE}", "-", stdin=m.stdout)
    # Every document the script prints must be a valid resource: the controller's five and
    # chaos-daemon's Service and DaemonSet.
    kinds = re.findall(r"^kind: (\w+)", m.stdout, flags=re.M)
    assert {"Deployment", "DaemonSet", "Service"} <= set(kinds), kinds
    assert k.returncode == 0 and f"Valid: {len(kinds)}, Invalid: 0, Errors: 0" in k.stdout, show(k)


def kubeconform_ok(tools, scenario, extra, apis) -> int:
    """Render and validate; returns the number of resources."""
    api_args = [a for api in apis for a in ("--api-versions", api)]
    t = run(tools, tools["helm"], "template", "t", str(CHART), "-f", str(scenario), *extra, *api_args)
    assert t.returncode == 0, show(t)
    env = tools["env"]
    # No -ignore-missing-schemas: a kind without a schema is an error, not a pass.
    k = run(tools, tools["kubeconform"], "-strict", "-summary",
            "-kubernetes-version", env["TORBED_KUBE_VERSION"],
            "-schema-location", f"{env['TORBED_K8S_SCHEMAS']}/{K8S_TEMPLATE}",
            "-schema-location", f"{env['TORBED_CRD_SCHEMAS']}/{CRD_TEMPLATE}",
            "-", stdin=t.stdout)
    assert k.returncode == 0, show(k)
    m = re.search(r"(\d+) resources found.*Valid: (\d+), Invalid: (\d+), Errors: (\d+), Skipped: (\d+)",
                  k.stdout + k.stderr)
    assert m, show(k)
    found, valid = int(m.group(1)), int(m.group(2))
    assert found > 0 and valid == found, show(k)
    return found


def test_replay_traces_inline_render_and_validate(tools, tmp_path):
    """A replay scenario with its own trace inline (what torbed run --backend k8s passes for a
    trace the image does not ship): a binaryData ConfigMap mounted by the replay pods."""
    import base64
    values = tmp_path / "traces.yaml"
    data = (REPO / "tests" / "data" / "replay" / "two-flows.trace.jsonl").read_bytes()
    values.write_text(yaml.safe_dump({"replayTraces": {"inline": {"two-flows.trace.jsonl": base64.b64encode(data).decode()}}}))
    found = kubeconform_ok(tools, REPO / "scenarios" / "gopal-heninger-2012-exp2.yaml", ["-f", str(values)], [])
    assert found == 1 + kubeconform_ok(tools, REPO / "scenarios" / "gopal-heninger-2012-exp2.yaml", [], [])


@pytest.mark.parametrize("load", [pytest.param({}, id="defaults"),
                                  pytest.param({"users": 6, "workers": 2, "path": ["guard", "middle", "exit"],
                                                "start": "5s", "stop": "60s"}, id="path")])
def test_background_load_renders_and_validates(tools, tmp_path, load):
    """load: adds the master and worker Deployments, the master's and the load nodes'
    Services and the web policy (5 objects) and the locust image's pull check (1), all valid;
    `load: {}` (every default) too."""
    values = tmp_path / "load.yaml"
    values.write_text(yaml.safe_dump({"load": load}))
    quickstart = REPO / "scenarios" / "quickstart.yaml"
    found = kubeconform_ok(tools, quickstart, ["-f", str(values), "--set", "variant=ewma-66"], [])
    assert found == 5 + 1 + kubeconform_ok(tools, quickstart, ["--set", "variant=ewma-66"], [])
    t = run(tools, tools["helm"], "template", "t", str(CHART), "-f", str(quickstart), "-f", str(values),
            "--show-only", "templates/load/workers.yaml")
    assert t.returncode == 0 and yaml.safe_load(t.stdout)["spec"]["replicas"] == load.get("workers", 1), show(t)


def test_replay_traces_over_the_limit_are_refused(tools, tmp_path):
    values = tmp_path / "big.yaml"
    values.write_text(yaml.safe_dump({"replayTraces": {"inline": {"big.trace.jsonl.gz": "A" * 700000}}}))
    t = run(tools, tools["helm"], "template", "t", str(CHART), "-f",
            str(REPO / "scenarios" / "gopal-heninger-2012-exp2.yaml"), "-f", str(values))
    assert t.returncode != 0 and "replayTraces.inline: 512 KiB of traces" in t.stderr, show(t)


def test_unittest(tools):
    # helm-unittest's default pattern, tests/*_test.yaml, skips suites in subdirectories of
    # tests/; name them all, and check that every suite file ran.
    suites = sorted((CHART / "tests").rglob("*_test.yaml"))
    assert suites, f"no helm-unittest suites in {CHART / 'tests'} (*_test.yaml)"
    # --strict: a misspelt key in a test suite is an error instead of a silently skipped assert.
    p = run(tools, tools["helm"], "unittest", "--strict", "-f", "tests/**/*_test.yaml", str(CHART))
    assert p.returncode == 0, show(p)
    m = re.search(r"Test Suites:\s+(\d+) passed, (\d+) total", p.stdout)
    assert m and int(m.group(1)) == int(m.group(2)) == len(suites), \
        f"expected all {len(suites)} suites to run and pass\n" + show(p)


# ------------------------------------------------------------------ schema rejection

def _set(doc, path, value):
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _rename_group(doc, old, new):
    """Rename a relay group everywhere it is named, so only the name itself is wrong."""
    doc["network"]["relays"][new] = doc["network"]["relays"].pop(old)
    for c in doc["clients"].values():
        c["path"] = [new if g == old else g for g in c.get("path") or []]
    for pair in doc.get("links", {}).get("pairs", []):
        pair["between"] = [new if g == old else g for g in pair["between"]]


# (id, mutation of quickstart, strings of which at least one must be in helm's stderr)
INVALID = [
    ("unknown-top-level-key", lambda d: _set(d, ["bogus_top"], 1), ["bogus_top"]),
    ("unknown-nested-key", lambda d: _set(d, ["network", "relays", "guard", "bogus_nested"], True),
     ["bogus_nested"]),
    ("bad-rate-unit", lambda d: _set(d, ["links", "pairs", 0, "rate"], "4 megabits"),
     ["/links/pairs/0/rate", "links.pairs[0].rate", "links.pairs.0.rate"]),
    ("count-zero", lambda d: _set(d, ["network", "relays", "middle", "count"], 0),
     ["/network/relays/middle/count", "network.relays.middle.count"]),
    ("unknown-workload-kind", lambda d: _set(d, ["clients", "bulk", "workload", "kind"], "stream"),
     ["/clients/bulk/workload/kind", "clients.bulk.workload.kind"]),
    ("wrong-apiversion", lambda d: _set(d, ["apiVersion"], "torbed/v2"), ["/apiVersion", "apiVersion:"]),
    ("bad-group-name", lambda d: _rename_group(d, "guard", "Guard_1"), ["Guard_1"]),
]


def render_mutated(tools, tmp_path, mutate):
    with open(REPO / "scenarios" / "quickstart.yaml") as f:
        doc = yaml.safe_load(f)
    mutate(doc)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return run(tools, tools["helm"], "template", "t", str(CHART), "-f", str(path),
               "--set", f"variant={doc['variants'][0]}")


def test_unmutated_quickstart_renders(tools, tmp_path):
    # The control for test_schema_rejects: the same round trip without a mutation passes, so
    # a rejection there is the mutation's doing.
    p = render_mutated(tools, tmp_path, lambda d: None)
    assert p.returncode == 0, show(p)


@pytest.mark.parametrize("mutate, expected", [pytest.param(m, e, id=i) for i, m, e in INVALID])
def test_schema_rejects(tools, tmp_path, mutate, expected):
    p = render_mutated(tools, tmp_path, mutate)
    assert p.returncode != 0, "helm template accepted an invalid scenario\n" + show(p, limit=1500)
    assert any(e in p.stderr for e in expected), \
        f"helm's error does not name the field (expected one of {expected})\n" + show(p, limit=1500)


# ------------------------------------------------------------------ nightly mode

NIGHTLY_VALUES = CHART / "tests" / "nightly" / "values-nightly.yaml"


def test_nightly_mode_renders_only_the_runner(tools):
    """No scenario at all: the schema asks for one only outside nightly mode, and no network
    object renders; what renders validates against Kubernetes 1.33."""
    t = run(tools, tools["helm"], "template", "n", str(CHART), "-f", str(NIGHTLY_VALUES))
    assert t.returncode == 0, show(t)
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(t.stdout) if d)
    assert kinds == ["ConfigMap", "CronJob", "PersistentVolumeClaim", "Role", "RoleBinding", "ServiceAccount"], kinds
    assert kubeconform_ok(tools, NIGHTLY_VALUES, [], []) == 6
    lint = run(tools, tools["helm"], "lint", str(CHART), "-f", str(NIGHTLY_VALUES))
    assert lint.returncode == 0, show(lint)


@pytest.mark.parametrize("mutate, expected", [
    pytest.param(lambda n: n["definition"].update(lookbak=3), "lookbak", id="unknown-key"),
    pytest.param(lambda n: n["definition"].update(kind="Scenario"), "/nightly/definition/kind", id="wrong-kind"),
    pytest.param(lambda n: n["definition"]["matrix"][0].update(duration="soon"), "/nightly/definition/matrix/0/duration",
                 id="bad-duration"),
    pytest.param(lambda n: n.pop("definition"), "definition", id="no-definition"),
])
def test_nightly_definition_checked_by_the_schema(tools, tmp_path, mutate, expected):
    values = yaml.safe_load(NIGHTLY_VALUES.read_text())
    mutate(values["nightly"])
    f = tmp_path / "v.yaml"
    f.write_text(yaml.safe_dump(values))
    t = run(tools, tools["helm"], "template", "n", str(CHART), "-f", str(f))
    assert t.returncode != 0 and expected in t.stderr, show(t, limit=1500)


def test_without_nightly_mode_and_a_scenario_the_quickstart_is_deployed_and_checked(tools, tmp_path):
    f = tmp_path / "v.yaml"
    f.write_text("variant: ewma-66\n")
    t = run(tools, tools["helm"], "template", "n", str(CHART), "-f", str(f))
    assert t.returncode == 0 and "torbed.io/scenario: \"quickstart\"" in t.stdout, show(t, limit=1500)
    assert "torbed.io/variant: \"ewma-66\"" in t.stdout
    # The default goes through the same cross-field checks as a given scenario.
    f.write_text("variant: kist\n")
    t = run(tools, tools["helm"], "template", "n", str(CHART), "-f", str(f))
    assert t.returncode != 0 and "variant: 'kist' is not one of the scenario's variants" in t.stderr, show(t)
    # Part of a scenario (clients without network) is refused, not merged into the default.
    f.write_text("clients: {web: {count: 1, workload: {kind: fetch, file: small}}}\n")
    t = run(tools, tools["helm"], "template", "n", str(CHART), "-f", str(f))
    assert t.returncode != 0 and "'network' required, if 'clients' exists" in t.stderr, show(t, limit=1500)
    lint = run(tools, tools["helm"], "lint", str(CHART))
    assert lint.returncode == 0, show(lint)


def test_the_nightly_runner_holds_every_permission_its_releases_grant(tools):
    """RBAC lets a subject grant only what it holds: the nightly runner installs releases whose
    key hook Role grants permissions, so the runner's Role must hold each of them (a missing
    verb fails every night's install with 'attempting to grant RBAC permissions not held')."""
    def roles(*args):
        p = run(tools, tools["helm"], "template", "t", str(CHART), *args)
        assert p.returncode == 0, show(p)
        return [d for d in yaml.safe_load_all(p.stdout) if d and d["kind"] == "Role"]
    runner = next(r for r in roles("-f", str(NIGHTLY_VALUES)) if r["metadata"]["name"].endswith("-nightly"))
    held = {(g, res, v) for rule in runner["rules"] for g in rule["apiGroups"] for res in rule["resources"]
            for v in rule["verbs"]}
    granted = {(g, res, v) for role in roles("-f", str(REPO / "scenarios" / "quickstart.yaml"))
               for rule in role["rules"] for g in rule["apiGroups"] for res in rule["resources"] for v in rule["verbs"]}
    assert granted and granted <= held, sorted(granted - held)


def test_the_nightly_runner_may_do_what_the_backend_does_at_fault_times_and_uninstall(tools):
    """The k8s backend runs inside the nightly Job with the runner's Role: it execs signals into
    tor, resizes pods and creates, lists and deletes Chaos objects. A list of a Chaos kind the
    Role does not name is refused (403) even where the CRD is absent, which once aborted the
    uninstall's sweep and left the night's relay pods behind."""
    from torbed.backends.k8s.backend import CHAOS_PLURALS
    p = run(tools, tools["helm"], "template", "t", str(CHART), "-f", str(NIGHTLY_VALUES))
    assert p.returncode == 0, show(p)
    runner = next(d for d in yaml.safe_load_all(p.stdout)
                  if d and d["kind"] == "Role" and d["metadata"]["name"].endswith("-nightly"))
    held = {(g, res, v) for rule in runner["rules"] for g in rule["apiGroups"] for res in rule["resources"]
            for v in rule["verbs"]}
    needed = {("", "pods/exec", "create"), ("", "pods/resize", "patch"), ("", "pods", "list"), ("", "pods", "delete")}
    needed |= {("chaos-mesh.org", plural, v) for plural in CHAOS_PLURALS for v in ("list", "create", "delete")}
    assert needed <= held, sorted(needed - held)


@pytest.mark.parametrize("changes, message", [
    ({"network.relays.middle.cpu": "qemu"}, "network.relays.middle.cpu: qemu emulates a slow CPU on the local backend only"),
    ({"network.relays.guard.weights": [100], "network.relays.middle.weights": [200],
      "network.relays.exit.weights": [300],
      "samples": [{"seed": 2, "relays": {g: {"bandwidth": "2mbit", "weights": [w]}
                                         for g, w in (("guard", 1), ("middle", 2), ("exit", 3))}}]},
     "samples: a Helm release is one network, and a network sampled anew per block needs one per block"),
    ({"variants": ["circswitch", "circswitch-ownpath"], "network.relays.middle.second_address": True},
     "network.relays.middle.second_address: a relay's second address on a link of its own"),
    ({"variants": ["vanilla", "kist"], "crossover": {"period": "30s", "cycles": 1}, "measure.duration": "60s"},
     "crossover: a within-run crossover switches the relays through their control ports on the local backend only"),
], ids=["cpu-qemu", "samples", "second-address", "crossover"])
def test_what_only_the_local_backend_does_is_refused(tools, tmp_path, changes, message):
    """Valid scenarios (torbed validate accepts them) that the chart cannot carry out: helm
    refuses them, naming the field, instead of deploying without them (torbed run --backend k8s
    refuses the same, except samples, which it installs as a release per block:
    tests/unit/test_k8s_local_only.py)."""
    from tests.unit.test_scenario import patched
    from torbed import cli
    values = tmp_path / "s.yaml"
    values.write_text(yaml.safe_dump(patched(changes)))
    assert cli.main(["validate", str(values)]) == 0
    t = run(tools, tools["helm"], "template", "t", str(CHART), "-f", str(values), "--set", "variant=kist")
    assert t.returncode != 0 and message in t.stderr, show(t)


def test_each_blocks_sample_renders_as_a_release_of_its_own(tools, tmp_path):
    """`torbed run --backend k8s` of a network sampled anew per block installs block k with
    sample k mod n's values file (K8sBackend.values_for): helm renders it, and the scenario
    the pods read carries that sample's weights and rates, not the other's."""
    from types import SimpleNamespace
    from tests.unit.test_scenario import patched
    from torbed import scenario
    from torbed.backends.k8s.backend import K8sBackend
    samples = [{"seed": i, "relays": {g: {"bandwidth": f"{2 * (i + 1)}mbit", "weights": [w + 100 * i]}
                                      for g, w in (("guard", 11), ("middle", 22), ("exit", 33))}} for i in range(2)]
    s = scenario.parse(patched({"network.relays.guard.weights": [1], "network.relays.middle.weights": [2],
                                "network.relays.exit.weights": [3], "samples": samples, "repetitions": 2}), "s.yaml")
    b = K8sBackend(console=None)
    run_ = SimpleNamespace(scenario=s, run_dir=tmp_path)
    b.values = b._write_values(tmp_path / "values.yaml", s)
    for k in range(2):
        values = b.values_for(SimpleNamespace(run=run_, index=k, scenario=s.for_block(k)))
        t = run(tools, tools["helm"], "template", "t", str(CHART), "-f", str(values), "--set", "variant=kist")
        assert t.returncode == 0, show(t)
        cm = next(d for d in yaml.safe_load_all(t.stdout) if d and d["kind"] == "ConfigMap"
                  and "scenario.json" in (d.get("data") or {}))
        relays = json.loads(cm["data"]["scenario.json"])["network"]["relays"]
        assert [relays[g]["weights"] for g in ("guard", "middle", "exit")] == [[11 + 100 * k], [22 + 100 * k], [33 + 100 * k]]
        assert scenario.parse(json.loads(cm["data"]["scenario.json"]), "cm").network.relays["guard"].bandwidth == \
            s.for_block(k).network.relays["guard"].bandwidth


@pytest.mark.parametrize("path", [p for p in SCENARIOS if local_only(p)], ids=lambda p: p.stem)
def test_shipped_local_only_scenarios_are_refused(tools, path):
    """A shipped scenario that uses what only the local backend does (e.g. Engler & Goldberg's
    emulated slow CPU) is refused by helm with the field, not deployed without it."""
    t = run(tools, tools["helm"], "template", "t", str(CHART), "-f", str(path), "--set", "variant=vanilla")
    assert t.returncode != 0 and "local backend only" in t.stderr, show(t)
