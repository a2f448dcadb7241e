"""The one module that talks to systemd: pystemd over D-Bus.

Root asks the manager over its private socket (/run/systemd/private), as
systemctl does: it answers while the system bus is down (early boot, a
shutdown, a container without dbus).  Anyone else asks over the system bus.
Properties are read and methods called by name through pystemd's bus
(`DBus.get_property`, `DBus.call_method`), one connection per process, so
nothing here introspects a unit before asking it one question.

What comes back is decoded from pystemd's bytes into str here, so nothing
else sees them, and "no systemd here" (no bus, no pystemd, an error reply)
is SystemdUnavailable.  Identity rule (docs/trust.md): a unit's processes
are those in the cgroup systemd reports for it (ControlGroup), never a
cgroup path that merely ends in its name."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

DESTINATION = b"org.freedesktop.systemd1"
MANAGER_PATH = b"/org/freedesktop/systemd1"
MANAGER = b"org.freedesktop.systemd1.Manager"
UNIT = b"org.freedesktop.systemd1.Unit"
SERVICE = b"org.freedesktop.systemd1.Service"
JOB = b"org.freedesktop.systemd1.Job"
PRIVATE_BUS = "/run/systemd/private"


class SystemdUnavailable(Exception):
    pass


# ------------------------------------------------------------------ the bus

# sd-bus connections are not thread-safe: pre-start asks from a thread
# (act/startlimit.py) while its checks go on.
_lock = threading.Lock()
_open: list[Any] = []       # the process's one connection, once opened


def _connect() -> Any:
    try:
        from pystemd.dbuslib import DBus, DBusAddress
    except ImportError as e:
        raise SystemdUnavailable(f"pystemd is not installed: {e}") from None
    try:
        if os.geteuid() == 0 and os.path.exists(PRIVATE_BUS):
            bus = DBusAddress(f"unix:path={PRIVATE_BUS}".encode(), peer_to_peer=True)
        else:
            bus = DBus()
        bus.open()
    except Exception as e:  # pystemd raises DBusError subclasses and OSError
        raise SystemdUnavailable(f"cannot reach systemd over D-Bus: {e}") from None
    return bus


def _with_bus(ask: Any, what: str) -> Any:
    """ask(bus), on the process's connection.  A kept connection that fails
    is dropped and the question asked once more on a new one: a
    daemon-reexec closes it, and what is left unread on it is not known."""
    with _lock:
        for kept in (bool(_open), False):
            if not _open:
                _open.append(_connect())
            try:
                return ask(_open[0])
            except Exception as e:  # pystemd's DBusError subclasses, OSError
                _drop()
                if not kept:
                    raise SystemdUnavailable(f"{what}: {_s(e) or type(e).__name__}") from None
    raise AssertionError("unreachable")


def _drop() -> None:
    while _open:
        bus = _open.pop()
        try:
            bus.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def unit_path(name: str) -> bytes:
    """The manager's object path of a unit (sd_bus_path_encode)."""
    from pystemd.dbuslib import path_encode
    return bytes(path_encode(MANAGER_PATH + b"/unit", name.encode()))


def _get(path: bytes, interface: bytes, prop: str, signature: str, what: str) -> Any:
    return _with_bus(lambda bus: bus.get_property(DESTINATION, path, interface,
                                                  prop.encode(), signature.encode()), what)


def _unit_get(name: str, interface: bytes, prop: str, signature: str) -> Any:
    try:
        path = unit_path(name)
    except ImportError as e:
        raise SystemdUnavailable(f"pystemd is not installed: {e}") from None
    return _get(path, interface, prop, signature, f"{prop} of {name}")


def _call(method: str, signature: str, *args: Any) -> Any:
    """A call on the manager; its reply's body."""
    def ask(bus: Any) -> Any:
        from pystemd.dbuslib import apply_signature     # there once connected
        return bus.call_method(DESTINATION, MANAGER_PATH, MANAGER, method.encode(),
                               apply_signature(signature.encode(), list(args))).body
    return _with_bus(ask, method)


