"""Waiting for processes to exit on pidfds: no fixed sleeps, no pid reuse races."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable, Iterable

from ..facts.procinfo import ProcInfo, read_stat


class PidSet:
    """pidfds for a set of processes, opened while they are known to be the
    processes we looked at (same start time), so a recycled pid is never signalled."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}      # pid -> pidfd

    def add(self, info: ProcInfo) -> bool:
        if info.pid in self.fds:
            return True
        try:
            fd = os.pidfd_open(info.pid)
        except ProcessLookupError:
            return False
        stat = read_stat(info.pid)
        if stat is None or stat[2] != info.start_time:
            os.close(fd)
            return False
        self.fds[info.pid] = fd
        return True

    def drop(self, pid: int) -> None:
        """Stop tracking a process (it no longer uses the GPU)."""
        self._forget(pid)

    def exited(self, pid: int) -> bool:
        """The process behind the pidfd has exited (readable pidfd)."""
        fd = self.fds.get(pid)
        if fd is None:
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))

    def signal(self, pid: int, signum: int) -> bool:
        try:
            signal.pidfd_send_signal(self.fds[pid], signum)
            return True
        except ProcessLookupError:
            return False

    def alive(self) -> list[int]:
        return sorted(self.fds)

    def wait(self, deadline: float,
             tick: Callable[[list[int]], Iterable[int] | None] | None = None,
             tick_s: float = 1.0) -> list[int]:
        """Block until every process has exited or `deadline` (monotonic) passes;
        returns the pids still alive.  `tick(alive)` runs about every `tick_s`
        while waiting (progress, re-checks) and may return pids to stop waiting
        for; an exit still wakes the wait at once."""
        poller = select.poll()
        by_fd = {}
        for pid, fd in self.fds.items():
            poller.register(fd, select.POLLIN)
            by_fd[fd] = pid
        next_tick = time.monotonic() + tick_s    # quick exits print nothing
        while by_fd:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                break
            if tick is not None:
                if now >= next_tick:
                    for pid in tick(self.alive()) or ():
                        stopped = self.fds.get(pid)
                        if stopped is not None and stopped in by_fd:
                            poller.unregister(stopped)
                            del by_fd[stopped]
                            self._forget(pid)
                    next_tick = now + tick_s
                    if not by_fd:
                        break
                remaining = min(remaining, next_tick - now)
            # poll() takes an int of ms: cap a very long wait at an hour per call.
            for fd, _event in poller.poll(max(1, int(min(remaining, 3600.0) * 1000 + 0.999))):
                poller.unregister(fd)
                self._forget(by_fd.pop(fd))
        return self.alive()

    def _forget(self, pid: int) -> None:
        fd = self.fds.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for pid in list(self.fds):
            self._forget(pid)

    def __enter__(self) -> "PidSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
