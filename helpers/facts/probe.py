"""The one HTTP health probe: readiness (wait-ready), liveness, status and the
multi-node worker all ask a server's health through it, on a URL read by the
one parser (generator/urls.py), so a URL means the same request everywhere.

Healthy is a 2xx status line within the timeout, judged after redirects; a
2xx's body is not read (SGLang's /health sends its status only after
generating a token).  The timeout is one deadline for the whole exchange:
the name's lookup, the connect, TLS, every redirect and every byte, since
the listener on a model's port is not necessarily the model
(docs/trust.md).  For the same reason a redirect is followed only within
the URL's own origin (scheme, host and port).

A waiter that asks again and again (wait-ready, while a server answers 503)
keeps one plain-http connection open between its requests (`Session`): a
new loopback connection and its teardown per probe were most of a probe's
CPU (docs/performance.md)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...generator.urls import Url, is_ipv6, parse_url

@dataclass(frozen=True)
class Answer:
    ok: bool            # a 2xx status line within the timeout
    text: str           # "HTTP 200", "HTTP 503", "no answer within 10s", ...
    seconds: float


# A kept connection reads a non-2xx answer's body to its end to reuse it;
# a longer one (or one without a length) ends the connection instead.
_KEPT_BODY_MAX = 65536
_REST_WAIT_S = 0.1
# The most redirects followed (urllib's own limit) and the most bytes of a
# status line and headers read.
MAX_REDIRECTS = 10
_HEAD_MAX = 65536

Left = Callable[[], float]


class _Refused(Exception):
    """An answer that is not a health answer: the message says why."""


def http_probe(url: str | Url, timeout: float, body: str | None = None) -> Answer:
    """GET url (POST `body`, JSON, when given: the one-token completion of
    [liveness] probe = "generate"), on a connection of its own."""
    return Session(url, keep=False).probe(timeout, body)


class Session:
    """Probes of one URL.  keep=True: a plain-http connection stays open
    between them while the server allows it (HTTP/1.1 keep-alive), and is
    opened again when the server closed it meanwhile.  close() ends it."""

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

        def answer(ok: bool, text: str) -> Answer:
            return Answer(ok, text, time.monotonic() - started)

        try:
            url = self.url if isinstance(self.url, Url) else parse_url(self.url)
            for hop in range(MAX_REDIRECTS + 1):
                if hop == 0 and url.scheme == "http" and self.keep and body is None:
                    code, head = self._kept_exchange(url, left)
                else:
                    code, head = _exchange(url, body, left)
                if not 300 <= code < 400:
                    return answer(200 <= code < 300, f"HTTP {code}")
                url = _redirect(url, _location(head, code))
                if code not in (307, 308):
                    body = None         # 301, 302, 303: the next request is a GET
            return answer(False, f"more than {MAX_REDIRECTS} redirects")
        except socket.timeout:
            self.close()
            return answer(False, f"no answer within {timeout:g}s")
        except (_Refused, ValueError) as e:
            self.close()
            return answer(False, str(e))
        except OSError as e:     # ssl.SSLError included
            self.close()
            reason = getattr(e, "reason", None)     # an ssl.SSLError's
            return answer(False, f"TLS: {reason}" if reason else e.strerror or str(e))

    def _kept_exchange(self, url: Url, left: Left) -> tuple[int, bytes]:
        """The first request on the kept connection (opened when missing, or
        again once when the server closed it while we slept)."""
        request = _request(url, None, keep=True)
        if self.sock is not None and not _idle(self.sock):
            self.close()            # bytes no request of ours asked for, or closed
        reused = self.sock is not None
        if self.sock is None:
            self.sock = _connect(url, left)
        try:
            data = _send_and_read_status(self.sock, request, left)
        except socket.timeout:
            raise                   # slow, not gone: asking again would not help
        except OSError:
            if not reused:
                raise
            data = b""
        if not data and reused:
            # A GET: asking again on a new connection changes nothing.
            self.close()
            self.sock = _connect(url, left)
            data = _send_and_read_status(self.sock, request, left)
        code, version = _status(data)
        if 300 <= code < 400:
            data = _read_head(self.sock, data, left)
            self.close()
        elif not 200 <= code < 300:
            self._finish(data, version, left)
        else:
            self.close()
        return code, data

    def _finish(self, data: bytes, version: bytes, left: Left) -> None:
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
        try:
            data = _read_head(sock, data, left_rest, _KEPT_BODY_MAX)
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
                sock.settimeout(left_rest())
                chunk = sock.recv(min(65536, length - len(rest)))
                if not chunk:
                    raise OSError("closed")
                rest += chunk
            if len(rest) != length:
                raise OSError("more than the answer")   # pipelined bytes: not ours to guess
        except (OSError, _Refused):
            self.close()


def _request(url: Url, body: str | None, keep: bool) -> bytes:
    payload = body.encode("utf-8") if body is not None else b""
    extra = (f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
             if body is not None else "")
    connection = "" if keep else "Connection: close\r\n"
    return (f"{'POST' if body is not None else 'GET'} {url.target} HTTP/1.1\r\n"
            f"Host: {url.authority}\r\nUser-Agent: infer-units\r\n"
            f"Accept: */*\r\n{extra}{connection}\r\n").encode("ascii") + payload


def _exchange(url: Url, body: str | None, left: Left) -> tuple[int, bytes]:
    """One request on a connection of its own: the status and what was read
    of the head (all of it for a redirect)."""
    sock = _connect(url, left)
    try:
        data = _send_and_read_status(sock, _request(url, body, keep=False), left)
        code, _version = _status(data)
        if 300 <= code < 400:
            data = _read_head(sock, data, left)
        return code, data
    finally:
        sock.close()


def _addresses(url: Url, left: Left) -> list[tuple[int, tuple[object, ...]]]:
    """Where to connect: an address as it is; a name looked up in a thread,
    since getaddrinfo() takes no timeout (a lookup that outlives the
    deadline is left to end on its own)."""
    if url.host.replace(".", "").isdigit() or is_ipv6(url.host):
        family = socket.AF_INET6 if ":" in url.host else socket.AF_INET
        return [(family, (url.host, url.port))]
    found: list[list[tuple[int, tuple[object, ...]]]] = []
    failed: list[OSError] = []

    def look_up() -> None:
        try:
            found.append([(info[0], info[4]) for info in socket.getaddrinfo(
                url.host, url.port, type=socket.SOCK_STREAM)])
        except OSError as e:
            failed.append(e)
    lookup = threading.Thread(target=look_up, daemon=True)
    lookup.start()
    lookup.join(left())
    if failed:
        raise failed[0]
    if not found:
        raise socket.timeout()
    return found[0]


def _connect(url: Url, left: Left) -> socket.socket:
    error: OSError = OSError(f"{url.host}: no address")
    for family, address in _addresses(url, left):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(left())
            sock.connect(address)
            if url.scheme == "https":
                import ssl      # here: a plain-http waiter never loads OpenSSL
                context = ssl.create_default_context()
                sock.settimeout(left())     # the handshake, all of it, within this
                return context.wrap_socket(sock, server_hostname=url.host)
            return sock
        except socket.timeout:
            sock.close()
            raise
        except OSError as e:
            sock.close()
            error = e
    raise error


def _send_and_read_status(sock: socket.socket, request: bytes, left: Left) -> bytes:
    """Send the request; what came back up to the status line's end."""
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


