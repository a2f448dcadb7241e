"""Where the `infer-units` CLI that generated units call is installed.

The .deb puts it in /usr/bin; pip puts it next to the interpreter's scripts
(a venv's bin/, /usr/local/bin, ~/.local/bin).  The generator and the CLI are
installed together, so when the running program is one of ours (the generator
or `infer-units render`) the CLI is found next to it (symlinks followed: a
generator linked into /etc/systemd/system-generators/ from a venv) or next to
its interpreter.  Anything else (tests, `python3 -m`) renders the .deb's path,
so generated units do not depend on who imported this module.

Also the environment and path joins the generator's modules use: they import
`posix` (the C module behind os), not os, whose import (with
_collections_abc) was ~5M instructions, 6% of a full generator run
(bench/generator_bench.py).  What they answer is what os would.
"""

from __future__ import annotations

import posix      # os's C module, not os: see above
import sys
from stat import S_ISLNK, S_ISREG

DEB_CLI = "/usr/bin/infer-units"
CLI_NAME = "infer-units"
# The runtime directory (a tmpfs: a reboot forgets it), spelled here only:
# env files, start claims, the drain fence, metrics state, the P2P cache,
# liveness state, and the first directory of the model search path.
RUN_DIR = "/run/infer-units"


def getenv(name: str) -> str | None:
    """os.environ.get(name).  Where os is loaded its environ is the one
    (putenv() and tests change it there); before that, posix.environ is
    what os.environ would be made from."""
    os = sys.modules.get("os")
    if os is not None:
        found: str | None = os.environ.get(name)
        return found
    value = posix.environ.get(name.encode(sys.getfilesystemencoding(),
                                          sys.getfilesystemencodeerrors()))
    return None if value is None else _decoded(value)


def environ() -> dict[str, str]:
    """dict(os.environ), the same way."""
    os = sys.modules.get("os")
    if os is not None:
        return dict(os.environ)
    return {_decoded(k): _decoded(v) for k, v in posix.environ.items()}


def _decoded(raw: bytes) -> str:
    return raw.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def join(directory: str, name: str) -> str:
    """os.path.join(directory, name)."""
    if name.startswith("/"):
        return name
    if not directory or directory.endswith("/"):
        return directory + name
    return directory + "/" + name


def dirname(path: str) -> str:
    """os.path.dirname(path)."""
    head = path[:path.rfind("/") + 1]
    if head and head != "/" * len(head):
        head = head.rstrip("/")
    return head


def basename(path: str) -> str:
    """os.path.basename(path)."""
    return path[path.rfind("/") + 1:]


def is_normal(path: str) -> bool:
    """An absolute path os.path.abspath() and normpath() leave as it is."""
    return (path.startswith("/") and "//" not in path and "/./" not in path
            and "/../" not in path and not path.endswith(("/.", "/..")) and
            (path == "/" or not path.endswith("/")))


def run_dir() -> str:
    """RUN_DIR, or $INFER_UNITS_RUN_DIR for the hooks (tests run them beside a
    real host)."""
    return getenv("INFER_UNITS_RUN_DIR") or RUN_DIR


def installed_cli(argv0: str | None = None, executable: str | None = None) -> str:
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    if not basename(argv0).startswith(CLI_NAME):
        return DEB_CLI
    found = _beside_plain(argv0, executable)
    if found is not None:
        return found
    import os
    candidates = [os.path.dirname(os.path.realpath(argv0)), os.path.dirname(os.path.abspath(argv0))]
    if executable:
        # not realpath: a venv's bin/python is a link to /usr/bin/python3
        candidates.append(os.path.dirname(os.path.abspath(executable)))
    for directory in candidates:
        path = os.path.join(directory, CLI_NAME)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return DEB_CLI


def _beside_plain(argv0: str, executable: str) -> str | None:
    """installed_cli()'s answer without os when the program is no link and
    has no CLI beside it (the .deb's launcher in system-generators/): then
    the CLI beside its interpreter, or the .deb's.  None: ask os."""
    if not is_normal(argv0) or (executable and not is_normal(executable)):
        return None
    try:
        if S_ISLNK(posix.lstat(argv0).st_mode):
            return None
    except OSError:
        return None
    # Not a link: the file beside its real path is the file beside it.
    if _executable_file(join(dirname(argv0), CLI_NAME)):
        return None         # found there: os says under which of its names
    if executable:
        path = join(dirname(executable), CLI_NAME)
        if _executable_file(path):
            return path
    return DEB_CLI


def _executable_file(path: str) -> bool:
    """os.path.isfile(path) and os.access(path, os.X_OK)."""
    try:
        return S_ISREG(posix.stat(path).st_mode) and posix.access(path, posix.X_OK)
    except (OSError, ValueError):
        return False


HOOK_CLI = installed_cli()
