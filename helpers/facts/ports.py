"""Is a TCP port free, and if not, which process listens on it."""

from __future__ import annotations

import errno
import os
import socket
import time
TYPE_CHECKING = False     # typing costs a hook's start-up; annotations are strings here
if TYPE_CHECKING:
    from typing import Callable

from .procinfo import ProcInfo, read_proc

_LISTEN = "0A"


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == _LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except OSError:
            continue
    return inodes


def is_listening(port: int) -> bool:
    return bool(_listening_inodes(port))


def port_holders(port: int) -> list[ProcInfo] | None:
    """Processes listening on `port`: [] when free, None when it is taken but
    the holder is out of sight (another network namespace, no permission)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    found: list[ProcInfo] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in wanted:
                    info = read_proc(int(entry))
                    if info is not None:
                        found.append(info)
                    break
            except OSError:
                continue
    return found or None


def can_bind(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError as e:
            # Only "in use" is ours to wait out; a bad address is the server's to report.
            return e.errno != errno.EADDRINUSE


def wait_port_reporting(host: str, port: int, timeout: float,
                        say: Callable[[str], None]) -> bool:
    """wait_port_free, saying who holds the port when it is taken, and who
    still does if it is not free in time."""
    started = time.monotonic()
    first = port_holders(port)
    for info in first or []:
        say(f"port {port} held by {info.describe()}; waiting")
    if wait_port_free(host, port, timeout):
        if first:
            say(f"port {port} free after {(time.monotonic() - started) * 1000:.0f} ms")
        return True
    holders = port_holders(port)
    who = "; ".join(i.describe() for i in holders) if holders else \
        "a process out of sight (another network namespace?)"
    say(f"port {port} still in use after {timeout:g}s: {who}")
    return False


def wait_port_free(host: str, port: int, timeout: float, poll_s: float = 0.05) -> bool:
    """True once nothing listens on the port and it can be bound (as the
    server will, with SO_REUSEADDR); False at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if not _listening_inodes(port) and can_bind(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
