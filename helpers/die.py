"""die(): the one way a user error ends an `infer-units` command, a hook or
an operator command alike (mkosi's log.die): one line on stderr, the exit
code of helpers/exitcodes.py, and under --json the command's one document.

One line, because a hook's stderr is the journal and a script reads the
CLI's: the hint goes on the same line.  In the journal the line carries
the err priority (`journalctl -p err` shows it); elsewhere it is plain."""

from __future__ import annotations

import sys
from typing import NoReturn

from ..generator.errors import one_line
from ..generator.log import say, stderr_is_for_people
from . import exitcodes
from .jsonout import json_error

ERR = 3     # syslog priority


def die(message: str, hint: str | None = None, code: int = exitcodes.CONFIG_ERROR) -> NoReturn:
    line = message if hint is None else f"{message} ({hint})"
    if sys.stderr is not None and stderr_is_for_people():
        say(ERR, line)          # the journal: with its priority; a terminal: as below
    else:
        print(f"infer-units: {one_line(line)}", file=sys.stderr, flush=True)
    json_error(line, code)
    sys.exit(code)
