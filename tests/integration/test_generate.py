"""torbed generate on real tor output, and a generated network brought up.

1. The authorities of a torbed network write a real consensus (cached-consensus) and the
   relays' server descriptors (cached-descriptors*); torbed generate parses them with stem and
   samples from them, flags as tor voted them.
2. A scenario generated from stem-made CollecTor-style documents (tests/unit/generate/torstub.py)
   passes `torbed validate`, comes up, and carries traffic on paths tor chooses.
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

from .helpers import namespaces, only_run_dir, records, run_torbed, small_scenario, start_torbed, wait_for, write_scenario

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _root():
    require_root()


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


def test_generate_reads_a_real_private_networks_consensus_and_descriptors(tmp_path):
    data = small_scenario("it-gen-source", **{
        "network.relays": {"guard": {"count": 2, "guard": True}, "middle": {"count": 2},
                           "exit": {"count": 2, "exit": True}},
        "clients.web": {"workload": {"kind": "fetch", "file": "small", "repeat": 1000, "pause": "0s"}},
        "measure.duration": "45s",
    })
    path = write_scenario(tmp_path, data)
    out = tmp_path / "runs"
    proc = start_torbed(["run", str(path), "--out", str(out), "--system-tor"], tmp_path / "run.log")
    docs = tmp_path / "docs"
    docs.mkdir()
    try:
        scratch = wait_for(lambda: _scratch_of(out), 120, "the run's state file")
        auth = scratch / "auth0"
        wait_for(lambda: (auth / "cached-consensus").exists() and
                 (auth / "cached-consensus").read_text().count("\nr ") >= 9, 150, "a consensus with every relay")
        time.sleep(20)     # traffic, so relays publish descriptors with an observed bandwidth
        shutil.copy(auth / "cached-consensus", docs / "cached-consensus")
        for f in auth.glob("cached-descriptors*"):
            shutil.copy(f, docs / f.name)
    finally:
        proc.wait(timeout=300)
    assert proc.returncode == 0, (tmp_path / "run.log").read_text()[-3000:]
    run = only_run_dir(out)
    assert namespaces(run) == []
    meta = json.loads((run / "kist" / "rep-0" / "meta.json").read_text())
    voted = meta["consensus_flags"]             # relay node -> flags when ready

    descriptor_files = [p for p in docs.glob("cached-descriptors*") if p.stat().st_size]
    budget = budget_mod.Budget(cores=2, memory_mib=16000)
    from torbed.generate import sources, sample
    relays, info = sources.read_consensus(docs / "cached-consensus")
    assert info.entries == 9 and info.valid_after
    by_name = {r.nickname: r for r in relays}
    for node, flags in voted.items():
        assert ("Guard" in flags) == ("Guard" in by_name[node].flags), (node, flags)
        assert ("Exit" in flags) == ("Exit" in by_name[node].flags), (node, flags)
    descs, _ = sources.read_descriptors(descriptor_files)
    joined, missing = sources.join(relays, descs, "c", ["d"])
    assert missing == 0 and len(joined) == 9
    usable, _ = sample.eligible(joined)
    res = generate(docs / "cached-consensus", descriptor_files, relays=len(usable), seed=1, budget=budget)
    got = {r.nickname: r.position for r in res.sample.relays}
    for g in ("guard0", "guard1"):
        assert got.get(g, "guard") == "guard"
    for e in ("exit0", "exit1"):
        assert got.get(e, "exit") == "exit"
    assert res.data["generated"]["sources"][0]["valid_after"] == info.valid_after
    print(f"real consensus {info.valid_after}: {len(relays)} relays, {len(usable)} usable "
          f"(weights {sorted(r.weight for r in joined)}), sampled {sorted(got.items())}")


def test_a_generated_network_comes_up_and_carries_traffic(tmp_path):
    net = write_network(tmp_path / "collector", n=300, seed=0)
    out_file = tmp_path / "gen.yaml"
    p = run_torbed(["generate", str(net.consensus), str(net.descriptors), "--relays", "9", "--clients", "3",
                    "--seed", "2", "--duration", "45s", "--warmup", "10s", "--bench-dir", "", "-o", str(out_file)])
    assert p.returncode == 0, p.stderr
    p = run_torbed(["validate", str(out_file)])
    assert p.returncode == 0, p.stderr
    data = yaml.safe_load(out_file.read_text())
    data["measure"]["ready_timeout"] = "150s"
    out_file.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "runs"
    p = run_torbed(["run", str(out_file), "--out", str(out), "--system-tor"], timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    run = only_run_dir(out)
    rep = run / "kist" / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    transfers = records(rep / "transfers.jsonl")
    ok = [t for t in transfers if t["status"] == "ok"]
    by_group, written = carried(rep)
    print(f"generated 9-relay network: ready {meta['ready_s']:.1f} s, {len(ok)} of {len(transfers)} transfers ok "
          f"{by_group}; MB written per relay {written}; groups {data['network']['relays']}")
    assert meta["status"] == "ok" and len(ok) >= 5
    # Clients had no fixed paths: tor spread the circuits over the sampled relays, exits of
    # both exit classes included.
    busy = [r for r, mb in written.items() if mb > 0.5]
    assert len(busy) >= 3, written
    exits = [n for n, flags in meta["consensus_flags"].items() if "Exit" in flags]
    assert exits and any(written.get(e, 0) > 0.5 for e in exits), (exits, written)
    assert namespaces(run) == []


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
