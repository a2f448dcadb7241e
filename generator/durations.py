"""systemd time spans ("10s", "2min", "1h 30min", "500ms", bare seconds)."""

from __future__ import annotations

_UNITS: dict[str, float] = {
    "us": 1e-6, "usec": 1e-6,
    "ms": 1e-3, "msec": 1e-3,
    "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}


def parse_duration(text: str | int | float) -> float:
    """Seconds in a systemd time span; ValueError with the reason otherwise."""
    if isinstance(text, bool):
        raise ValueError("expected a time span like \"10s\" or \"2min\"")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError("a time span cannot be negative")
        return float(text)
    s = text.strip()
    if not s:
        raise ValueError("empty time span")
    total = 0.0
    i = 0
    n = len(s)
    while i < n:
        while i < n and s[i] == " ":
            i += 1
        j = i
        while j < n and (s[j].isdigit() or s[j] == "."):
            j += 1
        if j == i:
            raise ValueError(f"bad time span {text!r}: expected a number at {s[i:]!r}")
        number = float(s[i:j])
        while j < n and s[j] == " ":
            j += 1
        k = j
        while k < n and s[k].isalpha():
            k += 1
        unit = s[j:k]
        if unit and unit not in _UNITS:
            raise ValueError(f"bad time span {text!r}: unknown unit {unit!r}")
        total += number * _UNITS[unit or "s"]
        i = k
    return total


def format_seconds(seconds: float) -> str:
    """A span systemd reads back exactly (whole ms)."""
    ms = round(seconds * 1000)
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"
