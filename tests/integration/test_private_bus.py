"""facts/systemd.py's hand-written private-bus client against a real Unix
socket that speaks the D-Bus wire format as systemd answers it: the stop's
question (is this stop half of a restart, and does systemd SIGKILL the old
run's leftovers?), asked with the replies systemd sends and with the broken
ones it must refuse.  Any refusal is SystemdUnavailable, which the hook
reads as "no: wait as on every stop".  The real systemd answers the same
questions in tests/e2e/test_e2e.py (a restart skips, a stop and a crash wait)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infer_units.helpers.facts import systemd

JOB = "/org/freedesktop/systemd1/job/42"
UNIT = systemd._unit_path("alpha.service")


def _string(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "little") + data + b"\0"


def variant_s(text: str) -> bytes:
    return b"\1s\0\0" + _string(text)


def variant_b(value: int) -> bytes:
    return b"\1b\0\0" + value.to_bytes(4, "little")


def variant_job(job_id: int, path: str = "/") -> bytes:
    return b"\4(uo)\0\0\0" + job_id.to_bytes(4, "little") + _string(path)


def _message(kind: int, body: bytes) -> bytes:
    # No header fields: the client reads the kind, the lengths and the body.
    return b"l" + bytes([kind, 0, 1]) + len(body).to_bytes(4, "little") \
        + (1).to_bytes(4, "little") + (0).to_bytes(4, "little") + body


def _request(data: bytes) -> tuple[str, str]:
    """The object path and the property a Get asked for."""
    fields_len = int.from_bytes(data[12:16], "little")
    fields = data[16:16 + fields_len]
    at = fields.index(b"/org/freedesktop/systemd1")
    path = fields[at:at + int.from_bytes(fields[at - 4:at], "little")].decode()
    start = 16 + fields_len + (-(16 + fields_len) % 8)
    body, args = data[start:], []
    while body:
        n = int.from_bytes(body[:4], "little")
        args.append(body[4:4 + n].decode())
        body = body[4 + n + 1 + (-(4 + n + 1) % 4):]
    return path, args[-1]


Answers = dict[tuple[str, str], bytes]


@pytest.fixture
def bus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Answers], list]]:
    """A private bus answering Get(path, property) from a table; an absent
    key is an ERROR reply, as systemd's for an unknown object."""
    if os.geteuid() != 0:
        pytest.skip("the private bus is asked only as root")
    path = tmp_path / "private"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    monkeypatch.setattr(systemd, "PRIVATE_BUS", str(path))
    answers: Answers = {}
    asked: list[tuple[str, str]] = []
    # How many calls a connection answers before the server closes it (as a
    # daemon-reexec does); 0: as many as come.
    per_connection = [0]
    connections = [0]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections[0] += 1
            with conn:
                data = b""
                while b"BEGIN\r\n" not in data:
                    data += conn.recv(4096)
                conn.sendall(b"OK 0123456789abcdef\r\n")
                data = data.split(b"BEGIN\r\n", 1)[1]
                answered, rest_of_signal = 0, b""
                while not per_connection[0] or answered < per_connection[0]:
                    while len(data) < 16 or len(data) < _total(data):
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    if len(data) < 16 or len(data) < _total(data):
                        break
                    key = _request(data[:_total(data)])
                    data = data[_total(data):]
                    asked.append(key)
                    # Signals, sent unasked as systemd does to its clients:
                    # one before the reply, one cut after it, its rest sent
                    # before the next reply.
                    signal = _message(4, b"\0" * 24)
                    reply = _message(2 if key in answers else 3,
                                     answers.get(key, _string("Unknown object")))
                    conn.sendall(rest_of_signal + signal + reply + signal[:10])
                    rest_of_signal = signal[10:]
                    answered += 1

    threading.Thread(target=serve, daemon=True).start()

    def set_answers(table: Answers, calls_per_connection: int = 0) -> list:
        systemd._drop_connection()
        answers.clear()
        answers.update(table)
        asked.clear()
        per_connection[0] = calls_per_connection
        connections[0] = 0
        return asked
    set_answers.connections = connections      # type: ignore[attr-defined]
    yield set_answers
    systemd._drop_connection()
    listener.close()


def _total(data: bytes) -> int:
    fields_len = int.from_bytes(data[12:16], "little")
    return 16 + fields_len + (-(16 + fields_len) % 8) + int.from_bytes(data[4:8], "little")


def test_a_restart_job_is_read_through_its_object_path(bus) -> None:
    asked = bus({(UNIT, "Job"): variant_job(42, JOB), (JOB, "JobType"): variant_s("restart")})
    assert systemd.pending_job_type("alpha.service") == "restart"
    assert asked == [(UNIT, "Job"), (JOB, "JobType")]


def test_no_job_is_the_empty_type_without_a_second_call(bus) -> None:
    asked = bus({(UNIT, "Job"): variant_job(0, "/")})
    assert systemd.pending_job_type("alpha.service") == ""
    assert asked == [(UNIT, "Job")]


