"""The one module that talks to systemd (pystemd over D-Bus).  It decodes
pystemd's bytes into str so nothing else sees them, and turns "no systemd
here" into SystemdUnavailable.

Two questions every start asks (act/startlimit.py) and the one every stop
asks (is this stop half of a restart? hooks/unit.py wait_free) go over the
manager's private socket instead, written by hand (systemctl when that
fails, or "no" for the stop's): importing pystemd costs 240-380 ms, two
systemctl calls ~30 ms, the socket under 1 ms (bookworm container), on the
path of every start and stop.  They are here so that this module stays the
only one that talks to systemd."""

from __future__ import annotations

import os
import time
import _thread      # the lock of the private bus; threading would cost a hook its import
from dataclasses import dataclass
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
    unit = _unit(name)
    try:
        svc = unit.Service
        cgroup = _s(svc.ControlGroup)
        if cgroup:
            return cgroup
        where = slice_path(_s(svc.Slice))
        return f"{where}/{name}" if _s(svc.Slice) else ""
    except Exception as e:
        raise SystemdUnavailable(f"cannot read {name}'s ControlGroup: {e}") from None


def service_facts(name: str) -> tuple[str, int, str]:
    """(ControlGroup, MainPID, Restart=) of a system service; raises SystemdUnavailable."""
    unit = _unit(name)
    try:
        svc = unit.Service
        return _s(svc.ControlGroup), int(svc.MainPID), _s(svc.Restart)
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


def _rows(patterns: list[str]) -> list[Any]:
    """ListUnitsByPatterns' rows for glob patterns: name, description, load,
    active, sub state, following, path, job id, job type, job path."""
    manager = _manager()
    try:
        rows = manager.Manager.ListUnitsByPatterns([], [p.encode() for p in patterns])
    except Exception as e:
        raise SystemdUnavailable(f"ListUnitsByPatterns failed: {e}") from None
    return list(rows)


def list_units(patterns: list[str]) -> list[str]:
    """Loaded units matching glob patterns (e.g. "*.service")."""
    rows = _rows(patterns)
    return sorted(_s(row[0]) for row in rows)


def list_unit_states(patterns: list[str]) -> dict[str, str]:
    """Loaded units matching glob patterns -> their ActiveState, in one call."""
    rows = _rows(patterns)
    return {_s(row[0]): _s(row[3]) for row in sorted(rows)}


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


def left_active_at_us(name: str) -> int:
    """Realtime µs of the unit's last ActiveExitTimestamp (0: never active)."""
    try:
        return int(_unit(name).Unit.ActiveExitTimestamp)
    except SystemdUnavailable:
        raise
    except Exception as e:
        raise SystemdUnavailable(f"cannot read {name}: {e}") from None


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
    return queue_stop(unit)


def queue_stop(unit: str) -> str | None:
    """Queue a stop job for `unit` (mode replace), not waiting for it; why not, or None."""
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
            u = _unit(unit)
            job = u.Unit.Job    # (id, object path); id 0: none
            job_type = ""
            if job and int(job[0]):
                from pystemd.base import SDObject
                j = SDObject(destination=b"org.freedesktop.systemd1", path=job[1])
                j.load()
                job_type = _s(j.Job.JobType) or "some"
            return ModelState(_s(u.Unit.ActiveState), _s(u.Unit.SubState),
                              bytes(u.Unit.InvocationID).hex(), job_type)
        except Exception as e:  # SystemdUnavailable, pystemd's DBusError subclasses, OSError
            from ...generator.log import say
            say(5, f"cannot ask systemd about {unit}: {e}", ident="")
            return None

    def _queue(self, method: str, unit: str) -> str | None:
        """None when queued, else why not.  Mode "fail": never replaces a job
        an operator queued (a pending stop stays a stop)."""
        try:
            getattr(_manager().Manager, method)(unit.encode(), b"fail")
            return None
        except Exception as e:
            return str(e) or type(e).__name__

    def try_restart(self, unit: str) -> str | None:
        # try-restart: a unit that is not running (stopped meanwhile) stays so.
        return self._queue("TryRestartUnit", unit)

    def stop(self, unit: str) -> str | None:
        return self._queue("StopUnit", unit)


