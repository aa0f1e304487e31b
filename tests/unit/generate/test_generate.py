"""torbed generate on consensuses and descriptors made with stem (tests/unit/generate/torstub.py):
sampling (weight-proportional, class membership), scaling into the budget and its refusals,
determinism for a seed, provenance recorded, bad inputs rejected naming the file."""

from __future__ import annotations

import statistics

import hashlib
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml

from torbed import cli, resources
from torbed.generate import BudgetError, SampleError, budget as budget_mod, build, generate, sample, sources
from torbed.scenario import parse

from .torstub import write_network

# A fixed budget so tests do not depend on the machine running them.
BUDGET = budget_mod.Budget(cores=2, memory_mib=16000)


@pytest.fixture(scope="session")
def net(tmp_path_factory):
    return write_network(tmp_path_factory.mktemp("collector"), n=300, seed=0)


def _relay(fp: str, flags: set[str], weight: int, capacity: int = 10_000_000) -> sources.Relay:
    return sources.Relay(fingerprint=fp, nickname=fp.lower(), flags=frozenset(flags | {"Running", "Valid", "Fast", "Stable"}),
                         weight=weight, capacity=capacity, observed=capacity)


# --- sampling ------------------------------------------------------------------------------

def test_weighted_sample_draws_in_proportion_to_weight():
    """One draw at a time, 20,000 times: each item's frequency within 0.012 of w/sum(w)
    (about 3.5 standard errors at this n); uniform sampling misses it by up to 0.08."""
    items = list(range(10))
    weights = [i + 1 for i in items]
    rng = random.Random(42)
    n = 20_000
    counts = Counter(sample.weighted_sample(items, weights, 1, rng)[0] for _ in range(n))
    expected = {i: w / sum(weights) for i, w in zip(items, weights)}
    worst = max(abs(counts[i] / n - expected[i]) for i in items)
    assert worst < 0.012, (worst, counts)
    # The check can fail: uniform frequencies are far outside the tolerance.
    assert max(abs(0.1 - expected[i]) for i in items) > 0.012


def test_weighted_sample_without_replacement_prefers_heavy_items():
    items = list(range(20))
    weights = [1] * 10 + [20] * 10
    rng = random.Random(7)
    heavy = sum(sum(1 for x in sample.weighted_sample(items, weights, 5, rng) if x >= 10) for _ in range(2000))
    # 5 of 20, heavy items 20x the weight: most draws are heavy, never all light.
    assert heavy / (2000 * 5) > 0.9
    picks = sample.weighted_sample(items, weights, 20, random.Random(1))
    assert sorted(picks) == items          # k = all: every item once


def test_draw_within_a_class_follows_consensus_weight():
    """The relays of a class are drawn by weight: over 4,000 seeds, one exit per network, the
    heaviest exit (weight 6 of 10) is drawn 60 % +- 3 % of the time."""
    relays = [_relay("E1", {"Exit"}, 6000), _relay("E2", {"Exit"}, 3000), _relay("E3", {"Exit"}, 1000)]
    relays += [_relay(f"M{i}", set(), 1000) for i in range(3)]
    got = Counter()
    for seed in range(4000):
        s = sample.draw(relays, 2, seed, "c")
        got.update(r.fingerprint for r in s.relays if r.position == "exit")
    assert abs(got["E1"] / 4000 - 0.6) < 0.03, got
    assert abs(got["E2"] / 4000 - 0.3) < 0.03, got
    assert abs(got["E3"] / 4000 - 0.1) < 0.03, got


def test_classes_and_proportions(net):
    res = generate(net.consensus, [net.descriptors], relays=40, seed=3, budget=BUDGET)
    by_fp = {r.fingerprint: r for r in net.relays}
    usable = [r for r in net.relays if {"Running", "Valid", "Fast", "Stable"} <= set(r.flags)]
    share = Counter(r.position for r in usable)
    for pos in sample.POSITIONS:
        assert abs(res.sample.per_class[pos] - 40 * share[pos] / len(usable)) < 1, (pos, res.sample.per_class)
    for g in res.groups:
        relays_ = res.data["network"]["relays"][g.name]
        assert relays_["count"] == len(g.relays)
        assert relays_.get("guard", False) == (g.position in ("guard", "guardexit"))
        assert relays_.get("exit", False) == (g.position in ("exit", "guardexit"))
        for r in g.relays:
            stub = by_fp[r.fingerprint]
            assert stub.position == g.position == r.position
            assert {"Running", "Valid", "Fast", "Stable"} <= set(stub.flags)
    # A BadExit relay is no exit.
    assert sources.Relay("X", "x", frozenset({"Exit", "BadExit", "Guard"}), 1, 1, 1).position == "guard"


def test_a_class_left_empty_is_refused_with_the_minimum():
    relays = [_relay(f"G{i}", {"Guard"}, 10) for i in range(50)] + [_relay("E", {"Exit"}, 10)]
    with pytest.raises(SampleError) as e:
        sample.draw(relays, 10, 1, "cons")
    assert "exit" in str(e.value) and "at least 26 relays" in str(e.value) and "cons" in str(e.value)


# --- scaling and budget --------------------------------------------------------------------

def _fixed(b, relays=0, authorities=0, clients=0):
    """The model's cores before relaying a byte (budget.fit_rates), written out again."""
    return (relays * (b.cpu_idle_relay + b.cpu_observe_relay) + authorities * b.cpu_idle_authority
            + clients * b.cpu_client + b.cpu_fixed)


