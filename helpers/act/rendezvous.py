"""A worker of a multi-node model waits, before its engine starts, until the
head forms a new group.

Hosts may boot in any order, and no engine lets a rank join a group that is
already running: a worker started too early fails (or times out inside
torch.distributed) into a restart loop.  So the worker parks in its start
checks, holding no GPU, until the head is *forming* a group: its rendezvous
port listens while its HTTP port still refuses connections (SGLang and vLLM
serve HTTP only once every rank joined).  A head whose HTTP port accepts is
serving a group formed without this rank, healthy or hung on the rank that
left: the worker waits for that head to restart (its liveness check does it).
"""

from __future__ import annotations

import logging
import socket
import time

from ...generator.urls import parse_host_port, parse_url

log = logging.getLogger(__name__)

POLL_S = 1.0           # between looks while the head is away
REPORT_EVERY_S = 60.0  # one journal line a minute while parked


def split_addr(addr: str) -> tuple[str, int]:
    """The generator's reading of [nodes] addr (generator/urls.py)."""
    return parse_host_port(addr)


def _connect(host: str, port: int, timeout: float = 2.0) -> str:
    """"open", "refused", or "unreachable" (no answer, no route, no name)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "unreachable"


def head_state(addr: str, head_url: str | None) -> str:
    """"forming" when this worker can join now; otherwise why not."""
    if _connect(*split_addr(addr)) != "open":
        return "rendezvous closed"
    if head_url is None:
        return "forming"
    url = parse_url(head_url)
    http = _connect(url.host, url.port)
    if http == "refused":
        return "forming"
    return "serving a group formed without this rank" if http == "open" else f"HTTP {http}"


def wait_rendezvous(addr: str, head_url: str | None, timeout: float | None = None,
                    poll_s: float = POLL_S) -> bool:
    """True once the head forms a group; False after `timeout` (None: never)."""
    started = time.monotonic()
    next_report = started
    while (state := head_state(addr, head_url)) != "forming":
        now = time.monotonic()
        if timeout is not None and now - started >= timeout:
            log.info(f"head at {addr} not forming a group after {timeout:g}s ({state})")
            return False
        if now >= next_report:
            log.info(f"parked until the head forms a group: {addr}: {state} "
                     f"({now - started:.0f}s)")
            next_report = now + REPORT_EVERY_S
        time.sleep(poll_s)
    log.info(f"head at {addr} is forming a group (after {time.monotonic() - started:.1f}s)")
    return True
