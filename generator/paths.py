"""Where the `infer-units` CLI that generated units call is installed, and
the runtime directory.

The .deb puts the CLI in /usr/bin; pip puts it next to the interpreter's
scripts (a venv's bin/, /usr/local/bin, ~/.local/bin).  The generator and the
CLI are installed together, so when the running program is one of ours (the
generator or `infer-units render`) the CLI is found next to it (symlinks
followed: a generator linked into /etc/systemd/system-generators/ from a
venv) or next to its interpreter.  Anything else (tests, `python3 -m`)
renders the .deb's path, so generated units do not depend on who imported
this module.
"""

from __future__ import annotations

import os
import sys

DEB_CLI = "/usr/bin/infer-units"
CLI_NAME = "infer-units"
# The runtime directory (a tmpfs: a reboot forgets it), spelled here only:
# env files, start claims, the drain fence, metrics state, the P2P cache,
# liveness state, and the first directory of the model search path.
RUN_DIR = "/run/infer-units"
# Where each model's compile caches live, kept across restarts and reboots:
# systemd's CacheDirectory=infer-units/<name> (a system unit's is under
# /var/cache), owned by the model's User= and 0700 (docs/trust.md).
CACHE_DIR = "/var/cache/infer-units"


def run_dir() -> str:
    """RUN_DIR, or $INFER_UNITS_RUN_DIR for the hooks (tests run them beside a
    real host)."""
    return os.environ.get("INFER_UNITS_RUN_DIR") or RUN_DIR


def installed_cli(argv0: str | None = None, executable: str | None = None) -> str:
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    if not os.path.basename(argv0).startswith(CLI_NAME):
        return DEB_CLI
    candidates = [os.path.dirname(os.path.realpath(argv0)), os.path.dirname(os.path.abspath(argv0))]
    if executable:
        # not realpath: a venv's bin/python is a link to /usr/bin/python3
        candidates.append(os.path.dirname(os.path.abspath(executable)))
    for directory in candidates:
        path = os.path.join(directory, CLI_NAME)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return DEB_CLI


HOOK_CLI = installed_cli()
