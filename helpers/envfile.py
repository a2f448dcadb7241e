"""/run/infer-units/<name>.env: KEY=value lines that start-up checks write and
the unit reads through EnvironmentFile= (read again before each Exec line)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .gpus import Gpu


def update_env_file(path: str, values: dict[str, str | None]) -> None:
    """Set (or, with None, remove) keys, keeping the others; atomic rename."""
    lines: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        pass
    kept = [line for line in lines if line.partition("=")[0].strip() not in values]
    for key, value in values.items():
        if value is not None:
            kept.append(f"{key}={value}")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def write_visible_devices(path: str, gpus: list[Gpu]) -> None:
    """CUDA takes no PCI bus ids: name the selected GPUs by UUID for the server."""
    update_env_file(path, {"CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus)})


def read_env_file(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.rstrip("\n").partition("=")
                if sep and not key.startswith("#"):
                    out[key.strip()] = value
    except FileNotFoundError:
        pass
    return out
