"""Quoting that makes systemd hand a process exactly the string the user wrote.

Exec lines: specifiers (%) are expanded on the raw line, then words are split
and C-unescaped, then $VAR is expanded per word.  Environment=: the word is
split and C-unescaped, then specifiers are expanded; there is no $ expansion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# str.translate tables: each character systemd would read otherwise, escaped.
_ENV_TABLE: dict[int, str] = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}
_ENV_TABLE.update({ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n",
                   ord("\t"): "\\t", ord("\r"): "\\r", ord("%"): "%%"})
# Unicode line and paragraph separators and NEL: no line break to systemd,
# but one to editors and to Python's splitlines(); systemd reads \uXXXX back.
_ENV_TABLE.update({c: f"\\u{c:04x}" for c in (0x85, 0x2028, 0x2029)})
_EXEC_TABLE = dict(_ENV_TABLE)
_EXEC_TABLE[ord("$")] = "$$"


# Words made only of these need no quotes (readable units); anything else,
# the empty word included, is quoted and escaped.
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:,=+-@")
_PREFIXES = "-@+!:"   # at the start of an Exec line's first word they are flags


@dataclass(frozen=True)
class Expand:
    """A word of an Exec line that systemd is meant to expand when it runs
    the line ($MAINPID; an unbraced $VAR, which becomes words, none when
    empty): written as is, never the program."""
    word: str


def exec_word(word: str | Expand, first: bool = False) -> str:
    """One argv word for ExecStart= and friends (`first`: the program)."""
    if isinstance(word, Expand):
        return word.word
    if word and _SAFE.issuperset(word) and not (first and word[0] in _PREFIXES):
        return word
    return '"' + word.translate(_EXEC_TABLE) + '"'


def exec_line(argv: Sequence[str | Expand]) -> str:
    """A whole argv, the program first, as the value of an Exec line: every
    command line of a unit is built as a list and quoted here, once."""
    line = " ".join([exec_word(w) for w in argv])
    first = argv[0] if argv else None
    if isinstance(first, str) and line[:1] in _PREFIXES:
        return exec_word(first, True) + line[len(first):]     # it needs quotes after all
    return line


def environment_assignment(name: str, value: str) -> str:
    """The right-hand side of Environment= for NAME=value."""
    return '"' + f"{name}={value}".translate(_ENV_TABLE) + '"'


def environment_assignments(env: dict[str, str]) -> list[str]:
    """environment_assignment() of each NAME=value."""
    return [environment_assignment(name, value) for name, value in env.items()]


_PLAIN_TABLE: dict[int, str | None] = {c: " " for c in (*range(0x20), 0x7F, 0x85, 0x2028, 0x2029)}
_PLAIN_TABLE[ord("%")] = "%%"


def plain_value(text: str) -> str:
    """Text for directives that expand specifiers but do not unquote
    (Description=): control characters become spaces (nothing can end the
    line), and a trailing backslash, which would continue it, is dropped."""
    return text.translate(_PLAIN_TABLE).rstrip("\\")


def path_value(path: str) -> str:
    """A path for SourcePath= (specifiers are expanded there)."""
    return path.replace("%", "%%")


def unquoted_word(word: str) -> str:
    """One word for directives that split words, remove quotes and then
    expand specifiers, with no C escapes (RequiresMountsFor=): in double
    quotes, `\\` and `"` escaped by a backslash, `%` doubled.  Words made
    only of _SAFE characters stay bare."""
    if word and _SAFE.issuperset(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'


def comment_text(text: str) -> str:
    """Text for a comment line: control characters and undecodable bytes
    (os.fsdecode's surrogates) shown as \\xNN, so a file named "a\\nb.toml"
    stays on its line."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        code = ord(ch)
        if code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code in (0x85, 0x2028, 0x2029):
            out.append(f"\\u{code:04x}")
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


# systemd's read_line() ends a line at LF, CR or NUL; lines over LONG_LINE_MAX
# (1 MiB) fail the whole unit.
_LINE_MAX = 1 << 20
_BAD_CHARS = tuple(chr(c) for c in (*range(0x09), *range(0x0B, 0x20), 0x7F))   # controls but TAB, LF


def unit_text_problem(text: str) -> str | None:
    """The last line of defence before a unit is written: None when every
    line is a line systemd reads as we meant it, else why not."""
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            return "would not be valid UTF-8"
    # All ASCII: in UTF-8 they are those bytes.
    for c in _BAD_CHARS:
        if c in text:
            return "would contain a control character (CR, NUL, ...)"
    if "\\" in text and ("\\\n" in text or text.endswith("\\")):
        return "would contain a line ending in a backslash (a line continuation)"
    if size >= _LINE_MAX and any(len(l.encode()) >= _LINE_MAX for l in text.split("\n")):
        return "would contain a line longer than systemd reads (1 MiB)"
    return None
