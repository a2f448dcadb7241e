"""The one probe's kept connection (helpers/facts/probe.py Session), as
wait-ready uses it while a server answers 503: whatever the server does with
the connection between and within answers (keeps it, closes it after an
answer, says "Connection: close", answers HTTP/1.0, sends a chunked or
unbounded body, closes it while the probe sleeps), every probe reports the
status the server sent, and a kept connection is used again only where HTTP
allows it."""

from __future__ import annotations

import os
import select
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from infer_units.helpers.facts.probe import Session, http_probe

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "infer-units-hypothesis"))

# What the server does with one answer.
KINDS = ("keep", "close-after", "connection-close", "http10", "chunked", "no-length",
         "idle-close")


@dataclass
class Script:
    """Answers to give, in order (status, kind), and what the server saw."""
    answers: list[tuple[int, str]] = field(default_factory=list)
    connections: int = 0
    requests: list[int] = field(default_factory=list)     # connection number of each request


class Server:
    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.script = Script()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.script.connections += 1
                number = self.script.connections
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    try:
                        chunk = conn.recv(4096)
                    except OSError:
                        return
                    if not chunk:
                        return
                    data += chunk
                _, _, data = data.partition(b"\r\n\r\n")
                with self.lock:
                    self.script.requests.append(number)
                    code, kind = self.script.answers.pop(0)
                body = b'{"error":{"code":503,"message":"Loading model"}}'
                version = b"HTTP/1.0" if kind == "http10" else b"HTTP/1.1"
                head = version + b" %d X\r\nContent-Type: application/json\r\n" % code
                if kind == "chunked":
                    conn.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n"
                                 + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
                elif kind == "no-length":
                    conn.sendall(head + b"\r\n" + body)
                    return                              # the end of the body is the close
                else:
                    extra = b"Connection: close\r\n" if kind == "connection-close" else b""
                    conn.sendall(head + b"Content-Length: %d\r\n" % len(body) + extra
                                 + b"\r\n" + body)
                if kind in ("close-after", "connection-close", "http10", "idle-close"):
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


answers = st.lists(st.tuples(st.sampled_from([200, 204, 404, 500, 503]), st.sampled_from(KINDS)),
                   min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=answers)
def test_every_probe_reports_the_status_sent_whatever_the_connection_does(
        server: Server, plan: list[tuple[int, str]]) -> None:
    server.script = Script(answers=list(plan))
    session = Session(f"http://127.0.0.1:{server.port}/health")
    try:
        for code, _kind in plan:
            answer = session.probe(5.0)
            assert answer.text == f"HTTP {code}", (plan, answer.text)
            assert answer.ok == (200 <= code < 300)
    finally:
        session.close()
    # A connection is used again only after an answer that allowed it: a
    # non-2xx, HTTP/1.1 answer with a length and no "Connection: close".
    seen = server.script.requests
    for i in range(1, len(seen)):
        code, kind = plan[i - 1]
        reusable = kind == "keep" and not 200 <= code < 300
        if seen[i] == seen[i - 1]:
            assert reusable, (plan, seen)
        else:
            assert not reusable or kind == "idle-close", (plan, seen)


def test_a_loading_server_is_asked_on_one_connection(server: Server) -> None:
    server.script = Script(answers=[(503, "keep")] * 5 + [(200, "keep")])
    session = Session(f"http://127.0.0.1:{server.port}/health")
    texts = [session.probe(5.0).text for _ in range(6)]
    assert texts == ["HTTP 503"] * 5 + ["HTTP 200"]
    assert server.script.connections == 1 and session.conn is None   # a 2xx ends it


def test_a_kept_connection_the_server_closed_meanwhile_is_opened_again(server: Server) -> None:
    # The server drops the connection after answering, without saying so
    # (as when its keep-alive timeout runs out while the probe sleeps).
    server.script = Script(answers=[(503, "idle-close"), (503, "keep"), (200, "keep")])
    session = Session(f"http://127.0.0.1:{server.port}/health")
    assert [session.probe(5.0).text for _ in range(3)] == ["HTTP 503", "HTTP 503", "HTTP 200"]
    assert server.script.requests == [1, 2, 2]


def test_the_one_shot_probe_says_connection_close(server: Server) -> None:
    server.script = Script(answers=[(503, "keep"), (503, "keep")])
    assert http_probe(f"http://127.0.0.1:{server.port}/health", 5.0).text == "HTTP 503"
    assert http_probe(f"http://127.0.0.1:{server.port}/health", 5.0).text == "HTTP 503"
    assert server.script.requests == [1, 2]


