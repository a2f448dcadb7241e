"""The one HTTP health probe: readiness (wait-ready), liveness, status and the
multi-node worker all ask a server's health through it, on a URL read by the
one parser (generator/urls.py), so a URL means the same request everywhere.

Plain sockets for http:// (http.client alone costs more than the rest of a
probe); urllib only for https:// and to follow a redirect, on the same
parsed URL.  Healthy is a 2xx status line within the timeout, judged after
redirects; a 2xx's body is not read (SGLang's /health sends its status only
after generating a token).

A waiter that asks again and again (wait-ready, every 50 ms while a server
answers 503) keeps one connection open between its requests (`Session`):
a new loopback connection and its teardown were ~60% of a probe's CPU here
(590 against 220 us a probe after 50 ms asleep), 1.1% of a core at 20
probes a second."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...generator.urls import Url, parse_url


@dataclass(frozen=True)
class Answer:
    ok: bool            # a 2xx status line within the timeout
    text: str           # "HTTP 200", "HTTP 503", "no answer within 10s", ...
    seconds: float


def http_probe(url: str | Url, timeout: float, body: str | None = None) -> Answer:
    """GET url (POST `body`, JSON, when given: the one-token completion of
    [liveness] probe = "generate"), on a connection of its own."""
    return Session(url, keep=False).probe(timeout, body)


# A kept connection reads a non-2xx answer's body to its end to reuse it;
# a longer one (or one without a length) ends the connection instead.
_KEPT_BODY_MAX = 65536
_REST_WAIT_S = 0.1


class Session:
    """Probes of one URL.  keep=True: the connection stays open between them
    while the server allows it (HTTP/1.1 keep-alive), and is opened again
    when the server closed it meanwhile.  close() ends it."""

    def __init__(self, url: str | Url, keep: bool = True) -> None:
        self.url = url
        self.keep = keep
        self.sock: socket.socket | None = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def probe(self, timeout: float, body: str | None = None) -> Answer:
        started = time.monotonic()
        deadline = started + timeout

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout()
            return remaining

        try:
            parsed = self.url if isinstance(self.url, Url) else parse_url(self.url)
            if parsed.scheme == "https":
                return _urllib_probe(parsed, timeout, timeout, started, body)
            keep = self.keep and body is None
            payload = body.encode("utf-8") if body is not None else b""
            extra = (f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                     if body is not None else "")
            connection = "" if keep else "Connection: close\r\n"
            request = (f"{'POST' if body is not None else 'GET'} {parsed.target} HTTP/1.1\r\n"
                       f"Host: {parsed.authority}\r\nUser-Agent: infer-units\r\n"
                       f"Accept: */*\r\n{extra}{connection}\r\n").encode("ascii") + payload
            if self.sock is not None and not _idle(self.sock):
                self.close()            # bytes no request of ours asked for, or closed
            reused = self.sock is not None
            if self.sock is None:
                self.sock = socket.create_connection((parsed.host, parsed.port), timeout=left())
            try:
                data = self._exchange(request, left)
            except socket.timeout:
                raise                   # slow, not gone: asking again would not help
            except OSError:
                if not reused:
                    raise
                data = b""
            if not data and reused:
                # The server closed the kept connection while we slept: once
                # more on a new one (a GET: asking again changes nothing).
                self.close()
                self.sock = socket.create_connection((parsed.host, parsed.port), timeout=left())
                data = self._exchange(request, left)
            seconds = time.monotonic() - started
            head_end = data.find(b"\r\n")
            words = data[:head_end if head_end >= 0 else len(data)].split()
            if len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
                self.close()
                what = "closed the connection without an answer" if not data else "not HTTP"
                return Answer(False, what, seconds)
            code = int(words[1])
            if keep and not 200 <= code < 300 and not 300 <= code < 400:
                self._finish(data, words[0], left)
            else:
                self.close()
            if 300 <= code < 400:
                # Judged after redirects, the same for readiness and liveness.
                return _urllib_probe(parsed, left(), timeout, started, body)
            return Answer(200 <= code < 300, f"HTTP {code}", seconds)
        except socket.timeout:
            self.close()
            return Answer(False, f"no answer within {timeout:g}s", time.monotonic() - started)
        except ValueError as e:
            self.close()
            return Answer(False, str(e), time.monotonic() - started)
        except OSError as e:
            self.close()
            return Answer(False, e.strerror or str(e), time.monotonic() - started)

    def _exchange(self, request: bytes, left: Callable[[], float]) -> bytes:
        """Send the request; what came back up to the status line's end."""
        sock = self.sock
        assert sock is not None
        sock.settimeout(left())
        sock.sendall(request)
        data = b""
        while b"\r\n" not in data and len(data) < 4096:
            sock.settimeout(left())
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        return data

    def _finish(self, data: bytes, version: bytes, left: Callable[[], float]) -> None:
        """Read the rest of a non-2xx answer so the connection can carry the
        next request; close it where that cannot be known or is not allowed.
        Whatever happens here, the answer's status stands."""
        sock = self.sock
        assert sock is not None
        # The rest comes with the status line from any server we know; one
        # that dawdles costs the connection, not the waiter's next probe.
        until = min(time.monotonic() + _REST_WAIT_S, time.monotonic() + left())

        def left_rest() -> float:
            remaining = until - time.monotonic()
            if remaining <= 0:
                raise socket.timeout()
            return remaining
        left = left_rest
        try:
            while b"\r\n\r\n" not in data and len(data) < _KEPT_BODY_MAX:
                sock.settimeout(left())
                chunk = sock.recv(4096)
                if not chunk:
                    raise OSError("closed")
                data += chunk
            if b"\r\n\r\n" not in data:
                raise OSError("a head without an end")
            head, _, rest = data.partition(b"\r\n\r\n")
            length: int | None = None
            persistent = version == b"HTTP/1.1"
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name, value = name.strip().lower(), value.strip().lower()
                if name == b"content-length":
                    if not value.isdigit() or (length is not None and length != int(value)):
                        raise OSError("an unclear length")
                    length = int(value)
                elif name == b"transfer-encoding":
                    length = None
                    break
                elif name == b"connection":
                    persistent = value == b"keep-alive" if version != b"HTTP/1.1" else value != b"close"
            if length is None or not persistent or length > _KEPT_BODY_MAX:
                raise OSError("not reusable")
            while len(rest) < length:
                sock.settimeout(left())
                chunk = sock.recv(min(65536, length - len(rest)))
                if not chunk:
                    raise OSError("closed")
                rest += chunk
            if len(rest) != length:
                raise OSError("more than the answer")   # pipelined bytes: not ours to guess
        except OSError:
            self.close()


