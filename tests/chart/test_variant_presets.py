"""The chart resolves a variant preset (``torchestra-exp1``) to the same torrc as torbed."""

from __future__ import annotations

from test_chart import CHART, REPO, run, show

from torbed.variants import load_variant


def test_a_preset_renders_every_parameter_it_sets(tools):
    scenario = REPO / "scenarios" / "gopal-heninger-2012-exp1.yaml"
    t = run(tools, tools["helm"], "template", "n", str(CHART), "-f", str(scenario),
            "--set", "variant=torchestra-exp1")
    assert t.returncode == 0, show(t, limit=1500)
    for line in load_variant("torchestra-exp1").torrc.splitlines():
        assert line in t.stdout, line
    assert "TorchestraIdleMultiplier 0.18" in t.stdout and "TorchestraHeavyThreshold 1.4" in t.stdout
    assert "TorchestraHeavyThreshold exp1" not in t.stdout
    # A plain number still sets the first parameter only.
    t = run(tools, tools["helm"], "template", "n", str(CHART), "-f", str(scenario),
            "--set", "variant=ewma-66")
    assert t.returncode == 0 and "CircuitPriorityHalflife 66" in t.stdout, show(t, limit=1500)
