"""The local backend's fast bring-up (backends.local, FAST_INITIAL_VOTING_INTERVAL): when it
applies, the first round's valid-after time, and the one-shot control connection, the last
against a real tor."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.unit.test_scenario import BASE
from torbed import builds
from torbed import constants, scenario
from torbed.backends.local import backend as local
from torbed.errors import RunFailed
from torbed.network import plan as make_plan
from torbed.torrc import NodePaths


def test_fast_for_small_networks_held_for_large_ones_unless_switched_off(monkeypatch):
    small = make_plan(scenario.parse(BASE, "t.yaml"), "kist")
    assert local.fast_bringup(small)
    monkeypatch.setenv("TORBED_FAST_BRINGUP", "0")
    assert not local.fast_bringup(small)
    monkeypatch.delenv("TORBED_FAST_BRINGUP")
    large = scenario.parse({**BASE, "network": {**BASE["network"], "relays": {
        **BASE["network"]["relays"], "middle": {"count": constants.LARGE_NETWORK_TORS}}}}, "t.yaml")
    assert not local.fast_bringup(make_plan(large, "kist"))
    assert local.first_round(make_plan(large, "kist")) == "held" and local.first_round(small) == "fast"
    monkeypatch.setenv("TORBED_FAST_BRINGUP", "0")
    assert local.first_round(make_plan(large, "kist")) is None
    monkeypatch.setenv("TORBED_FAST_BRINGUP", "held")
    assert local.first_round(small) == "held" and not local.fast_bringup(small)


def test_the_torrcs_fallback_round_comes_after_the_whole_launch():
    small = make_plan(scenario.parse(BASE, "t.yaml"), "kist")
    hundred = make_plan(scenario.parse({**BASE, "network": {**BASE["network"], "relays": {
        **BASE["network"]["relays"], "middle": {"count": 100}}}}, "t.yaml"), "kist")
    tors = sum(1 for n in hundred.nodes if n.runs_tor)
    lead, schedule = local.torrc_first_round(hundred, "fast")
    # 100+ tors take 11-12 s to launch: the old 9 s round had voted (4 s earlier) before
    # torbed reached the authorities. A placeholder interval lets the lead pass 10 s.
    assert lead == local.VOTE_LEAD_FALLBACK + local.LAUNCH_S_PER_TOR * tors > 30
    assert schedule == (local.FAST_PLACEHOLDER_INTERVAL, constants.VOTE_DELAY, constants.DIST_DELAY)
    assert lead < schedule[0]                               # the first boundary, not a later one
    assert local.torrc_first_round(small, "fast")[0] < lead
    assert local.torrc_first_round(small, None) == (local.VOTE_LEAD, None)
    assert local.torrc_first_round(small, "held") == (constants.HELD_ROUND_LEAD, (
        constants.HELD_ROUND_INTERVAL, constants.VOTE_DELAY, constants.DIST_DELAY))


def test_a_held_round_waits_for_its_longer_delays():
    # backends.local._held_first_round: 6 + 6 s delays and a 30 s interval.
    assert local.first_round_valid_after(100.5, 0, (6, 6), 30) == 113
    # ... and with the held network's own 300 s rounds: as soon, whatever the interval.
    assert local.first_round_valid_after(100.5, 0, (6, 6), constants.HELD_VOTING_INTERVAL) == 113


def test_a_held_network_keeps_slow_rounds_after_ready_and_its_caches_keep_enough_consensuses():
    assert local.after_ready_interval("held") == constants.HELD_VOTING_INTERVAL
    assert local.after_ready_interval("fast") == local.after_ready_interval(None) == local.VOTING_INTERVAL_AFTER_READY
    assert constants.HELD_VOTING_INTERVAL > constants.LARGE_VOTING[0]


def test_directory_caches_are_the_directory_guards_or_every_v2dir_relay():
    plan = make_plan(scenario.parse(BASE, "t.yaml"), "kist")
    relays = [r.name for r in plan.by_role("relay")]
    flags = {r: ["Fast", "Running", "V2Dir"] for r in relays}
    assert local.directory_caches(plan, flags) == relays
    flags[relays[0]].append("Guard")
    assert local.directory_caches(plan, flags) == [relays[0]]
    flags[relays[0]].remove("V2Dir")      # a guard that is no cache is no directory guard
    assert local.directory_caches(plan, flags) == relays[1:]


@pytest.mark.parametrize("now, previous, expected", [
    (100.0, 0, 103),      # vote fires at 101.0 = valid-after - 1 - 1
    (100.94, 0, 103),     # fires at 101.94, still in second 101
    (100.5, 103, 104),    # a postponement in the same second must change the schedule
    (101.2, 103, 104),
    (102.7, 103, 105),
    (105.1, 103, 109),    # 108 would be the same offset (mod 5) as 103: nothing would reschedule
])
def test_first_round_valid_after(now, previous, expected):
    va = local.first_round_valid_after(now, previous)
    assert va == expected
    fires = int(now + 1.0)    # tor's timer fires 1 s after the SETCONF; tor counts whole seconds
    vote = va - local.FAST_VOTE_S - local.FAST_DIST_S
    if not previous:
        assert vote == fires, "the first schedule votes as soon as the timer fires"
    assert fires <= vote <= fires + 2
    assert not previous or (va - previous) % local.FAST_INITIAL_VOTING_INTERVAL, "same offset: no reschedule"


@pytest.fixture(scope="module")
def tor_binary():
    try:
        return builds.ensure(None, None, system_tor=True).tor
    except RunFailed as e:
        pytest.fail(f"no tor: {e}")


def test_control_oneshot_against_a_real_tor(tmp_path, tor_binary):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    paths = NodePaths(datadir=str(data), log=str(tmp_path / "notice.log"), control_socket=str(data / "control"))
    assert not local._control_oneshot(paths, ["SETEVENTS BW"]), "nothing listens yet"
    torrc = tmp_path / "torrc"
    torrc.write_text(f"DataDirectory {data}\nControlSocket {data / 'control'}\nCookieAuthentication 1\n"
                     f"SocksPort 0\nDisableNetwork 1\nLog notice file {paths.log}\n")
    proc = subprocess.Popen([tor_binary, "-f", str(torrc)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while not local._control_oneshot(paths, ["SETEVENTS BW"]):
            assert proc.poll() is None and time.time() < deadline, Path(paths.log).read_text()
            time.sleep(0.05)
        assert local._control_oneshot(paths, ["SETEVENTS", "GETINFO version"])
        with pytest.raises(RunFailed, match="NOSUCHEVENT"):
            local._control_oneshot(paths, ["SETEVENTS NOSUCHEVENT"])
    finally:
        proc.terminate()
        proc.wait(10)


def test_torbed_real_time_for_itself_not_for_what_it_starts():
    """A held (large) bring-up makes torbed's own thread SCHED_RR until ready; the tors it
    launches meanwhile must start as normal tasks (SCHED_RESET_ON_FORK), not real-time."""
    import os
    if os.geteuid() != 0:
        pytest.skip("needs CAP_SYS_NICE (root)")
    try:
        assert local._self_realtime(1) == 1
        assert os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK == os.SCHED_RR
        child = subprocess.run(["python3", "-c", "import os; print(os.sched_getscheduler(0))"],
                               capture_output=True, text=True, check=True)
        assert int(child.stdout) == os.SCHED_OTHER
    finally:
        local._self_realtime(None)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
