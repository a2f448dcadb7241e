"""A strict subset of TOML, parsed without importing tomllib.

Importing tomllib (with re, string and typing behind it) costs more than the
rest of a 64-file generator run together (bench/generator_bench.py).  Model
files use a small part of TOML: [table] headers, bare keys, basic and literal
strings, integers, booleans, arrays.  This parser reads exactly that part and
raises Unsupported for anything else (floats, dates, inline tables, multi-line
strings, dotted or quoted keys, ...) and for anything it finds wrong; the
caller then parses the file with tomllib, which either handles it or gives
the real error message.  tests/test_fasttoml.py checks it against tomllib.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_DIGITS = frozenset("0123456789")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


class Unsupported(Exception):
    """Outside the subset (or invalid): let tomllib decide."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.n = len(text)
        self.depth = 0      # nested arrays: deeper ones go to tomllib (no RecursionError here)

    def fail(self) -> None:
        raise Unsupported(self.i)

    def skip_ws(self) -> None:
        s, i, n = self.s, self.i, self.n
        while i < n and (s[i] == " " or s[i] == "\t"):
            i += 1
        self.i = i

    def skip_ws_comments_newlines(self) -> None:
        s, n = self.s, self.n
        while self.i < n:
            c = s[self.i]
            if c in " \t\n":
                self.i += 1
            elif c == "\r" and s.startswith("\r\n", self.i):
                self.i += 2
            elif c == "#":
                self.skip_comment()
            else:
                return

    def skip_comment(self) -> None:
        end = self.s.find("\n", self.i)
        end = self.n if end < 0 else end
        text = self.s[self.i:end]
        if not text.isprintable():      # printable has no control character: most comments
            for ch in text:
                if (ch < " " and ch != "\t") or ch == "\x7f":
                    self.fail()
        self.i = end

    def end_of_line(self) -> None:
        self.skip_ws()
        if self.i < self.n and self.s[self.i] == "#":
            self.skip_comment()
        if self.i < self.n:
            if self.s[self.i] == "\n":
                self.i += 1
            elif self.s.startswith("\r\n", self.i):
                self.i += 2
            else:
                self.fail()

    def bare_key(self) -> str:
        start = i = self.i
        s, n = self.s, self.n
        while i < n and s[i] in _BARE:
            i += 1
        self.i = i
        if i == start:
            self.fail()
        return s[start:i]

    def value(self) -> Any:
        if self.i >= self.n:
            self.fail()
        c = self.s[self.i]
        if c == '"':
            return self.basic_string()
        if c == "'":
            return self.literal_string()
        if c == "[":
            return self.array()
        if self.s.startswith("true", self.i):
            self.i += 4
            return self.after_word(True)
        if self.s.startswith("false", self.i):
            self.i += 5
            return self.after_word(False)
        return self.integer()

    def after_word(self, value: Any) -> Any:
        if self.i < self.n and self.s[self.i] in _BARE:
            self.fail()
        return value

    def integer(self) -> int:
        start = self.i
        if self.s[self.i] in "+-":
            self.i += 1
        digits_start = self.i
        while self.i < self.n and self.s[self.i] in _DIGITS:
            self.i += 1
        digits = self.s[digits_start:self.i]
        if not digits or (len(digits) > 1 and digits[0] == "0") or len(digits) > 18:
            self.fail()      # > 18 digits may not fit 64 bits: tomllib, then the loader's limit
        if self.i < self.n and self.s[self.i] not in " \t\r\n,]#":
            self.fail()      # floats, dates, hex, underscores: tomllib
        return int(self.s[start:self.i])

    def basic_string(self) -> str:
        s = self.s
        if s.startswith('"""', self.i):
            self.fail()
        # Fast path, most strings: no escape before the closing quote, and
        # printable (else the loop below checks each character).
        end = s.find('"', self.i + 1)
        if end > 0:
            text = s[self.i + 1:end]
            if "\\" not in text and "\n" not in text and text.isprintable():
                self.i = end + 1
                return text
        self.i += 1
        out = []
        chunk = self.i
        while True:
            if self.i >= self.n:
                self.fail()
            c = s[self.i]
            if c == '"':
                out.append(s[chunk:self.i])
                self.i += 1
                return "".join(out)
            if c == "\\":
                out.append(s[chunk:self.i])
                self.i += 1
                if self.i >= self.n:
                    self.fail()
                e = s[self.i]
                if e in _ESCAPES:
                    out.append(_ESCAPES[e])
                    self.i += 1
                elif e in "uU":
                    width = 4 if e == "u" else 8
                    hexpart = s[self.i + 1:self.i + 1 + width]
                    if len(hexpart) != width or any(h not in "0123456789abcdefABCDEF" for h in hexpart):
                        self.fail()
                    code = int(hexpart, 16)
                    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                        self.fail()
                    out.append(chr(code))
                    self.i += 1 + width
                else:
                    self.fail()
                chunk = self.i
                continue
            if (c < " " and c != "\t") or c == "\x7f":
                self.fail()
            self.i += 1

    def literal_string(self) -> str:
        s = self.s
        if s.startswith("'''", self.i):
            self.fail()
        end = s.find("'", self.i + 1)
        if end < 0:
            self.fail()
        text = s[self.i + 1:end]
        for ch in text:
            if (ch < " " and ch != "\t") or ch == "\x7f":
                self.fail()
        self.i = end + 1
        return text

    def array(self) -> list[Any]:
        self.i += 1
        self.depth += 1
        if self.depth > 8:      # loader._copied relies on this bound (and on 18 digits)
            self.fail()
        items: list[Any] = []
        while True:
            self.skip_ws_comments_newlines()
            if self.i >= self.n:
                self.fail()
            if self.s[self.i] == "]":
                self.i += 1
                self.depth -= 1
                return items
            items.append(self.value())
            self.skip_ws_comments_newlines()
            if self.i >= self.n:
                self.fail()
            if self.s[self.i] == ",":
                self.i += 1
            elif self.s[self.i] != "]":
                self.fail()

    def document(self) -> dict[str, Any]:
        root: dict[str, Any] = {}
        table = root
        seen_tables: set[str] = set()
        while True:
            self.skip_ws_comments_newlines()
            if self.i >= self.n:
                return root
            if self.s[self.i] == "[":
                if self.s.startswith("[[", self.i):
                    self.fail()
                self.i += 1
                self.skip_ws()
                name = self.bare_key()
                self.skip_ws()
                if self.i >= self.n or self.s[self.i] != "]":
                    self.fail()    # dotted or quoted table names: tomllib
                self.i += 1
                if name in seen_tables or name in root:
                    self.fail()
                seen_tables.add(name)
                table = root[name] = {}
                self.end_of_line()
                continue
            # Most lines are `key = value` with a value of one line (a string
            # without escapes, an integer, a boolean, an array of those):
            # read whole by _line_value; anything else, char by char below.
            end = self.s.find("\n", self.i)
            if end < 0:
                end = self.n
            key, eq, rest = self.s[self.i:end].partition("=")
            key = key.rstrip(" \t")
            if eq and key and _BARE.issuperset(key):
                value = _line_value(rest.strip(" \t"))
                if value is not _NO:
                    if key in table:
                        self.fail()
                    table[key] = value
                    self.i = end
                    continue
            key = self.bare_key()
            self.skip_ws()
            if self.i >= self.n or self.s[self.i] != "=":
                self.fail()
            self.i += 1
            self.skip_ws()
            if key in table:
                self.fail()
            table[key] = self.value()
            self.end_of_line()