def _idle(sock: socket.socket) -> bool:
    """A kept connection with nothing to read and still open: safe to ask on."""
    try:
        sock.settimeout(0)      # with a timeout, recv() would first wait for data
        sock.recv(1, socket.MSG_PEEK)
        return False            # data nobody asked for, or b"": closed
    except BlockingIOError:
        return True
    except OSError:
        return False


def _urllib_probe(url: Url, left: float, timeout: float, started: float,
                  body: str | None = None) -> Answer:
    """https, and redirects: urllib (slower to import), on the parsed URL's text."""
    import http.client
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url.text()) if body is None else urllib.request.Request(
        url.text(), data=body.encode("utf-8"), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=left) as response:
            code = response.status
    except urllib.error.HTTPError as e:
        code = e.code
    except http.client.HTTPException as e:        # a redirect's target that is not HTTP
        return Answer(False, f"not HTTP ({type(e).__name__})", time.monotonic() - started)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, socket.timeout) or "timed out" in str(reason):
            return Answer(False, f"no answer within {timeout:g}s", time.monotonic() - started)
        return Answer(False, str(reason), time.monotonic() - started)
    return Answer(200 <= code < 300, f"HTTP {code}", time.monotonic() - started)


def local_address(url: Url) -> tuple[str, int] | None:
    """(address, port) to connect() to while a server loads, for a URL on this
    host; else None (a remote health URL, e.g. a multi-node head's, is probed
    over HTTP only)."""
    if url.host in ("127.0.0.1", "localhost", "0.0.0.0"):
        return "127.0.0.1", url.port
    if url.host in ("::1", "::"):
        return "::1", url.port
    return None
