import pytest

from torbed import units


@pytest.mark.parametrize("text,expected", [
    ("300KB", 300_000), ("5MiB", 5 * 1024 * 1024), ("1GB", 10**9), ("512B", 512), ("1.5KiB", 1536),
])
def test_sizes(text, expected):
    assert units.parse_size(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("3mbit", 3_000_000), ("500kbit", 500_000), ("1MB/s", 8_000_000), ("1gbit", 10**9), ("2KiB/s", 16384),
])
def test_rates(text, expected):
    assert units.parse_rate(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("20ms", 0.02), ("5s", 5.0), ("15m", 900.0), ("1h", 3600.0), ("250us", 0.00025), ("0s", 0.0),
])
def test_durations(text, expected):
    assert units.parse_duration(text) == pytest.approx(expected)


def test_percent():
    assert units.parse_percent("1%") == pytest.approx(0.01)
    assert units.parse_percent("0.5%") == pytest.approx(0.005)


@pytest.mark.parametrize("parser,text", [
    (units.parse_size, "300"), (units.parse_size, "300kb"), (units.parse_size, 300),
    (units.parse_rate, "3mbps"), (units.parse_rate, "fast"), (units.parse_duration, "20"),
    (units.parse_duration, "5 minutes"), (units.parse_percent, "101%"), (units.parse_percent, "0.1"),
])
def test_rejects_with_examples(parser, text):
    with pytest.raises(ValueError, match="e.g.|above 100"):
        parser(text)
