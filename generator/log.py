"""Logging the way systemd's generators do: /dev/kmsg with <N> priorities,
stderr when kmsg is not writable or SYSTEMD_LOG_TARGET=console."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO

LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warning": 4,
          "notice": 5, "info": 6, "debug": 7}


def _max_level() -> int:
    raw = os.environ.get("SYSTEMD_LOG_LEVEL", "info").strip().lower()
    if raw.isdigit():
        return min(int(raw), 7)
    return LEVELS.get(raw, 6)


class GeneratorLog:
    def __init__(self, ident: str = "infer-units-generator") -> None:
        self.ident = ident
        self.max_level = _max_level()
        self.errors = 0
        self._kmsg: TextIO | None = None
        target = os.environ.get("SYSTEMD_LOG_TARGET", "auto").strip().lower()
        if target not in ("console", "console-prefixed"):
            try:
                self._kmsg = open("/dev/kmsg", "w", encoding="utf-8")
            except OSError:
                self._kmsg = None

    def log(self, level: int, message: str) -> None:
        if level <= LEVELS["err"]:
            self.errors += 1
        if level > self.max_level:
            return
        if self._kmsg is not None:
            try:
                self._kmsg.write(f"<{level}>{self.ident}[{os.getpid()}]: {message}\n")
                self._kmsg.flush()
                return
            except OSError:
                self._kmsg = None
        print(f"{self.ident}: {message}", file=sys.stderr)

    def error(self, message: str) -> None:
        self.log(LEVELS["err"], message)

    def debug(self, message: str) -> None:
        self.log(LEVELS["debug"], message)
