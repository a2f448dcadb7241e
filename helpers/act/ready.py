"""Waiting until the server answers health, failing fast when it dies loading,
and ending a load cleanly when the unit is stopped meanwhile."""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import time

from dataclasses import dataclass

from ...generator.urls import Url, parse_url
from ..facts.probe import Session, http_probe, local_address
from .progress import Progress

log = logging.getLogger(__name__)


# How wait-ready's ready timeout begins its reason: `status` knows it by this
# in the hook's closing line (the server's exit after is our stop's doing).
NOT_READY = "no healthy answer within"


@dataclass
class ReadyResult:
    ready: bool
    seconds: float
    reason: str
    server_exited: bool = False
    stopped: bool = False       # the unit was stopped while the server loaded


def probe(url: str | Url, timeout: float) -> tuple[bool, str]:
    """One health request: (2xx, what it answered).  The same probe liveness uses."""
    answer = http_probe(url, timeout)
    return answer.ok, answer.text


# How often a loading server is looked at.  Until its port accepts a
# connection, a connect() attempt (refused by the kernel: the server never
# sees it) says "not yet", for a small fraction of a core at this pace (the
# goal: under 1% of a core while waiting; docs/performance.md has the
# figures).  In the first second the port is tried faster: a server up that
# soon (a small or cached model, a restart) is seen about as soon as it
# listens, for a cost paid once.  Once it listens, health is asked every
# `interval` (llama.cpp answers 503 "Loading model" cheaply meanwhile).
# Reading /proc/net/tcp instead costs far more than a refused connect().
LISTEN_POLL_S = 0.05
LISTEN_FAST_POLL_S, LISTEN_FAST_FOR_S = 0.003, 1.0


class StopRequested(BaseException):
    """SIGTERM: systemd stops the unit while we wait (BaseException: no
    `except Exception` in a probe may swallow it)."""


