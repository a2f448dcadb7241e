"""Checks across models: two models on one GPU, two models on one port."""

from __future__ import annotations

from .errors import ConfigError
from .model import Model

_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def find_conflicts(models: list[Model]) -> list[ConfigError]:
    """One error per clash, reported against the later model's file (by name).

    Selectors of different kinds (index vs UUID) can only be compared once the
    driver is up; the start-time reaper refuses to touch another service's
    processes (exit 2) whatever the files say.
    """
    errors: list[ConfigError] = []
    gpu_owner: dict[str, Model] = {}
    all_owner: Model | None = None
    port_owners: dict[int, list[tuple[Model, str]]] = {}
    for m in sorted(models, key=lambda m: m.name):
        if m.gpus == "all":
            others = ([all_owner] if all_owner else []) + list(dict.fromkeys(gpu_owner.values()))
            for other in others:
                errors.append(_clash(m, "gpus", f"GPU all overlaps {other.name}'s GPUs", other))
            all_owner = all_owner or m
        elif m.gpus:
            keys = [str(g).lower() for g in m.gpus]
            if all_owner is not None:
                errors.append(_clash(m, "gpus", 'GPUs overlap gpus = "all"', all_owner))
            for key in keys:
                owner = gpu_owner.get(key)
                if owner is not None:
                    errors.append(_clash(m, "gpus", f"GPU {key} also used", owner))
                else:
                    gpu_owner[key] = m
        # Every port the model listens on: its own and the engine's helpers
        # (TGI's torch master and prometheus ports), so fixed defaults collide
        # here and not at start.
        for what, port in m.ports.items():
            for other, other_what in port_owners.get(port, []):
                # The engines bind their helper ports on every address.
                if (what != "port" or other_what != "port" or m.host == other.host
                        or m.host in _WILDCARD_HOSTS or other.host in _WILDCARD_HOSTS):
                    errors.append(_clash(m, "port" if what == "port" else "args",
                                         f"{_port_text(what, port)} also used"
                                         + ("" if other_what == what else f" (as {other_what})"),
                                         other))
                    break
            port_owners.setdefault(port, []).append((m, what))
    return errors


def _clash(m: Model, key: str, what: str, other: Model) -> ConfigError:
    error = ConfigError(m.main_path, key, f"{what} by {other.name} ({other.main_path})")
    error.model, error.other = m.name, other.name
    return error


def _port_text(what: str, port: int) -> str:
    return f"port {port}" if what == "port" else f"{what} {port}"
