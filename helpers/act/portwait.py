"""The one wait for ports to be free, for pre-start (every port the server
binds) and `infer-units wait-port`: a holder is named at once; one of the
unit's own processes (a leftover the reap ends) is waited for; any other is
foreign, and `[reap] foreign` says what to do: "fail" refuses at once
(exit 2), "wait" and "kill" wait, saying so every REMINDER_S, then exit 3.
A port holder is never killed: anything on the model's GPUs was reaped
before, and what holds only a port may be any service of the host."""

from __future__ import annotations

import logging
import time

from .. import exitcodes
from ..decide.identity import in_unit
from ..facts.ports import port_users, wait_port_free
from ..facts.procinfo import ProcInfo

log = logging.getLogger(__name__)
OUT_OF_SIGHT = ("a process out of sight (another network namespace, or a socket only bound, "
                "which kernels before 6.11 do not name)")
REMINDER_S = 10.0       # how often a wait says again that it still waits
# A dual-stack wildcard bind: it clashes with every socket on its port.
EVERY_ADDRESS = "::"


def holders_text(users: list[tuple[ProcInfo, str]] | None) -> str:
    return "; ".join(f"{i.describe()} ({how})" for i, how in users) if users else OUT_OF_SIGHT


def wait_ports(first_host: str, ports: list[int], unit: str | None, foreign: str,
               timeout: float) -> int:
    """Every port free within `timeout` (one deadline for all): an exit code
    of helpers/exitcodes.py.  The first of `ports` (the HTTP port) is the
    one the server binds on `host`; the engines bind the ports they derive
    from it (torch's stores, TGI's metrics, SGLang's ZMQ ports) on every
    address, so there any socket on the port holds it.  `unit`: whose
    processes are not foreign (None: every holder is)."""
    started = time.monotonic()
    deadline = started + timeout
    for index, port in enumerate(ports):
        host = first_host if index == 0 else EVERY_ADDRESS
        if wait_port_free(host, port, 0.0):
            continue         # the common case: one look
        users = port_users(host, port)
        strangers = users is None or unit is None or \
            any(not in_unit(i.cgroup, unit) for i, _how in users)
        if strangers and foreign == "fail":
            log.error(f"port {port} held by {holders_text(users)}: not {unit}'s, and "
                      '[reap] foreign = "fail": start refused')
            return exitcodes.BLOCKED
        log.log(logging.WARNING if strangers else logging.INFO,
                f"port {port} held by {holders_text(users)}; waiting up to "
                f"{max(0.0, deadline - time.monotonic()):g}s")
        while not wait_port_free(host, port,
                                 min(REMINDER_S, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                log.error(f"port {port} still in use after {timeout:g}s: "
                          f"{holders_text(port_users(host, port))}")
                return exitcodes.TIMED_OUT
            log.warning(f"port {port} still held by {holders_text(port_users(host, port))}; "
                        f"waiting ({deadline - time.monotonic():.0f}s left)")
        log.info(f"port {port} free after {(time.monotonic() - started) * 1000:.0f} ms")
    return exitcodes.CLEAN
