"""The `infer-units` command line.  Exit codes (DESIGN.md): 0 done/clean,
1 usage or config error, 2 blocked, 3 timed out with holders left."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from ..exitcodes import CLEAN, CONFIG_ERROR


class Duration(click.ParamType):
    """A systemd time span ("10s", "2min", "1h 30min") -> seconds.  Defaults
    are given as text so --help shows "10s", not 10.0."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        from ..argtypes import duration
        try:
            return duration(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


DURATION = Duration()


def complete_model_names(ctx: Any, param: Any, incomplete: str) -> list[str]:
    """Model names on the search path, for bash completion."""
    from ...generator.loader import discover
    return sorted(n for n in discover()[0] if n.startswith(incomplete))


def echo_json(data: Any) -> None:
    """Machine-readable output: stdout holds exactly one JSON document,
    whatever is logged on stderr."""
    import json
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


class _Group(click.Group):
    """click's usage errors exit 2, which here means "blocked": make them 1."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            kwargs.setdefault("prog_name", "infer-units")
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.UsageError as e:
            # One line (the journal, scripts): which command, what is wrong.
            where = e.ctx.command_path if e.ctx else "infer-units"
            click.echo(f"{where}: {' '.join(e.format_message().split())} (see --help)", err=True)
            sys.exit(CONFIG_ERROR)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.Abort:
            sys.exit(CONFIG_ERROR)


# show_default: every option's default in --help (the subcommands inherit it).
@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"],
                                           "show_default": True})
@click.version_option(package_name=None, version=__import__("infer_units").__version__)
def main() -> None:
    """Systemd services for multi-GPU inference servers that clean their GPUs."""


# ---------------------------------------------------------------- generator views

@main.command()
@click.argument("names", nargs=-1, shell_complete=complete_model_names)
@click.option("--output", type=click.Path(file_okay=False), metavar="DIR",
              help="Write units here instead of stdout.  [default: stdout]")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable: each unit's name, source, links and text (or path).")
def render(names: tuple[str, ...], output: str | None, as_json: bool) -> None:
    """Print (or write) what the generator would write for NAMES (default: every model)."""
    from ...generator.build import load_all, render_checked
    from ...generator.errors import ConfigError
    from ...generator.main import write_unit

    loaded = load_all(list(names))
    for error in loaded.errors:
        click.echo(f"error: {error}", err=True)
    for conflict in loaded.conflicts:
        click.echo(f"error: {conflict}", err=True)
    missing = {n.removesuffix(".service") for n in names} - {m.name for m in loaded.models}
    missing -= {e.model or e.path.rsplit("/", 1)[-1].removesuffix(".toml") for e in loaded.errors}
    for name in sorted(missing):
        click.echo(f"error: no model file named {name}.toml on the search path", err=True)
    if output:
        try:
            os.makedirs(output, exist_ok=True)
        except OSError as e:
            click.echo(f"error: {output}: cannot create: {e.strerror}", err=True)
            sys.exit(CONFIG_ERROR)
    failed: list[str] = []
    units: list[dict[str, Any]] = []
    for model in loaded.models:
        try:
            rendered = render_checked(model)    # the unit, then its [liveness] companions
            if output:
                for unit in rendered:
                    write_unit(output, unit)
        except (ConfigError, OSError) as e:
            what = e if isinstance(e, ConfigError) else f"{model.main_path}: cannot write: {e.strerror}"
            click.echo(f"error: {what}", err=True)
            failed.append(str(what))
            continue
        for unit in rendered:
            entry = {"name": unit.name, "source": model.main_path, "links": list(unit.links)}
            if output:
                entry["path"] = os.path.join(output, unit.name)
            else:
                entry["text"] = unit.text
            units.append(entry)
            if as_json:
                continue
            if output:
                click.echo(entry["path"])
            else:
                click.echo(f"# {unit.name}" + (f" (linked from {', '.join(unit.links)})" if unit.links else ""))
                click.echo(unit.text)
    code = CONFIG_ERROR if loaded.errors or missing or failed else CLEAN
    if as_json:
        echo_json({"units": units, "errors": [str(e) for e in loaded.errors] + failed +
                   [f"no model file named {n}.toml on the search path" for n in sorted(missing)],
                   "conflicts": [str(c) for c in loaded.conflicts], "exit": code})
    sys.exit(code)


@main.command()
@click.argument("names", nargs=-1, shell_complete=complete_model_names)
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable: the files that passed and every error.")
@click.option("--verify/--no-verify", default=True,
              help="Also run systemd-analyze verify (where installed) on the units; its "
                   "findings are warnings.")
def check(names: tuple[str, ...], as_json: bool, verify: bool) -> None:
    """Validate model files: NAMES on the search path, or PATHS anywhere.

    Also GPU and port overlaps between models, and what systemd-analyze verify
    says of the units they would get (warnings); exit 1 on any error."""
    from ...generator.build import load_all, render_checked
    from ...generator.errors import ConfigError

    loaded = load_all(list(names))
    problems: list[Any] = [*loaded.errors, *loaded.conflicts]
    passed: list[dict[str, str]] = []
    for problem in problems:
        click.echo(f"error: {problem}", err=True)
    rendered = []
    for model in loaded.models:
        try:
            units = render_checked(model)
        except ConfigError as e:
            click.echo(f"error: {e}", err=True)
            problems.append(e)
            continue
        rendered += units
        passed.append({"path": model.main_path, "unit": model.unit_name})
        if not as_json:
            click.echo(f"ok: {model.main_path} -> {model.unit_name}")
    findings = None
    if verify and rendered:
        from .verify import verify_units
        findings = verify_units(rendered)
        for lines in (findings or {}).values():
            for line in lines:
                click.echo(f"warning: systemd-analyze verify: {line}", err=True)
    if not loaded.models and not problems:
        click.echo("no model files on the search path", err=True)
    code = CONFIG_ERROR if problems else CLEAN
    if as_json:
        echo_json({"ok": passed, "errors": [str(p) for p in problems],
                   "verify": findings, "exit": code})
    sys.exit(code)


from . import gpu  # noqa: E402,F401  (registers the GPU commands on `main`)

from . import config  # noqa: E402,F401  (registers cat and edit on `main`)