def _status(data: bytes) -> tuple[int, bytes]:
    """The status code and HTTP version of the status line in `data`."""
    head_end = data.find(b"\r\n")
    words = data[:head_end if head_end >= 0 else len(data)].split()
    if len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
        raise _Refused("closed the connection without an answer" if not data else "not HTTP")
    return int(words[1]), words[0]


def _read_head(sock: socket.socket, data: bytes, left: Left, limit: int = _HEAD_MAX) -> bytes:
    """`data` read on to the end of the head (status line and headers)."""
    while b"\r\n\r\n" not in data:
        if len(data) >= limit:
            raise _Refused("a head without an end")
        sock.settimeout(left())
        chunk = sock.recv(4096)
        if not chunk:
            raise _Refused("closed the connection in the middle of an answer")
        data += chunk
    return data


def _location(head: bytes, code: int) -> str:
    for line in head.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"location":
            return value.strip().decode("ascii", errors="replace")
    raise _Refused(f"HTTP {code} without a Location")


def _redirect(url: Url, location: str) -> Url:
    """Where a redirect leads, only within the URL's origin (scheme, host,
    port): a listener on the model's port must not send root's probe to
    another host or service, nor turn http into https or back."""
    if location.startswith("//"):
        location = f"{url.scheme}:{location}"
    if "://" in location.partition("?")[0]:
        target = parse_url(location)
        if (target.scheme, target.host.lower(), target.port) != \
                (url.scheme, url.host.lower(), url.port):
            raise _Refused(f"redirect to {target.scheme}://{target.authority} refused: "
                           f"only {url.scheme}://{url.authority} is probed")
        return target
    if not location.startswith("/"):
        # Relative to the current path's directory (RFC 3986 5.2.3).
        base = url.target.partition("?")[0]
        location = base[:base.rfind("/") + 1] + location
    return parse_url(f"{url.scheme}://{url.authority}{location}")


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


def local_address(url: Url) -> tuple[str, int] | None:
    """(address, port) to connect() to while a server loads, for a URL on this
    host; else None (a remote health URL, e.g. a multi-node head's, is probed
    over HTTP only)."""
    if url.host in ("127.0.0.1", "localhost", "0.0.0.0"):
        return "127.0.0.1", url.port
    if url.host in ("::1", "::"):
        return "::1", url.port
    return None
