"""Long waits: a live line on a terminal, one journal line per state change otherwise."""

from __future__ import annotations

import sys

from ...generator.errors import one_line


class Progress:
    def __init__(self, what: str) -> None:
        self.what = what
        self.tty = sys.stderr.isatty()
        self.last_state: str | None = None

    def update(self, state: str) -> None:
        state = one_line(state)
        if self.tty:
            sys.stderr.write(f"\r\033[K{self.what}: {state}")
            sys.stderr.flush()
            return
        # Off a terminal only changes are worth a line; drop the elapsed part.
        key = state.split(",")[0]
        if key != self.last_state:
            self.last_state = key
            print(f"infer-units: {self.what}: {state}", file=sys.stderr, flush=True)

    def done(self, message: str) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
        print(f"infer-units: {one_line(message)}", file=sys.stderr, flush=True)
