"""Layered torrc: golden output, and every generated torrc accepted by `tor --verify-config`."""

import os
import shutil
import subprocess
from pathlib import Path


from torbed import constants, network, scenario
from torbed.keys import AuthorityKeys, make_authority_keys, make_relay_identity
from torbed.torrc import Identities, NodePaths, diff_max_age, render_fragments, render_node, voting_schedule
from torbed.variants import load_variant

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden-torrc"


def fake_identities(plan) -> Identities:
    ids = Identities()
    for i, n in enumerate(plan.nodes):
        if n.role in ("authority", "relay"):
            ids.fingerprints[n.name] = f"{i:02X}" * 20
        if n.role == "authority":
            ids.authorities[n.name] = AuthorityKeys(v3ident=f"A{i:01X}" * 20, expires="2027-01-01T00:00:00Z",
                                                    certificate=Path("/dev/null"))
    return ids


def render_all(plan, ids, root: str, voting_offset: int = 0, schedule=None) -> dict[str, str]:
    variants = {v: load_variant(v) for v in plan.variants_in_use()}
    files = render_fragments(plan, ids, variants, voting_offset, schedule)
    for n in plan.nodes:
        if n.role == "server":
            continue
        paths = NodePaths(datadir=f"{root}/data/{n.name}", log=f"{root}/logs/{n.name}.log",
                          control_socket=f"{root}/data/{n.name}/control")
        files[f"{n.name}.torrc"] = render_node(n, plan, paths, f"{root}/torrc")
    return files


def test_golden_quickstart():
    s = scenario.load(REPO / "scenarios" / "quickstart.yaml")
    plan = network.plan(s, "ewma-66")
    files = render_all(plan, fake_identities(plan), "/RUN")
    if os.environ.get("UPDATE_GOLDEN"):
        shutil.rmtree(GOLDEN, ignore_errors=True)
        GOLDEN.mkdir(parents=True)
        for name, text in files.items():
            (GOLDEN / name).write_text(text)
    expected = {p.name: p.read_text() for p in GOLDEN.iterdir()}
    assert sorted(files) == sorted(expected)
    for name in files:
        assert files[name] == expected[name], f"{name} differs from the golden file (UPDATE_GOLDEN=1 to accept)"


def test_layering_and_essentials():
    s = scenario.load(REPO / "scenarios" / "quickstart.yaml")
    plan = network.plan(s, "ewma-66")
    files = render_all(plan, fake_identities(plan), "/RUN")
    assert "ConfluxEnabled 0" in files["common.torrc"]
    assert "V3AuthVotingInterval 10" in files["common.torrc"]
    assert files["common.torrc"].count("DirAuthority ") == 3
    assert "cfx_enabled=0" in files["role-authority.torrc"]
    assert "TestingEnableCellStatsEvent 1" in files["role-relay.torrc"]
    assert "MetricsPortPolicy accept 10.77.0.0/16" in files["role-relay.torrc"]
    assert "ExitPolicy accept *:*" in files["role-exit.torrc"]
    assert "CircuitPriorityHalflife 66" in files["variant-ewma-66.torrc"]
    exit_torrc = files["exit0.torrc"]
    includes = [line.split("/")[-1] for line in exit_torrc.splitlines() if line.startswith("%include")]
    assert includes == ["common.torrc", "role-relay.torrc", "role-exit.torrc", "variant-ewma-66.torrc"]
    assert "role-nonexit.torrc" in files["middle0.torrc"] and "role-exit" not in files["middle0.torrc"]
    assert "LogTimeGranularity 1" in files["common.torrc"]


def test_tor_accepts_every_generated_torrc(tmp_path):
    """Real keys (tor-gencert, tor --list-fingerprint) and tor --verify-config on each node."""
    tor = shutil.which("tor")
    assert tor, "tor not installed: run make setup"
    s = scenario.load(REPO / "scenarios" / "quickstart.yaml")
    for variant in ("kist", "ewma-66", "kistlite"):
        _verify_every_torrc(tor, network.plan(s, variant), tmp_path / variant)


def test_large_networks_vote_on_a_slower_schedule_tor_accepts(tmp_path, monkeypatch):
    s = scenario.load(REPO / "scenarios" / "quickstart.yaml")
    plan = network.plan(s, "kist")
    assert voting_schedule(plan) == (10, 2, 2)
    assert voting_schedule(network.plan(scenario.load(REPO / "scenarios" / "bench-750-tors.yaml"), "kist")) \
        == constants.LARGE_VOTING == (30, 6, 6)
    monkeypatch.setattr(constants, "LARGE_NETWORK_TORS", 5)      # quickstart counts as large
    assert voting_schedule(plan) == (30, 6, 6)
    files = render_fragments(plan, fake_identities(plan), {"kist": load_variant("kist")}, voting_offset=29)
    assert "V3AuthVotingInterval 30\nV3AuthVoteDelay 6\nV3AuthDistDelay 6" in files["common.torrc"]
    assert "TestingV3AuthInitialVotingInterval 30" in files["common.torrc"]
    tor = shutil.which("tor")
    assert tor, "tor not installed: run make setup"
    _verify_every_torrc(tor, plan, tmp_path, voting_offset=29)    # the largest offset the interval allows


