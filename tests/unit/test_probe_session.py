"""The one probe's kept connection (helpers/facts/probe.py Session), as
wait-ready uses it while a server answers 503: whatever the server does with
the connection between and within answers (keeps it, closes it after an
answer, says "Connection: close", answers HTTP/1.0, sends a chunked or
unbounded body, closes it while the probe sleeps), every probe reports the
status the server sent, and a kept connection is used again only where HTTP
allows it."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
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
    assert server.script.connections == 1 and session.sock is None   # a 2xx ends it


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
        first = session.probe(0.5)
        second = session.probe(0.5)
        assert (first.text, second.text) == ("HTTP 503", "HTTP 503")
        assert first.seconds < 0.5 and len(held) == 2
    finally:
        session.close()
        for conn in held:
            conn.close()
        listener.close()
