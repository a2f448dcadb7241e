"""Finding model files on the search path and merging them with their drop-ins.

Order of application for model NAME: defaults.toml.d/*.toml, NAME.toml (first
found on the path), NAME.toml.d/*.toml.  Drop-ins are collected from every
directory; a same-named drop-in in a higher directory replaces the lower one;
all are applied in file-name order.  Tables merge key by key; scalars and
arrays replace.
"""

from __future__ import annotations

import os

from . import fasttoml
from .errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_SEARCH_PATH = (
    "/run/infer-units",
    "/etc/infer-units",
    "/usr/local/lib/infer-units",
    "/usr/lib/infer-units",
)
DEFAULTS_NAME = "defaults"
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")


def search_path() -> list[str]:
    override = os.environ.get("INFER_UNITS_CONFIG_PATH")
    if override is not None:
        return [d for d in override.split(":") if d]
    return list(DEFAULT_SEARCH_PATH)


class MergedConfig:
    def __init__(self, name: str, main_path: str) -> None:
        self.name = name
        self.main_path = main_path            # the model file itself
        self.sources: list[str] = []          # every file applied, in order
        self.data: dict[str, Any] = {}
        self.origin: dict[str, str] = {}      # dotted key -> file that set it

    def file_of(self, key: str) -> str:
        """The file a (possibly nested) key came from, for error messages."""
        probe = key
        while probe:
            if probe in self.origin:
                return self.origin[probe]
            probe = probe.rpartition(".")[0]
        return self.main_path


def _is_masked(path: str) -> bool:
    try:
        if os.path.islink(path) and os.path.realpath(path) == "/dev/null":
            return True
        return os.path.getsize(path) == 0
    except OSError:
        return False


_listings: dict[str, list[str]] = {}   # each directory is listed once per run


def _list_dir(directory: str) -> list[str]:
    if directory not in _listings:
        try:
            _listings[directory] = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            _listings[directory] = []
    return _listings[directory]


def forget_cache() -> None:
    """Drop what this process read (for long-lived callers and tests)."""
    _listings.clear()
    _parsed.clear()


_parsed: dict[str, dict[str, Any]] = {}   # host-wide drop-ins are read once per run


def _read_toml(path: str) -> dict[str, Any]:
    if path in _parsed:
        return _parsed[path]
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(path, None, f"cannot read: {e.strerror}") from None
    try:
        _parsed[path] = fasttoml.loads(data)
    except fasttoml.Unsupported:
        _parsed[path] = _tomllib_loads(path, data)
    return _parsed[path]


def _tomllib_loads(path: str, data: bytes) -> dict[str, Any]:
    """The full parser, for what fasttoml leaves to it, and for its error messages."""
    import tomllib
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(path, None, f"not UTF-8: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, None, f"invalid TOML: {e}") from None


def _merge(dst: dict[str, Any], src: dict[str, Any], path: str,
           origin: dict[str, str], prefix: str = "") -> None:
    for key, value in src.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value, path, origin, dotted + ".")
            continue
        dst[key] = _deep_copy(value)
        # A replaced table forgets where its old keys came from.
        for old in [k for k in origin if k.startswith(dotted + ".")]:
            del origin[old]
        origin[dotted] = path


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def _drop_ins(dirs: list[str], subdir: str) -> list[str]:
    """Drop-in paths for `subdir` (e.g. "x.toml.d"), higher directories winning by file name."""
    chosen: dict[str, str] = {}
    for directory in dirs:
        if subdir not in _list_dir(directory):
            continue
        full = os.path.join(directory, subdir)
        for entry in _list_dir(full):
            if entry.endswith(".toml") and entry not in chosen:
                chosen[entry] = os.path.join(full, entry)
    return [chosen[k] for k in sorted(chosen) if not _is_masked(chosen[k])]


def discover(dirs: list[str] | None = None) -> tuple[dict[str, str], list[ConfigError]]:
    """Model name -> main file (first on the path, masks removed), plus naming errors."""
    dirs = search_path() if dirs is None else dirs
    found: dict[str, str] = {}
    errors: list[ConfigError] = []
    for directory in dirs:
        for entry in sorted(_list_dir(directory)):
            if not entry.endswith(".toml"):
                continue
            name = entry[: -len(".toml")]
            if name in found:
                continue
            path = os.path.join(directory, entry)
            if os.path.isdir(path):
                continue
            found[name] = path
    models: dict[str, str] = {}
    for name, path in sorted(found.items()):
        if _is_masked(path):
            continue
        if name == DEFAULTS_NAME:
            errors.append(ConfigError(path, None, f'"{DEFAULTS_NAME}" is reserved for '
                                      f"{DEFAULTS_NAME}.toml.d/ host-wide defaults"))
            continue
        if not name or not _NAME_CHARS.issuperset(name) or len(name) > 240:
            errors.append(ConfigError(path, None, f"{name!r} is not a valid unit name "
                                      "(letters, digits, '_', '.', ':', '-')"))
            continue
        models[name] = path
    return models, errors


def load_model(name: str, main_path: str, dirs: list[str] | None = None) -> MergedConfig:
    dirs = search_path() if dirs is None else dirs
    merged = MergedConfig(name, main_path)
    files = (_drop_ins(dirs, f"{DEFAULTS_NAME}.toml.d") + [main_path]
             + _drop_ins(dirs, f"{name}.toml.d"))
    for path in files:
        _merge(merged.data, _read_toml(path), path, merged.origin)
        merged.sources.append(path)
    return merged
