"""The chart tools fixture (defined in test_chart.py) for every module of tests/chart."""

from test_chart import tools  # noqa: F401