def daemon_reload() -> str | None:
    """systemctl daemon-reload over D-Bus, waiting until it is done (the
    Reload call returns when the generators have run); why not, or None."""
    try:
        _manager().Manager.Reload()
        return None
    except SystemdUnavailable as e:
        return str(e)
    except Exception as e:
        return f"Reload failed: {e}"


# ------------------------------------------------------- hot path: the private bus

# Two questions every start asks (act/startlimit.py): the manager's private
# socket (root only; no bus daemon, no Hello) answers each in well under a
# millisecond, where a systemctl process costs 12-15 ms and pystemd's import
# more than both.  The few messages they need are written here by hand (the
# D-Bus wire format, little-endian); any trouble falls back to systemctl.
PRIVATE_BUS = "/run/systemd/private"
_MANAGER_PATH = "/org/freedesktop/systemd1"


def _pad(data: bytearray, align: int) -> None:
    data.extend(b"\0" * (-len(data) % align))


def _put_string(data: bytearray, text: str) -> None:
    raw = text.encode()
    _pad(data, 4)
    data.extend(len(raw).to_bytes(4, "little") + raw + b"\0")


class _Connection:
    """An AUTHed connection to the private bus, kept for the rest of the
    process: a hook asks two to four questions, and each connect and AUTH is
    another round trip to a manager busy with the very stop or start that
    asks.  The calls go one at a time, so the next reply read is the one to
    the call just sent; what came after it (a signal) stays in `unread`."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.unread = b""
        self.serial = 0


_kept: list[_Connection] = []
# One call at a time on the kept connection: pre-start asks from a thread
# (act/startlimit.forgive_asked_start_meanwhile) while its checks go on.
_bus_lock = _thread.allocate_lock()


def _connection() -> _Connection:
    if _kept:
        return _kept[0]
    import _socket      # the C module: socket.py would import enum, selectors (generator/log.py)
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except OSError as e:
        raise SystemdUnavailable(f"{PRIVATE_BUS}: {e}") from None
    try:
        sock.settimeout(5.0)
        sock.connect(PRIVATE_BUS)
        uid = str(os.geteuid()).encode().hex().encode()
        # BEGIN with AUTH, as systemctl does: systemd drops what comes
        # in one read with BEGIN (a call sent with it was never answered).
        sock.sendall(b"\0AUTH EXTERNAL " + uid + b"\r\nBEGIN\r\n")
        line = b""
        while not line.endswith(b"\r\n"):
            chunk = sock.recv(256)
            if not chunk:
                raise SystemdUnavailable("the private bus closed during AUTH")
            line += chunk
        if not line.startswith(b"OK "):
            raise SystemdUnavailable(f"the private bus refused AUTH: {line.strip()!r}")
    except OSError as e:
        sock.close()
        raise SystemdUnavailable(f"{PRIVATE_BUS}: {e}") from None
    except SystemdUnavailable:
        sock.close()
        raise
    _kept.append(_Connection(sock))
    return _kept[0]


def warm_bus() -> None:
    """Open the private-bus connection in a thread, now, for a hook that will
    ask (commands.py BUS_FIRST): PID 1 accepts and AUTHs it while the hook's
    modules load.  Only where the hook would ask (root, run by systemd);
    what fails here is left for the first call, which connects anew and
    says why (nothing waits for this thread)."""
    if not os.environ.get("INVOCATION_ID") or not _private_bus():
        return

    def connect() -> None:
        with _bus_lock:          # the first call waits for this connection
            try:
                _connection()
            except SystemdUnavailable:
                pass
    from ..background import Background
    Background(connect)


def _drop_connection() -> None:
    while _kept:
        _kept.pop().sock.close()


def _call(path: str, interface: str, member: str, args: tuple[str, ...]) -> bytes:
    """One method call with string arguments on the private bus; the reply's body."""
    with _bus_lock:
        return _call_locked(path, interface, member, args)


