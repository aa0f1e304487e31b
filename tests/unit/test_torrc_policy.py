"""Extra torrc lines of relay groups: tor's option list, the allow-list, refusals and line syntax."""

import copy
import shutil
import subprocess

import pytest

from torbed import constants, scenario, torrc_policy

from .test_scenario import BASE, SCENARIOS


def test_option_list_is_the_installed_tors():
    """data/tor-<version>-options.txt is `tor --list-torrc-options` of the pinned tor."""
    tor = shutil.which("tor") or "/usr/bin/tor"
    if not shutil.which(tor):
        pytest.skip("no tor installed")
    version = subprocess.run([tor, "--version"], capture_output=True, text=True, timeout=30).stdout
    if f"Tor version {constants.TOR_VERSION}." not in version:
        pytest.skip(f"installed tor is not {constants.TOR_VERSION}: {version.splitlines()[:1]}")
    listed = subprocess.run([tor, "--list-torrc-options"], capture_output=True, text=True, timeout=30,
                            check=True).stdout.split()
    assert sorted(torrc_policy.tor_options().values()) == sorted(listed)


def test_allow_list_names_only_options_tor_has_and_refuses_none_of_them():
    known = set(torrc_policy.tor_options().values())
    assert set(torrc_policy.ALLOWED) <= known, set(torrc_policy.ALLOWED) - known
    assert [n for n in torrc_policy.ALLOWED if torrc_policy.refusal(n) is not None] == []


@pytest.mark.parametrize("name", ["DataDirectory", "Log", "ControlPort", "SocksPort", "ORPort", "DirPort", "Address",
                                  "Nickname", "User", "RunAsDaemon", "PidFile", "CookieAuthFile", "Sandbox",
                                  "HashedControlPassword", "GeoIPFile", "KeyDirectory", "CacheDirectory",
                                  "HiddenServiceDir", "ClientOnionAuthDir", "V3BandwidthsFile", "MetricsPort",
                                  "ServerTransportPlugin", "ExitPolicy", "DirAuthority", "ConfluxEnabled",
                                  "__OwningControllerProcess", "TestingEnableCellStatsEvent", "ConsensusParams",
                                  "TestingV3AuthInitialVotingInterval", "HTTPSProxy", "AccelName",
                                  "DataDirectoryGroupReadable"])
def test_dangerous_options_are_refused(name):
    assert torrc_policy.refusal(name) not in (None, torrc_policy.NOT_ALLOWED), name


def test_every_option_that_looks_like_a_path_is_refused():
    for name in torrc_policy.tor_options().values():
        if "File" in name or name.endswith(("Dir", "Directory")):
            assert torrc_policy.refusal(name) is not None, name


@pytest.mark.parametrize("text", [
    "ConstrainedSockets 1\nConstrainedSockSize 8192",           # the shipped scenarios' lines
    "Schedulers KIST\nKISTSchedRunInterval 2 msec\nKISTSockBufSizeFactor 1.5",
    "CircuitPriorityHalflife 30",
    "schedulers kist",                                           # tor matches names case-insensitively
    "+Schedulers Vanilla\n/MaxMemInQueues",                      # append / clear prefixes
    "# a comment\n\nRelayBandwidthRate 1 MB   # trailing comment\nRelayBandwidthBurst 2 MB",
    "Schedulers KIST,\\\n   Vanilla",                            # a continued value
    "TestingServerDownloadInitialDelay 0\nDoSCircuitCreationEnabled 0\nMaxMemInQueues 256 MB",
])
def test_allowed_lines(text):
    assert torrc_policy.problems(text) == []