# ------------------------------------------------------------------ units

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
    source_path: str
    exec_main_code: int = 0         # the last main process: 1 exited, 2 killed, 3 dumped core
    invocation_id: str = ""         # the current (or last) run's, as journald records it
    fragment_path: str = ""         # the unit file systemd loaded (the generator's output)
    need_daemon_reload: bool = False
    active_exit_us: int = 0         # realtime µs the unit last left active (a stop began)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "load_state": self.load_state,
                "active_state": self.active_state, "sub_state": self.sub_state,
                "result": self.result, "main_pid": self.main_pid,
                "active_since": self.active_since_us / 1e6 if self.active_since_us else None,
                "restarts": self.restarts, "source_path": self.source_path}


def unit_state(name: str) -> UnitState:
    def unit(prop: str, signature: str = "s") -> Any:
        return _unit_get(name, UNIT, prop, signature)

    def service(prop: str, signature: str) -> Any:
        return _unit_get(name, SERVICE, prop, signature)
    return UnitState(
        name=name, load_state=_s(unit("LoadState")), active_state=_s(unit("ActiveState")),
        sub_state=_s(unit("SubState")), result=_s(service("Result", "s")),
        main_pid=int(service("MainPID", "u")),
        active_since_us=int(unit("ActiveEnterTimestamp", "t")),
        restarts=int(service("NRestarts", "u")),
        exec_main_status=int(service("ExecMainStatus", "i")),
        source_path=_s(unit("SourcePath")),
        exec_main_code=int(service("ExecMainCode", "i")),
        invocation_id=bytes(unit("InvocationID", "ay")).hex(),
        fragment_path=_s(unit("FragmentPath")),
        need_daemon_reload=bool(unit("NeedDaemonReload", "b")),
        active_exit_us=int(unit("ActiveExitTimestamp", "t")))


def slice_path(slice_name: str) -> str:
    """The cgroup path of a slice: "a-b.slice" is /a.slice/a-b.slice, "-.slice" the root."""
    if not slice_name or slice_name == "-.slice":
        return ""
    stem = slice_name[:-len(".slice")] if slice_name.endswith(".slice") else slice_name
    parts = stem.split("-")
    return "".join("/" + "-".join(parts[:i + 1]) + ".slice" for i in range(len(parts)))


def control_group(name: str) -> str:
    """The cgroup systemd runs the service `name` in: its ControlGroup while
    it has one, else where it would put it (its Slice's path + its name, e.g.
    after a stop that left an unkillable process); "" when systemd knows no
    slice for it.  Raises SystemdUnavailable."""
    cgroup = _s(_unit_get(name, SERVICE, "ControlGroup", "s"))
    if cgroup:
        return cgroup
    where = _s(_unit_get(name, SERVICE, "Slice", "s"))
    return f"{slice_path(where)}/{name}" if where else ""


def service_facts(name: str) -> tuple[str, int, str]:
    """(ControlGroup, MainPID, Restart=) of a system service; raises SystemdUnavailable."""
    return (_s(_unit_get(name, SERVICE, "ControlGroup", "s")),
            int(_unit_get(name, SERVICE, "MainPID", "u")),
            _s(_unit_get(name, SERVICE, "Restart", "s")))


def _rows(patterns: list[str]) -> list[Any]:
    """ListUnitsByPatterns' rows for glob patterns: name, description, load,
    active, sub state, following, path, job id, job type, job path."""
    return list(_call("ListUnitsByPatterns", "asas", [], [p.encode() for p in patterns]))


def list_unit_states(patterns: list[str]) -> dict[str, str]:
    """Loaded units matching glob patterns -> their ActiveState, in one call."""
    return {_s(row[0]): _s(row[3]) for row in sorted(_rows(patterns))}


@dataclass(frozen=True)
class Listed:
    """One row of ListUnitsByPatterns: a unit's state and its pending job."""
    name: str
    active_state: str
    sub_state: str
    job_type: str        # "" when no job is pending: "start", "stop", "restart", ...