def _call_locked(path: str, interface: str, member: str, args: tuple[str, ...]) -> bytes:
    body = bytearray()
    for arg in args:
        _put_string(body, arg)
    fields = bytearray()
    for code, sig, value in ((1, "o", path), (2, "s", interface), (3, "s", member),
                             (6, "s", "org.freedesktop.systemd1")):
        _pad(fields, 8)
        fields.extend(bytes((code, 1)) + sig.encode() + b"\0")
        _put_string(fields, value)
    if args:
        _pad(fields, 8)
        fields.extend(bytes((8, 1)) + b"g\0" + bytes((len(args),)) + b"s" * len(args) + b"\0")
    while True:
        kept = bool(_kept)
        conn = _connection()
        conn.serial += 1
        header = bytearray(b"l\1\0\1" + len(body).to_bytes(4, "little")
                           + conn.serial.to_bytes(4, "little")
                           + len(fields).to_bytes(4, "little") + fields)
        _pad(header, 8)
        try:
            conn.sock.sendall(header + body)
            kind, reply = _reply(conn)
            break
        except (OSError, SystemdUnavailable) as e:
            _drop_connection()          # where the next message starts is not known
            if kept:
                continue                # closed since (a daemon-reexec): once more, anew
            if isinstance(e, OSError):
                raise SystemdUnavailable(f"{PRIVATE_BUS}: {e}") from None
            raise
    if kind == 3:                   # ERROR: its first argument is the message
        n = int.from_bytes(reply[:4], "little") if len(reply) >= 4 else 0
        raise SystemdUnavailable(reply[4:4 + n].decode(errors="replace") or "error reply")
    return reply


def _reply(conn: _Connection) -> tuple[int, bytes]:
    """The kind (2 METHOD_RETURN, 3 ERROR) and body of the next reply."""
    def need(n: int) -> None:
        while len(conn.unread) < n:
            chunk = conn.sock.recv(65536)
            if not chunk:
                raise SystemdUnavailable("the private bus closed before the reply")
            conn.unread += chunk

    while True:
        need(16)
        data = conn.unread
        if data[:1] != b"l":
            raise SystemdUnavailable("a big-endian reply on the private bus")
        kind = data[1]
        body_len = int.from_bytes(data[4:8], "little")
        fields_len = int.from_bytes(data[12:16], "little")
        start = 16 + fields_len + (-(16 + fields_len) % 8)
        need(start + body_len)
        body = conn.unread[start:start + body_len]
        conn.unread = conn.unread[start + body_len:]
        if kind in (2, 3):       # signals (4), sent unasked here, are skipped
            return kind, body


def _unit_path(name: str) -> str:
    """The manager's object path of a unit (sd_bus_path_encode)."""
    return _MANAGER_PATH + "/unit/" + "".join(
        chr(b) if chr(b).isascii() and (chr(b).isalpha() or (chr(b).isdigit() and i))
        else f"_{b:02x}" for i, b in enumerate(name.encode()))


def _nrestarts_bus(name: str) -> int:
    body = _call(_unit_path(name), "org.freedesktop.DBus.Properties", "Get",
                 ("org.freedesktop.systemd1.Service", "NRestarts"))
    # A variant: signature "u", padded to 4, the value.
    if body[:3] != b"\1u\0" or len(body) < 8:
        raise SystemdUnavailable(f"NRestarts of {name}: unexpected reply {body[:8]!r}")
    return int.from_bytes(body[4:8], "little")


def _string_at(body: bytes, offset: int, what: str) -> str:
    """The D-Bus string (or object path) whose length is at `offset`."""
    n = int.from_bytes(body[offset:offset + 4], "little")
    if len(body) < offset + 4 + n:
        raise SystemdUnavailable(f"{what}: a short reply")
    return body[offset + 4:offset + 4 + n].decode(errors="replace")