def test_a_body_that_never_comes_leaves_the_status_standing() -> None:
    """A 503 whose promised body never arrives: the probe still says 503,
    within its timeout, and the next probe opens a new connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held: list[socket.socket] = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            held.append(conn)
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 503 X\r\nContent-Length: 100\r\n\r\nshort")
    threading.Thread(target=serve, daemon=True).start()
    session = Session(f"http://127.0.0.1:{listener.getsockname()[1]}/health")
    try:
        first = session.probe(60.0)
        second = session.probe(60.0)
        assert (first.text, second.text) == ("HTTP 503", "HTTP 503")
        # The rest of the body would be waited for until the timeout: far above.
        assert first.seconds < 30 and len(held) == 2
    finally:
        session.close()
        for conn in held:
            conn.close()
        listener.close()


# ------------------------------------------------------------------ the deadline

class Trickler:
    """A listener that answers every request a byte at a time (each recv()
    quick, the answer never whole) and records when the probe's side of a
    connection was closed: an orphaned exchange would keep it open."""

    def __init__(self, redirect: bool = False) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.redirect = redirect
        self.accepted = 0
        self.closed = threading.Semaphore(0)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = conn.recv(4096)
            if self.redirect and request.startswith(b"GET /health "):
                conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /slow\r\nContent-Length: 0\r\n\r\n")
            answer = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"x" * 4000
            for byte in answer:
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    break
                readable, _, _ = select.select([conn], [], [], 0.05)
                try:
                    if readable and conn.recv(4096, socket.MSG_PEEK) == b"":
                        break                           # the probe's side closed
                except ConnectionResetError:
                    break                               # ... with unread bytes: a reset
            else:
                return                                  # never closed: no release
            self.closed.release()

    def close(self) -> None:
        self.listener.close()


def _probe_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "infer-units probe"]


@pytest.mark.parametrize("how", ["one-shot", "kept", "redirect"])
def test_a_trickled_answer_ends_at_the_deadline_and_leaves_no_connection(how: str) -> None:
    """http.client's timeout is per read: bytes that come one at a time never
    reach it.  The probe answers at its deadline, and the connection it was
    reading is closed then, not when the trickle ends (minutes later)."""
    server = Trickler(redirect=how == "redirect")
    url = f"http://127.0.0.1:{server.port}/health"
    try:
        started = time.monotonic()
        if how == "kept":
            session = Session(url)
            answer = session.probe(1.0)
            session.close()
        else:
            answer = http_probe(url, 1.0)
        took = time.monotonic() - started
        assert (answer.ok, answer.text) == (False, "no answer within 1s"), answer
        assert took < 60, took          # the deadline, not the trickle's end
        # The trickle lasts over 3 minutes; a close within 10 s is the cut's.
        assert server.closed.acquire(timeout=10), "the probe's connection outlived its deadline"
        assert server.accepted == (2 if how == "redirect" else 1)
        for thread in _probe_threads():
            thread.join(10)
        assert not _probe_threads()
    finally:
        server.close()


def test_a_signal_while_the_probe_waits_ends_its_exchange() -> None:
    """wait-ready's stop raises from a signal handler while a probe waits:
    the exception is the caller's, and the exchange in flight is cut."""
    server = Trickler()

    class Stop(BaseException):
        pass

    def on_alarm(signum: int, frame: object) -> None:
        raise Stop()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Stop):
            http_probe(f"http://127.0.0.1:{server.port}/health", 60.0)
        assert server.closed.acquire(timeout=10), "the probe's connection outlived its caller"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        server.close()


# ------------------------------------------------------------------ answers that are not health

class Canned:
    """Answers every connection with the same bytes, then closes it."""

    def __init__(self, answer: bytes) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.answer = answer
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("answer,text", [
    (b"", "closed the connection without an answer"),
    (b"SSH-2.0-OpenSSH_9.2\r\n", "not HTTP"),
    (b"HTTP/3 200 OK\r\n\r\n", "not HTTP"),
    (b"HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n", "HTTP 302 without a Location"),
    (b"HTTP/1.1 302 Found\r\nLocation: /health\r\nContent-Length: 0\r\n\r\n",
     "more than 10 redirects"),
    (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", "a head without an end"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-Many: 1\r\n" * 200 + b"\r\n", "a head without an end"),
])
@pytest.mark.parametrize("keep", [False, True])
def test_an_answer_that_is_not_health_is_a_failed_probe_with_its_reason(
        answer: bytes, text: str, keep: bool) -> None:
    server = Canned(answer)
    session = Session(f"http://127.0.0.1:{server.port}/health", keep=keep)
    try:
        got = session.probe(5.0)
        assert not got.ok and got.text.startswith(text), got
        assert session.conn is None
    finally:
        session.close()
        server.close()


def test_https_to_a_plain_listener_is_a_tls_failure() -> None:
    server = Canned(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    try:
        got = http_probe(f"https://127.0.0.1:{server.port}/health", 5.0)
        assert not got.ok and got.text.startswith("TLS: "), got
    finally:
        server.close()


def test_a_tls_handshake_that_never_ends_is_within_the_deadline() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)          # accepted by the kernel, never answered
    try:
        started = time.monotonic()
        got = http_probe(f"https://127.0.0.1:{listener.getsockname()[1]}/health", 1.0)
        took = time.monotonic() - started
        # The deadline, not the handshake's end (never): any bound tells.
        assert (got.ok, got.text) == (False, "no answer within 1s") and took < 60, (got, took)
    finally:
        listener.close()
