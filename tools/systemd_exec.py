"""Reading a unit file's ExecStart= into the argv systemd would execute.

Independent of the generator (which writes these lines) so that a bug in its
quoting cannot hide itself: unit syntax (sections, comments, backslash
continuation), specifiers (%%, %n, %N, %p, %i), word splitting with quotes
and C escapes (extract_first_word with UNQUOTE|CUNESCAPE), then, at exec
time, environment substitution (replace_env_argv): a word that is exactly
`$NAME` becomes the variable's value split on whitespace (no word when empty
or unset), `${NAME}` inside a word is replaced in place, `$$` is `$`.
"""

from __future__ import annotations

import re

_ESC = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
        "\\": "\\", '"': '"', "'": "'", "s": " "}
_WS = " \t\n\r"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class UnitError(ValueError):
    pass


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections -> [(key, value)], in order; continuation lines joined."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: str | None = None
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith(("#", ";")):
            continue            # comments, also between continued lines
        line, pending = pending + stripped, ""
        if not line:
            continue
        if line.endswith("\\"):
            # systemd joins a continued line with a space in place of the backslash
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
            continue
        key, sep, value = line.partition("=")
        if not sep or current is None:
            raise UnitError(f"not a key=value line in a section: {line!r}")
        sections[current].append((key.strip(), value.strip()))
    return sections


def values(sections: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    """A key's values; an empty assignment resets the list, as for Exec lines."""
    out: list[str] = []
    for k, v in sections.get(section, []):
        if k == key:
            out = [] if v == "" else out + [v]
    return out


def specifiers(value: str, unit: str) -> str:
    name = unit.rsplit(".", 1)[0]
    prefix, _, instance = name.partition("@")
    table = {"%": "%", "n": unit, "N": name, "p": prefix, "i": instance}

    def one(m: re.Match[str]) -> str:
        if m.group(1) not in table:
            raise UnitError(f"specifier %{m.group(1)} not supported by this check")
        return table[m.group(1)]

    return re.sub(r"%(.)", one, value)


def _cunescape(value: str, i: int) -> tuple[str, int]:
    """One escape at value[i] == '\\'; returns (text, next index)."""
    if i + 1 >= len(value):
        raise UnitError(f"trailing backslash in {value!r}")
    e = value[i + 1]
    if e in _ESC:
        return _ESC[e], i + 2
    widths = {"x": 2, "u": 4, "U": 8}
    if e in widths:
        digits = value[i + 2:i + 2 + widths[e]]
        if len(digits) != widths[e] or not re.fullmatch(r"[0-9A-Fa-f]+", digits):
            raise UnitError(f"bad \\{e} escape in {value!r}")
        return chr(int(digits, 16)), i + 2 + widths[e]
    if e in "01234567":
        digits = value[i + 1:i + 4]
        if not re.fullmatch(r"[0-7]{3}", digits):
            raise UnitError(f"bad octal escape in {value!r}")
        return chr(int(digits, 8)), i + 4
    raise UnitError(f"unknown escape \\{e} in {value!r}")


def split_words(value: str) -> list[str]:
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in _WS:
            i += 1
        if i >= n:
            return words
        word: list[str] = []
        quote: str | None = None
        while i < n and (quote is not None or value[i] not in _WS):
            c = value[i]
            if c == "\\":
                text, i = _cunescape(value, i)
                word.append(text)
            elif quote is None and c in "\"'":
                quote, i = c, i + 1
            elif c == quote:
                quote, i = None, i + 1
            else:
                word.append(c)
                i += 1
        if quote is not None:
            raise UnitError(f"unterminated quote in {value!r}")
        words.append("".join(word))


def _replace_in_word(word: str, env: dict[str, str]) -> str:
    out, i = [], 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        elif word.startswith("${", i) and "}" in word[i:]:
            end = word.index("}", i)
            out.append(env.get(word[i + 2:end], ""))
            i = end + 1
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def expand_env(words: list[str], env: dict[str, str]) -> list[str]:
    out: list[str] = []
    for w in words:
        if w.startswith("$") and _NAME.fullmatch(w[1:]):
            out.extend(env.get(w[1:], "").split())
        else:
            out.append(_replace_in_word(w, env))
    return out


def variables(words: list[str]) -> list[str]:
    """Names the command line takes from the environment."""
    found: list[str] = []
    for w in words:
        if w.startswith("$") and _NAME.fullmatch(w[1:]):
            names = [w[1:]]
        else:
            names = re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", w)
        found += [n for n in names if n not in found]
    return found


class Exec:
    """One Exec line: the executable and the argv before environment expansion."""

    def __init__(self, value: str, unit: str) -> None:
        prefix = re.match(r"[-@:+!]*", value).group(0)  # type: ignore[union-attr]
        self.expand = ":" not in prefix
        words = split_words(specifiers(value[len(prefix):], unit))
        if not words:
            raise UnitError("empty command line")
        # "@": the second word is argv[0], the first the file executed
        self.executable = words[0]
        self.words = words[1:] if "@" in prefix else words

    def argv(self, env: dict[str, str]) -> list[str]:
        return expand_env(self.words, env) if self.expand else list(self.words)


def environment(sections: dict[str, list[tuple[str, str]]], unit: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for v in values(sections, "Service", "Environment"):
        for word in split_words(specifiers(v, unit)):
            k, sep, val = word.partition("=")
            if sep:
                env[k] = val
    return env
