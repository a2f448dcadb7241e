"""Waiting until the server answers health, failing fast when it dies loading."""

from __future__ import annotations

import os
import select
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from .progress import Progress


@dataclass
class ReadyResult:
    ready: bool
    seconds: float
    reason: str
    server_exited: bool = False


def _probe(url: str, timeout: float) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300, f"HTTP {response.status}"
    except urllib.error.HTTPError as e:
        return False, f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return False, str(reason)


def wait_ready(url: str, pid: int | None, timeout: float, interval: float) -> ReadyResult:
    started = time.monotonic()
    deadline = started + timeout
    pidfd: int | None = None
    if pid:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return ReadyResult(False, 0.0, f"server pid {pid} is not running", True)
    poller = select.poll()
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    last = ""
    progress = Progress(f"waiting for {url}")
    try:
        while True:
            ok, last = _probe(url, min(5.0, max(0.5, interval * 2)))
            elapsed = time.monotonic() - started
            if ok:
                progress.done(f"{url} answered {last} after {elapsed:.1f}s")
                return ReadyResult(True, elapsed, last)
            progress.update(f"{last}, {elapsed:.0f}s of {timeout:.0f}s")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ReadyResult(False, elapsed, f"no healthy answer within {timeout:g}s "
                                   f"(last: {last})")
            # Sleep until the next poll, but wake at once if the server dies.
            if poller.poll(int(min(interval, remaining) * 1000)):
                return ReadyResult(False, time.monotonic() - started,
                                   f"server pid {pid} exited while loading (last: {last})", True)
    finally:
        if pidfd is not None:
            os.close(pidfd)
