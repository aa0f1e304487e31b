"""The results service's per-release token in the rendered chart: one Secret per release
(random unless results.token), and every container that writes to the service (one that is
given TORBED_RESULTS_URL), and the service itself, reads its token from that Secret; a bad
results.token is refused by the values schema naming the field."""

import base64
import re

import pytest
import yaml
from test_chart import CHART, REPO, run, show

QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
# Replay servers (which ship cells.jsonl) beside the quickstart's relays and clients.
REPLAY = REPO / "scenarios" / "gopal-heninger-2012-exp2.yaml"


def render(tools, *args) -> list[dict]:
    p = run(tools, tools["helm"], "template", "t", str(CHART), *args)
    assert p.returncode == 0, show(p)
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def containers(doc: dict):
    spec = doc.get("spec") or {}
    template = spec.get("template") or (spec.get("jobTemplate") or {}).get("spec", {}).get("template")
    pod = (template or {}).get("spec") or (spec if doc["kind"] == "Pod" else {})
    for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
        yield f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}", {e["name"]: e for e in c.get("env") or []}


def token_of(docs: list[dict]) -> str:
    secrets = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "t-results-token"]
    assert len(secrets) == 1, [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"]
    return base64.b64decode(secrets[0]["data"]["token"]).decode()


@pytest.mark.parametrize("args", [
    pytest.param(["-f", str(QUICKSTART), "--set", "load.users=2,load.workers=2"], id="quickstart-load"),
    pytest.param(["-f", str(REPLAY)], id="replay-servers")])
def test_every_writer_and_the_service_read_the_release_token(tools, args):
    docs = render(tools, *args)
    writers, service = [], []
    for where, env in (c for d in docs for c in containers(d)):
        if "TORBED_RESULTS_URL" in env:
            writers.append(where)
        elif where == "Deployment/t-results/results":
            service.append(where)
        else:
            assert "TORBED_RESULTS_TOKEN" not in env, f"{where} has the token but writes nowhere"
            continue
        ref = (env.get("TORBED_RESULTS_TOKEN") or {}).get("valueFrom", {}).get("secretKeyRef")
        assert ref == {"name": "t-results-token", "key": "token"}, f"{where}: {env.get('TORBED_RESULTS_TOKEN')}"
    assert service == ["Deployment/t-results/results"]
    # Each kind of writer is there: shapers, relay collectors, client drivers, and per scenario
    # the load pods or the replay servers.
    names = {w.rsplit("/", 1)[1] for w in writers}
    assert {"shaper", "collector", "driver"} <= names, names
    assert ("locust" in names) if "--set" in args else ("replay" in names or "server" in names), names
    assert re.fullmatch(r"[A-Za-z0-9]{40}", token_of(docs))


def test_each_install_makes_its_own_token_unless_one_is_given(tools):
    a, b = (token_of(render(tools, "-f", str(QUICKSTART))) for _ in range(2))
    assert a != b
    given = "Given.token_0123456789+/="
    assert token_of(render(tools, "-f", str(QUICKSTART), "--set-string", f"results.token={given}")) == given


@pytest.mark.parametrize("token", ["short", "has space in it 1234", "x" * 257])
def test_a_bad_token_value_is_refused_naming_the_field(tools, token):
    p = run(tools, tools["helm"], "template", "t", str(CHART), "-f", str(QUICKSTART),
            "--set-string", f"results.token={token}")
    assert p.returncode != 0 and "results" in p.stderr and "token" in p.stderr, show(p, limit=1500)