_NO: Any = object()      # _line_value: not a value it reads whole


def _line_int(text: str) -> Any:
    """An integer as _Parser.integer() reads it (sign, no leading zero, at
    most 18 digits), else _NO."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if digits.isascii() and digits.isdigit() and len(digits) <= 18 \
            and (digits[0] != "0" or len(digits) == 1):
        return int(text)
    return _NO


def _line_value(text: str) -> Any:
    """The value that is all of `text` (the rest of a line, stripped) when it
    is one of the common simple forms, else _NO (the char parser decides,
    errors included).  Only what the char parser reads the same."""
    if not text:
        return _NO
    first, last = text[0], text[-1]
    if first == '"' or first == "'":
        inner = text[1:-1]
        # One string, no escapes (a backslash is one only in "..."), no
        # control character (printable has none; tabs go the long way).
        if len(text) >= 2 and last == first and first not in inner and inner.isprintable() \
                and (first == "'" or "\\" not in inner):
            return inner
        return _NO
    if first == "[":
        if last != "]":
            return _NO
        inner = text[1:-1]
        if not inner.strip(" \t"):
            return []
        if '"' in inner:
            # An array of basic strings: between the quotes, only commas
            # (one after each string but the last, where it may be left out).
            if "\\" in inner:
                return _NO
            parts = inner.split('"')
            if len(parts) % 2 == 0 or parts[0].strip(" \t"):
                return _NO
            items: list[Any] = []
            for i in range(1, len(parts), 2):
                between = parts[i + 1].strip(" \t")
                if not parts[i].isprintable() or \
                        (between != "," and not (between == "" and i == len(parts) - 2)):
                    return _NO
                items.append(parts[i])
            return items
        words = inner.split(",")
        if not words[-1].strip(" \t") and len(words) > 1:
            words.pop()                 # a trailing comma
        items = []
        for word in words:
            word = word.strip(" \t")
            value = True if word == "true" else False if word == "false" else _line_int(word)
            if value is _NO:
                return _NO
            items.append(value)
        return items
    if text == "true":
        return True
    if text == "false":
        return False
    return _line_int(text)


def _by_lines(text: str) -> dict[str, Any] | None:
    """The document when every line is blank, a comment, a [table] header or
    `key = value` with a _line_value (almost every model file), else None:
    then _Parser reads it from the start.  A line at a time: the per-line
    work is C (split, strip, partition), not a loop over characters."""
    if "\r" in text:
        return None                     # CRLF and stray CRs: _Parser's care
    root: dict[str, Any] = {}
    table = root
    for line in text.split("\n"):
        line = line.strip(" \t")
        if not line:
            continue
        first = line[0]
        if first == "#":
            if not line.isprintable():  # a control character, or a tab: _Parser decides
                return None
            continue
        if first == "[":
            name = line[1:-1].strip(" \t")
            if line[-1] != "]" or not name or not _BARE.issuperset(name) or name in root:
                return None
            table = root[name] = {}
            continue
        key, eq, rest = line.partition("=")
        key = key.rstrip(" \t")
        if not eq or not key or not _BARE.issuperset(key) or key in table:
            return None
        value = _line_value(rest.lstrip(" \t"))
        if value is _NO:
            return None
        table[key] = value
    return root


def loads(data: bytes) -> dict[str, Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Unsupported("not UTF-8") from None
    found = _by_lines(text)
    return _Parser(text).document() if found is None else found
