"""The one error type for bad user input: it names the file, the key and the reason."""

from __future__ import annotations

# A message is one log line: whatever a path, key or reason holds (a drop-in
# named "a\nb.toml", bytes that are not UTF-8) is shown escaped, and a
# megabyte of value is cut short (/dev/kmsg takes at most 1 KiB a record).
MAX_MESSAGE = 800


def one_line(text: str) -> str:
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        elif "\udc80" <= ch <= "\udcff":          # a byte os.fsdecode() could not decode
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        else:
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii"))
    return "".join(out)


class ConfigError(Exception):
    def __init__(self, path: str, key: str | None, reason: str) -> None:
        self.path = path
        self.key = key
        self.reason = reason
        self.model: str | None = None     # the model refused, when path is not its own
        self.other: str | None = None     # a clash: the other model involved
        # The file's other errors, found in the same pass (build_model checks
        # every key before it stops): `check` reports them all at once.
        self.also: list[ConfigError] = []
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}: {self.key}" if self.key else self.path
        text = one_line(f"{where}: {self.reason}")
        return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."
