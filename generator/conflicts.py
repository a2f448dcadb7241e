"""Checks across models: two models on one GPU, two models on one port."""

from __future__ import annotations

from .errors import ConfigError
from .model import Model


def _gpu_keys(m: Model) -> set[str] | None:
    """Comparable GPU names; None for "all" (overlaps everything)."""
    if m.gpus is None:
        return set()
    if m.gpus == "all":
        return None
    return {str(g).lower() for g in m.gpus}


def find_conflicts(models: list[Model]) -> list[ConfigError]:
    """One error per clashing pair, reported against the later model's file.

    Selectors of different kinds (index vs UUID) can only be compared once the
    driver is up; the start-time reaper refuses to touch another service's
    processes (exit 2) whatever the files say.
    """
    errors: list[ConfigError] = []
    ordered = sorted(models, key=lambda m: m.name)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            ga, gb = _gpu_keys(a), _gpu_keys(b)
            if (ga is None and gb != set()) or (gb is None and ga != set()):
                shared = "all"
            else:
                shared = ",".join(sorted((ga or set()) & (gb or set())))
            if shared:
                errors.append(ConfigError(b.main_path, "gpus",
                                          f"GPU {shared} also used by {a.name} ({a.main_path})"))
            if a.port is not None and a.port == b.port and _same_address(a.host, b.host):
                errors.append(ConfigError(b.main_path, "port",
                                          f"port {b.port} also used by {a.name} ({a.main_path})"))
    return errors


def _same_address(a: str, b: str) -> bool:
    wildcard = ("0.0.0.0", "::", "")
    return a == b or a in wildcard or b in wildcard
