"""The `infer-units` click group.  Exit codes (DESIGN.md): 0 done/clean,
1 usage or config error, 2 blocked, 3 timed out with holders left.

Commands come from helpers/commands.py, each module imported only when its
command runs (or --help lists it); the unit hooks are there too, hidden,
forwarded as they are to their argparse parsers (hooks/unit.py), so callers
of `main` itself reach them."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from .. import commands
from ..exitcodes import CONFIG_ERROR
from ..jsonout import _Json, json_error, want_json
from .options import from_argparse


def _module(name: str) -> Any:
    """A module of helpers/commands.py's table ("cli.gpu"), imported now."""
    return importlib.import_module(f"{__package__.rpartition('.')[0]}.{name}")


def _hook(name: str, summary: str) -> click.Command:
    """Hidden from --help (operators never type them; `infer-units NAME
    --help` still works): parsed once, by the hook's own argparse."""
    @click.command(name, help=summary, add_help_option=False, hidden=True,
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    @click.pass_context
    def command(ctx: click.Context) -> None:
        module, function, _summary = commands.HOOKS[name]
        sys.exit(getattr(_module(module), function)(ctx.args))
    return command


class _Group(click.Group):
    """The commands of helpers/commands.py, loaded lazily.  click's usage
    errors exit 2, which here means "blocked": make them 1."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*commands.COMMANDS, *commands.FAST, *commands.HOOKS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in commands.HOOKS:
            return _hook(cmd_name, commands.HOOKS[cmd_name][2])
        if cmd_name in commands.FAST:
            # entry.py runs it without click; this one, built from its own
            # parser, is its --help, man page, README row and completion.
            name, _main, parser, function = commands.FAST[cmd_name]
            loaded = _module(name)
            return from_argparse(getattr(loaded, parser)(), cmd_name, getattr(loaded, function))
        if cmd_name not in commands.COMMANDS:
            return None
        module, attr = commands.COMMANDS[cmd_name]
        command: click.Command = getattr(_module(module), attr)
        return command

    def main(self, *args: Any, **kwargs: Any) -> Any:
        argv = list(args[0] if args and args[0] is not None else
                    kwargs.get("args") or sys.argv[1:])
        # --json anywhere before "--": every path below prints one JSON document
        # on stdout, a usage error or an unexpected one included.
        want_json(argv)
        try:
            kwargs.setdefault("prog_name", "infer-units")
            run: Any = super().main      # click's overloads pin standalone_mode's type
            return run(*args, standalone_mode=False, **kwargs)
        except click.UsageError as e:
            # One line (the journal, scripts): which command, what is wrong.
            where = e.ctx.command_path if e.ctx else "infer-units"
            message = f"{where}: {' '.join(e.format_message().split())}"
            click.echo(f"{message} (see --help)", err=True)
            json_error(message, CONFIG_ERROR)
            sys.exit(CONFIG_ERROR)
        except click.exceptions.Exit as e:
            if e.exit_code:
                json_error(f"exit status {e.exit_code}", e.exit_code)
            sys.exit(e.exit_code)
        except click.Abort:
            json_error("aborted", CONFIG_ERROR)
            sys.exit(CONFIG_ERROR)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else CONFIG_ERROR)
            if code:
                json_error(f"exit status {code} (the reason is on stderr)", code)
            raise
        except Exception as e:      # noqa: BLE001  entry.py's last line of defence, in JSON
            if not _Json.wanted or os.environ.get("INFER_UNITS_DEBUG"):
                raise
            reason = " ".join(str(e).split())[:300] or type(e).__name__
            click.echo(f"infer-units: error: {type(e).__name__}: {reason}", err=True)
            json_error(f"{type(e).__name__}: {reason}", CONFIG_ERROR)
            sys.exit(CONFIG_ERROR)


# show_default: every option's default in --help (the subcommands inherit it).
@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"],
                                           "show_default": True})
@click.version_option(package_name=None, version=__import__("infer_units").__version__)
def main() -> None:
    """Systemd services for multi-GPU inference servers that clean their GPUs."""


def all_commands() -> dict[str, click.Command]:
    """Every command, the hidden hooks included, loaded (the man page, the
    README's table and the tests read them)."""
    ctx = click.Context(main, info_name="infer-units")
    found = {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}
