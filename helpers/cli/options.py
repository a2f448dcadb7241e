"""What the click commands share: option types, shell completion of model
names, die() for a user error (JSON output: helpers/jsonout.py)."""

from __future__ import annotations

import sys
from typing import Any, Callable, NoReturn

import click

from .. import argtypes, exitcodes
from ..jsonout import json_error


def die(message: str, code: int = exitcodes.CONFIG_ERROR) -> NoReturn:
    """A user error (or a blocked/timed-out result): one line, that exit code."""
    click.echo(f"infer-units: {message}", err=True)
    json_error(message, code)
    sys.exit(code)


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


def from_argparse(parser: Any, name: str,
                  command: Callable[..., int]) -> click.Command:
    """The click command of a parser's options (hooks/args.py's Parser,
    whose actions are argparse's; hooks/reap.py declares them once): flags,
    store_true, append, choices, required, and types that are argtypes checks.
    Its callback exits with command's code."""
    params: list[click.Parameter] = []
    for action in parser._actions:
        if not action.option_strings or "-h" in action.option_strings:
            continue
        decls = [*action.option_strings, action.dest]
        common: dict[str, Any] = {"help": action.help, "metavar": action.metavar}
        if action.const is True and action.nargs == 0:         # store_true
            params.append(click.Option(decls, is_flag=True, help=action.help))
        elif action.choices is not None:
            params.append(click.Option(decls, type=click.Choice(list(action.choices)),
                                       default=action.default, help=action.help))
        else:
            check = getattr(action.type, "check", None)
            kind: Any = Checked(check) if check is not None else click.STRING
            multiple = isinstance(action.default, list)          # append
            params.append(click.Option(decls, type=kind, multiple=multiple,
                                       default=() if multiple else action.default,
                                       required=action.required, **common))

    def callback(**values: Any) -> None:
        sys.exit(command(**values))
    return click.Command(name, params=params, callback=callback, help=parser.description)


def complete_model_names(ctx: Any, param: Any, incomplete: str) -> list[str]:
    """Model names on the search path, for bash completion."""
    from ...generator.loader import discover
    return sorted(n for n in discover()[0] if n.startswith(incomplete))
