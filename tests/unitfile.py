"""Reading generated unit files back the way systemd does, for assertions:
sections, directives, and Exec/Environment words unquoted (C escapes, %%, $$).
The end-to-end tests prove the same against real systemd."""

from __future__ import annotations

_ESC = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a",
        "b": "\b", "f": "\f", "v": "\v", "s": " "}


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        if not line.strip() or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
            continue
        key, _, value = line.partition("=")
        assert current is not None, line
        sections[current].append((key.strip(), value.strip()))
    return sections


def values(text: str, section: str, key: str) -> list[str]:
    return [v for k, v in parse_unit(text).get(section, []) if k == key]


def split_words(value: str, exec_line: bool) -> list[str]:
    """systemd's extract_first_word with UNQUOTE|CUNESCAPE, then %% and $$."""
    words: list[str] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            break
        word: list[str] = []
        quote = None
        while i < n:
            c = value[i]
            if quote is None and c in " \t":
                break
            if c in "\"'" and (quote is None or quote == c):
                quote = None if quote else c
                i += 1
                continue
            if c == "\\" and i + 1 < n:
                e = value[i + 1]
                if e == "x":
                    word.append(chr(int(value[i + 2:i + 4], 16)))
                    i += 4
                    continue
                word.append(_ESC.get(e, e))
                i += 2
                continue
            word.append(c)
            i += 1
        assert quote is None, f"unterminated quote in {value!r}"
        words.append("".join(word))
    out = []
    for w in words:
        w = w.replace("%%", "%")
        if exec_line:
            w = w.replace("$$", "$")
        out.append(w)
    return out


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
