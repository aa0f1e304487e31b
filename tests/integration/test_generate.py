"""torbed generate on real tor output, and a generated network brought up: one network for both.

A scenario generated from stem-made CollecTor-style documents (tests/unit/generate/torstub.py)
passes `torbed validate`, comes up, and carries traffic on paths tor chooses; its consensus
carries the sampled weights and flags, and its transfers the latency model's delays. While it runs, its
authorities write a real consensus (cached-consensus) and the relays' server descriptors
(cached-descriptors*): torbed generate parses those with stem and samples from them, flags as tor
voted them. (One network, not two: each costs a bring-up and a window of the integration stage.)
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import require_root
from tests.unit.generate.torstub import write_network
from torbed import constants
from torbed.generate import budget as budget_mod, generate

from .helpers import namespaces, only_run_dir, records, run_torbed, start_torbed, wait_for

pytestmark = pytest.mark.integration

# One network for every test here: 30 relays, the size issue 41 asks an integration run to
# bring up (it replaced a 9-relay network: one bring-up, not two, for CI's sake).
RELAYS = 30


def _scratch_of(out: Path) -> Path | None:
    """The scratch directory (node data directories) of the run writing under ``out``."""
    for f in constants.STATE_DIR.glob("*.json"):
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if str(out) in str(st.get("run_dir", "")) and st.get("scratch"):
            return Path(st["scratch"])
    return None


@pytest.fixture(scope="module")
def generated_run(tmp_path_factory):
    """A 30-relay network (issue 41 item 5's size) generated from a stub consensus, run for 30 s;
    the real consensus and
    descriptors its first authority holds 15 s into the window, copied aside. Without the
    OnionPerf-style probes: at the sample's scaled rates their 5 MiB fetch takes ~2 minutes, and
    a fetch started in the window runs to its end (the probes are unit-tested)."""
    require_root()
    tmp = tmp_path_factory.mktemp("generated")
    net = write_network(tmp / "collector", n=300, seed=0)
    out_file = tmp / "gen.yaml"
    # --min-utilization 0: this network is for checking that a generated scenario runs, not
    # for measuring, and 8 clients on 30 relays would otherwise hold every rate at tor's
    # floor (the budget keeps relays loaded), leaving too few pages in 30 s to see by bytes.
    # Two of the clients replay the captured sessions (a replay server beside the file server).
    p = run_torbed(["generate", str(net.consensus), str(net.descriptors), "--relays", str(RELAYS), "--clients", "8",
                    "--mix", "web=0.625,bulk=0.125,http=0.125,ssh=0.125", "--seed", "2", "--duration", "30s", "--warmup", "5s", "--no-perf", "--bench-dir", "",
                    "--min-utilization", "0", "-o", str(out_file)])
    assert p.returncode == 0, p.stderr
    p = run_torbed(["validate", str(out_file)])
    assert p.returncode == 0, p.stderr
    data = yaml.safe_load(out_file.read_text())
    data["measure"]["ready_timeout"] = "240s"
    out_file.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp / "runs"
    docs = tmp / "docs"
    docs.mkdir()
    proc = start_torbed(["run", str(out_file), "--out", str(out), "--system-tor"], tmp / "run.log")
    try:
        scratch = wait_for(lambda: _scratch_of(out), 120, "the run's state file")
        auth = scratch / "auth0"
        n_nodes = RELAYS + data["network"]["authorities"]
        wait_for(lambda: (auth / "cached-consensus").exists() and
                 (auth / "cached-consensus").read_text().count("\nr ") >= n_nodes, 240, "a consensus with every relay")
        time.sleep(15)     # traffic, so relays publish descriptors with an observed bandwidth
        shutil.copy(auth / "cached-consensus", docs / "cached-consensus")
        for f in auth.glob("cached-descriptors*"):
            shutil.copy(f, docs / f.name)
    finally:
        proc.wait(timeout=600)
    assert proc.returncode == 0, (tmp / "run.log").read_text()[-4000:]
    return {"run": only_run_dir(out), "data": data, "docs": docs, "nodes": n_nodes}


def test_generate_reads_a_real_private_networks_consensus_and_descriptors(generated_run):
    docs, n_nodes = generated_run["docs"], generated_run["nodes"]
    meta = json.loads((generated_run["run"] / "kist" / "rep-0" / "meta.json").read_text())
    voted = meta["consensus_flags"]             # relay node -> flags when ready

    descriptor_files = [p for p in docs.glob("cached-descriptors*") if p.stat().st_size]
    budget = budget_mod.Budget(cores=2, memory_mib=16000)
    from torbed.generate import sample, sources
    relays, info = sources.read_consensus(docs / "cached-consensus")
    assert info.entries == n_nodes and info.valid_after
    by_name = {r.nickname: r for r in relays}
    for node, flags in voted.items():
        assert ("Guard" in flags) == ("Guard" in by_name[node].flags), (node, flags)
        assert ("Exit" in flags) == ("Exit" in by_name[node].flags), (node, flags)
    descs, _ = sources.read_descriptors(descriptor_files)
    joined, missing = sources.join(relays, descs, "c", ["d"])
    assert missing == 0 and len(joined) == n_nodes
    usable, _ = sample.eligible(joined)
    res = generate(docs / "cached-consensus", descriptor_files, relays=len(usable), seed=1, budget=budget)
    # Each sampled relay is in the class its voted flags put it in.
    for r in res.sample.relays:
        flags = set(voted.get(r.nickname, by_name[r.nickname].flags))
        exit_, guard = "Exit" in flags and "BadExit" not in flags, "Guard" in flags
        assert r.position == ("guardexit" if guard and exit_ else "guard" if guard else "exit" if exit_
                              else "middle"), (r.nickname, flags, r.position)
    assert res.data["generated"]["sources"][0]["valid_after"] == info.valid_after
    print(f"real consensus {info.valid_after}: {len(relays)} relays, {len(usable)} usable "
          f"(weights {sorted(r.weight for r in joined)}), "
          f"sampled {sorted((r.nickname, r.position) for r in res.sample.relays)}")


def test_the_testbed_consensus_carries_the_sampled_weights_and_flags(generated_run):
    """The authorities voted the sampled consensus weights (V3BandwidthsFile): every relay's
    'w Bandwidth=' in the real consensus is its sampled weight, measured (no Unmeasured=1),
    and its flags are the sample's: Guard and Exit by class, Fast and Stable."""
    import stem.descriptor
    data, docs = generated_run["data"], generated_run["docs"]
    meta = json.loads((generated_run["run"] / "kist" / "rep-0" / "meta.json").read_text())
    cons = next(stem.descriptor.parse_file(str(docs / "cached-consensus"),
                                           descriptor_type="network-status-consensus-3 1.0",
                                           document_handler=stem.descriptor.DocumentHandler.DOCUMENT, validate=False))
    entries = {e.nickname: e for e in cons.routers.values()}
    seen = {}
    for node in meta["nodes"]:
        if node["role"] != "relay":
            continue
        group = data["network"]["relays"][node["group"]]
        e = entries[node["name"]]
        seen[node["name"]] = (group["weights"][node["index"]], e.bandwidth)
        assert e.bandwidth == group["weights"][node["index"]] and not e.is_unmeasured, (node["name"], e.bandwidth)
        assert ("Guard" in e.flags) == bool(group.get("guard")) and ("Exit" in e.flags) == bool(group.get("exit"))
        assert {"Fast", "Stable", "Running", "Valid"} <= set(e.flags), (node["name"], e.flags)
    assert len(seen) == RELAYS and len({w for w, _ in seen.values()}) > 1, seen
    print(f"sampled weight -> consensus w Bandwidth= per relay: {seen}")


def _path_delay_bounds(data: dict) -> tuple[float, float]:
    """(least, most) one-way delay in seconds of a client -> guard -> relay -> exit -> server path
    through the scenario's group-pair delays (--latency): any path tor may build lies between."""
    delay = {frozenset(p["between"]): int(p["delay"].removesuffix("ms")) / 1000 for p in data["links"]["pairs"]}
    relays = data["network"]["relays"]
    client = next(iter(data["clients"]))
    totals = []
    for g, gs in relays.items():
        for m in relays:
            for e, es in relays.items():
                if not gs.get("guard") or not es.get("exit"):
                    continue
                hops = [frozenset((client, g)), frozenset((g, m)), frozenset((m, e)), frozenset((e, "www"))]
                if all(h in delay for h in hops):
                    totals.append(sum(delay[h] for h in hops))
    return min(totals), max(totals)


def test_a_generated_network_comes_up_and_carries_traffic(generated_run):
    run, data = generated_run["run"], generated_run["data"]
    rep = run / "kist" / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    transfers = records(rep / "transfers.jsonl")
    ok = [t for t in transfers if t["status"] == "ok"]
    by_group, written = carried(rep)
    print(f"generated {RELAYS}-relay network: ready {meta['ready_s']:.1f} s, {len(ok)} of {len(transfers)} transfers ok "
          f"{by_group}; MB written per relay {written}; groups {data['network']['relays']}")
    assert meta["status"] == "ok" and len(ok) >= 8
    relay_nodes = [n["name"] for n in meta["nodes"] if n["role"] == "relay"]
    assert len(relay_nodes) == RELAYS and set(relay_nodes) <= set(meta["consensus_flags"])
    # Clients had no fixed paths: tor spread the circuits over the sampled relays, exits
    # included. An idle relay writes about 0.8 MB here (directory traffic), so 2 MB means it
    # carried the clients' pages.
    busy = [r for r, mb in written.items() if mb > 2]
    assert len(busy) >= 4, written
    # Exits: the clients' general circuits (tor's own choice; built events carry the path)
    # ended at two or more of the sample's exits. Not by bytes: pages are a small share of an
    # exit's writes beside directory traffic once the generator holds the rates at tor's
    # floor for a load this light (8 clients on 30 relays, 5 of them fetching pages).
    exits = [n for n, flags in meta["consensus_flags"].items() if "Exit" in flags]
    name_of = {n["fingerprint"]: n["name"] for n in meta["nodes"] if n.get("fingerprint")}
    last_hops = {name_of.get(c["path"][-1]) for c in records(rep / "circuits.jsonl")
                 if c.get("event") == "built" and c.get("purpose") == "GENERAL" and c.get("path")
                 and not {"IS_INTERNAL", "ONEHOP_TUNNEL"} & set(c.get("build_flags") or ())}
    assert len(last_hops & set(exits)) >= 2, (last_hops, exits)
    # The replayed sessions went through tor's own paths too: cells of both traces delivered
    # in the window.
    cells = [c for c in records(rep / "cells.jsonl") if not c.get("warmup") and c.get("t_recv")]
    by_trace = {t: sum(1 for c in cells if c.get("group") == t) for t in ("http", "ssh")}
    print(f"replayed cells delivered in the window: {by_trace}")
    assert by_trace["http"] >= 20 and by_trace["ssh"] >= 5, by_trace
    assert namespaces(run) == []
    # The shapers applied the latency model's delays: a request and its first byte cross the
    # path twice, so no TTFB is under twice the least path delay (unshaped, a 50 KiB page's TTFB
    # here is tens of ms), and the fastest is near twice a path's delay, not a multiple of it.
    # Every server group, the replay server's too, is that far from the exits (it once had no
    # delay: a replayed flow's first byte beat every page). The fastest page is near twice a
    # path's delay; a replayed flow's first byte may be due later, at the trace's own time.
    least, most = _path_delay_bounds(data)
    fastest = min(t["ttfb_s"] for t in ok)
    page = min(t["ttfb_s"] for t in ok if t.get("workload") != "replay")
    print(f"one-way path delay {least * 1000:.0f}-{most * 1000:.0f} ms; fastest TTFB {fastest * 1000:.0f} ms, "
          f"of a page {page * 1000:.0f} ms")
    assert 2 * least * 0.98 <= fastest, (least, fastest)
    assert page <= 2 * most + 0.15, (most, page)


def carried(rep: Path) -> tuple[dict[str, int], dict[str, float]]:
    """(successful transfers per client group, MB each relay wrote) of a repetition."""
    by_group: dict[str, int] = {}
    for t in records(rep / "transfers.jsonl"):
        if t["status"] == "ok":
            by_group[t["group"]] = by_group.get(t["group"], 0) + 1
    written: dict[str, float] = {}
    for r in records(rep / "relay_bw.jsonl"):
        written[r["relay"]] = written.get(r["relay"], 0) + r.get("written", 0) / 1e6
    return by_group, {k: round(v, 2) for k, v in sorted(written.items())}
