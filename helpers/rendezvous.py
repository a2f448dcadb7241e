"""A worker of a multi-node model waits for its head's rendezvous port.

Hosts may boot in any order: a worker that started its engine before the
head listens would fail (or time out inside torch.distributed) into a restart
loop, reloading weights each time.  Parked in its start checks instead, it
holds no GPU and costs one TCP connect every few seconds.
"""

from __future__ import annotations

import socket
import time
from typing import Callable

POLL_S = 2.0          # between connects while the head is away
REPORT_EVERY_S = 60.0  # one journal line a minute while parked


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def head_listens(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_rendezvous(addr: str, say: Callable[[str], None], timeout: float | None = None,
                    poll_s: float = POLL_S) -> bool:
    """True once `addr` accepts a TCP connection; False after `timeout` (None: never)."""
    host, port = split_addr(addr)
    started = time.monotonic()
    next_report = started
    while not head_listens(host, port):
        now = time.monotonic()
        if timeout is not None and now - started >= timeout:
            return False
        if now >= next_report:
            say(f"waiting for the head's rendezvous at {addr} ({now - started:.0f}s)")
            next_report = now + REPORT_EVERY_S
        time.sleep(poll_s)
    say(f"head's rendezvous at {addr} listens (after {time.monotonic() - started:.1f}s)")
    return True
