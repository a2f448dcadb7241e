"""--json output: stdout holds exactly one JSON document on every path, a
usage error or an unexpected one included.  Shared by the click commands
(cli/root.py), die() (helpers/die.py) and entry.py's last line of defence."""

from __future__ import annotations

import json
import sys
from typing import Any


class _Json:
    """--json on the command line (set before the command runs), and whether
    its one document was printed: every error path then prints one of its
    own ({"error": ..., "exit": N}) if none was."""
    wanted = False
    written = False


def want_json(argv: list[str]) -> None:
    """--json anywhere before "--"."""
    _Json.wanted = "--json" in (argv[:argv.index("--")] if "--" in argv else argv)


def json_error(message: str, code: int) -> None:
    """Under --json, the one document of a path that printed none."""
    if _Json.wanted and not _Json.written:
        echo_json({"error": message, "exit": code})


def echo_json(data: Any) -> None:
    """Machine-readable output: stdout holds exactly one JSON document,
    whatever is logged on stderr."""
    _Json.written = True
    if sys.stdout is None:      # started with stdout closed (`>&-`): nowhere to print
        return
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()