def test_rates_keep_ratios_and_fit_the_budget():
    caps = [50_000_000, 20_000_000, 5_000_000, 1_000_000, 100_000]
    fit = budget_mod.fit_rates(caps, BUDGET, {"relay": 5, "authority": 3, "client": 5})
    assert fit.scale < 1 and fit.binding == "cpu"
    assert sum(fit.rates) <= fit.relayed_budget * 1.0001
    assert min(fit.rates) >= budget_mod.MIN_RELAY_RATE
    unfloored = [(c, r) for c, r in zip(caps, fit.rates) if r > budget_mod.MIN_RELAY_RATE]
    for c, r in unfloored:
        assert r == pytest.approx(c * fit.scale, abs=1)
    assert fit.floored == len(caps) - len(unfloored) >= 1
    # The budget's arithmetic: (2 cores x 70 % - the running network) / (0.09 + 0.075 cores per MB/s).
    fixed = _fixed(BUDGET, 5, 3, 5)
    assert fit.cpu_idle == pytest.approx(fixed)
    assert fit.relayed_budget == pytest.approx((1.4 - fixed) / 0.165 * 1e6)
    # Without a traffic model the rates fill the CPU at full load.
    assert fit.expected_load == pytest.approx(sum(fit.rates), rel=1e-6)
    assert fit.cpu_expected == pytest.approx(1.4, rel=1e-3)


def test_never_faster_than_the_real_relays():
    fit = budget_mod.fit_rates([200_000, 300_000], BUDGET, {"relay": 2})
    assert fit.scale == 1.0 and fit.rates == [200_000, 300_000] and fit.binding == "capacity"


def test_the_offered_load_follows_the_traffic_model():
    files = {"page": "50KiB", "bulk": "5MiB"}
    clients = {"web": {"count": 10, "workload": {"kind": "fetch", "file": "page", "think": {"mean": "5s"}}},
               "bulk": {"count": 2, "workload": {"kind": "bulk", "file": "bulk"}},
               "probe": {"count": 1, "workload": {"kind": "fetch", "file": "bulk", "pause": "30s"}}}
    d = budget_mod.demand(clients, files)
    assert d.bulk == 2 and sorted(d.fetches) == [(1, 5 * 1024 * 1024, 30.0), (10, 51200, 5.0)]
    # At 102,400 B/s a page takes 0.5 s: 10 x 51,200 / 5.5; the probe 51.2 s: 5 MiB / 81.2; bulk at the rate.
    want = 10 * 51200 / 5.5 + 5 * 1024 * 1024 / (30 + 51.2) + 2 * 102400
    assert d.offered(102400) == pytest.approx(want)


def test_with_a_traffic_model_the_expected_load_sets_the_rates():
    caps = [c * 1_000_000 for c in (5, 10, 20, 40, 80)] * 8      # 40 relays
    tors = {"relay": 40, "authority": 3, "client": 150}
    four = budget_mod.Budget(cores=4, memory_mib=16000)
    web_only = budget_mod.Demand(fetches=((150, 51200, 5.0),))
    fit = budget_mod.fit_rates(caps, four, tors, demand=web_only)
    # Web clients' load hardly grows with the rates: the rates stop where the expected load is
    # min_utilization of their sum (more would give relays that never queue), within the CPU.
    assert fit.binding == "utilization" and fit.floored < 40
    assert fit.expected_load == pytest.approx(0.3 * sum(fit.rates), rel=0.01)
    assert fit.expected_load == pytest.approx(2.3 * web_only.offered(statistics.median(fit.rates)), rel=1e-6)
    assert fit.cpu_expected <= 2.8 + 1e-9
    # Too few clients even for tor's smallest rates: the floor it is, the utilization recorded.
    few = budget_mod.fit_rates(caps, four, tors, demand=budget_mod.Demand(fetches=((10, 51200, 5.0),)))
    assert few.binding == "utilization" and max(few.rates) <= budget_mod.MIN_RELAY_RATE + 1
    assert few.expected_load < 0.3 * sum(few.rates)
    # Bulk clients take what their path gives: with many, the CPU binds first.
    tors = {"relay": 40, "authority": 3, "client": 42}
    bulky = budget_mod.Demand(fetches=((30, 51200, 5.0),), bulk=12)
    fit2 = budget_mod.fit_rates(caps, BUDGET, tors, demand=bulky)
    assert fit2.binding == "cpu" and fit2.cpu_expected == pytest.approx(1.4, rel=1e-3)
    assert fit2.expected_load >= 0.3 * sum(fit2.rates) * 0.999
    # A given rates' sum is taken as it is when the CPU can carry what it brings, refused when not.
    fixed = budget_mod.fit_rates(caps, BUDGET, tors, total=4_000_000, demand=bulky)
    assert fixed.binding == "total-rate" and sum(fixed.rates) == pytest.approx(4_000_000, rel=1e-3)
    with pytest.raises(BudgetError, match="would write .* more than this machine's budget"):
        budget_mod.fit_rates(caps, BUDGET, tors, total=400_000_000, demand=bulky)


def test_the_shipped_sample_is_admitted_and_predicted_as_measured():
    """The 60-relay pilot the figures come from: its rates' sum (8.95 MB/s), 63 clients (54 web,
    6 bulk, 3 probes) at its median rate of 113,975 B/s: the model expects what was measured
    (2.94 MB/s written by the relays, 1.32 cores used) within a few per cent."""
    d = budget_mod.Demand(fetches=((54, 51200, 5.0), (1, 51200, 30.0), (1, 1 << 20, 30.0), (1, 5 << 20, 30.0)),
                          bulk=6)
    load = 2.3 * d.offered(113_975)
    assert load == pytest.approx(2.94e6, rel=0.03)
    cpu = _fixed(BUDGET, 60, 3, 63) + load * 0.165e-6
    assert cpu == pytest.approx(1.32, rel=0.06) and cpu <= 1.4


