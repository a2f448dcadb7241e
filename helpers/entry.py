"""`infer-units`: the hooks units run on every start and stop go straight to
their parser (helpers/hooks/unit.py, hooks/args.py: argparse's declarations,
no argparse import unless for --help or a usage error), and so does `reap`
(hooks/reap.py, timed end to end) unless asked for --help; everything else
goes to the click CLI.

Whatever escapes a command is one line on stderr and exit 1, never a
traceback in the journal (INFER_UNITS_DEBUG=1 shows it)."""

from __future__ import annotations

import os
import sys

from ..generator.leave import leave as _exit   # flush stdio, then posix._exit
from .commands import FAST, HOOKS

def _asks_help(argv: list[str]) -> bool:
    return bool({"-h", "--help"} & set(argv))


def _run(scrub_hooks: bool) -> None:
    argv = sys.argv[1:]
    if argv and argv[0] in HOOKS:        # the unit hooks: argparse, no click
        from . import hookenv
        if scrub_hooks:
            # Root hooks never run with the server's environment (hookenv.py),
            # before anything else is imported.
            hookenv.scrub()
        else:
            hookenv.trust_caller()
        from .hooks.unit import run
        _exit(run(argv))
    if argv and argv[0] in FAST and not _asks_help(argv) \
            and "_INFER_UNITS_COMPLETE" not in os.environ:
        import importlib
        module, function, _parser, _command = FAST[argv[0]]
        _exit(getattr(importlib.import_module(f"{__package__}.{module}"), function)(argv[1:]))
    from .cli.root import main as cli_main
    cli_main()


def main(scrub_hooks: bool = True) -> None:
    """The installed CLI (the .deb's launcher, a console script): what units
    run.  scrub_hooks=False only for `python3 -m infer_units`, the tests'
    and a developer's invocation, which no unit runs."""
    try:
        _run(scrub_hooks)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001  (the last line of defence)
        if os.environ.get("INFER_UNITS_DEBUG"):
            raise
        reason = " ".join(str(e).split())[:300] or type(e).__name__
        print(f"infer-units: error: {type(e).__name__}: {reason}", file=sys.stderr, flush=True)
        from .jsonout import json_error     # under --json (reap), still its one document
        json_error(f"{type(e).__name__}: {reason}", 1)
        sys.exit(1)


if __name__ == "__main__":
    main()
