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

systemctl, not pystemd: pystemd's import alone (240-380 ms measured under
load) costs more than both calls (~31 ms together at a load average of 50,
measured in a bookworm container), and this runs on every start.  Outside
the unit's own cgroup, or not run by systemd (no INVOCATION_ID), it does
nothing.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

SYSTEMCTL = ("/usr/bin/systemctl", "/bin/systemctl")
# systemctl's own environment: nothing of the unit's [env] reaches it.
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "SYSTEMD_PAGER": "",
       "SYSTEMD_COLORS": "0"}


def _systemctl() -> str | None:
    for path in SYSTEMCTL:
        if os.access(path, os.X_OK):
            return path
    return None


def forgive_asked_start(unit: str, say: Callable[[str, int], None],
                        environ: dict[str, str] | None = None) -> bool:
    """Reset the start-limit counter when this start is not an automatic
    restart; True when it did.  Never fails the start: a systemctl that
    cannot answer leaves systemd's counting as it is, with a journal line."""
    env = os.environ if environ is None else environ
    # Only as that unit's own hook, run by systemd (its cgroup, as root; the
    # one such check, decide/identity.py's): a pre-start run by hand or by a
    # test under some other unit leaves that unit's counter alone.
    from ..decide.identity import _own_cgroup_if
    if not env.get("INVOCATION_ID") or _own_cgroup_if(unit) is None:
        return False
    systemctl = _systemctl()
    if systemctl is None:
        return False
    try:
        shown = subprocess.run([systemctl, "show", "--value", "--property=NRestarts", unit],
                               capture_output=True, text=True, timeout=10, env=ENV)
        restarts = shown.stdout.strip()
        if shown.returncode != 0 or not restarts.isdigit():
            say(f"cannot read NRestarts of {unit} ({shown.stderr.strip() or restarts!r}): "
                "this start counts toward StartLimitBurst", 5)
            return False
        if restarts != "0":
            return False                # an automatic restart: systemd's crash-loop cap
        done = subprocess.run([systemctl, "reset-failed", unit], capture_output=True,
                              text=True, timeout=10, env=ENV)
        if done.returncode != 0:
            say(f"cannot reset the start limit of {unit}: {done.stderr.strip()}", 5)
            return False
        return True
    except (OSError, subprocess.TimeoutExpired) as e:
        say(f"cannot ask systemctl about {unit}: {e}", 5)
        return False
