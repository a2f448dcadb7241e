"""`infer-units render` and `infer-units check`: what the generator would
write, and whether model files are valid, before anything is installed."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from ..die import die
from ..exitcodes import CLEAN, CONFIG_ERROR
from ..jsonout import echo_json
from .options import complete_model_names


@click.command()
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
    missing = [str(e) for e in loaded.missing_errors()]
    for line in missing:
        click.echo(f"error: {line}", err=True)
    out_dir = None
    if output:
        from ...generator.atomicfile import ensure_dir
        try:
            out_dir = ensure_dir(output)     # checked, 0755 when made (atomicfile.py)
        except OSError as e:
            die(f"{output}: cannot create: {e.strerror or e}")
    failed: list[str] = []
    units: list[dict[str, Any]] = []
    for model in loaded.models:
        try:
            rendered = render_checked(model)    # the unit, then its [liveness] companions
            if out_dir is not None:
                for unit in rendered:
                    write_unit(out_dir, unit)
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
        echo_json({"units": units, "errors": [str(e) for e in loaded.errors] + failed + missing,
                   "conflicts": [str(c) for c in loaded.conflicts], "exit": code})
    sys.exit(code)


@click.command()
@click.argument("names", nargs=-1, shell_complete=complete_model_names)
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable: the files that passed and every error.")
@click.option("--verify/--no-verify", default=True,
              help="Also run systemd-analyze verify (where installed) on the units; its "
                   "findings are warnings.")
def check(names: tuple[str, ...], as_json: bool, verify: bool) -> None:
    """Validate model files: NAMES on the search path, or PATHS anywhere.

    Also GPU and port overlaps between models, GPUs this host does not have
    (when its GPUs can be listed), model paths and `user` accounts missing
    on this host (warnings), and what systemd-analyze verify says of the units they would
    get (warnings); exit 1 on any error."""
    from ...generator.build import load_all, render_checked
    from ...generator.errors import ConfigError

    loaded = load_all(list(names))
    given = {os.path.abspath(n) for n in names}
    checked = {m.name: m for m in loaded.models if m.main_path in given}
    problems: list[Any] = [*loaded.errors, *loaded.missing_errors(),
                           *[_from_checked_side(c, checked) for c in loaded.conflicts]]
    passed: list[dict[str, str]] = []
    warnings: list[str] = []
    rendered = []
    gpus = _host_gpus()
    for model in loaded.models:
        try:
            units = render_checked(model)
        except ConfigError as e:
            problems.append(e)
            continue
        rendered += units
        problems += _host_problems(model, gpus)
        warnings += _host_warnings(model)
        # A file an error is reported for is not ok.
        if not any(model.name in _models_named(p) for p in problems):
            passed.append({"path": model.main_path, "unit": model.unit_name})
    for problem in problems:
        click.echo(f"error: {problem}", err=True)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if not as_json:
        for ok in passed:
            click.echo(f"ok: {ok['path']} -> {ok['unit']}")
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
                   "warnings": warnings, "verify": findings, "exit": code})
    sys.exit(code)


def _from_checked_side(clash: Any, checked: dict[str, Any]) -> Any:
    """A clash is reported against the later model's file; for a file
    checked by its path beside the installed models (`check PATH`, before it
    is installed), it is said against that file, naming the installed one."""
    if clash.other not in checked or clash.model in checked:
        return clash
    from ...generator.errors import ConfigError
    mine = checked[clash.other]
    what = clash.reason.rsplit(f" by {clash.other} (", 1)[0]
    error = ConfigError(mine.main_path, clash.key, f"{what} by {clash.model} ({clash.path})")
    error.model, error.other = mine.name, clash.model
    return error


def _host_gpus() -> list[Any] | None:
    """This host's GPUs, or None when no GPU backend answers (a build host)."""
    from ..facts.gpus import GpuError, backend
    try:
        return backend().gpus()
    except GpuError:
        return None


def _host_problems(model: Any, gpus: list[Any] | None) -> list[Any]:
    """What would refuse the model's start on this host, found now."""
    from ...generator.errors import ConfigError
    from ..facts.gpus import GpuError, select
    selector = model.gpu_selector()
    if gpus is None or selector is None:
        return []
    try:
        select(gpus, selector)
    except GpuError as e:
        # Its message already names this host's GPUs ("GPUs here: ...").
        error = ConfigError(model.main_path, "gpus", str(e))
        error.model = model.name
        return [error]
    return []


def _host_warnings(model: Any) -> list[str]:
    """A model path that is missing here: pre-start will refuse the start
    (a hub id is the engine's to fetch)."""
    from ...generator.render import model_path
    warnings = []
    path = model_path(model)
    if path is not None and not os.path.exists(path):
        warnings.append(f"{model.main_path}: model: {path} does not exist on this host")
    if model.user and not _account_exists(model.user):
        # systemd cannot start the server as an account it cannot find: the
        # unit then fails with 217/USER at every try, in a crash loop.
        warnings.append(f"{model.main_path}: user: {model.user} does not exist on this host "
                        "(the server would fail to start, status=217/USER); create it: "
                        f"useradd --system --user-group --no-create-home --shell "
                        f"/usr/sbin/nologin {model.user}")
    return warnings


def _account_exists(user: str) -> bool:
    """As systemd resolves User=: a name, or a numeric uid (valid as such)."""
    import pwd
    try:
        if user.isdigit():
            return True     # systemd runs a numeric uid with or without a passwd entry
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def _models_named(problem: Any) -> set[str]:
    """The models an error is reported for: its file's (a clash is reported
    for the later file; the other one, named in it, stays ok)."""
    return {n for n in (getattr(problem, "model", None),
                        file_model_name(str(getattr(problem, "path", "")))) if n}


def file_model_name(path: str) -> str:
    """The model a file belongs to: x.toml, x.toml.d/10-y.toml -> "x"."""
    base = path.rsplit("/", 1)[-1]
    parent = path.rsplit("/", 2)[-2] if path.count("/") >= 2 else ""
    return parent[:-len(".toml.d")] if parent.endswith(".toml.d") else base.removesuffix(".toml")
