"""Reading generated unit files back the way systemd does, for assertions:
sections, directives, and Exec/Environment words unquoted (C escapes, %%, $$).

The one unit-file reader is tools/systemd_exec.py (independent of the
generator, so a quoting bug there cannot hide itself); this is the tests'
short form of it.  The end-to-end tests prove the same against real systemd."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import systemd_exec  # noqa: E402

parse_unit = systemd_exec.parse_unit


def values(text: str, section: str, key: str) -> list[str]:
    return systemd_exec.values(parse_unit(text), section, key)


def split_words(value: str, exec_line: bool) -> list[str]:
    """systemd's extract_first_word with UNQUOTE|CUNESCAPE after specifiers;
    on an Exec line `$$` is then `$` (no variable is expanded here)."""
    words = systemd_exec.split_words(value.replace("%%", "\0"))
    words = [w.replace("\0", "%") for w in words]
    return [w.replace("$$", "$") for w in words] if exec_line else words


def exec_argv(value: str) -> list[str]:
    """ExecStart= value to argv (prefix characters like + and - removed)."""
    while value and value[0] in "+-@:!":
        value = value[1:]
    return split_words(value, exec_line=True)


def environment(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for v in values(text, "Service", "Environment"):
        for word in split_words(v, exec_line=False):
            k, _, val = word.partition("=")
            env[k] = val
    return env