def test_too_many_relays_for_the_cpu_is_refused_with_numbers():
    b = budget_mod.Budget(cores=2, memory_mib=64000)
    with pytest.raises(BudgetError) as e:
        budget_mod.fit_rates([10_000_000] * 200, b, {"relay": 200})
    msg = str(e.value)
    # 200 x 76,800 B/s = 15.36 MB/s against (1.4 - 200 x 0.0055 - 0.1) / 0.165 = 1.21 MB/s.
    assert "200 relays" in msg and "75 KiB/s" in msg and "15.36 MB/s" in msg and "1.21 MB/s" in msg
    assert "use at most 15 relays" in msg


def test_a_network_whose_running_cost_exceeds_the_cpu_share_is_refused_with_numbers():
    with pytest.raises(BudgetError) as e:
        budget_mod.fit_rates([10_000_000] * 300, budget_mod.Budget(cores=1, memory_mib=64000), {"relay": 300})
    assert "300 tors and their observers need 1.75 cores before relaying a byte" in str(e.value)
    assert "0.70 cores (70% of 1)" in str(e.value) and "0.0055 per relay" in str(e.value)


def test_too_many_clients_for_the_floor_rates_is_refused_with_numbers():
    # 60 bulk clients load 100 relays at 76,800 B/s fully (7.68 MB/s); the CPU allows
    # (1.4 - 100 x 0.0055 - 60 x 0.005 - 0.1) / 0.165 = 2.73 MB/s.
    d = budget_mod.Demand(bulk=60)
    with pytest.raises(BudgetError) as e:
        budget_mod.fit_rates([10_000_000] * 100, BUDGET, {"relay": 100, "client": 60}, demand=d)
    msg = str(e.value)
    assert "100 relays at tor's smallest relay rate" in msg and "7.68 MB/s for 60 clients" in msg
    assert "2.73 MB/s" in msg and "use fewer relays or clients" in msg


def test_too_many_tors_for_the_memory_is_refused_with_numbers():
    with pytest.raises(BudgetError) as e:
        budget_mod.fit_rates([10_000_000] * 10, budget_mod.Budget(cores=64, memory_mib=400), {"relay": 10, "client": 10})
    assert "20 tors" in str(e.value) and "400 MiB MiB" not in str(e.value) and "200 MiB" in str(e.value)


def test_a_total_rate_above_the_budget_is_refused():
    with pytest.raises(BudgetError, match="more than this machine's budget"):
        budget_mod.fit_rates([10_000_000] * 4, BUDGET, {"relay": 4}, total=10**9)


def test_bench_results_replace_the_defaults(tmp_path):
    import json
    run = {"roles": {"guard0": "relay", "auth0": "authority"}, "rss_peak_mib": {"guard0": 44.0, "auth0": 50.0},
           "cpu_pct_ready_to_end": {"guard0": 0.5, "auth0": 2.0}}
    (tmp_path / "backend-20261126T000000Z.json").write_text(json.dumps({"quickstart": {"runs": [run]}}))
    b = budget_mod.machine(cores=2, memory_mib=1000, bench_dir=tmp_path)
    assert b.mem_per_tor_mib == 44.0 and b.cpu_idle_relay == 0.005 and "backend-2026" in b.source
    assert budget_mod.machine(cores=2, memory_mib=1000, bench_dir=tmp_path / "none").mem_per_tor_mib == 20.0


# --- the scenario ----------------------------------------------------------------------------

def test_same_seed_same_scenario_other_seed_other_relays(net):
    a = generate(net.consensus, [net.descriptors], relays=30, seed=5, budget=BUDGET)
    b = generate(net.consensus, [net.descriptors], relays=30, seed=5, budget=BUDGET)
    c = generate(net.consensus, [net.descriptors], relays=30, seed=6, budget=BUDGET)
    assert a.yaml == b.yaml
    assert {r.fingerprint for r in a.sample.relays} != {r.fingerprint for r in c.sample.relays}


def test_provenance_is_recorded_and_the_file_validates(net, tmp_path):
    res = generate(net.consensus, [net.descriptors], relays=20, seed=9, budget=BUDGET)
    gen = res.data["generated"]
    assert gen["seed"] == 9 and res.data["seed"] == 9
    cons, descs = gen["sources"]
    assert cons["sha256"] == hashlib.sha256(net.consensus.read_bytes()).hexdigest()
    assert cons["valid_after"] == "2024-03-01T12:00:00Z" and cons["entries"] == 300
    assert descs["kind"] == "server-descriptors" and descs["entries"] == sum(len(r.descriptors) for r in net.relays)
    assert descs["published"] == "2024-02-28T22:00:00Z .. 2024-03-01T10:00:00Z"
    out = tmp_path / "s.yaml"
    out.write_text(res.yaml)
    s = parse(yaml.safe_load(out.read_text()), str(out))
    assert s.generated.sources[0].sha256 == cons["sha256"]
    assert sum(g.count for g in s.network.relays.values()) == 20
    assert all(c.path is None for c in s.clients.values())     # tor chooses paths
    assert "valid-after 2024-03-01T12:00:00Z" in res.yaml.splitlines()[1]
    # Every sampled relay is listed in the header with its fingerprint.
    for r in res.sample.relays:
        assert r.fingerprint in res.yaml


