"""Work a command starts in a thread and goes on beside: pre-start's
start-limit question to systemd (act/startlimit.py) is a wait on the manager
that needs no GIL while the start checks run."""

from __future__ import annotations

import threading
from typing import Callable


class Background:
    """`work()` started now in a thread; wait() gives its result, or raises
    what escaped it, so that the command's one handler for the unexpected
    reports it."""

    def __init__(self, work: Callable[[], object]) -> None:
        self._result: object = None
        self._escaped: BaseException | None = None

        def run() -> None:
            try:
                self._result = work()
            except BaseException as e:      # noqa: BLE001 - handed to wait()
                self._escaped = e
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def wait(self, limit: float | None = None) -> object:
        """The work's result once it is done; None after `limit` seconds
        (None: no limit) while it still runs."""
        self._thread.join(limit)
        if self._thread.is_alive():
            return None
        if self._escaped is not None:
            raise self._escaped
        return self._result
