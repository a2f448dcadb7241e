"""The one module that talks to systemd (pystemd over D-Bus).  It decodes
pystemd's bytes into str so nothing else sees them, and turns "no systemd
here" into SystemdUnavailable."""

from __future__ import annotations

import os
import time
from ..records import dataclass
from typing import Any


class SystemdUnavailable(Exception):
    pass


@dataclass(frozen=True)
class UnitState:
    name: str
    load_state: str
    active_state: str
    sub_state: str
    result: str
    main_pid: int
    active_since_us: int        # realtime µs of the last ActiveEnter (0: never)
    restarts: int
    exec_main_status: int
    fragment_path: str
    source_path: str

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "load_state": self.load_state,
                "active_state": self.active_state, "sub_state": self.sub_state,
                "result": self.result, "main_pid": self.main_pid,
                "active_since": self.active_since_us / 1e6 if self.active_since_us else None,
                "restarts": self.restarts, "source_path": self.source_path}


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _unit(name: str) -> Any:
    try:
        from pystemd.systemd1 import Unit
        unit = Unit(name.encode())
        unit.load()
        return unit
    except ImportError as e:
        raise SystemdUnavailable(f"pystemd is not installed: {e}") from None
    except Exception as e:  # pystemd raises DBusError subclasses and OSError
        raise SystemdUnavailable(f"cannot reach systemd over D-Bus: {e}") from None


def unit_state(name: str) -> UnitState:
    unit = _unit(name)
    try:
        u, svc = unit.Unit, unit.Service
        return UnitState(
            name=name, load_state=_s(u.LoadState), active_state=_s(u.ActiveState),
            sub_state=_s(u.SubState), result=_s(svc.Result), main_pid=int(svc.MainPID),
            active_since_us=int(u.ActiveEnterTimestamp), restarts=int(svc.NRestarts),
            exec_main_status=int(svc.ExecMainStatus), fragment_path=_s(u.FragmentPath),
            source_path=_s(u.SourcePath))
    except Exception as e:
        raise SystemdUnavailable(f"cannot read {name}: {e}") from None


def _manager() -> Any:
    try:
        from pystemd.systemd1 import Manager
        manager = Manager()
        manager.load()
        return manager
    except ImportError as e:
        raise SystemdUnavailable(f"pystemd is not installed: {e}") from None
    except Exception as e:
        raise SystemdUnavailable(f"cannot reach systemd over D-Bus: {e}") from None


def list_units(patterns: list[str]) -> list[str]:
    """Loaded units matching glob patterns (e.g. "*.service")."""
    manager = _manager()
    try:
        rows = manager.Manager.ListUnitsByPatterns([], [p.encode() for p in patterns])
    except Exception as e:
        raise SystemdUnavailable(f"ListUnitsByPatterns failed: {e}") from None
    return sorted(_s(row[0]) for row in rows)


def list_unit_states(patterns: list[str]) -> dict[str, str]:
    """Loaded units matching glob patterns -> their ActiveState, in one call."""
    manager = _manager()
    try:
        rows = manager.Manager.ListUnitsByPatterns([], [p.encode() for p in patterns])
    except Exception as e:
        raise SystemdUnavailable(f"ListUnitsByPatterns failed: {e}") from None
    return {_s(row[0]): _s(row[3]) for row in sorted(rows)}


def _has_job(name: str) -> bool:
    try:
        return int(_unit(name).Unit.Job[0]) != 0
    except SystemdUnavailable:
        raise
    except Exception as e:
        raise SystemdUnavailable(f"cannot read {name}'s job: {e}") from None


def start_units(names: list[str], timeout: float | None) -> dict[str, str]:
    """Queue a start job for each unit, then wait (up to `timeout`; None: not
    at all) until each is active or failed.  Returns unit -> ActiveState, or
    "not started: why" for a unit systemd refused to queue."""
    manager = _manager()
    refused: dict[str, str] = {}
    for name in names:
        try:
            manager.Manager.StartUnit(name.encode(), b"replace")
        except Exception as e:   # e.g. the model file was removed meanwhile: start the rest
            refused[name] = f"not started: {_s(e)}"
    queued = [n for n in names if n not in refused]
    deadline = time.monotonic() + (timeout or 0.0)
    while True:
        states = {n: unit_state(n).active_state for n in queued}
        # "inactive" with its start job still queued has not begun yet
        settled = all(s in ("active", "failed") or (s == "inactive" and not _has_job(n))
                      for n, s in states.items())
        if settled or timeout is None or time.monotonic() >= deadline:
            return {**states, **refused}
        time.sleep(0.2)


def stop_units(names: list[str], timeout: float) -> list[str]:
    """Stop units and wait until each is inactive or failed; returns those that are not."""
    manager = _manager()
    for name in names:
        try:
            manager.Manager.StopUnit(name.encode(), b"replace")
        except Exception as e:
            raise SystemdUnavailable(f"StopUnit {name} failed: {e}") from None
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending and time.monotonic() < deadline:
        pending = [n for n in pending
                   if unit_state(n).active_state not in ("inactive", "failed")]
        if pending:
            time.sleep(0.1)
    return pending


def cancel_own_start(unit: str) -> str | None:
    """Queue a stop job for `unit` without waiting (it replaces our own start
    job): a start refused as blocked must not come back through Restart=,
    which systemd applies to failed ExecStartPre= too (RestartPreventExitStatus=
    only looks at the main process).  Returns why it could not, or None."""
    try:
        _manager().Manager.StopUnit(unit.encode(), b"replace")
        return None
    except SystemdUnavailable as e:
        return str(e)
    except Exception as e:
        return f"StopUnit failed: {e}"


def main_exit_status(invocation_id: str | None, pid: int | None, wait_s: float = 1.0) -> int | None:
    """The exit status systemd recorded for our unit's main process, waiting
    briefly for systemd to notice the death; None when unknown."""
    from .procinfo import read_cgroup, unit_of_cgroup
    unit = unit_of_cgroup(read_cgroup(os.getpid()))
    if not unit or not invocation_id:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            svc = _unit(unit).Service
            if int(svc.ExecMainCode) != 0 and (pid is None or int(svc.ExecMainPID) == pid):
                return int(svc.ExecMainStatus)
        except SystemdUnavailable:
            return None
        except Exception:
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
