"""Only automatic restarts count toward the unit's start limit.

systemd counts every start against StartLimitBurst= (5 within
StartLimitIntervalSec=60s), the ones an operator asks for too: six
`systemctl restart`s within a minute left the model failed with "Start
request repeated too quickly".  The limit is there for crash loops
(Restart=always), so pre-start forgives a start that nobody's crash caused:
systemd's NRestarts counts the automatic restarts since the last start that
was asked for and is 0 on every asked-for one (`systemctl start/restart`,
liveness' try-restart, `infer-units resume`; systemd flushes it when a unit
stops without being restarted automatically).  Such a start resets the
counter (`systemctl reset-failed`, which also clears start-limit-hit), so a
crash loop is still capped by systemd: five automatic restarts within a
minute of the last asked-for start pass, the sixth is refused.

The two questions go through facts/systemd.py.  Outside the unit's own cgroup, or not run by
systemd (no INVOCATION_ID), it does nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from ...generator.log import NOTICE

log = logging.getLogger(__name__)


def forgive_asked_start(unit: str, environ: dict[str, str] | None = None) -> bool:
    """Reset the start-limit counter when this start is not an automatic
    restart; True when it did.  Never fails the start: a systemd that
    cannot answer leaves systemd's counting as it is, with a journal line."""
    env = os.environ if environ is None else environ
    # Only as that unit's own hook, run by systemd (its cgroup, as root; the
    # one such check, decide/identity.py's): a pre-start run by hand or by a
    # test under some other unit leaves that unit's counter alone.
    from ..decide.identity import own_cgroup_if
    if not env.get("INVOCATION_ID") or own_cgroup_if(unit) is None:
        return False
    from ..facts.systemd import SystemdUnavailable, reset_failed, restarts_since_asked
    try:
        if restarts_since_asked(unit) != 0:
            return False                # an automatic restart: systemd's crash-loop cap
        reset_failed(unit)
        return True
    except SystemdUnavailable as e:
        log.log(NOTICE, f"cannot reset the start limit of {unit} ({e}): this start counts "
                "toward StartLimitBurst")
        return False


def forgive_asked_start_meanwhile(unit: str) -> Callable[[], bool]:
    """forgive_asked_start in a thread, beside pre-start's checks: its
    questions are round trips to the manager that is running this very
    start, and the checks need none of their answers.  Returns the function that waits for
    the thread and gives its result, or raises what escaped it.  pre-start
    calls it before it leaves, whichever way it leaves, and turns what it
    raises into an error line: the question never decides the start."""
    from ..background import Background
    from ..decide import identity  # noqa: F401  (imported here, not in the thread)
    from ..facts import systemd  # noqa: F401
    asked = Background(lambda: forgive_asked_start(unit))
    return lambda: asked.wait() is True
