"""RUN_DIR/<name>.env: KEY=value lines that start-up checks write and
the unit reads through EnvironmentFile= (read again before each Exec line)."""

from __future__ import annotations

from ...generator.atomicfile import UnsafePath, read_text, write_file

from ..facts.gpus import Gpu


class EnvFileError(Exception):
    """One line: the file and why it cannot be read or written."""


def _lines(path: str) -> list[str]:
    try:
        return (read_text(path) or "").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise EnvFileError(f"env file {path}: cannot read: {reason}") from None


def update_env_file(path: str, values: dict[str, str | None]) -> None:
    """Set (or, with None, remove) keys, keeping the others; atomic rename."""
    for key, value in values.items():
        if value is not None and ("\n" in value or "\r" in value):
            raise EnvFileError(f"env file {path}: {key}: a value cannot span lines")
    kept = [line for line in _lines(path) if line.partition("=")[0].strip() not in values]
    for key, value in values.items():
        if value is not None:
            kept.append(f"{key}={value}")
    try:
        # its directory is ours (RUN_DIR): 0755 whatever the umask
        write_file(path, "".join(line + "\n" for line in kept), dir_mode=0o755)
    except OSError as e:
        why = str(e) if isinstance(e, UnsafePath) else e.strerror or str(e)
        raise EnvFileError(f"env file {path}: cannot write: {why}") from None


def write_visible_devices(path: str, gpus: list[Gpu], every: list[Gpu]) -> None:
    """The selected GPUs for the server as indexes in PCI order, which is how
    CUDA counts under CUDA_DEVICE_ORDER=PCI_BUS_ID (the unit sets it) and the
    one form every engine parses (vLLM takes CUDA_VISIBLE_DEVICES entries with
    int(): a UUID crashes its start).  `every`: all the host's GPUs."""
    order = sorted(g.pci for g in every)
    update_env_file(path, {"CUDA_VISIBLE_DEVICES": ",".join(str(order.index(g.pci))
                                                            for g in gpus)})


def read_env_file(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in _lines(path):
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            out[key.strip()] = value
    return out