def accepts(address: str, port: int) -> bool:
    """Does something listen on address:port?  A refused connect() (nothing
    bound, or bound and not listening yet, as vLLM holds its port) costs the
    server nothing; an accepted one is closed at once."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        # connect_ex: a refusal is a number, not an exception to build, which
        # is most of a refused poll's CPU.
        return s.connect_ex((address, port)) == 0


def _stranger_on(address: str, port: int, pid: int | None) -> str | None:
    """Who listens where an answer from `address`:`port` came from (the
    address the probe connected to: a listener on another address of the
    same port never saw it) that is not the server: neither in this hook's
    service (the unit's cgroup, where ExecStartPost runs) nor the server
    `pid` or a process below it; or that nobody listens there any more (a
    listener that answered, then closed).  None when all are the server's,
    or when that cannot be told (no service and no pid; a holder out of
    sight)."""
    from ..decide.identity import in_unit
    from ..facts.ports import listeners
    from ..facts.procinfo import read_cgroup, read_stat, unit_of_cgroup
    unit = unit_of_cgroup(read_cgroup(os.getpid()))
    if unit is not None and not unit.endswith(".service"):
        unit = None             # a session's scope or a slice is no service of ours
    if unit is None and not pid:
        return None
    found = listeners(address, port)
    if found == []:
        return f"a listener on {address} port {port} that is gone"
    for info, how in found or []:
        if unit is not None and in_unit(info.cgroup, unit):
            continue
        below, up = False, info.pid
        for _ in range(64):     # the parent chain, bounded
            if up == pid:
                below = True
                break
            stat = read_stat(up)
            if stat is None or stat[1] <= 1:
                break
            up = stat[1]
        if not below:
            return f"{info.describe()} ({how})"
    return None


def _kill_loading_server(pidfd: int, pid: int) -> None:
    """The unit is stopped before the server became ready: it has nothing to
    drain, and it may ignore SIGTERM while it loads (vLLM did at 20-25 s into
    its load, then went on to serve), which would hold the stop for the whole
    TimeoutStopSec and fail the unit.  SIGKILL it now; systemd (KillMode=mixed)
    kills the rest of the cgroup and ExecStopPost waits for the GPUs."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    if poller.poll(0):
        return                       # already gone by the stop's SIGTERM
    from ..facts.procinfo import read_proc
    info = read_proc(pid)
    who = info.describe() if info is not None else f"pid {pid}"
    log.info(f"stopped while loading: killing the server {who} with SIGKILL (never became "
             "ready: nothing to drain; a loading server may ignore SIGTERM)")
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        return
    # Until it is gone, so the stop goes on with its main process dead; a
    # process stuck in the kernel is systemd's to time out, not ours.
    poller.poll(10_000)


def wait_ready(url: str, pid: int | None, timeout: float, interval: float,
               probe_timeout: float = 10.0) -> ReadyResult:
    """Wait for a 2xx from `url`.  SIGTERM while waiting (the unit stopped or
    restarted while the server loads) kills the loading server (pid) and
    returns stopped=True; once the server answered, SIGTERM is left to the
    server (it drains) and this returns at once."""
    started = time.monotonic()
    deadline = started + timeout
    pidfd: int | None = None
    ready = False

    def on_term(signum: int, frame: object) -> None:
        if not ready:
            raise StopRequested()

    # The unit starts this hook with SIGTERM blocked (render(): env
    # --block-signal; blocked here too when run otherwise): a stop that came
    # before the handler was in place stays pending until the try below
    # unblocks it, and is then a stop, even if the server it also reached is
    # gone by now (a server that dies at SIGTERM while loading).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    gone = False
    if pid:
        try:
            pidfd = os.pidfd_open(pid)      # before the handler: a stop must find it
        except ProcessLookupError:
            gone = True
    previous = signal.signal(signal.SIGTERM, on_term)
    stopped = False
    session: Session | None = None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})   # a pending stop raises here
        if gone:
            return ReadyResult(False, 0.0, f"server pid {pid} is not running", True)
        poller = select.poll()
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        last = "not listening yet"
        parsed = parse_url(url)      # wait-ready's argv was read by the same parser
        session = Session(parsed)    # one connection while the server answers 503
        local = local_address(parsed)
        listening = local is None
        progress = Progress(f"waiting for {url}")
        while True:
            if not listening:
                assert local is not None
                listening = accepts(*local)
            if listening:
                # One request gets probe_timeout whatever the interval: SGLang's
                # /health sleeps 1 s and generates a token before it answers.
                answer = session.probe(max(0.1, min(probe_timeout, deadline - time.monotonic())))
                ok, last = answer.ok, answer.text
                wait_s = interval
            else:
                ok = False
                fast = time.monotonic() - started < LISTEN_FAST_FOR_S
                wait_s = LISTEN_FAST_POLL_S if fast else LISTEN_POLL_S
            elapsed = time.monotonic() - started
            if ok and local is not None and \
                    (stranger := _stranger_on(answer.peer or local[0], local[1], pid)):
                # Anyone may listen on the port while the server loads: a 2xx
                # from them is not the server's health (docs/trust.md).
                ok, last = False, f"{last} from {stranger}, not this server's"
                session.close()
            if ok:
                ready = True         # from here on a SIGTERM is the server's to drain
                progress.done(f"{url} answered {last} after {elapsed:.1f}s")
                return ReadyResult(True, elapsed, last)
            progress.update(f"{last}, {elapsed:.0f}s of {timeout:.0f}s")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ReadyResult(False, elapsed, f"{NOT_READY} {timeout:g}s "
                                   f"(last: {last})")
            # Sleep until the next poll, but wake at once if the server dies.
            if poller.poll(max(1, int(min(wait_s, remaining) * 1000))):
                return ReadyResult(False, time.monotonic() - started,
                                   f"server pid {pid} exited while loading (last: {last})", True)
    except StopRequested:
        stopped = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)    # one is enough
        if pidfd is not None and pid:
            _kill_loading_server(pidfd, pid)
        return ReadyResult(False, time.monotonic() - started,
                           "stopped while the server loaded", stopped=True)
    finally:
        if session is not None:
            session.close()
        if pidfd is not None:
            os.close(pidfd)
        if not stopped:
            signal.signal(signal.SIGTERM, previous)
