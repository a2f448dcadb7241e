"""The one way our programs end (the generator, every hook, reap): flush
stdio, then straight out with _exit.  The interpreter's teardown of the run's
modules and objects buys nothing here and is ~9% of a full generator run's
instructions (valgrind) and ~5-10 ms at the end of each hook, on every start
and stop (bench/restart_bench.py).  Every file our commands write is closed,
and every log line sent (os.write, sendto), before they return; only stdio
may still hold buffered text."""

from __future__ import annotations

import posix     # os's own functions, loaded at start-up: the generator imports no os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn


def leave(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:      # None: started with it closed (`>&-`)
                stream.flush()
        except (OSError, ValueError):
            pass
    posix._exit(code)