# (case, text, what the message must say)
REFUSED = [
    ("datadirectory", "DataDirectory /etc", "DataDirectory: names a host path"),
    ("log-file", "Log notice file /etc/passwd", "Log: torbed sets each node's log"),
    ("lower-case", "datadirectory /etc", "DataDirectory: names a host path"),
    ("append-prefix", "+Log notice file /tmp/x", "Log:"),
    ("clear-prefix", "/ExitPolicy", "ExitPolicy: changes the node's role"),
    ("include", "%include /etc/tor/torrc", "%include reads another file"),
    ("abbreviation", "DataDir /etc", "unknown option 'DataDir'"),
    ("alias", "l notice file /tmp/x", "unknown option 'l'"),
    ("unknown", "Schedulr KIST", "did you mean Schedulers?"),
    ("patched-option", "CircSwitch 1", "unknown option 'CircSwitch'"),
    ("not-allowed", "ExcludeNodes {us}", "ExcludeNodes: not on torbed's allow-list"),
    ("control", "ControlPort 9051", "ControlPort: changes the control interface"),
    ("user", "User nobody", "User: changes the user"),
    ("conflux", "ConfluxEnabled 1", "network.consensus_params cfx_enabled"),
    ("carriage-return", "Schedulers KIST\rDataDirectory /etc", "character U+000D"),
    ("nbsp", "Schedulers\u00a0KIST", "character U+00A0"),
    ("line-separator", "Schedulers KIST\u2028DataDirectory /etc", "character U+2028"),
    ("comment-in-continuation", "Schedulers KIST \\\n# note\nKISTSchedRunInterval 2", "comment inside a continued line"),
    ("comment-on-continued-line", "Schedulers KIST # note \\\nDataDirectory /etc", "comment on a continued line"),
    ("trailing-backslash", "Schedulers KIST \\", "continues onto nothing"),
    ("backslash-in-name", "DataDirectory\\\n/etc", "is not an option name"),
    ("quoted", 'Schedulers "KIST"', "quoted values"),
]


@pytest.mark.parametrize("case,text,expected", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_lines(case, text, expected):
    found = torrc_policy.problems(text)
    assert found and any(expected in p for p in found), found


def test_a_continued_line_hides_no_option():
    """Only the option line is checked; its continuation is its value, as tor reads it."""
    assert torrc_policy.problems("Schedulers KIST,\\\nVanilla\nLog notice stdout") == \
        ["line 3: 'Log notice stdout': Log: " + torrc_policy.LOG]


def test_bandwidth_lines_clash_with_the_groups_bandwidth():
    assert torrc_policy.problems("BandwidthRate 1 MB") == []
    assert "'bandwidth' sets it" in torrc_policy.problems("BandwidthRate 1 MB", bandwidth_set=True)[0]


def test_scenario_reports_the_group_the_line_and_the_reason():
    data = copy.deepcopy(BASE)
    data["network"]["relays"]["middle"]["torrc"] = "ConstrainedSockets 1\nDataDirectory /etc"
    with pytest.raises(scenario.ScenarioError) as err:
        scenario.parse(data, "s.yaml")
    assert err.value.problems == [("network.relays.middle.torrc",
                                   "line 2: 'DataDirectory /etc': DataDirectory: " + torrc_policy.PATH)]


def test_validate_exits_2_naming_file_and_field(tmp_path, capsys):
    import yaml
    from torbed import cli
    data = copy.deepcopy(BASE)
    data["network"]["relays"]["exit"]["torrc"] = "Log notice file /etc/passwd"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    assert cli.main(["validate", str(path)]) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert f"{path}: network.relays.exit.torrc: line 1:" in text and "Traceback" not in text


def test_shipped_scenarios_torrc_lines_pass():
    checked = 0
    for path in SCENARIOS:
        for g, rg in scenario.load(path).network.relays.items():
            if rg.torrc:
                checked += 1
                assert torrc_policy.problems(rg.torrc, rg.bandwidth is not None) == [], (path, g)
    assert checked


def test_lines_written_are_the_lines_checked():
    from torbed import torrc
    assert torrc_policy.extra_lines("  Schedulers KIST  \n\n\tConstrainedSockets 1\n") == \
        ["Schedulers KIST", "", "ConstrainedSockets 1"]
    assert torrc.torrc_policy.extra_lines is torrc_policy.extra_lines


def test_a_patched_tors_options_need_every_variant_of_the_group_to_have_them():
    """CircSwitch exists only in the circswitch variant's tor (tests/integration turn it off per group)."""
    data = copy.deepcopy(BASE)
    data["variants"] = ["circswitch"]
    data["network"]["relays"]["middle"]["torrc"] = "CircSwitch 0"
    scenario.parse(copy.deepcopy(data), "s.yaml")
    data["variants"] = ["circswitch", "kist"]
    with pytest.raises(scenario.ScenarioError) as err:
        scenario.parse(copy.deepcopy(data), "s.yaml")
    assert "unknown option 'CircSwitch'" in str(err.value)
    data["network"]["relays"]["middle"]["variant"] = "circswitch"
    scenario.parse(data, "s.yaml")
    assert "relayconnectionthreads" in torrc_policy.variant_options("mtrelay")
    assert torrc_policy.variant_options("kist") == {}
