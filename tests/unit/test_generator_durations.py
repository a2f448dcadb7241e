"""Time spans: what we accept is finite, ASCII, at most 10 years; what we
render is a form systemd parses back to the same microsecond."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest

from infer_units.generator.durations import MAX_SECONDS, format_seconds, parse_duration


@pytest.mark.parametrize("text, seconds", [
    ("10s", 10), ("2min", 120), ("1h 30min", 5400), ("1h30min", 5400), ("500ms", 0.5),
    ("1us", 1e-6), ("1.5", 1.5), (" 3 s ", 3), ("3650d", MAX_SECONDS), (0, 0), (2.5, 2.5),
])
def test_accepted(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, reason", [
    ("١٢", "expected a number"), ("١٢s", "expected a number"), ("12٣s", "unexpected"),
    ("９s", "expected a number"), ("1.2.3s", "expected a number"), (".s", "expected a number"),
    ("9" * 400 + "s", "number too large"), ("3651d", "too long"), ("1e5", "unknown unit"),
    (float("nan"), "not a finite"), (float("inf"), "not a finite"), (-1, "negative"),
    (10 ** 30, "too long"), ("10s!", "expected a number"), ("", "empty"), ("5 fortnight", "unknown unit"),
    ("10s\n", "expected a number"),
])
def test_refused(text: str | float, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_duration(text)


@pytest.mark.parametrize("seconds, text", [
    (10, "10s"), (0, "0s"), (0.5, "500ms"), (1e-6, "1us"), (0.0015, "1500us"),
    (MAX_SECONDS, "315360000s"), (4 * MAX_SECONDS + 150, "1261440150s"), (1e-7, "0s"),
])
def test_format(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text
    if seconds <= MAX_SECONDS:      # sums (TimeoutStartSec=) may exceed what a key takes
        assert parse_duration(text) == pytest.approx(round(seconds * 1e6) / 1e6, abs=1e-9)


TIMESPAN = shutil.which("systemd-analyze")


@pytest.mark.skipif(not TIMESPAN, reason="systemd-analyze needed")
def test_systemd_reads_what_we_render() -> None:
    spans = [0, 1e-6, 0.0015, 0.5, 10, 90.25, MAX_SECONDS, 4 * MAX_SECONDS + 270]
    texts = [format_seconds(s) for s in spans]
    done = subprocess.run([TIMESPAN, "timespan", *texts], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    got = [int(l.split(":", 1)[1]) for l in done.stdout.splitlines() if "μs:" in l]
    assert got == [round(s * 1e6) for s in spans]
    assert all(math.isfinite(s) for s in spans)
