"""Waiting until the server answers health, failing fast when it dies loading."""

from __future__ import annotations

import os
import select
import time
import urllib.error
import urllib.parse
import urllib.request
from ..records import dataclass

from ..facts.ports import is_listening
from .progress import Progress


@dataclass
class ReadyResult:
    ready: bool
    seconds: float
    reason: str
    server_exited: bool = False


def probe(url: str, timeout: float) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300, f"HTTP {response.status}"
    except urllib.error.HTTPError as e:
        return False, f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return False, str(reason)


# Servers open their port only once the model is loaded: until then a read of
# /proc/net/tcp (~0.1 ms) says "not yet" without an HTTP request.  Once the
# port listens, health is probed at 20 ms, backing off to `interval`.
LISTEN_POLL_S = 0.02


def _local_port(url: str) -> int | None:
    parsed = urllib.parse.urlsplit(url)
    if parsed.hostname in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"):
        return parsed.port or (443 if parsed.scheme == "https" else 80)
    return None


def wait_ready(url: str, pid: int | None, timeout: float, interval: float,
               probe_timeout: float = 10.0) -> ReadyResult:
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
    last = "not listening yet"
    port = _local_port(url)
    backoff = LISTEN_POLL_S
    progress = Progress(f"waiting for {url}")
    try:
        while True:
            if port is None or is_listening(port):
                # One request gets probe_timeout whatever the interval: SGLang's
                # /health sleeps 1 s and generates a token before it answers.
                ok, last = probe(url, max(0.1, min(probe_timeout, deadline - time.monotonic())))
                wait_s = min(interval, backoff)
                backoff *= 2
            else:
                ok, wait_s = False, LISTEN_POLL_S
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
            if poller.poll(max(1, int(min(wait_s, remaining) * 1000))):
                return ReadyResult(False, time.monotonic() - started,
                                   f"server pid {pid} exited while loading (last: {last})", True)
    finally:
        if pidfd is not None:
            os.close(pidfd)
