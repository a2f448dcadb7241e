"""Work a command starts in a thread and goes on beside: the driver's ioctls of
NVML's init (facts/gpus.warm_nvml), pre-start's start-limit question to
systemd (act/startlimit.py).  Both are waits on something else (the driver,
the manager) that need no GIL, while the command imports and checks.

`_thread`, not threading: threading's import costs a hook more than the
whole thread (bench/restart_bench.py)."""

from __future__ import annotations

import _thread

TYPE_CHECKING = False     # typing costs a hook's start-up; annotations are strings here
if TYPE_CHECKING:
    from typing import Callable


class Background:
    """`work()` started now in a thread (run here and now where no thread can
    be had); wait() gives its result, or raises what escaped it, so that the
    command's one handler for the unexpected reports it."""

    def __init__(self, work: Callable[[], object]) -> None:
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._result: object = None
        self._escaped: BaseException | None = None

        def run() -> None:
            try:
                self._result = work()
            except BaseException as e:      # noqa: BLE001 - handed to wait()
                self._escaped = e
            finally:
                self._done.release()
        try:
            _thread.start_new_thread(run, ())
        except RuntimeError:
            run()

    def wait(self, limit: float = -1) -> object:
        """The work's result once it is done; None after `limit` seconds
        (-1: no limit) while it still runs."""
        if not self._done.acquire(True, limit):
            return None
        self._done.release()
        if self._escaped is not None:
            raise self._escaped
        return self._result
