"""Load every model on the search path: the shared front half of the generator,
`infer-units render` and `infer-units check`.

No exception of one model file may take the others down (docs/architecture.md): every failure while loading, validating or rendering one model
becomes a ConfigError naming its file."""

from __future__ import annotations

import os

from .conflicts import find_conflicts
from .errors import ConfigError
from .loader import MAX_DEPTH, Loader, is_path, search_path
from .model import Model, build_model
from .render import RenderedUnit, liveness_dropins, render
from .systemd_quote import unit_text_problem


class Loaded:
    def __init__(self, errors: list[ConfigError]) -> None:
        self.models: list[Model] = []
        self.errors = errors                          # per file: no unit
        self.conflicts: list[ConfigError] = []        # across files
        self.missing: list[str] = []                  # names asked for, no file at all

    def missing_errors(self, dirs: list[str] | None = None) -> list[ConfigError]:
        """One error per name asked for that has no file."""
        where = ":".join(search_path() if dirs is None else dirs)
        return [ConfigError(name, None, f"no model file named {name}.toml on the search "
                            f"path ({where})") for name in self.missing]


def as_config_error(path: str, e: BaseException) -> ConfigError:
    """Any exception met while handling `path`, as one clear line."""
    if isinstance(e, ConfigError):
        return e
    if isinstance(e, RecursionError):
        return ConfigError(path, None, f"nested too deeply (more than {MAX_DEPTH} levels)")
    if isinstance(e, MemoryError):
        return ConfigError(path, None, "out of memory while reading it (too large?)")
    if isinstance(e, OSError):
        where = f" ({e.filename})" if e.filename and e.filename != path else ""
        return ConfigError(path, None, f"cannot read{where}: {e.strerror or e}")
    if isinstance(e, ValueError) and "integer string conversion" in str(e):
        return ConfigError(path, None, "integer too large")
    # A bug of ours, not the file's fault alone: say so, and name the file.
    return ConfigError(path, None, f"internal error ({type(e).__name__}: {e}); "
                       "please report it with this file")


def load_all(names: list[str] | None = None, dirs: list[str] | None = None) -> Loaded:
    """Every model on the search path, or those NAMES; a name that is a file's
    path (`check ./qwen.toml`) loads that file as the model of its name, as it
    would be once installed: host defaults and drop-ins from the search path
    and its own directory, and it replaces an installed model of that name."""
    loader = Loader(dirs)
    dirs = loader.dirs
    found, errors = loader.discover()
    model_dirs = {name: dirs for name in found}
    wanted = {n.removesuffix(".service") for n in names or () if not is_path(n)}
    for arg in [n for n in names or () if is_path(n)]:
        path = os.path.abspath(arg)
        name = os.path.basename(path).removesuffix(".toml")
        wanted.add(name)
        error = (ConfigError(path, None, "no such file") if not os.path.isfile(path)
                 else loader.name_error(name, path))
        if error is not None:
            error.model = name
            errors.append(error)
            found.pop(name, None)
            continue
        found[name] = path
        model_dirs[name] = [os.path.dirname(path), *dirs]
    loaded = Loaded(errors=errors)
    for name, path in found.items():
        try:
            loaded.models.append(build_model(loader.load_model(name, path, model_dirs[name])))
        except Exception as e:      # noqa: BLE001 - one file never takes the others down
            first = as_config_error(path, e)
            for error in [first, *first.also]:      # every error the file has, each named
                if _name_of(error.path) != name:
                    # A host-wide defaults file: the same line for every model, so say whose.
                    error = ConfigError(error.path, error.key, f"{error.reason} (model {name})")
                error.model = name
                loaded.errors.append(error)
    try:
        loaded.conflicts = find_conflicts(loaded.models)
    except Exception as e:          # noqa: BLE001
        loaded.conflicts = [as_config_error("(overlap check)", e)]
    if names:
        # A name with no file at all: `check`, `render`, `status` say so and fail.
        loaded.missing = sorted(wanted - set(found)
                                - {e.model or _name_of(e.path) for e in errors})
        loaded.models = [m for m in loaded.models if m.name in wanted]
        loaded.errors = [e for e in loaded.errors
                         if (e.model or _name_of(e.path)) in wanted]
        # a clash concerns both models: asked about either, it is shown
        loaded.conflicts = [e for e in loaded.conflicts
                            if (e.model or _name_of(e.path)) in wanted or e.other in wanted]
    return loaded


def render_checked(model: Model) -> list[RenderedUnit]:
    """Every file of a model, its unit first, then the drop-ins its [liveness]
    needs for the shipped template units (often none), with every failure (and
    any text systemd would read differently from what we meant) as a
    ConfigError naming the model file."""
    try:
        units = [render(model), *liveness_dropins(model)]
    except Exception as e:          # noqa: BLE001
        raise as_config_error(model.main_path, e) from None
    for i, unit in enumerate(units):
        problem = unit_text_problem(unit.text)
        if problem:
            what = "the unit" if i == 0 else unit.name
            raise ConfigError(model.main_path, None, f"{what} {problem}; refused")
    return units


def _name_of(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    if base.endswith(".toml.d"):
        return base[: -len(".toml.d")]
    parent = path.rsplit("/", 2)[-2] if path.count("/") >= 2 else ""
    if parent.endswith(".toml.d"):
        return parent[: -len(".toml.d")]
    return base.removesuffix(".toml")
