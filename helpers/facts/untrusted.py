"""Running a command root does not trust (a model's `python` from its user's
venv: the P2P self-test, doctor's checks) and reading what it prints.

What such a command prints is its own choice, and so is how long it runs
and which processes it starts: root keeps at most `limit` bytes of each
stream (the last ones: a verdict or a traceback comes at the end), and the
whole run, output included, ends at one deadline.  The command runs in a
session of its own as the account given; at the deadline that session is
sent SIGKILL (logged with pid, command line and why), and root stops
reading at once, even where a process that left the session still holds
the pipes (docs/trust.md).  What it printed is escaped here, where root
reads it: each line of a stream (split on "\n" alone) with one_line, and
each string of a JSON answer parsed from it with escaped(), so no control
character it chose reaches root's journal or a terminal."""

from __future__ import annotations

import logging
import os
import pwd
import select
import signal
import subprocess
import time
from dataclasses import dataclass

from ...generator.errors import one_line

log = logging.getLogger(__name__)

OUTPUT_MAX = 1 << 20


@dataclass(frozen=True)
class Ran:
    returncode: int | None      # None: killed at the deadline
    stdout: str
    stderr: str
    timed_out: bool
    cut: bool                   # more was printed than was kept


def run_untrusted(argv: list[str], timeout: float, env: dict[str, str],
                  account: pwd.struct_passwd | None, extra_groups: list[int] | None = None,
                  limit: int = OUTPUT_MAX) -> Ran:
    """Run `argv` as `account` (None: as ourselves) in "/" with `env` only
    and no stdin; OSError when it cannot start."""
    drop: dict[str, object] = {}
    if account is not None:
        drop = {"user": account.pw_uid, "group": account.pw_gid,
                "extra_groups": extra_groups or []}
    deadline = time.monotonic() + timeout
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd="/", env=env, close_fds=True,
                             start_new_session=True, **drop)  # type: ignore[call-overload]
    assert child.stdout is not None and child.stderr is not None
    out_fd, err_fd = child.stdout.fileno(), child.stderr.fileno()
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    cut = timed_out = False
    poller = select.poll()
    for fd in kept:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    open_fds = set(kept)
    try:
        while open_fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for fd, _event in poller.poll(max(1, int(remaining * 1000))):
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                buffer = kept[fd]
                buffer += chunk
                if len(buffer) > limit:
                    del buffer[:len(buffer) - limit]
                    cut = True
        if not timed_out:
            try:
                returncode: int | None = child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            _kill_session(child, argv, timeout)
            returncode = None
    finally:
        child.stdout.close()
        child.stderr.close()
    return Ran(returncode, _escaped_lines(kept[out_fd]), _escaped_lines(kept[err_fd]),
               timed_out, cut)


def _escaped_lines(raw: bytes | bytearray) -> str:
    return "\n".join(one_line(line) for line in raw.decode(errors="replace").split("\n"))


def escaped(value: object) -> object:
    """A JSON value an untrusted program printed, every string in it escaped
    (json.loads turns a printable "\\u001b" back into ESC)."""
    if isinstance(value, str):
        return one_line(value)
    if isinstance(value, list):
        return [escaped(v) for v in value]
    if isinstance(value, dict):
        return {one_line(str(k)): escaped(v) for k, v in value.items()}
    return value


def _kill_session(child: subprocess.Popen[bytes], argv: list[str], timeout: float) -> None:
    """SIGKILL the session we started the command in (its pid is the
    session's and the process group's id), then reap the command."""
    log.info(f"sending SIGKILL to process group {child.pid} ({' '.join(argv)}): "
             f"still running {timeout:g}s after it started")
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        child.wait(1.0)
    except subprocess.TimeoutExpired:
        pass            # unkillable (D state): left for init once it exits
