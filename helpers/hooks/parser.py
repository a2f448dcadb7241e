"""argparse for the hooks: a usage error is one line and exit 1 (die()), not
argparse's usage block and exit 2, which here means "blocked"; option types
are made from the argtypes checks, so a bad value says why.

An option's value is the next word whatever it looks like: the generator
writes `--ignore NAME` and a process name may start with a dash, which
argparse alone would take for an option."""

from __future__ import annotations

import argparse
from typing import Any, Callable, NoReturn

from ..die import die


def checked(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option type from an argtypes check: its reason in argparse's message."""
    def convert(text: str) -> Any:
        try:
            return check(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = check.__name__
    return convert


class HookParser(argparse.ArgumentParser):
    """One hook's options.  `allow_abbrev=False`: --gp is not --gpus."""

    def __init__(self, name: str, description: str) -> None:
        super().__init__(prog=f"infer-units {name}", description=description,
                         allow_abbrev=False)
        self.name = name
        self._takes_value: set[str] = set()

    def option(self, *flags: str, **kwargs: Any) -> None:
        """add_argument(), remembering the options that take a value."""
        action = self.add_argument(*flags, **kwargs)
        if action.nargs != 0:
            self._takes_value.update(action.option_strings)

    def read(self, argv: list[str]) -> argparse.Namespace:
        glued: list[str] = []
        words = iter(argv)
        for word in words:
            if word in self._takes_value:
                value = next(words, None)
                glued.append(word if value is None else f"{word}={value}")
            else:
                glued.append(word)
        return self.parse_args(glued)

    def error(self, message: str) -> NoReturn:
        die(f"{self.name}: {message}", hint="see --help")
