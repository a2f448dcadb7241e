"""The environment the root hooks run with.

systemd gives every command of a unit its Environment=, the `+` hooks
(pre-start, wait-ready, wait-free, liveness-probe, group-watch) included; a
model's [env] is the *server's* environment (PATH into the user's venv,
PYTHONPATH, LD_LIBRARY_PATH, OPENSSL_CONF, TMPDIR, ...), and a root process
that honoured it would run or read what the service user controls.  So a
hook keeps only what systemd itself tells a command (systemd.exec(5),
"Environment Variables in Spawned Processes"), a fixed PATH, and the hook
settings an operator sets in a root-owned model file (README: metrics).

The variables that replace the machine for tests (INFER_UNITS_FAKE_GPUS,
INFER_UNITS_RUN_DIR, ...) are honoured only on a host marked for tests by a
root-owned file no one else can write (TEST_MARKER; the e2e containers and
the GPU harness write it beside their fake GPU table).  `python3 -m
infer_units` (the tests' and a developer's invocation, never a unit's: units
call the installed CLI, generator/paths.py) keeps the caller's environment.

Imports only os: it runs before anything else is imported.
"""

from __future__ import annotations

import os
import stat

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# What systemd sets for a unit's commands and the hooks read or pass on.
SYSTEMD_VARIABLES = frozenset((
    "INVOCATION_ID", "SERVICE_RESULT", "EXIT_CODE", "EXIT_STATUS", "MAINPID", "MANAGERPID",
    "JOURNAL_STREAM", "NOTIFY_SOCKET", "SYSTEMD_EXEC_PID", "LISTEN_FDS", "LISTEN_PID",
    "LISTEN_FDNAMES", "WATCHDOG_PID", "WATCHDOG_USEC", "RUNTIME_DIRECTORY",
    "STATE_DIRECTORY", "CACHE_DIRECTORY", "LOGS_DIRECTORY", "CONFIGURATION_DIRECTORY",
    "CREDENTIALS_DIRECTORY", "SYSTEMD_LOG_LEVEL", "SYSTEMD_LOG_TARGET",
))
# Hook settings of a model file ([env], root's): values the hooks check
# themselves, never code (the metrics directory must be root's: act/metrics.py).
HOOK_SETTINGS = frozenset(("INFER_UNITS_METRICS_DIR", "INFER_UNITS_GPU_BASELINE_MIB"))
TEST_PREFIX = "INFER_UNITS_"
TEST_MARKER = "/etc/infer-units/hooks-test-mode"


def _root_only(path: str) -> bool:
    """A regular file (no link) owned by root, in a directory owned by root,
    neither writable by group or others."""
    try:
        st = os.lstat(path)
        parent = os.stat(os.path.dirname(path))
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022
            and parent.st_uid == 0 and not parent.st_mode & 0o022)


class _State:
    # None: decide by the marker; True: `python3 -m infer_units` (entry.py)
    trusted_caller: bool | None = None


def trust_caller() -> None:
    """`python3 -m infer_units`: the caller's environment and the models'
    INFER_UNITS_* settings are the test's own (no unit runs this)."""
    _State.trusted_caller = True


def test_mode(marker: str = TEST_MARKER) -> bool:
    """May the hooks honour INFER_UNITS_* test variables?"""
    return bool(_State.trusted_caller) or _root_only(marker)


def allowed(name: str, testing: bool) -> bool:
    return (name in SYSTEMD_VARIABLES or name in HOOK_SETTINGS
            or (testing and name.startswith(TEST_PREFIX)))


def hook_environment(environ: dict[str, str], testing: bool | None = None) -> dict[str, str]:
    """What a root hook keeps of `environ`."""
    if testing is None:
        testing = test_mode()
    kept = {k: v for k, v in environ.items() if allowed(k, testing)}
    kept["PATH"] = DEFAULT_PATH
    return kept


def hook_settings(env: dict[str, str], testing: bool | None = None) -> dict[str, str]:
    """Of a model's [env], what a hook reading the model file itself may take
    (`infer-units canary NAME`): the same rule as for its environment."""
    if testing is None:
        testing = test_mode()
    return {k: v for k, v in env.items()
            if k.startswith(TEST_PREFIX) and allowed(k, testing)}


def scrub() -> None:
    """Replace this process's environment with the hooks' (os.environ and
    the C environment both: subprocesses and NVML see the same)."""
    kept = hook_environment(dict(os.environ))
    os.environ.clear()
    os.environ.update(kept)
