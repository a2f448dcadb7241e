"""`infer-units cat` and `infer-units edit`: a model's files as the generator
merges them, like `systemctl cat` and `systemctl edit` but per value.

cat NAME: the merged model as TOML, each value followed by the file that set
it (systemctl cat only lists the files).  edit NAME: opens a copy of
NAME.toml.d/override.toml in the first writable configuration directory
(/etc/infer-units) in $EDITOR, keeps it only if the model with it is still
valid (what the generator would see), then reloads systemd."""

from __future__ import annotations

import logging
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from ...generator.paths import RUN_DIR
from ..jsonout import echo_json
from ..die import die
from .options import complete_model_names

log = logging.getLogger(__name__)

if TYPE_CHECKING:      # an annotation only: the generator is imported when a command runs
    from ...generator.loader import Loader

OVERRIDE = "override.toml"
# Like systemctl edit: what is above the first marker is the drop-in; the rest is for reference.
MARKER = "### Lines from here on are ignored: the model as it is now, for reference"
_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


# ---------------------------------------------------------------- TOML out

def _key(key: str) -> str:
    return key if key and _BARE.issuperset(key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # JSON's escapes (\" \\ \n \t \uXXXX) are TOML basic-string escapes too.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))      # dates and times: as text


def merged_lines(merged: Any) -> list[tuple[str, str]]:
    """(TOML line, file) pairs: scalars first, then each table; file "" for headers."""
    lines: list[tuple[str, str]] = []

    def table(data: dict[str, Any], prefix: str) -> None:
        subtables = []
        for key, value in data.items():
            if isinstance(value, dict):
                subtables.append((key, value))
            else:
                lines.append((f"{_key(key)} = {_value(value)}", merged.file_of(prefix + key)))
        for key, value in subtables:
            dotted = prefix + key
            header = ".".join(_key(part) for part in dotted.split("."))
            lines.append(("", ""))
            lines.append((f"[{header}]", ""))
            table(value, dotted + ".")

    table(merged.data, "")
    return lines


def format_merged(merged: Any, comment: str = "") -> str:
    out = [f"# {merged.name}: " + (", ".join(merged.sources) if merged.sources else "no files")]
    pairs = merged_lines(merged)
    width = min(60, max((len(line) for line, _ in pairs), default=0))
    for line, source in pairs:
        text = f"{line:<{width}}  # {source}" if source else line
        out.append(f"{comment}{text}".rstrip() if comment else text)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- loading

def _find(name: str, loader: Loader) -> str:
    name = name.removesuffix(".service")
    found, _ = loader.discover()
    if name not in found:
        die(f"no model file named {name}.toml on the search path ({':'.join(loader.dirs)})")
    return found[name]


def _load(name: str) -> Any:
    from ...generator.errors import ConfigError
    from ...generator.loader import Loader
    loader = Loader()
    path = _find(name, loader)
    try:
        return loader.load_model(name.removesuffix(".service"), path)
    except ConfigError as e:
        die(str(e))


DEFAULT = "default"      # the "file" of a value no file sets (cat --all)


@dataclass
class _WithDefaults:
    """A merged model plus the defaults of every key no file sets."""
    merged: Any
    data: dict[str, Any] = field(default_factory=dict)
    defaults: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return str(self.merged.name)

    @property
    def sources(self) -> list[str]:
        return list(self.merged.sources)

    def file_of(self, key: str) -> str:
        return DEFAULT if key in self.defaults else str(self.merged.file_of(key))


def with_defaults(merged: Any) -> _WithDefaults:
    """The effective defaults (generator/settings.py) added where no file
    sets a key; keys whose default is the engine's, or empty, are left out."""
    from ...generator.durations import format_seconds
    from ...generator.settings import SETTINGS, check_duration
    data = json.loads(json.dumps(merged.data, default=str))     # a deep copy of plain values
    shown = _WithDefaults(merged, data)
    for setting in SETTINGS:
        if setting.default is None or setting.default in ({}, [], ()):
            continue
        *tables, last = setting.key.split(".")
        where = data
        for table in tables:
            where = where.setdefault(table, {})
        if last in where:
            continue
        value = setting.default
        where[last] = format_seconds(value) if setting.check is check_duration else value
        shown.defaults.add(setting.key)
    return shown


@click.command("cat")
@click.argument("name", shell_complete=complete_model_names)
@click.option("--all", "show_all", is_flag=True,
              help="Also the defaults of the keys no file sets, marked as defaults.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: every key with its value and file.")
def cat_command(name: str, show_all: bool, as_json: bool) -> None:
    """The merged model NAME: every value with the file it came from."""
    from ...generator.errors import ConfigError
    from ...generator.model import build_model
    loaded = _load(name)
    merged = with_defaults(loaded) if show_all else loaded
    if as_json:
        flat: dict[str, Any] = {}

        def walk(data: dict[str, Any], prefix: str) -> None:
            for key, value in data.items():
                if isinstance(value, dict):
                    walk(value, f"{prefix}{key}.")
                else:
                    flat[prefix + key] = {"value": value, "file": merged.file_of(prefix + key)}
        walk(merged.data, "")
        echo_json({"name": merged.name, "files": merged.sources, "keys": flat})
    else:
        click.echo(format_merged(merged), nl=False)
    try:
        build_model(loaded)
    except ConfigError as e:
        die(f"error: {e}")


# ---------------------------------------------------------------- edit

def _edit_dir(dirs: list[str]) -> str:
    """Where operators write: /etc/infer-units on the default path, else the
    first directory that is not the runtime one."""
    for d in dirs:
        if d.rstrip("/") == "/etc/infer-units":
            return d
    for d in dirs:
        if d.rstrip("/") != RUN_DIR:
            return d
    return dirs[0]


def _editor() -> list[str]:
    for var in ("SYSTEMD_EDITOR", "EDITOR", "VISUAL"):     # systemctl edit's order
        if os.environ.get(var, "").strip():
            return shlex.split(os.environ[var])
    for candidate in ("editor", "nano", "vim", "vi"):
        if shutil.which(candidate):
            return [candidate]
    die("no editor: set $EDITOR")
    return []


def _validate(name: str, dirs: list[str], edit_dir: str, content: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the model with `content` as its override: the
    generator's own loading, on the search path with a directory holding only
    the candidate drop-in placed just above edit_dir (so it replaces the old
    override there and higher directories still win, as they will)."""
    from ...generator.build import load_all
    from ...generator.render import render
    with tempfile.TemporaryDirectory(prefix="check-", dir=_work_dir()) as overlay:
        candidate = os.path.join(overlay, f"{name}.toml.d", OVERRIDE)
        # Modes given, not left to the umask: the loader refuses a drop-in
        # that group or others can write, as it must.
        os.mkdir(os.path.dirname(candidate), 0o700)
        fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        at = dirs.index(edit_dir)
        loaded = load_all([name], dirs[:at] + [overlay] + dirs[at:])
        # name the file where it will be, not the overlay
        shown = os.path.join(edit_dir, f"{name}.toml.d", OVERRIDE)
        errors = [str(e).replace(candidate, shown) for e in loaded.errors]
        warnings = [str(e).replace(candidate, shown) for e in loaded.conflicts]
        for model in loaded.models:
            try:
                render(model)
            except Exception as e:    # a render failure is a bug, but never keep what causes it
                errors.append(f"{shown}: cannot render {model.unit_name}: {e}")
        if not loaded.models and not errors:
            errors.append(f"{shown}: the model no longer loads")
    return errors, warnings


def _reload() -> None:
    if not os.path.isdir("/run/systemd/system"):
        log.warning("systemd is not running here: no daemon-reload")
        return
    from ..facts.systemd import daemon_reload
    why_not = daemon_reload()
    if why_not is not None:
        die(f"systemctl daemon-reload failed: {why_not}")


def _work_dir() -> str:
    """Where edit keeps its copies: a directory only root can enter
    (run_dir()/edit, 0700), never /tmp; each copy is removed on every path
    but a refused edit, which is kept there for `edit --from`."""
    from ...generator.atomicfile import ensure_dir
    from ...generator.paths import run_dir
    path = os.path.join(run_dir(), "edit")
    try:
        ensure_dir(path, 0o700).close()
    except OSError as e:
        die(f"{path}: cannot create: {e.strerror or e}")
    return path


# Lines edit adds above what the operator typed when it opens the editor again
# after a refused edit (the reasons): removed when the file is read back.
_NOTE = "#! infer-units: "


def _run_editor(name: str, text: str, reference: str) -> tuple[str, bool]:
    """`text`, the marker and `reference` in $EDITOR; (what is above the
    marker when it exits 0, whether the file is as it was given): anything
    changed below the marker is said to be ignored."""
    fd, temp = tempfile.mkstemp(prefix=f"{name[:100]}-", suffix=".toml", dir=_work_dir())
    given = f"{text}\n{MARKER}\n{reference}"
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(given)
        editor = _editor()
        try:
            status = subprocess.call([*editor, temp])
        except OSError as e:
            die(f"cannot run the editor {editor[0]!r}: {e.strerror or e}",
                hint="set $SYSTEMD_EDITOR, $EDITOR or $VISUAL to an editor on PATH")
        if status != 0:
            die(f"editor exited with status {status}: nothing changed")
        with open(temp, encoding="utf-8") as f:
            back = f.read()
        content, marker, below = back.partition(MARKER)
    finally:
        os.unlink(temp)
    if not marker:
        pass            # the marker line removed: all of it is the drop-in
    elif below.strip("\n").rstrip() != reference.strip("\n").rstrip():
        log.warning(f"what was typed below the line \"{MARKER[:40]}...\" was "
                    "ignored: only the text above it is the drop-in")
    return "".join(line for line in content.splitlines(keepends=True)
                   if not line.startswith(_NOTE)), back == given


def _keep_rejected(name: str, content: str) -> str:
    """What the operator typed, kept (0600, a new file of a random name in
    edit's root-only directory) for `edit --from`."""
    fd, kept = tempfile.mkstemp(prefix=f"refused-{name[:100]}-", suffix=".toml",
                                dir=_work_dir())
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(content)
    return kept


@click.command("edit")
@click.argument("name", shell_complete=complete_model_names)
@click.option("--no-reload", is_flag=True, help="Do not run systemctl daemon-reload afterwards.")
@click.option("--from", "start_from", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Start from FILE (an edit that was refused) instead of the override.")
def edit_command(name: str, no_reload: bool, start_from: str | None) -> None:
    """Edit NAME's drop-in NAME.toml.d/override.toml in $EDITOR; kept only if
    the model stays valid, then systemctl daemon-reload.  A refused edit is
    never lost: on a terminal the editor opens again with the reasons; else
    (or when declined) it is kept until reboot in a file under /run the
    error names (edit --from)."""
    from ...generator.errors import ConfigError
    from ...generator.loader import Loader
    name = name.removesuffix(".service")
    loader = Loader()
    dirs = loader.dirs
    path = _find(name, loader)
    edit_dir = _edit_dir(dirs)
    target = os.path.join(edit_dir, f"{name}.toml.d", OVERRIDE)
    old = None
    if os.path.exists(target):
        with open(target, encoding="utf-8") as f:
            old = f.read()
    try:
        reference = format_merged(loader.load_model(name, path), comment="# ")
    except ConfigError as e:
        # A broken override (or another file) is what edit is for: open it anyway.
        reference = f"# {name} does not load now:\n# {e}\n"
    start = old
    if start_from is not None:
        with open(start_from, encoding="utf-8") as f:
            start = f.read()
    text = (start if start is not None else
            f"# {target}: keys here override {name}'s other files\n"
            "# (tables merge key by key; scalars and arrays replace).\n\n")
    while True:
        if not text.endswith("\n"):
            text += "\n"
        content, untouched = _run_editor(name, text, reference)
        if content.strip() == (old or "").strip() or (old is None and _only_comments(content)):
            # An editor that returns at once (a GUI editor that forks) leaves the file as given.
            hint = (f" ({shlex.join(_editor())} returned without changing the file; a graphical editor "
                    "must be told to wait: EDITOR=\"code --wait\", \"gedit -w\", \"subl -w\")"
                    if untouched else "")
            log.info(f"{target} unchanged{hint}")
            return
        if _only_comments(content):
            os.unlink(target)
            log.info(f"removed {target}")
            break
        errors, warnings = _validate(name, dirs, edit_dir, content)
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
        if not errors:
            _write_override(target, content)
            log.info(f"wrote {target}")
            if start_from is not None:
                os.unlink(start_from)       # the refused edit is in place now
            break
        for error in errors:
            click.echo(f"error: {error}", err=True)
        if sys.stdin.isatty() and sys.stderr.isatty() and \
                click.confirm("infer-units: edit again?", default=True, err=True):
            text = "".join(f"{_NOTE}{line}\n" for line in errors) + content
            continue
        kept = _keep_rejected(name, content)
        die(f"{target} not written: the model would not load; what you typed is kept in "
            f"{kept} until reboot (/run is not on disk): infer-units edit {name} --from {kept}")
    if not no_reload:
        _reload()
    log.info(f"restart {name} to apply: "
             + ("systemctl daemon-reload && " if no_reload else "")
             + f"systemctl restart {name}")


def _write_override(target: str, content: str) -> None:
    from ...generator.atomicfile import write_file
    try:    # atomic (the generator never sees half a file), on disk: durable
        write_file(target, content.rstrip("\n") + "\n", durable=True, dir_mode=0o755)
    except OSError as e:
        die(f"{target} not written: {e.strerror or e}")


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines())