def test_group_rates_are_their_members_mean_and_links_the_slower_side(net):
    res = generate(net.consensus, [net.descriptors], relays=40, seed=2, budget=BUDGET)
    for g in res.groups:
        assert g.rate == pytest.approx(sum(g.rates) / len(g.rates), abs=1024)
        assert max(g.rates) / min(g.rates) <= build.DEFAULT_BIN_RATIO + 1e-9
    rates = {g.name: g.rate for g in res.groups}
    for pair in res.data["links"]["pairs"]:
        a, b = pair["between"]
        if a not in rates or b not in rates:
            continue                           # delay-only links to clients and servers
        kbit = int(pair["rate"].removesuffix("kbit"))
        assert kbit == pytest.approx(min(rates[a], rates[b]) * 8 * build.LINK_WIRE_OVERHEAD / 1000, abs=1)


def test_clients_scale_with_the_network(net):
    res = generate(net.consensus, [net.descriptors], relays=20, seed=1, budget=BUDGET, mix={"web": 0.75, "bulk": 0.25})
    clients = res.data["clients"]
    assert clients["web"]["count"] == 15 and clients["bulk"]["count"] == 5
    assert {"perf50k", "perf1m", "perf5m"} <= set(clients)


def test_replayed_sessions_in_the_mix(net):
    """http and ssh in the mix: captured sessions replayed through a replay server of their own
    beside the file server, every workload naming its server, on paths tor chooses; their bytes
    count in the clients' offered load."""
    mix = {"web": 0.5, "bulk": 0.1, "http": 0.2, "ssh": 0.2}
    res = generate(net.consensus, [net.descriptors], relays=20, seed=1, budget=BUDGET, mix=mix)
    data = res.data
    clients = data["clients"]
    assert {k: clients[k]["count"] for k in mix} == {"web": 10, "bulk": 2, "http": 4, "ssh": 4}
    assert data["servers"]["replay"] == {"replay": {"port": build.REPLAY_PORT}}
    for name in ("http", "ssh"):
        w = clients[name]["workload"]
        assert w["kind"] == "replay" and w["server"] == "replay" and w["distribute"] == "each"
        assert resources.path(w["trace"]).is_file()
        assert "path" not in clients[name]
    assert all(clients[k]["workload"]["server"] == build.SERVER for k in ("web", "bulk", "perf50k"))
    parse(data, "gen")      # the scenario model accepts it
    params = data["generated"]["parameters"]
    assert "ssh-session.trace" in params["workload_ssh"] and "http-browsing.trace" in params["workload_http"]
    # Offered load: the replay clients add their traces' bytes per second of loop, never more
    # than the path's rate.
    d = budget_mod.demand(clients, data["servers"]["www"]["files"])
    without = budget_mod.demand({k: v for k, v in clients.items() if k not in ("http", "ssh")}, data["servers"]["www"]["files"])
    assert [n for n, _ in d.replays] == [4, 4] and all(bps > 100 for _, bps in d.replays)
    assert d.offered(1e6) - without.offered(1e6) == pytest.approx(sum(n * bps for n, bps in d.replays))
    assert d.offered(50.0) - without.offered(50.0) == pytest.approx(8 * 50.0)
    # Without them nothing changes: one server group, no server named.
    plain = generate(net.consensus, [net.descriptors], relays=20, seed=1, budget=BUDGET)
    assert list(plain.data["servers"]) == [build.SERVER] and "server" not in plain.data["clients"]["web"]["workload"]


def test_scale_instead_of_a_count(net):
    res = generate(net.consensus, [net.descriptors], scale=0.1, seed=1, budget=BUDGET)
    usable = sum(1 for r in net.relays if {"Running", "Valid", "Fast", "Stable"} <= set(r.flags))
    assert len(res.sample.relays) == round(0.1 * usable)


# --- the command: bad input is exit 2 naming the file ------------------------------------------

def _run(capsys, *argv) -> tuple[int, str]:
    code = cli.main(["generate", *map(str, argv)])
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return code, cap.err + cap.out


def test_command_writes_a_scenario_torbed_validate_accepts(net, tmp_path, capsys):
    out = tmp_path / "gen.yaml"
    code, text = _run(capsys, net.consensus, net.descriptors, "--relays", 12, "--seed", 4, "--cores", 2,
                      "--memory-mib", 8000, "--bench-dir", "", "-o", out)
    assert code == 0, text
    assert "guardexit" in text and "budget:" in text
    assert cli.main(["validate", str(out)]) == 0
    code, text = _run(capsys, net.consensus, net.descriptors, "--relays", 12, "-o", out)
    assert code == 2 and "exists" in text
    missing_dir = tmp_path / "no-such-dir" / "gen.yaml"
    code, text = _run(capsys, net.consensus, net.descriptors, "--relays", 12, "--cores", 2, "--memory-mib", 8000,
                      "--bench-dir", "", "-o", missing_dir)
    assert code == 2 and str(missing_dir) in text and "cannot write" in text


def _file(d: Path, content: str | bytes) -> Path:
    p = d / "x"
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)
    return p


@pytest.mark.parametrize("make, expect", [
    (lambda d, net: _file(d, "hello\n"), "not a network-status consensus"),
    (lambda d, net: _file(d, b"\x00\x01\xff" * 100), "binary file"),
    (lambda d, net: next(net.descriptors.iterdir()), "'server-descriptor 1.0' document, not a consensus"),
    (lambda d, net: d / "missing", "no such file"),
    (lambda d, net: _file(d, "network-status-version 3\nvote-status consensus\nbroken\n"), "not a valid consensus"),
])
def test_a_bad_consensus_is_exit_2_naming_the_file(net, tmp_path, capsys, make, expect):
    path = make(tmp_path, net)
    code, text = _run(capsys, path, net.descriptors, "--relays", 10)
    assert code == 2, text
    assert str(path) in text and expect in text


