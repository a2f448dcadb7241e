"""Load every model on the search path: the shared front half of the generator,
`infer-units render` and `infer-units check`."""

from __future__ import annotations

from .conflicts import find_conflicts
from .errors import ConfigError
from .loader import discover, forget_cache, load_model, search_path
from .model import Model, build_model


class Loaded:
    def __init__(self, errors: list[ConfigError]) -> None:
        self.models: list[Model] = []
        self.errors = errors                          # per file: no unit
        self.conflicts: list[ConfigError] = []        # across files


def load_all(names: list[str] | None = None, dirs: list[str] | None = None) -> Loaded:
    dirs = search_path() if dirs is None else dirs
    forget_cache()
    found, errors = discover(dirs)
    loaded = Loaded(errors=errors)
    for name, path in found.items():
        try:
            loaded.models.append(build_model(load_model(name, path, dirs)))
        except ConfigError as e:
            loaded.errors.append(e)
    loaded.conflicts = find_conflicts(loaded.models)
    if names:
        wanted = {n.removesuffix(".service") for n in names}
        loaded.models = [m for m in loaded.models if m.name in wanted]
        loaded.errors = [e for e in loaded.errors if _name_of(e.path) in wanted]
        loaded.conflicts = [e for e in loaded.conflicts if _name_of(e.path) in wanted]
    return loaded


def _name_of(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    parent = path.rsplit("/", 2)[-2] if path.count("/") >= 2 else ""
    if parent.endswith(".toml.d"):
        return parent[: -len(".toml.d")]
    return base.removesuffix(".toml")