def test_a_held_first_round_is_a_placeholder_tor_accepts_and_then_the_large_schedule(tmp_path, monkeypatch):
    """backends.local._held_first_round: the torrc's placeholder round (600 s interval, the
    largest offset), and the SETCONF that replaces it, both accepted by tor."""
    monkeypatch.setattr(constants, "LARGE_NETWORK_TORS", 5)
    plan = network.plan(scenario.load(REPO / "scenarios" / "quickstart.yaml"), "kist")
    held = (constants.HELD_ROUND_INTERVAL, 6, 6)
    files = render_fragments(plan, fake_identities(plan), {"kist": load_variant("kist")}, voting_offset=599,
                             schedule=held)
    assert "TestingV3AuthInitialVotingInterval 600" in files["common.torrc"]
    assert "V3AuthVotingInterval 600\nV3AuthVoteDelay 6" in files["common.torrc"]
    assert constants.HELD_ROUND_LEAD < constants.HELD_ROUND_INTERVAL     # the placeholder is the next boundary
    tor = shutil.which("tor")
    _verify_every_torrc(tor, plan, tmp_path, voting_offset=599, schedule=held)
    # What torbed sets once the descriptors are in: the held rounds and their largest offset.
    auth = tmp_path / "torrc" / "auth0.torrc"
    interval = constants.HELD_VOTING_INTERVAL
    p = subprocess.run([tor, "--verify-config", "-f", str(auth), "V3AuthVotingInterval", str(interval),
                        "TestingV3AuthInitialVotingInterval", str(interval),
                        "TestingV3AuthVotingStartOffset", str(interval - 1)], capture_output=True, text=True)
    assert p.returncode == 0 and "Configuration was valid" in p.stdout, p.stdout[-2000:]


def _verify_every_torrc(tor: str, plan, root: Path, voting_offset: int = 0,
                        schedule: tuple[int, int, int] | None = None) -> None:
    ids = Identities()
    for n in plan.nodes:
        data = root / "data" / n.name
        if n.role == "authority":
            ids.authorities[n.name] = make_authority_keys(data, n.address, n.ports["dir"])
        if n.role in ("authority", "relay"):
            ids.fingerprints[n.name] = make_relay_identity(data, n.nickname)
        (root / "logs").mkdir(parents=True, exist_ok=True)
        data.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = render_all(plan, ids, str(root), voting_offset, schedule)
    (root / "torrc").mkdir()
    for name, text in files.items():
        (root / "torrc" / name).write_text(text)
    for n in plan.nodes:
        if n.role == "server":
            continue
        p = subprocess.run([tor, "--verify-config", "-f", str(root / "torrc" / f"{n.name}.torrc")],
                           capture_output=True, text=True)
        assert p.returncode == 0, f"{plan.variant}/{n.name}: {p.stdout[-2000:]}"
        assert "Configuration was valid" in p.stdout


def test_keys_are_real(tmp_path):
    keys = make_authority_keys(tmp_path / "a", "10.0.0.1", 7000)
    cert = (tmp_path / "a" / "keys" / "authority_certificate").read_text()
    assert cert.startswith("dir-key-certificate-version 3")
    assert f"fingerprint {keys.v3ident}" in cert
    assert keys.expires > "2026"  # ISO dates compare lexically
    assert (tmp_path / "a" / "keys" / "authority_signing_key").exists()
    fpr = make_relay_identity(tmp_path / "r", "relay0")
    assert len(fpr) == 40 and all(c in "0123456789ABCDEF" for c in fpr)
    assert (tmp_path / "r" / "keys" / "secret_id_key").exists()
    assert make_relay_identity(tmp_path / "r", "relay0") == fpr  # stable once generated


def test_caches_diff_only_from_the_last_rounds_and_keep_the_latest_consensus():
    # MaxConsensusAgeForDiffs: a cache deletes every consensus older than this, the latest
    # too, so it must outlast the slowest round with a failed round to spare.
    for interval in (10, 30, 60, constants.HELD_VOTING_INTERVAL):
        age = diff_max_age(interval)
        assert age >= 2 * interval + interval // 2, (interval, age)
        assert age <= max(constants.MIN_DIFF_MAX_AGE, 4 * interval), "keeps the diff work per round bounded"
    plan = network.plan(scenario.load(REPO / "scenarios" / "quickstart.yaml"), "kist")
    files = render_fragments(plan, fake_identities(plan), {"kist": load_variant("kist")}, diff_age=900)
    assert "MaxConsensusAgeForDiffs 900 seconds" in files["role-relay.torrc"]
    assert "MaxConsensusAgeForDiffs" not in files["role-authority.torrc"] + files["role-client.torrc"]
