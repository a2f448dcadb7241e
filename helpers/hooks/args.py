"""The one parser of the argparse commands (unit.py's hooks, reap.py): a
usage error is one line and exit 1, not argparse's 2 and a usage block, and
option types are made from the argtypes checks.

Its engine is a small table-driven one: the hooks run on every start and
stop, and argparse's import (with re, gettext and locale) and the building
of its actions were ~40% of a hook's start-up before its first action
(bench/restart_bench.py).  The declarations are argparse's (add_argument,
the same keywords, `_actions` that cli/options.from_argparse reads for the
click twin); a command line the engine reads with certainty (known long
options, `--opt=value` or `--opt value`, store_true, append, choices,
required) is read here; anything else -- --help, a usage error of any
kind -- goes to a real argparse parser built from the same actions, which
answers it exactly as before.  So argparse stays the reference for every
message, and is imported only when one is written."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, Callable, NoReturn

from .. import exitcodes

SUPPRESS = "==SUPPRESS=="       # argparse.SUPPRESS: hidden from --help


def checked(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option type from an argtypes check: its reason, one line, exit 1.
    `.check` is the check itself, for the click command built from a parser
    (cli/options.from_argparse)."""
    def convert(text: str) -> Any:
        try:
            return check(text)
        except ValueError as e:
            import argparse     # only on a bad value: argparse writes the message
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = check.__name__
    convert.check = check       # type: ignore[attr-defined]
    return convert


def _formatter(prog: str) -> argparse.HelpFormatter:
    # A width given: HelpFormatter imports shutil (and zlib, bz2, lzma) to ask
    # the terminal's, and add_argument() builds one for every option.
    import argparse
    import os
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isascii() and columns.isdigit() and 0 < int(columns) < 1000 \
        else 100
    return argparse.HelpFormatter(prog, width=width)


class Namespace:
    """What parse_args returns: one attribute per option (argparse's Namespace)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any: ...

    def __repr__(self) -> str:
        return f"Namespace({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class Action:
    """One option as argparse's action objects describe it (the attributes
    cli/options.from_argparse reads)."""

    def __init__(self, option_strings: list[str], dest: str, kind: str, default: Any = None,
                 type: Callable[[str], Any] | None = None, choices: Any = None,  # noqa: A002
                 required: bool = False, help: str | None = None,  # noqa: A002
                 metavar: str | None = None) -> None:
        self.option_strings, self.dest, self.kind = option_strings, dest, kind
        self.nargs: int | None = 0 if kind in ("store_true", "help") else None
        self.const: Any = True if kind == "store_true" else None
        self.default = False if kind == "store_true" and default is None else default
        self.type, self.choices, self.required = type, choices, required
        self.help, self.metavar = help, metavar


class Parser:
    """add_argument() and parse_args() as argparse's, for long options only
    (allow_abbrev=False: --gp is not --gpus, click agrees)."""

    def __init__(self, prog: str | None = None, description: str | None = None) -> None:
        self.prog = prog or "infer-units"
        self.description = description
        self._actions: list[Action] = [Action(["-h", "--help"], "help", "help", default=SUPPRESS,
                                              help="show this help message and exit")]
        self._by_flag: dict[str, Action] = {}

    def add_argument(self, *flags: str, action: str = "store", dest: str | None = None,
                     **kw: Any) -> Action:
        if action not in ("store", "store_true", "append") or kw.keys() - {
                "default", "type", "choices", "required", "help", "metavar"} \
                or not flags or not all(f.startswith("--") and len(f) > 2 for f in flags):
            raise TypeError(f"{self.prog}: an option this parser does not read: {flags} {kw}")
        a = Action(list(flags), dest or flags[0][2:].replace("-", "_"), action, **kw)
        self._actions.append(a)
        for flag in flags:
            self._by_flag[flag] = a
        return a

    # ------------------------------------------------------------ reading
    def parse_args(self, args: Any = None) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        values = self._read(argv)
        if values is None:          # not certain: argparse reads it (help, errors)
            return self._argparse().parse_args(self._glued(argv))
        return Namespace(**values)

    def _read(self, argv: list[str]) -> dict[str, Any] | None:
        """The options' values, or None when argparse must answer."""
        given: dict[str, Any] = {}
        i = 0
        while i < len(argv):
            word = argv[i]
            if word == "--" and i + 1 == len(argv):     # a lone `--` at the end ends nothing
                break
            flag, eq, value = word.partition("=")
            a = self._by_flag.get(flag)
            if a is None:
                return None
            if a.kind == "store_true":
                if eq:
                    return None
                given[a.dest] = True
                i += 1
                continue
            if not eq:
                if i + 1 == len(argv):
                    return None
                value = argv[i + 1]     # whatever it looks like (`--ignore -bash`), as click
                i += 1
            i += 1
            if value == "--":           # argparse drops it and stores []: its answer, kept
                return None
            if a.type is not None:
                try:
                    value = a.type(value)
                except Exception:       # noqa: BLE001  (argparse says why)
                    return None
            if a.choices is not None and value not in a.choices:
                return None
            if a.kind == "append":
                given.setdefault(a.dest, []).append(value)
            else:
                given[a.dest] = value
        values: dict[str, Any] = {}
        for a in self._actions[1:]:
            if a.dest in given:
                values[a.dest] = (list(a.default or []) + given[a.dest] if a.kind == "append"
                                  else given[a.dest])
            elif a.required:
                return None
            elif a.default is SUPPRESS:
                continue
            elif isinstance(a.default, str) and a.type is not None:
                values[a.dest] = a.type(a.default)      # argparse converts a string default
            else:
                values[a.dest] = list(a.default) if a.kind == "append" else a.default
        return values

    # ------------------------------------------------------------ argparse
    def _glued(self, argv: list[str]) -> list[str]:
        """click's reading, which these commands had, for argparse: an option's
        value is the next word whatever it looks like (`--ignore -bash`, which
        argparse takes for an option), and a lone `--` at the end ends nothing."""
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

    def _argparse(self) -> argparse.ArgumentParser:
        """The same options as a real argparse parser: --help and every usage error."""
        import argparse
        outer = self

        class Real(argparse.ArgumentParser):
            def error(self, message: str) -> NoReturn:
                outer.error(message)

        p = Real(prog=self.prog, description=self.description, formatter_class=_formatter,
                 allow_abbrev=False)
        for a in self._actions[1:]:
            kw: dict[str, Any] = {"dest": a.dest, "help": a.help, "action": a.kind,
                                  "default": a.default}
            if a.kind != "store_true":
                kw.update(type=a.type, choices=a.choices, metavar=a.metavar)
            if a.required:
                kw["required"] = True
            p.add_argument(*a.option_strings, **kw)
        return p

    def report(self, line: str) -> None:
        """Where the one line of a usage error goes."""
        print(line, file=sys.stderr, flush=True)

    def error(self, message: str) -> NoReturn:
        self.report(f"{self.prog}: {message} (see --help)")
        sys.exit(exitcodes.CONFIG_ERROR)
