"""Which systemd the units are written for, as `systemctl --version` says.

A few directives exist only from some version on (RestartSteps= and
RestartMaxDelaySec=, the crash-loop back-off, since 254: Debian 13 has them,
Debian 12's 252 does not, and an unknown directive is a warning
`systemd-analyze verify` reports).  The generator asks no manager (it runs
before one answers, and talks no D-Bus): `systemctl --version` prints the
version it was built as, which is the installed systemd's."""

from __future__ import annotations

import functools
import re
import subprocess

# Since which version systemd backs off a crash loop by itself.
RESTART_STEPS_SINCE = 254


@functools.cache
def systemd_version() -> int:
    """The installed systemd's major version; 0 when systemctl cannot say,
    and then the units use only what every supported systemd knows."""
    try:
        done = subprocess.run(["systemctl", "--version"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    found = re.match(r"systemd (\d+)", done.stdout)
    return int(found.group(1)) if found else 0