def list_units_with_jobs(patterns: list[str]) -> list[Listed]:
    rows = _rows(patterns)
    return sorted((Listed(_s(r[0]), _s(r[3]), _s(r[4]), _s(r[8]) if int(r[7]) else "")
                   for r in rows), key=lambda u: u.name)


def exec_argvs(name: str, prop: str = "ExecStartPost") -> list[list[str]]:
    """The argv of each command of a service's Exec*= setting (ExecStart,
    ExecStartPost, ...), as systemd loaded it: the unit that runs, not the
    file on disk since (a daemon-reload loads that)."""
    rows = _unit_get(name, SERVICE, prop, "a(sasbttttuii)")
    # The program systemd executes, then its arguments (argv[0] may differ).
    return [[_s(row[0])] + [_s(word) for word in row[1][1:]] for row in rows]


def left_active_at_us(name: str, monotonic: bool = False) -> int:
    """µs of the unit's last ActiveExitTimestamp (0: never active): realtime,
    or CLOCK_MONOTONIC with `monotonic` (time.monotonic()'s clock), which no
    clock setting moves."""
    prop = "ActiveExitTimestampMonotonic" if monotonic else "ActiveExitTimestamp"
    return int(_unit_get(name, UNIT, prop, "t"))


def pending_job_type(name: str) -> str:
    """The type of the job systemd is running on the unit ("restart",
    "stop", "start", ...), "" when none; SystemdUnavailable when systemd
    cannot say.  A restart's job is "restart" while it stops the unit
    (ExecStopPost= included) and becomes "start" after; try-restart and
    reload-or-restart are "restart" once queued."""
    job_id, job_path = _unit_get(name, UNIT, "Job", "(uo)")
    if not int(job_id):
        return ""
    try:
        return _s(_get(bytes(job_path), JOB, "JobType", "s", f"JobType of {name}"))
    except SystemdUnavailable:
        # The job finished between the two questions: none is pending now.
        job_id, _ = _unit_get(name, UNIT, "Job", "(uo)")
        if not int(job_id):
            return ""
        raise


def sigkills_leftovers(name: str) -> bool:
    """Whether systemd SIGKILLs what is left of the unit's cgroup once its
    stop hooks have run: KillMode= mixed (the template's) or control-group,
    with SendSIGKILL=yes; a [service] KillMode=process or none, or
    SendSIGKILL=no, leaves a stopped server's workers running."""
    mode = _s(_unit_get(name, SERVICE, "KillMode", "s"))
    return mode in ("mixed", "control-group") and bool(_unit_get(name, SERVICE, "SendSIGKILL", "b"))


def restarts_since_asked(name: str) -> int:
    """systemd's NRestarts: automatic restarts since the last asked-for start."""
    return int(_unit_get(name, SERVICE, "NRestarts", "u"))


def reset_failed(name: str) -> None:
    """Clear the unit's failed state and its start-limit counter."""
    _call("ResetFailedUnit", "s", name.encode())


# ------------------------------------------------------------------ jobs

def start_units(names: list[str], timeout: float | None,
                watch: Callable[[UnitState], None] | None = None) -> dict[str, str]:
    """Queue a start job for each unit, then wait (up to `timeout`; None: not
    at all) until each is active or failed.  Returns unit -> ActiveState, or
    "not started: why" for a unit systemd refused to queue.  `watch` sees
    each unit's state at every look while it waits (to say progress)."""
    refused: dict[str, str] = {}
    for name in names:
        try:
            _call("StartUnit", "ss", name.encode(), b"replace")
        except SystemdUnavailable as e:   # e.g. the model file was removed meanwhile: start the rest
            refused[name] = f"not started: {e}"
    queued = [n for n in names if n not in refused]
    deadline = time.monotonic() + (timeout or 0.0)
    while True:
        seen = [unit_state(n) for n in queued]
        if watch is not None and timeout is not None:
            for state in seen:
                watch(state)
        states = {u.name: u.active_state for u in seen}
        # "inactive" with its start job still queued has not begun yet
        settled = all(s in ("active", "failed") or (s == "inactive" and not pending_job_type(n))
                      for n, s in states.items())
        if settled or timeout is None or time.monotonic() >= deadline:
            return {**states, **refused}
        time.sleep(0.2)


