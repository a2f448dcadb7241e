"""What the click commands share: option types, shell completion of model
names, JSON output, die() for a user error."""

from __future__ import annotations

import sys
from typing import Any, Callable, NoReturn

import click

from .. import argtypes, exitcodes


class _Json:
    """--json on the command line (set by cli/root.py before the command
    runs), and whether its one document was printed: every error path then
    prints one of its own ({"error": ..., "exit": N}) if none was."""
    wanted = False
    written = False


def die(message: str, code: int = exitcodes.CONFIG_ERROR) -> NoReturn:
    """A user error (or a blocked/timed-out result): one line, that exit code."""
    click.echo(f"infer-units: {message}", err=True)
    json_error(message, code)
    sys.exit(code)


def json_error(message: str, code: int) -> None:
    """Under --json, the one document of a path that printed none."""
    if _Json.wanted and not _Json.written:
        echo_json({"error": message, "exit": code})


class Duration(click.ParamType):
    """A systemd time span ("10s", "2min", "1h 30min") -> seconds.  Defaults
    are given as text so --help shows "10s", not 10.0."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        try:
            return argtypes.duration(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


DURATION = Duration()


class Checked(click.ParamType):
    """A click type from an argtypes check (ASCII digits, ranges)."""

    def __init__(self, check: Callable[[str], Any]) -> None:
        self.check = check
        self.name = check.__name__

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        try:
            return self.check(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


PORT = Checked(argtypes.port)
HOST = Checked(argtypes.host)
UNIT = Checked(argtypes.unit)


def complete_model_names(ctx: Any, param: Any, incomplete: str) -> list[str]:
    """Model names on the search path, for bash completion."""
    from ...generator.loader import discover
    return sorted(n for n in discover()[0] if n.startswith(incomplete))


def echo_json(data: Any) -> None:
    """Machine-readable output: stdout holds exactly one JSON document,
    whatever is logged on stderr."""
    import json
    _Json.written = True
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
