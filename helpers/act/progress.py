"""Long waits: a live line on a terminal, one log line per state change otherwise."""

from __future__ import annotations

import logging
import sys

from ...generator.errors import one_line

log = logging.getLogger(__name__)


class Progress:
    def __init__(self, what: str) -> None:
        self.what = what
        # The live line is for a person's terminal, not a record: it is
        # rewritten in place, so it goes to the terminal directly.
        self.tty = sys.stderr is not None and sys.stderr.isatty()
        self.last_state: str | None = None

    def update(self, state: str) -> None:
        if self.tty:
            sys.stderr.write(f"\r\033[K{self.what}: {one_line(state)}")
            sys.stderr.flush()
            return
        # Off a terminal only changes are worth a line; drop the elapsed part.
        key = state.split(",")[0]
        if key != self.last_state:
            self.last_state = key
            log.info(f"{self.what}: {state}")

    def done(self, message: str) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
        log.info(message)
