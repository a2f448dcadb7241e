"""Command-line values, checked before use: each bad one is one line and exit 1
(argparse in hooks/unit.py, click in cli/options.py), never a traceback from deep
inside (a port over 65535 used to reach bind(), a URL without a scheme
urlopen(), pid -1 pidfd_open()).  Each function raises ValueError with the
reason; callers name the option."""

from __future__ import annotations

import math

# ONE bound for every span, the generator's (generator/durations.py): what the
# generator accepts in a config, every hook accepts on its argv.  It also keeps
# poll()/monotonic arithmetic finite.
from ..generator.durations import MAX_SECONDS
PID_MAX = 1 << 22       # the kernel's PID_MAX_LIMIT on 64-bit


def _ascii_number(text: str, what: str) -> int:
    t = text.strip()
    # str.isdigit() accepts "١" and "²"; int() even parses the former.
    if not (t.isascii() and t.isdigit()):
        raise ValueError(f"{what} must be ASCII digits, got {text!r}")
    if len(t) > 12:
        raise ValueError(f"{what} {text!r} is out of range")
    return int(t)


def duration(text: str) -> float:
    from ..generator.durations import parse_duration
    if not text.isascii():
        raise ValueError(f"bad time span {text!r}: ASCII digits and units only")
    seconds = parse_duration(text)
    if not math.isfinite(seconds) or seconds > MAX_SECONDS:
        raise ValueError(f"bad time span {text!r}: more than {MAX_SECONDS}s (10 years)")
    return seconds


def port(text: str) -> int:
    number = _ascii_number(text, "port")
    if not 1 <= number <= 65535:
        raise ValueError(f"port {text!r} is not in 1-65535")
    return number


def pid(text: str) -> int:
    number = _ascii_number(text, "pid")
    if not 1 <= number <= PID_MAX:
        raise ValueError(f"pid {text!r} is not a process id")
    return number


def http_url(text: str) -> str:
    """A health URL, read by the generator's one parser (generator/urls.py)."""
    from ..generator.urls import parse_url
    try:
        parse_url(text)
    except ValueError as e:
        raise ValueError(f"bad URL: {e}") from None
    return text


def host(text: str) -> str:
    """A host name or IP address, no port (the model's `host`)."""
    from ..generator.urls import check_host
    return check_host(text)


def host_port(text: str) -> str:
    """HOST:PORT or [IPv6]:PORT ([nodes] addr)."""
    from ..generator.urls import parse_host_port
    parse_host_port(text)
    return text


def count(text: str) -> int:
    """A whole number >= 0 (failures, max-restarts)."""
    return _ascii_number(text, "count")


def unit_name(name: str) -> str:
    """A unit named without its suffix is a service ("m" -> "m.service")."""
    return name if name.endswith((".service", ".scope")) else name + ".service"


def unit(text: str) -> str:
    if not text or not text.isprintable() or "/" in text or text.strip() != text:
        raise ValueError(f"bad unit name {text!r}")
    return text


def health_checks(text: str) -> tuple[str, ...]:
    """"xid,remapped-rows": names of health checks ([health] accept)."""
    from ..generator.settings import HEALTH_CHECKS
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if name not in HEALTH_CHECKS:
            raise ValueError(f"{name!r} is not a health check (known: {', '.join(HEALTH_CHECKS)})")
    return names