def pending_job_type(name: str) -> str:
    """The type of the job systemd is running on the unit ("restart",
    "stop", "start", ...), "" when none; private bus only (root), else
    SystemdUnavailable.  A restart's job is "restart" while it stops the unit
    (ExecStopPost= included) and becomes "start" after; try-restart and
    reload-or-restart are "restart" once queued."""
    if not _private_bus():
        raise SystemdUnavailable("no private bus")
    body = _call(_unit_path(name), "org.freedesktop.DBus.Properties", "Get",
                 ("org.freedesktop.systemd1.Unit", "Job"))
    # A variant "(uo)": the struct at 8, the job's id, then its object path.
    if body[:6] != b"\4(uo)\0" or len(body) < 16:
        raise SystemdUnavailable(f"Job of {name}: unexpected reply {body[:8]!r}")
    if int.from_bytes(body[8:12], "little") == 0:
        return ""
    path = _string_at(body, 12, f"Job of {name}")
    body = _call(path, "org.freedesktop.DBus.Properties", "Get",
                 ("org.freedesktop.systemd1.Job", "JobType"))
    if body[:3] != b"\1s\0":
        raise SystemdUnavailable(f"JobType of {name}: unexpected reply {body[:8]!r}")
    return _string_at(body, 4, f"JobType of {name}")


def sigkills_leftovers(name: str) -> bool:
    """Whether systemd SIGKILLs what is left of the unit's cgroup once its
    stop hooks have run: KillMode= mixed (the template's) or control-group,
    with SendSIGKILL=yes; a [service] KillMode=process or none, or
    SendSIGKILL=no, leaves a stopped server's workers running.  Private bus
    only (root), else SystemdUnavailable."""
    if not _private_bus():
        raise SystemdUnavailable("no private bus")
    path = _unit_path(name)
    body = _call(path, "org.freedesktop.DBus.Properties", "Get",
                 ("org.freedesktop.systemd1.Service", "KillMode"))
    if body[:3] != b"\1s\0":
        raise SystemdUnavailable(f"KillMode of {name}: unexpected reply {body[:8]!r}")
    mode = _string_at(body, 4, f"KillMode of {name}")
    body = _call(path, "org.freedesktop.DBus.Properties", "Get",
                 ("org.freedesktop.systemd1.Service", "SendSIGKILL"))
    # A variant "b": padded to 4, a 32-bit 0 or 1.
    if body[:3] != b"\1b\0" or len(body) < 8:
        raise SystemdUnavailable(f"SendSIGKILL of {name}: unexpected reply {body[:8]!r}")
    return mode in ("mixed", "control-group") and int.from_bytes(body[4:8], "little") == 1


# ------------------------------------------------------- systemctl, the fallback

SYSTEMCTL = ("/usr/bin/systemctl", "/bin/systemctl")
# systemctl's own environment: nothing of the unit's [env] reaches it.
_SYSTEMCTL_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C",
                  "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}


def _systemctl(*args: str) -> str:
    import subprocess
    exe = next((p for p in SYSTEMCTL if os.access(p, os.X_OK)), None)
    if exe is None:
        raise SystemdUnavailable("no systemctl")
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=10,
                              env=_SYSTEMCTL_ENV)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemdUnavailable(f"systemctl {args[0]}: {e}") from None
    if done.returncode != 0:
        raise SystemdUnavailable(f"systemctl {args[0]}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _private_bus() -> bool:
    return os.geteuid() == 0 and os.path.exists(PRIVATE_BUS)


def restarts_since_asked(name: str) -> int:
    """systemd's NRestarts: automatic restarts since the last asked-for start."""
    if _private_bus():
        try:
            return _nrestarts_bus(name)
        except SystemdUnavailable:
            pass                 # systemctl says the same, slower, or says why not
    value = _systemctl("show", "--value", "--property=NRestarts", name).strip()
    if not value.isdigit():
        raise SystemdUnavailable(f"NRestarts of {name} reads {value!r}")
    return int(value)


def reset_failed(name: str) -> None:
    """Clear the unit's failed state and its start-limit counter."""
    if _private_bus():
        try:
            _call(_MANAGER_PATH, "org.freedesktop.systemd1.Manager", "ResetFailedUnit", (name,))
            return
        except SystemdUnavailable:
            pass
    _systemctl("reset-failed", name)
