"""`infer-units`: the hooks units run on every start and stop go straight to
argparse (helpers/hooks.py); everything else goes to the click CLI."""

from __future__ import annotations

import sys


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] in ("pre-start", "wait-ready", "wait-free"):
        from .hooks import run
        sys.exit(run(argv))
    if argv and argv[0] == "liveness-probe":      # run by <name>-liveness.service
        from .liveness import main as liveness_main
        sys.exit(liveness_main(argv[1:]))
    from .cli import main as cli_main
    cli_main()


if __name__ == "__main__":
    main()
