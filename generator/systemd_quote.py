"""Quoting that makes systemd hand a process exactly the string the user wrote.

Exec lines: specifiers (%) are expanded on the raw line, then words are split
and C-unescaped, then $VAR is expanded per word.  Environment=: the word is
split and C-unescaped, then specifiers are expanded; there is no $ expansion.
"""

from __future__ import annotations

# str.translate tables (the generator quotes thousands of words per run).
_ENV_TABLE: dict[int, str] = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}
_ENV_TABLE.update({ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n",
                   ord("\t"): "\\t", ord("\r"): "\\r", ord("%"): "%%"})
_EXEC_TABLE = dict(_ENV_TABLE)
_EXEC_TABLE[ord("$")] = "$$"


# Words made only of these need no quotes (readable units); anything else,
# the empty word included, is quoted and escaped.
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:,=+-@")
_PREFIXES = "-@+!:"   # at the start of an Exec line's first word they are flags


def exec_word(word: str, first: bool = False) -> str:
    """One argv word for ExecStart= and friends (`first`: the program)."""
    if word and _SAFE.issuperset(word) and not (first and word[0] in _PREFIXES):
        return word
    return '"' + word.translate(_EXEC_TABLE) + '"'


def exec_line(argv: list[str] | tuple[str, ...]) -> str:
    return " ".join(exec_word(w, i == 0) for i, w in enumerate(argv))


def environment_assignment(name: str, value: str) -> str:
    """The right-hand side of Environment= for NAME=value."""
    return '"' + f"{name}={value}".translate(_ENV_TABLE) + '"'


def plain_value(text: str) -> str:
    """Text for directives that expand specifiers but do not unquote (Description=)."""
    return text.replace("%", "%%").replace("\n", " ")
