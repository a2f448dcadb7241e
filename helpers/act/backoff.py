"""The crash-loop back-off where systemd cannot do it (systemd < 254).

The generated unit restarts a server that exits by itself (Restart=always)
and never gives up; what keeps a crash loop from hammering the GPUs and the
journal is the wait before each automatic restart: RestartSec= before the
first, then about twice as long each time, up to a ceiling.  systemd >= 254
waits so itself (RestartSteps=, RestartMaxDelaySec=: the generator renders
them there).  Debian 12's systemd 252 knows only RestartSec=, so the
generator hands the three values to pre-start, which waits out the rest
before it claims anything (this module), with the same rule as systemd's
service_restart_usec_next().  A stop while it waits ends it at once (the
stop's SIGTERM).  systemd's NRestarts counts the automatic restarts since the
last start someone asked for; a healthy server's liveness probe resets it
(act/liveness.py), so the next loop starts again from RestartSec=.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...generator.log import NOTICE

log = logging.getLogger(__name__)


def restart_delay(n: int, first: float, steps: int, ceiling: float) -> float:
    """systemd's wait before automatic restart `n` (1 for the first):
    first * (ceiling / first) ** ((n - 1) / steps), `ceiling` from restart
    steps + 1 on."""
    if n <= 1 or steps <= 0 or first <= 0 or first >= ceiling:
        return first
    if n > steps:
        return ceiling
    return float(first * (ceiling / first) ** ((n - 1) / steps))


def wait_out(unit: str, first: float, steps: int, ceiling: float,
             restarts: Callable[[str], int],
             sleep: Callable[[float], None] = time.sleep) -> float:
    """On an automatic restart, wait what the back-off asks beyond the
    RestartSec= systemd already waited; returns the seconds waited here.
    `restarts`: systemd's NRestarts of the unit (facts/systemd.py)."""
    try:
        n = restarts(unit)
    except Exception as e:  # noqa: BLE001 - the wait must never fail a start
        log.log(NOTICE, f"crash-loop back-off: cannot ask systemd for {unit}'s restarts ({e}); "
                "not waiting")
        return 0.0
    if n <= 0:
        return 0.0          # a start someone asked for
    delay = restart_delay(n, first, steps, ceiling)
    extra = max(0.0, delay - first)
    after = restart_delay(n + 1, first, steps, ceiling)
    log.log(NOTICE, f"automatic restart {n} of {unit} (crash loop): waiting {delay:.1f}s in all "
            f"({extra:.1f}s here after systemd's RestartSec= {first:g}s); the next waits "
            f"{after:.1f}s, up to {ceiling:g}s; a healthy server starts the count over")
    if extra > 0:
        sleep(extra)
    return extra
