"""The JSON the hooks read and write (claims, counters, the drain fence,
liveness' and P2P's state, the fake GPU table, liveness' request, the P2P
self-test's report): the same text and the same values as the json module,
through its C half (`_json`).

json.decoder compiles regular expressions at import: re, and enum,
functools and collections behind it, were a fifth of pre-start's imports
(bench/restart_bench.py).  The C scanner and encoder need none of them; the
json module is imported only for what they do not do (indented text) and to
raise its own error for bad text (json.JSONDecodeError, a ValueError).
What a command prints under --json goes through jsonout.py, not here.
tests/test_jsontext.py checks both directions against the json module.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

_WHITESPACE = " \t\n\r"
_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Options:
    """What json.JSONDecoder() hands the C scanner, with json.loads' defaults."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


_scanner: Callable[[str, int], tuple[Any, int]] | None = None


def _unencodable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def loads(text: str) -> Any:
    """json.loads(text) for a str: the same value, or json's own ValueError."""
    global _scanner
    if _scanner is None:
        import _json
        _scanner = _json.make_scanner(_Options())  # type: ignore[arg-type]  # any object with these attributes
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scanner(text, start)
    except RecursionError:
        raise                   # as json.loads: too deep a nesting
    except Exception:           # noqa: BLE001
        # No value at `start` (StopIteration), or bad text: the C scanner
        # raises json.decoder's error only once that module is imported
        # (before, a SystemError); json.loads below raises json's own.
        end = -1
    if end != len(text.rstrip(_WHITESPACE)):
        import json
        return json.loads(text)        # raises json's error for that text ("Extra data", ...)
    return value


def dumps(value: Any, indent: int | None = None, sort_keys: bool = False) -> str:
    """json.dumps(value, indent=indent, sort_keys=sort_keys)."""
    if indent is not None or sort_keys:
        import json          # the C encoder writes only the compact form
        return json.dumps(value, indent=indent, sort_keys=sort_keys)
    import _json
    # As json.dumps builds it: a fresh marker table (circular references are
    # an error, not a recursion), ASCII, ", " and ": ", NaN allowed.
    encode = _json.make_encoder({}, _unencodable, _json.encode_basestring_ascii, None,
                                ": ", ", ", False, False, True)
    return "".join(encode(value, 0))
