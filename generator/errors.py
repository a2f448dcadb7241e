"""The one error type for bad user input: it names the file, the key and the reason."""

from __future__ import annotations


class ConfigError(Exception):
    def __init__(self, path: str, key: str | None, reason: str) -> None:
        self.path = path
        self.key = key
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}: {self.key}" if self.key else self.path
        return f"{where}: {self.reason}"
