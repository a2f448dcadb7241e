"""The drain fence: while RUN_DIR/drain.fence exists no model starts.

`infer-units drain` writes it before it stops anything (so a unit that
Restart= brings back while the services stop, or one an operator or a timer
starts during the driver reload, is refused by its own pre-start), and
records in it the units it stopped; `infer-units resume` removes it and
starts exactly those again.  RUN_DIR is generator/paths.py's (a tmpfs: a reboot,
which reloads the driver anyway, lifts the fence), or $INFER_UNITS_RUN_DIR.

pre-start reads it on every start: this module imports only os, json and
the generator's light atomicfile and paths.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ...generator.atomicfile import ensure_dir, read_text
from ...generator.paths import run_dir


NAME = "drain.fence"


def path() -> str:
    return os.path.join(run_dir(), NAME)


class FenceError(Exception):
    pass


def read() -> dict[str, Any] | None:
    """The fence's record, None when there is no fence.  A fence that exists
    but cannot be parsed is still a fence: FenceError."""
    p = path()
    try:
        text = read_text(p)
    except (OSError, UnicodeDecodeError) as e:
        raise FenceError(f"{p}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if text is None:
        return None
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or not isinstance(record.get("stopped", []), list):
            raise ValueError("not a fence record")
        record.setdefault("stopped", [])
        return record
    except ValueError as e:
        raise FenceError(f"{p}: unreadable fence ({e})") from None


def refusal(unit: str | None) -> str | None:
    """Why `unit` may not start now, or None: pre-start's first check."""
    p = path()
    if not os.path.lexists(p):
        return None
    try:
        record = read() or {}
        since = f" since {record['since_text']}" if record.get("since_text") else ""
    except FenceError:
        since = ""
    return (f"start of {unit or 'the model'} refused: GPUs drained by `infer-units drain`{since} "
            f"(fence {p}); run `infer-units resume` once the driver is back")


def _old() -> dict[str, Any]:
    try:
        return read() or {}
    except FenceError:
        return {}


def merged(stopped: list[str]) -> list[str]:
    """The units the fence records after write(stopped): a second drain keeps
    the units the first one stopped (resume starts them all)."""
    return list(dict.fromkeys([*_old().get("stopped", []), *stopped]))


def write(stopped: list[str]) -> dict[str, Any]:
    """Create or extend the fence (atomically: pre-start never reads half a file)."""
    old = _old()
    units = merged(stopped)
    now = time.time()
    # The moment drain compares with systemd's exit stamps: on CLOCK_MONOTONIC
    # (the fence lives in RUN_DIR, a tmpfs, never across a boot), so that a
    # clock set back or forward between two drains neither forgets a unit
    # that left active after the fence nor counts one that left before it.
    # A fence without it (an older version's) keeps its wall-clock "since".
    mono = old.get("since_monotonic") if "since" in old else time.monotonic()
    record = {"since": old.get("since", now), "since_monotonic": mono,
              "since_text": old.get("since_text",
                                    time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now))),
              "stopped": units, "by_pid": os.getpid()}
    with ensure_dir(run_dir()) as d:
        d.write(NAME, json.dumps(record, indent=2) + "\n", durable=True)
    return record


def lift() -> None:
    try:
        os.unlink(path())
    except FileNotFoundError:
        pass