def stop_units(names: list[str], timeout: float) -> list[str]:
    """Stop units and wait until each is inactive or failed; returns those that are not."""
    for name in names:
        _call("StopUnit", "ss", name.encode(), b"replace")
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
    return queue_stop(unit)


def queue_stop(unit: str) -> str | None:
    """Queue a stop job for `unit` (mode replace), not waiting for it; why not, or None."""
    try:
        _call("StopUnit", "ss", unit.encode(), b"replace")
        return None
    except SystemdUnavailable as e:
        return str(e)


def main_exit_status(unit: str, invocation_id: str | None, pid: int | None,
                     wait_s: float = 1.0) -> int | None:
    """The exit status systemd recorded for `unit`'s main process, waiting
    briefly for systemd to notice the death; None when unknown."""
    if not unit or not invocation_id:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if int(_unit_get(unit, SERVICE, "ExecMainCode", "i")) != 0 and \
                    (pid is None or int(_unit_get(unit, SERVICE, "ExecMainPID", "u")) == pid):
                return int(_unit_get(unit, SERVICE, "ExecMainStatus", "i"))
        except SystemdUnavailable:
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def daemon_reload() -> str | None:
    """systemctl daemon-reload over D-Bus, waiting until it is done (the
    Reload call returns when the generators have run); why not, or None."""
    try:
        _call("Reload", "")
        return None
    except SystemdUnavailable as e:
        return str(e)


# ------------------------------------------------------------------ liveness

@dataclass(frozen=True)
class ModelState:
    """What systemd says about the model when a probe failed."""
    active_state: str
    sub_state: str
    invocation: str
    job: str            # "" or the type of the job pending on it ("stop", ...)

    @property
    def serving(self) -> bool:
        """Active, its server running, nothing queued: loading, stopping and
        restarting are never probed against."""
        return self.active_state == "active" and self.sub_state == "running" and not self.job

    def describe(self) -> str:
        return f"{self.active_state}/{self.sub_state}" + (f", {self.job} job" if self.job else "")


class Liveness:
    """The model's state and the two jobs the liveness probe queues.  Never
    raises: a probe that cannot ask systemd skips (None) or says why not."""

    def model_state(self, unit: str) -> ModelState | None:
        try:
            job = pending_job_type(unit)
            invocation = _unit_get(unit, UNIT, "InvocationID", "ay")
            return ModelState(_s(_unit_get(unit, UNIT, "ActiveState", "s")),
                              _s(_unit_get(unit, UNIT, "SubState", "s")),
                              bytes(invocation).hex(), job)
        except SystemdUnavailable as e:
            from ...generator.log import NAMES_UNIT, NOTICE
            logging.getLogger(__name__).log(NOTICE, f"cannot ask systemd about {unit}: {e}",
                                            extra=NAMES_UNIT)
            return None

    def forget_restarts(self, unit: str) -> int:
        """Called when the server answers its probe: systemd's count of
        automatic restarts (NRestarts) back to 0, so that the crash-loop
        back-off (RestartSteps=, or pre-start's on systemd < 254) starts again
        from RestartSec= at the next crash.  ResetFailedUnit on a running
        unit touches nothing else.  Returns how many restarts it forgot (0:
        none, or systemd could not say)."""
        try:
            n = restarts_since_asked(unit)
            if n:
                reset_failed(unit)
            return n
        except SystemdUnavailable:
            return 0

    def _queue(self, method: str, unit: str) -> str | None:
        """None when queued, else why not.  Mode "fail": never replaces a job
        an operator queued (a pending stop stays a stop)."""
        try:
            _call(method, "ss", unit.encode(), b"fail")
            return None
        except SystemdUnavailable as e:
            return str(e)

    def try_restart(self, unit: str) -> str | None:
        # try-restart: a unit that is not running (stopped meanwhile) stays so.
        return self._queue("TryRestartUnit", unit)

    def stop(self, unit: str) -> str | None:
        return self._queue("StopUnit", unit)