@pytest.mark.parametrize("job_reply, type_reply", [
    (variant_job(42, JOB)[:14], None),                         # cut inside the path
    (variant_job(42, JOB)[:6], None),                          # no struct at all
    (b"\1s\0\0" + _string("restart"), None),                   # not a "(uo)"
    (variant_job(42, JOB), b"\1s\0\0\xff\xff\xff\xff"),        # a length past the end
    (variant_job(42, JOB), variant_b(1)),                      # JobType not a string
    (variant_job(42, JOB), None),                              # the job vanished (error)
])
def test_a_reply_systemd_would_not_send_is_unavailable(bus, job_reply, type_reply) -> None:
    table = {(UNIT, "Job"): job_reply}
    if type_reply is not None:
        table[(JOB, "JobType")] = type_reply
    bus(table)
    with pytest.raises(systemd.SystemdUnavailable):
        systemd.pending_job_type("alpha.service")


@pytest.mark.parametrize("mode, sigkill, kills", [
    ("mixed", 1, True), ("control-group", 1, True),
    ("process", 1, False), ("none", 1, False), ("mixed", 0, False),
])
def test_leftovers_are_killed_only_with_a_group_kill_mode_and_sigkill(
        bus, mode: str, sigkill: int, kills: bool) -> None:
    bus({(UNIT, "KillMode"): variant_s(mode), (UNIT, "SendSIGKILL"): variant_b(sigkill)})
    assert systemd.sigkills_leftovers("alpha.service") is kills


@pytest.mark.parametrize("table", [
    {(UNIT, "KillMode"): variant_b(1)},
    {(UNIT, "KillMode"): variant_s("mixed"), (UNIT, "SendSIGKILL"): b"\1b\0"},
    {(UNIT, "KillMode"): variant_s("mixed")},
])
def test_a_kill_setting_that_cannot_be_read_is_unavailable(bus, table: Answers) -> None:
    bus(table)
    with pytest.raises(systemd.SystemdUnavailable):
        systemd.sigkills_leftovers("alpha.service")


def test_without_the_private_bus_the_question_is_not_asked(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(systemd, "PRIVATE_BUS", str(tmp_path / "absent"))
    for ask in (systemd.pending_job_type, systemd.sigkills_leftovers):
        with pytest.raises(systemd.SystemdUnavailable):
            ask("alpha.service")


def test_the_questions_of_a_hook_share_one_connection(bus) -> None:
    asked = bus({(UNIT, "Job"): variant_job(42, JOB), (JOB, "JobType"): variant_s("restart"),
                 (UNIT, "KillMode"): variant_s("mixed"), (UNIT, "SendSIGKILL"): variant_b(1)})
    assert systemd.pending_job_type("alpha.service") == "restart"
    assert systemd.sigkills_leftovers("alpha.service") is True
    assert len(asked) == 4 and bus.connections[0] == 1


def test_an_error_reply_leaves_the_connection_usable(bus) -> None:
    asked = bus({(UNIT, "KillMode"): variant_s("process"), (UNIT, "SendSIGKILL"): variant_b(1)})
    with pytest.raises(systemd.SystemdUnavailable, match="Unknown object"):
        systemd.pending_job_type("alpha.service")
    assert systemd.sigkills_leftovers("alpha.service") is False
    assert len(asked) == 3 and bus.connections[0] == 1


def test_a_kept_connection_closed_since_is_opened_again_once(bus) -> None:
    # The server closes each connection after one answer (a daemon-reexec).
    asked = bus({(UNIT, "KillMode"): variant_s("mixed"), (UNIT, "SendSIGKILL"): variant_b(1)},
                calls_per_connection=1)
    assert systemd.sigkills_leftovers("alpha.service") is True
    assert len(asked) == 2 and bus.connections[0] == 2


def test_a_warmed_connection_is_the_one_the_questions_use(bus, monkeypatch) -> None:
    """entry.py opens wait-free's connection in a thread (warm_bus) while the
    hook's modules load; the questions then go over it, after it is up."""
    monkeypatch.setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
    asked = bus({(UNIT, "Job"): variant_job(42, JOB), (JOB, "JobType"): variant_s("restart")})
    systemd.warm_bus()
    assert systemd.pending_job_type("alpha.service") == "restart"
    assert asked == [(UNIT, "Job"), (JOB, "JobType")]
    assert bus.connections[0] == 1


def test_no_warm_up_outside_a_unit_and_a_failed_one_is_no_error(bus, monkeypatch,
                                                                  tmp_path) -> None:
    from infer_units.helpers import background
    real_background = background.Background
    started: list[object] = []
    monkeypatch.setattr(background, "Background", lambda work: started.append(work))
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    bus({(UNIT, "Job"): variant_job(0, "/")})
    systemd.warm_bus()
    assert started == []          # not run by systemd: no thread, no connection
    monkeypatch.setattr(background, "Background", real_background)
    # A bus that is not there when warmed: the first call says so itself.
    monkeypatch.setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
    real = systemd.PRIVATE_BUS
    monkeypatch.setattr(systemd, "PRIVATE_BUS", str(tmp_path / "absent"))
    monkeypatch.setattr(systemd, "_private_bus", lambda: True)
    systemd.warm_bus()
    with pytest.raises(systemd.SystemdUnavailable):
        systemd.pending_job_type("alpha.service")
    monkeypatch.setattr(systemd, "PRIVATE_BUS", real)
    assert systemd.pending_job_type("alpha.service") == ""
