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

# The longest span accepted: 10 years.  systemd keeps spans as 64-bit
# microseconds (~584,000 years), and we add a few spans together for
# TimeoutStartSec=: 10 years each stays far below that, and stays exact in a
# float at microsecond resolution (3.2e14 us < 2**53).  No wait of ours is
# meant to be longer; "never" is not a duration we render.
MAX_SECONDS = 10 * 365 * 86400
# str.isdigit() is true for "١٢" and float() reads it: only ASCII digits here.
_DIGITS = frozenset("0123456789")
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_MAX_NUMBER_CHARS = 24   # "315360000000000.000000" and friends; longer is nonsense


def parse_duration(text: str | int | float) -> float:
    """Seconds in a systemd time span; ValueError with the reason otherwise."""
    if isinstance(text, bool):
        raise ValueError("expected a time span like \"10s\" or \"2min\"")
    if isinstance(text, (int, float)):
        return _bounded(text, text)
    known = _SPANS.get(text)
    if known is not None:
        return known
    _SPANS[text] = seconds = _parse(text)
    return seconds


# The spans read so far ("30min" in every model's drop-in is read once); only
# those that parsed: a bad one raises every time.
_SPANS: dict[str, float] = {}


def _parse(text: str) -> float:
    s = text.strip(" ")
    if not s:
        raise ValueError("empty time span")
    total = 0.0
    i = 0
    n = len(s)
    while i < n:
        while i < n and s[i] == " ":
            i += 1
        j = i
        while j < n and (s[j] in _DIGITS or s[j] == "."):
            j += 1
        number_text = s[i:j]
        if not number_text or number_text == "." or number_text.count(".") > 1:
            raise ValueError(f"bad time span {_show(text)}: expected a number at {_show(s[i:])}")
        if j - i > _MAX_NUMBER_CHARS:
            raise ValueError(f"bad time span {_show(text)}: number too large "
                             f"(at most {MAX_SECONDS}s, 10 years)")
        number = float(number_text)
        while j < n and s[j] == " ":
            j += 1
        k = j
        while k < n and s[k] in _LETTERS:
            k += 1
        unit = s[j:k]
        if unit and unit not in _UNITS:
            raise ValueError(f"bad time span {_show(text)}: unknown unit {_show(unit)}")
        if k == j and k < n and s[k] not in " ":
            raise ValueError(f"bad time span {_show(text)}: unexpected {_show(s[k])}")
        total += number * _UNITS[unit or "s"]
        i = k
    return _bounded(total, text)


def _bounded(seconds: float, text: object) -> float:
    # NaN fails every comparison, so test for what is allowed.
    if not seconds == seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError("not a finite time span")
    if seconds < 0:
        raise ValueError("a time span cannot be negative")
    if seconds > MAX_SECONDS:
        raise ValueError(f"time span too long (at most {MAX_SECONDS}s, 10 years)")
    return float(seconds)


def _show(text: object) -> str:
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


_LARGE = (("d", 86400), ("h", 3600), ("min", 60))


def format_seconds(seconds: float, style: str = "exact") -> str:
    """The one duration formatter.  style "exact": a span systemd reads back
    exactly, to the microsecond ("90s", "1500ms", "250us"; units and --help
    defaults); "large": the largest unit that divides it ("6h", "30s", for
    log lines); "about": one decimal of the largest unit it reaches ("1.5h",
    "42s", for an age in a table).

    Exact uses whole units only: systemd's parser takes "1.5s" too, but an
    integer keeps the text exact for any float we hand it."""
    if style == "large":
        for unit, size in _LARGE:
            if seconds >= size and seconds % size == 0:
                return f"{seconds / size:g}{unit}"
        return f"{seconds:g}s"
    if style == "about":
        for unit, size in _LARGE:
            if seconds >= size:
                return f"{seconds / size:.1f}{unit}"
        return f"{seconds:.0f}s"
    us = round(seconds * 1_000_000)
    if us % 1_000_000 == 0:
        return f"{us // 1_000_000}s"
    if us % 1000 == 0:
        return f"{us // 1000}ms"
    return f"{us}us"
