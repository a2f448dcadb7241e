"""What the argparse commands share (unit.py's hooks, reap.py): a parser
whose usage error is one line and exit 1, not argparse's 2 and a usage
block, and option types made from the argtypes checks."""

from __future__ import annotations

import argparse
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, NoReturn

from .. import exitcodes


def checked(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from an argtypes check: its reason, one line, exit 1.
    `.check` is the check itself, for the click command built from a parser
    (cli/options.from_argparse)."""
    def convert(text: str) -> Any:
        try:
            return check(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = check.__name__
    convert.check = check       # type: ignore[attr-defined]
    return convert


def _formatter(prog: str) -> argparse.HelpFormatter:
    # A width given: HelpFormatter imports shutil (and zlib, bz2, lzma) to ask
    # the terminal's, and add_argument() builds one for every option.
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isascii() and columns.isdigit() and 0 < int(columns) < 1000 \
        else 100
    return argparse.HelpFormatter(prog, width=width)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _formatter)
        kwargs.setdefault("allow_abbrev", False)     # --gp is not --gpus (click agrees)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        return super().parse_args(self._glued(list(sys.argv[1:] if args is None else args)),
                                  namespace)

    def _glued(self, argv: list[str]) -> list[str]:
        """click's reading, which these commands had: an option's value is the
        next word whatever it looks like (`--ignore -bash`, which argparse
        takes for an option), and a lone `--` at the end ends nothing."""
        takes = {flag for action in self._actions if action.nargs is None
                 for flag in action.option_strings}
        out: list[str] = []
        i = 0
        while i < len(argv):
            word = argv[i]
            if word == "--":
                out.extend(argv[i:] if i + 1 < len(argv) else [])
                break
            if word in takes and i + 1 < len(argv):
                out.append(f"{word}={argv[i + 1]}")
                i += 2
                continue
            out.append(word)
            i += 1
        return out

    def report(self, line: str) -> None:
        """Where the one line of a usage error goes."""
        print(line, file=sys.stderr, flush=True)

    def error(self, message: str) -> NoReturn:
        self.report(f"{self.prog}: {message} (see --help)")
        sys.exit(exitcodes.CONFIG_ERROR)
