"""What the click commands share: option types and shell completion of
model names (a user error ends with helpers/die.py's die())."""

from __future__ import annotations

from typing import Any, Callable

import click

from .. import argtypes


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


def complete_model_names(ctx: Any, param: Any, incomplete: str) -> list[str]:
    """Model names on the search path, for bash completion."""
    from ...generator.loader import Loader
    return sorted(n for n in Loader().discover()[0] if n.startswith(incomplete))
