"""The `infer-units` command line.  Exit codes (DESIGN.md): 0 done/clean,
1 usage or config error, 2 blocked, 3 timed out with holders left."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from .exitcodes import CLEAN, CONFIG_ERROR


def _duration(value: str, name: str) -> float:
    from ..generator.durations import parse_duration
    try:
        return parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=name) from None


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


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name=None, version=__import__("infer_units").__version__)
def main() -> None:
    """Systemd services for multi-GPU inference servers that clean their GPUs."""


# ---------------------------------------------------------------- generator views

@main.command()
@click.argument("names", nargs=-1)
@click.option("--output", type=click.Path(file_okay=False), help="Write units here instead of stdout.")
def render(names: tuple[str, ...], output: str | None) -> None:
    """Print (or write) what the generator would write."""
    from ..generator.build import load_all, render_checked
    from ..generator.errors import ConfigError
    from ..generator.main import write_unit

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
    failed = False
    for model in loaded.models:
        try:
            units = render_checked(model)       # the unit, then its [liveness] companions
            if output:
                for unit in units:
                    write_unit(output, unit)
        except (ConfigError, OSError) as e:
            what = e if isinstance(e, ConfigError) else f"{model.main_path}: cannot write: {e.strerror}"
            click.echo(f"error: {what}", err=True)
            failed = True
            continue
        for unit in units:
            if output:
                click.echo(os.path.join(output, unit.name))
            else:
                click.echo(f"# {unit.name}" + (f" (linked from {', '.join(unit.links)})" if unit.links else ""))
                click.echo(unit.text)
    if loaded.errors or missing or failed:
        sys.exit(CONFIG_ERROR)


@main.command()
@click.argument("names", nargs=-1)
def check(names: tuple[str, ...]) -> None:
    """Validate model files, GPU and port overlaps; exit 1 on any error."""
    from ..generator.build import load_all, render_checked
    from ..generator.errors import ConfigError

    loaded = load_all(list(names))
    problems = [*loaded.errors, *loaded.conflicts]
    for problem in problems:
        click.echo(f"error: {problem}", err=True)
    for model in loaded.models:
        try:
            render_checked(model)
        except ConfigError as e:
            click.echo(f"error: {e}", err=True)
            problems.append(e)
            continue
        click.echo(f"ok: {model.main_path} -> {model.unit_name}")
    if not loaded.models and not problems:
        click.echo("no model files on the search path", err=True)
    sys.exit(CONFIG_ERROR if problems else CLEAN)


from . import cli_gpu  # noqa: E402,F401  (registers the GPU commands on `main`)

from . import cli_config  # noqa: E402,F401  (registers cat and edit on `main`)
