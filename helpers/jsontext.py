"""The JSON the hooks read and write (claims, counters, the drain fence,
liveness' and P2P's state, the fake GPU table, liveness' request, the P2P
self-test's report): the json module's text and values.  What a command
prints under --json goes through jsonout.py."""

from __future__ import annotations

import json
from typing import Any


def loads(text: str) -> Any:
    return json.loads(text)


def dumps(value: Any, indent: int | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, sort_keys=sort_keys)
