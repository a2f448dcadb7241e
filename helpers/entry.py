"""`infer-units`: one dispatch through helpers/commands.py's table.  A hook
(what units run as root) gets the hooks' environment first, then its
argparse main; every other command goes to the click group (cli/root.py),
which loads the command's module when it runs.

Whatever escapes a command is one line on stderr and exit 1, never a
traceback in the journal (INFER_UNITS_DEBUG=1 shows it)."""

from __future__ import annotations

import logging
import os
import sys

from ..generator.log import StdioHandler, setup
from . import hookenv
from .commands import HOOKS
from .jsonout import json_error


def _run(argv: list[str], scrub_hooks: bool) -> int:
    hook = HOOKS.get(argv[0]) if argv else None
    # A hook's stderr is the journal (its lines carry their priority); an
    # operator's command is read by a person or a script (generator/log.py).
    setup(StdioHandler(run_by_systemd=hook is not None))
    if hook is None:
        from .cli.root import main as cli_main
        cli_main(args=argv)
        return 0
    if scrub_hooks:
        # Root hooks never run with the server's environment (hookenv.py):
        # before anything reads it.
        hookenv.scrub()
    else:
        hookenv.trust_caller()
    code: int = hook.load()(argv[1:])
    return code


def main(scrub_hooks: bool = True) -> None:
    """The installed CLI (the .deb's launcher, a console script): what units
    run.  scrub_hooks=False only for `python3 -m infer_units`, the tests'
    and a developer's invocation, which no unit runs."""
    try:
        sys.exit(_run(sys.argv[1:], scrub_hooks))
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001  (the last line of defence)
        if os.environ.get("INFER_UNITS_DEBUG"):
            raise
        reason = " ".join(str(e).split())[:300] or type(e).__name__
        logging.getLogger(__name__).error(f"error: {type(e).__name__}: {reason}")
        json_error(f"{type(e).__name__}: {reason}", 1)
        sys.exit(1)
