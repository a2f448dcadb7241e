"""The `infer-units` click group of the operator commands.  Exit codes
(helpers/exitcodes.py): 0 done/clean, 1 usage or config error, 2 blocked,
3 timed out with holders left.

Commands come from helpers/commands.py, each module imported only when its
command runs (or --help lists it)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ... import __version__
from .. import commands
from ..die import die
from ..exitcodes import CONFIG_ERROR
from ..jsonout import json_error, want_json


class _Group(click.Group):
    """The click commands of helpers/commands.py, loaded lazily (the hooks
    are not click commands: helpers/entry.py runs them).  click's usage
    errors exit 2, which here means "blocked": make them 1."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, c in commands.COMMANDS.items() if not c.hook)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = commands.COMMANDS.get(cmd_name)
        if spec is None or spec.hook:
            return None
        command: click.Command = spec.load()
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
            where = e.ctx.command_path.removeprefix("infer-units").strip() if e.ctx else ""
            what = " ".join(e.format_message().split())
            die(f"{where}: {what}" if where else what, hint="see --help")
        except click.exceptions.Exit as e:
            if e.exit_code:
                json_error(f"exit status {e.exit_code}", e.exit_code)
            sys.exit(e.exit_code)
        except click.Abort:       # Ctrl-C
            die("aborted")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else CONFIG_ERROR)
            if code:
                json_error(f"exit status {code} (the reason is on stderr)", code)
            raise


# show_default: every option's default in --help (the subcommands inherit it).
@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"],
                                           "show_default": True})
@click.version_option(package_name=None, version=__version__)
def main() -> None:
    """Systemd services for multi-GPU inference servers that clean their GPUs."""


def all_commands() -> dict[str, click.Command]:
    """Every click command, loaded (the man page, the README's table and the
    tests read them)."""
    ctx = click.Context(main, info_name="infer-units")
    found = {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}
