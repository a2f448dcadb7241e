"""Quoting that makes systemd hand a process exactly the string the user wrote.

Exec lines: specifiers (%) are expanded on the raw line, then words are split
and C-unescaped, then $VAR is expanded per word.  Environment=: the word is
split and C-unescaped, then specifiers are expanded; there is no $ expansion.
"""

from __future__ import annotations

_C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape_char(ch: str) -> str:
    if ch in _C_ESCAPES:
        return _C_ESCAPES[ch]
    if ch == "%":
        return "%%"
    code = ord(ch)
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    return ch


def exec_word(word: str) -> str:
    """One argv word for ExecStart= and friends."""
    return '"' + "".join("$$" if ch == "$" else _escape_char(ch) for ch in word) + '"'


def exec_line(argv: list[str] | tuple[str, ...]) -> str:
    return " ".join(exec_word(w) for w in argv)


def environment_assignment(name: str, value: str) -> str:
    """The right-hand side of Environment= for NAME=value."""
    return '"' + "".join(_escape_char(ch) for ch in f"{name}={value}") + '"'


def plain_value(text: str) -> str:
    """Text for directives that expand specifiers but do not unquote (Description=)."""
    return text.replace("%", "%%").replace("\n", " ")
