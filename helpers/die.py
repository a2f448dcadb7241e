"""die(): the one way a user error ends an `infer-units` command, a hook or
an operator command alike (mkosi's log.die): one line on stderr, the exit
code of helpers/exitcodes.py, and under --json the command's one document.

One line, because a hook's stderr is the journal and a script reads the
CLI's: the hint goes on the same line.  In the journal the line carries
the err priority (`journalctl -p err` shows it); elsewhere it is plain
(generator/log.py decides, as for every other line)."""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

from . import exitcodes
from .jsonout import json_error

log = logging.getLogger(__name__)


def die(message: str, hint: str | None = None, code: int = exitcodes.CONFIG_ERROR) -> NoReturn:
    line = message if hint is None else f"{message} ({hint})"
    log.error(line)             # the one log path (generator/log.py): err where journald reads it
    json_error(line, code)
    sys.exit(code)