def test_descriptors_that_are_missing_or_wrong_are_exit_2(net, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, text = _run(capsys, net.consensus, empty, "--relays", 10)
    assert code == 2 and str(empty) in text and "no files" in text
    # Descriptors of another network: the consensus' relays have none.
    other = write_network(tmp_path / "other", n=5, seed=1)
    code, text = _run(capsys, net.consensus, other.descriptors, "--relays", 10)
    assert code == 2 and "server descriptors for only 0 of the 300 relays" in text and str(net.consensus) in text
    # The consensus given as descriptors.
    code, text = _run(capsys, net.consensus, net.consensus, "--relays", 10)
    assert code == 2 and str(net.consensus) in text and "not server descriptors" in text
    # A descriptor file cut short.
    broken = tmp_path / "broken"
    broken.mkdir()
    src = next(net.descriptors.iterdir())
    (broken / src.name).write_text(src.read_text()[:400])
    code, text = _run(capsys, net.consensus, broken, "--relays", 10)
    assert code == 2 and str(broken / src.name) in text


def test_a_sample_that_does_not_fit_is_exit_2_with_the_numbers(net, capsys):
    code, text = _run(capsys, net.consensus, net.descriptors, "--relays", 200, "--cores", 0.5, "--memory-mib", 64000,
                      "--bench-dir", "")
    assert code == 2
    assert "406 tors and their observers need" in text and "the budget is 0.35 cores" in text


def test_arguments_are_checked_at_parse_time(net, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", str(net.consensus), str(net.descriptors), "--relays", "0"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["generate", str(net.consensus), str(net.descriptors), "--relays", "5", "--mix", "video=1"])
    code, text = _run(capsys, net.consensus, net.descriptors)
    assert code == 2 and "--relays N or --scale" in text


def test_descriptors_from_a_tar_archive(net, tmp_path):
    archive = shutil.make_archive(str(tmp_path / "server-descriptors-2024-03"), "xztar", net.descriptors.parent,
                                  net.descriptors.name)
    by_fp, infos = sources.read_descriptors([Path(archive)])
    assert len(by_fp) == len(net.relays) and infos[0].sha256 == hashlib.sha256(Path(archive).read_bytes()).hexdigest()


def test_tors_own_caches_are_read(net, tmp_path):
    """What tor itself writes (tests/integration/test_generate.py reads a live network's): a
    consensus with empty client-versions/server-versions lines (stem's validation refuses
    them, tor does not) and descriptors annotated @uploaded-at/@source, beside an empty
    cached-descriptors.new."""
    lines = net.consensus.read_text().splitlines(keepends=True)
    lines = [x for x in lines if not x.startswith("@type")]
    at = next(i for i, x in enumerate(lines) if x.startswith("known-flags"))
    cons = tmp_path / "cached-consensus"
    cons.write_text("".join(lines[:at] + ["client-versions \n", "server-versions \n"] + lines[at:]))
    cache = tmp_path / "auth0"
    cache.mkdir()
    texts = []
    for f in sorted(net.descriptors.iterdir()):
        for d in f.read_text().split("@type server-descriptor 1.0\n")[1:]:
            texts.append('@uploaded-at 2026-11-26 20:07:26\n@source "10.77.0.10"\n' + d)
    (cache / "cached-descriptors").write_text("".join(texts))
    (cache / "cached-descriptors.new").write_text("")
    relays, info = sources.read_consensus(cons)
    assert info.entries == 300 and info.valid_after == "2024-03-01T12:00:00Z"
    res = generate(cons, [cache], relays=10, seed=1, budget=BUDGET)
    assert len(res.sample.relays) == 10
    assert res.data["generated"]["sources"][1]["entries"] == sum(len(r.descriptors) for r in net.relays)


def test_more_clients_than_a_group_holds_is_refused(net, capsys):
    code, text = _run(capsys, net.consensus, net.descriptors, "--relays", 10, "--clients", 1200, "--bench-dir", "")
    assert code == 2 and "more than a client group holds" in text


def test_a_scale_that_leaves_a_class_empty_is_exit_2(net, capsys):
    code, text = _run(capsys, net.consensus, net.descriptors, "--scale", 0.01, "--bench-dir", "")
    assert code == 2 and str(net.consensus) in text and "would be empty" in text and "use at least" in text


# --- consensus weights and flags as sampled ----------------------------------------------------

def test_groups_carry_the_sampled_weights_in_node_order(net):
    res = generate(net.consensus, [net.descriptors], relays=40, seed=3, budget=BUDGET)
    by_fp = {r.fingerprint: r for r in net.relays}
    for g in res.groups:
        weights = res.data["network"]["relays"][g.name]["weights"]
        assert weights == [by_fp[r.fingerprint].weight for r in g.relays]
    # Every sampled relay was Fast and Stable in the consensus (the authorities vote both for all).
    assert all({"Fast", "Stable"} <= set(by_fp[r.fingerprint].flags) for r in res.sample.relays)
    unstable = [r for r in net.relays if "Stable" not in r.flags and {"Running", "Valid", "Fast"} <= set(r.flags)]
    assert unstable and res.data["generated"]["parameters"]["excluded_no_stable_flag"] == len(unstable)


def test_the_authorities_vote_the_weights_from_a_bandwidth_file(net):
    from tests.unit.test_torrc import fake_identities, render_all
    from torbed import network
    res = generate(net.consensus, [net.descriptors], relays=20, seed=4, budget=BUDGET)
    s = parse(res.data, "gen")
    plan = network.plan(s, "kist")
    ids = fake_identities(plan)
    files = render_all(plan, ids, "/RUN")
    lines = files["v3bw"].splitlines()
    assert lines[0].isdigit()                       # bandwidth-file 1.0.0: the timestamp line first
    voted = dict(line.split(" ") for line in lines[1:])
    expected = {}
    for g in res.groups:
        for i, r in enumerate(g.relays):
            expected[f"node_id=${ids.fingerprints[f'{g.name}{i}']}"] = f"bw={r.weight}"
    assert voted == expected and len(voted) == 20
    for n in plan.by_role("authority"):
        assert "V3BandwidthsFile /RUN/torrc/v3bw" in files[f"{n.name}.torrc"].splitlines()
    assert not any("V3BandwidthsFile" in files[f"{n.name}.torrc"] for n in plan.by_role("relay"))


@pytest.mark.parametrize("change, field, reason", [
    (lambda d, g: d["network"]["relays"][g]["weights"].append(5), "weights", "give one per relay"),
    (lambda d, g: d["network"]["relays"][g].pop("weights"), "network.relays", "every relay group or none"),
    (lambda d, g: d["network"].update(authorities=2), "network.authorities", "need 3 or more"),
    (lambda d, g: d["network"]["relays"][g].update(weights=[0] * d["network"]["relays"][g]["count"]), "weights",
     "greater than or equal to 1"),
])
def test_bad_weights_are_refused_naming_the_field(net, change, field, reason):
    from torbed.scenario import ScenarioError
    res = generate(net.consensus, [net.descriptors], relays=12, seed=1, budget=BUDGET)
    data = res.data
    change(data, next(iter(data["network"]["relays"])))
    with pytest.raises(ScenarioError) as e:
        parse(data, "gen.yaml")
    assert field in str(e.value) and reason in str(e.value), str(e.value)


def test_a_scenario_without_weights_has_no_bandwidth_file():
    from tests.unit.test_torrc import fake_identities, render_all
    from torbed import network, scenario as scenario_mod
    s = scenario_mod.load(Path(__file__).resolve().parents[3] / "scenarios" / "quickstart.yaml")
    plan = network.plan(s, "kist")
    files = render_all(plan, fake_identities(plan), "/RUN")
    assert "v3bw" not in files and not any("V3BandwidthsFile" in t for t in files.values())


# --- traffic model: recorded and shown ----------------------------------------------------------

def test_the_traffic_model_is_recorded_and_shown_in_the_report_section(net):
    from torbed.analysis import generated as report_section
    res = generate(net.consensus, [net.descriptors], relays=24, seed=1, budget=BUDGET, mix={"web": 0.5, "bulk": 0.5})
    params = res.data["generated"]["parameters"]
    assert params["clients_per_relay"] == 1.0 and params["mix"] == "web=0.5,bulk=0.5"
    assert "exponential" in params["traffic_model"] and "no fixed paths" in params["traffic_model"]
    assert res.data["clients"]["web"]["count"] == res.data["clients"]["bulk"]["count"] == 12
    # Clients scale with the network: twice the relays, twice the clients.
    big = generate(net.consensus, [net.descriptors], relays=48, seed=1, budget=BUDGET, mix={"web": 0.5, "bulk": 0.5})
    assert big.data["clients"]["web"]["count"] == 24
    info = {"scenario": parse(res.data, "gen").model_dump(mode="json")}
    bl = report_section.blocks(info)
    text = repr(bl)
    assert ("h", 2, "Sampled network") in bl and "Traffic model" in text and "web=0.5,bulk=0.5" in text
    assert "one sampled network for every repetition" in text
    assert report_section.blocks({"scenario": {"name": "x"}}) == []
    # Through summary.json (tuples become lists) into the report's run section.
    import json
    from pathlib import Path

    from torbed.analysis import render
    kept = json.loads(json.dumps({"generated_section": bl}))
    shown = [tuple(x) for x in kept["generated_section"]]
    assert shown == bl and "## Sampled network" in render.to_markdown(shown, Path("."))


# --- an independently sampled network per block (item 3) -----------------------------------------

def test_a_network_per_block_same_structure_independent_draws(net):
    from torbed import engine
    res = generate(net.consensus, [net.descriptors], relays=20, seed=7, budget=BUDGET, networks=3)
    again = generate(net.consensus, [net.descriptors], relays=20, seed=7, budget=BUDGET, networks=3)
    assert res.yaml == again.yaml                                   # determinism from the seed
    data = res.data
    assert data["repetitions"] == 3 and [b["seed"] for b in data["samples"]] == [7, 8, 9]
    assert data["generated"]["parameters"]["network_design"] == "network-per-block"
    s = parse(data, "gen")
    assert s.network_design == "network-per-block"
    from torbed.analysis import generated as report_section
    text = repr(report_section.blocks({"scenario": s.model_dump(mode="json")}))
    assert "an independently sampled network per block (3 networks, seeds 7, 8, 9" in text
    relays = data["network"]["relays"]
    for b in data["samples"]:
        assert {g: len(x["weights"]) for g, x in b["relays"].items()} == {g: x["count"] for g, x in relays.items()}
    # Block 0 is the scenario's own network; the others are other draws (different weights).
    assert {g: x["weights"] for g, x in data["samples"][0]["relays"].items()} == {g: x["weights"] for g, x in relays.items()}
    weights = [sorted(w for x in b["relays"].values() for w in x["weights"]) for b in data["samples"]]
    assert weights[0] != weights[1] != weights[2]
    # Each block's relays were drawn by seed seed+k, as a one-network sample with that seed draws them.
    alone = generate(net.consensus, [net.descriptors], relays=20, seed=8, budget=BUDGET)
    assert weights[1] == sorted(r.weight for r in alone.sample.relays)
    # Repetition k runs block k mod 3: its groups carry that block's rates, weights and links.
    run = engine.Run(scenario=s, run_dir=Path("/nonexistent"), console=None, variants=["kist"], info={}, engine=None)
    for k in range(4):
        rep = engine.Repetition(run=run, variant="kist", index=k, dir=Path("/nonexistent"), meta={})
        b = data["samples"][k % 3]
        got = rep.scenario
        for g, x in b["relays"].items():
            assert got.network.relays[g].weights == x["weights"]
            assert got.network.relays[g].bandwidth.bps // 8 == int(x["bandwidth"].removesuffix("KiB/s")) * 1024
        assert [p.between for p in got.links.pairs] == [p["between"] for p in b["pairs"]]
        assert [p.rate and p.rate.bps for p in got.links.pairs] == [
            int(p["rate"].removesuffix("kbit")) * 1000 if "rate" in p else None for p in b["pairs"]]
        assert [round(p.delay.seconds * 1000) for p in got.links.pairs] == [int(p["delay"].removesuffix("ms"))
                                                              for p in b["pairs"]]


def test_a_block_network_that_does_not_match_the_groups_is_refused(net):
    from torbed.scenario import ScenarioError
    data = generate(net.consensus, [net.descriptors], relays=12, seed=1, budget=BUDGET, networks=2).data
    g = next(iter(data["network"]["relays"]))
    data["samples"][1]["relays"][g]["weights"].append(3)
    with pytest.raises(ScenarioError, match=rf"samples\[1\]\.relays\.{g}\.weights: .* give one per relay"):
        parse(data, "gen.yaml")
    del data["samples"][1]["relays"][g]
    with pytest.raises(ScenarioError, match=r"samples\[1\]\.relays: .*every block must have"):
        parse(data, "gen.yaml")


# --- latency (item 4) ------------------------------------------------------------------------------

def test_relay_regions_follow_the_shares_and_are_deterministic():
    from torbed.generate import latency
    fps = [f"{i:040X}" for i in range(5000)]
    regions = latency.relay_regions(fps, latency.DEFAULT, seed=3)
    assert regions == latency.relay_regions(fps, latency.DEFAULT, seed=3)
    assert regions != latency.relay_regions(fps, latency.DEFAULT, seed=4)
    got = Counter(regions.values())
    for r, share in latency.DEFAULT.regions.items():
        assert abs(got[r] / len(fps) - share) < 0.02, (r, got)


def _matrix(tmp_path, text: str) -> Path:
    p = tmp_path / "latency.yaml"
    p.write_text(text)
    return p


def test_a_user_matrix_sets_each_group_pairs_delay_and_the_plan_applies_it(net, tmp_path):
    from torbed import network
    from torbed.generate import latency
    model = latency.load(_matrix(tmp_path, "regions: {a: 1, b: 3}\ndelay_ms: {a: {a: 4, b: 100}, b: {b: 8}}\n"))
    res = generate(net.consensus, [net.descriptors], relays=20, seed=5, budget=BUDGET, latency=model)
    regions = latency.relay_regions([r.fingerprint for r in res.sample.relays], model, 5)
    d = {("a", "a"): 4, ("a", "b"): 100, ("b", "a"): 100, ("b", "b"): 8}
    shares = {"a": 0.25, "b": 0.75}
    by_name = {g.name: g for g in res.groups}

    def side(name):
        if name in by_name:
            rs = [regions[r.fingerprint] for r in by_name[name].relays]
            return {x: rs.count(x) / len(rs) for x in set(rs)}
        return shares                                        # clients and the server: the shares

    pairs = res.data["links"]["pairs"]
    assert any(set(p["between"]) & set(res.data["clients"]) for p in pairs)
    assert any("www" in p["between"] for p in pairs)
    s = parse(res.data, "gen")
    plan = network.plan(s, "kist")
    for p in pairs:
        a, b = p["between"]
        want = max(1, round(sum(wa * wb * d[(ra, rb)] for ra, wa in side(a).items() for rb, wb in side(b).items())))
        assert p["delay"] == f"{want}ms", (p, side(a), side(b))
        # What the shapers get (Plan.link, Plan.shaped_pairs): that delay on every node pair of the groups.
        na, nb = plan.group_nodes(a)[0], plan.group_nodes(b)[-1]
        assert round(plan.link(na, nb).delay_s * 1000) == want
    # Clients reach only the guards, the server only the exits.
    for p in pairs:
        if set(p["between"]) & set(res.data["clients"]):
            assert by_name[next(x for x in p["between"] if x in by_name)].guard
        if "www" in p["between"]:
            assert by_name[next(x for x in p["between"] if x in by_name)].exit
    assert "matrix" in res.data["generated"]["parameters"]["latency_model"]


def test_the_replay_server_is_as_far_from_the_exits_as_the_file_server(net, tmp_path):
    """With replayed sessions in the mix, the latency model reaches the replay server too (it
    once had no delay at all, so a replayed flow's first byte came back faster than any page
    could), in every independently drawn network of a network-per-block design."""
    from torbed.generate import latency
    model = latency.load(_matrix(tmp_path, "regions: {a: 1, b: 3}\ndelay_ms: {a: {a: 4, b: 100}, b: {b: 8}}\n"))
    mix = {"web": 0.5, "bulk": 0.1, "http": 0.2, "ssh": 0.2}
    res = generate(net.consensus, [net.descriptors], relays=20, seed=5, budget=BUDGET, latency=model, mix=mix,
                   networks=2)
    assert len(res.data["samples"]) == 2
    for links in [res.data["links"]["pairs"]] + [smp["pairs"] for smp in res.data["samples"]]:
        to = {srv: {next(x for x in p["between"] if x != srv): p["delay"] for p in links
                    if srv in p["between"] and "delay" in p} for srv in ("www", "replay")}
        assert to["www"] and to["replay"] == to["www"], to


def test_no_latency_means_no_delays(net):
    res = generate(net.consensus, [net.descriptors], relays=12, seed=1, budget=BUDGET, latency=None)
    assert not any("delay" in p for p in res.data["links"]["pairs"])
    assert res.data["generated"]["parameters"]["latency_model"] == "none"


@pytest.mark.parametrize("text, reason", [
    ("regions: {a: 1}\n", "exactly the keys 'regions' and 'delay_ms'"),
    ("regions: {a: 1, b: 1}\ndelay_ms: {a: {a: 5, b: 9}}\n", "no delay for b-b"),
    ("regions: {a: 1}\ndelay_ms: {a: {z: 5}}\n", "'z' is not in regions"),
    ("regions: {a: 1}\ndelay_ms: {a: {a: -5}}\n", "not a delay in milliseconds"),
    ("regions: {a: 0}\ndelay_ms: {a: {a: 5}}\n", "positive share"),
    ("regions: [\n", "not YAML"),
])
def test_a_bad_latency_matrix_is_exit_2_naming_the_file(net, tmp_path, capsys, text, reason):
    path = _matrix(tmp_path, text)
    code, out = _run(capsys, net.consensus, net.descriptors, "--relays", 10, "--bench-dir", "", "--latency", path)
    assert code == 2 and str(path) in out and reason in out, out


def test_weight_order_heavy_relays_are_likelier_and_rates_keep_capacity_order(net):
    """Drawn by weight, the sampled relays of a class are heavier on average than the class (a
    uniform draw matches the class mean); and the fitted rates keep the capacities' order."""
    joined = sources.join(*_joined(net))[0]
    usable, _ = sample.eligible(joined)
    heavier = 0
    for seed in range(10):
        smp = sample.draw(joined, 30, seed, "c")
        for pos in ("guard", "middle"):
            cls = [r.weight for r in usable if r.position == pos]
            got = [r.weight for r in smp.relays if r.position == pos]
            heavier += sum(got) / len(got) > sum(cls) / len(cls)
        fit = budget_mod.fit_rates([r.capacity for r in smp.relays], BUDGET, {"relay": 30, "authority": 3, "client": 30})
        by_capacity = [rate for _, rate in sorted(zip([r.capacity for r in smp.relays], fit.rates))]
        assert by_capacity == sorted(by_capacity)
    assert heavier >= 18, heavier                    # of 20 (class, seed) draws


def _joined(net):
    relays, _ = sources.read_consensus(net.consensus)
    descs, _ = sources.read_descriptors([net.descriptors])
    return relays, descs, "c", ["d"]


# --- the fallback: capacities from the consensus alone ----------------------------------------

def test_capacity_from_consensus_uses_the_weights_and_says_so(net, tmp_path, capsys):
    """Without descriptors (--capacity-from-consensus) a relay's capacity is its consensus
    weight x 1000 B/s; the draw is the same as with descriptors (it depends on weights only,
    and every stub relay has one), and the file records which capacity it used."""
    res = generate(net.consensus, [], relays=12, seed=4, budget=BUDGET, capacity_from_consensus=True)
    assert all(r.capacity == 1000 * r.weight for r in res.sample.relays)
    with_desc = generate(net.consensus, [net.descriptors], relays=12, seed=4, budget=BUDGET)
    assert {r.fingerprint for r in res.sample.relays} == {r.fingerprint for r in with_desc.sample.relays}
    # ... but not the same capacities: the stub's descriptors advertise other values.
    assert [r.capacity for r in res.sample.relays] != [r.capacity for r in with_desc.sample.relays]
    params, gen = res.data["generated"]["parameters"], res.data["generated"]
    assert params["capacity_source"].startswith("consensus weight")
    assert with_desc.data["generated"]["parameters"]["capacity_source"].startswith("largest advertised")
    assert [s["kind"] for s in gen["sources"]] == ["consensus"] and "Capacities: consensus weight" in gen["method"]
    assert "No server descriptors: capacity = consensus weight" in res.yaml
    parse(res.data, "fallback")
    out = tmp_path / "fb.yaml"
    code, text = _run(capsys, net.consensus, "--capacity-from-consensus", "--relays", 12, "--bench-dir", "",
                      "--cores", 2, "--memory-mib", 8000, "-o", out)
    assert code == 0, text
    assert cli.main(["validate", str(out)]) == 0


def test_descriptors_and_the_fallback_are_one_or_the_other(net, capsys):
    code, text = _run(capsys, net.consensus, "--relays", 10)
    assert code == 2 and str(net.consensus) in text and "not neither" in text
    code, text = _run(capsys, net.consensus, net.descriptors, "--capacity-from-consensus", "--relays", 10)
    assert code == 2 and "not both" in text
    # The fallback still checks the consensus: a descriptor given as one is refused, naming it.
    desc = next(net.descriptors.iterdir())
    code, text = _run(capsys, desc, "--capacity-from-consensus", "--relays", 10)
    assert code == 2 and str(desc) in text and "not a consensus" in text
