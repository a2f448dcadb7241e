"""The one HTTP health probe: readiness (wait-ready), liveness, status and the
multi-node worker all ask a server's health through it, on a URL read by the
one parser (generator/urls.py), so a URL means the same request everywhere.
HTTP itself is the standard library's http.client.

Healthy is a 2xx status within the timeout, judged after redirects; a 2xx's
body is not read (SGLang's /health sends its status only after generating a
token), unless the caller asks for it (the known-answer check): then at most
`read` bytes of it, within the same deadline, and a longer body is no answer.  The timeout is one deadline for the whole exchange: the connect,
TLS, every redirect and every byte, since the listener on a model's port is
not necessarily the model (docs/trust.md).  http.client's own timeout is per
socket operation, so a listener that trickles its answer a byte at a time
would hold it for ever; hence the exchange runs in a thread of its own, the
caller waits for it until the deadline, and then cuts the connection in
flight (a shutdown wakes a blocked read or TLS handshake at once) and stops
the thread from opening another.  A name's lookup takes no timeout: one that
outlives the deadline is left to end on its own, and what it would connect
to is closed unasked.  For the same reason a redirect is followed only
within the URL's own origin (scheme, host and port).

A waiter that asks again and again (wait-ready, while a server answers 503)
keeps one plain-http connection open between its requests (`Session`): a
new loopback connection and its teardown per probe were most of a probe's
CPU (docs/performance.md)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass

from ...generator.urls import Url, parse_url


@dataclass(frozen=True)
class Answer:
    ok: bool            # a 2xx status line within the timeout
    text: str           # "HTTP 200", "HTTP 503", "no answer within 10s", ...
    seconds: float
    # The address the answer came from (the connection's peer): whose
    # listener answered is judged there, not by the port alone.
    peer: str | None = None
    body: bytes | None = None   # a 2xx's body, when asked for (read > 0)


# A kept connection reads a non-2xx answer's body to its end to reuse it; a
# longer one (or one without a length) ends the connection instead.  The
# rest comes with the status line from any server we know; one that dawdles
# costs the connection, not the waiter's next probe.
_KEPT_BODY_MAX = 65536
_REST_WAIT_S = 0.1
# The most redirects followed (urllib's own limit).
MAX_REDIRECTS = 10


class _Refused(Exception):
    """An answer that is not a health answer: the message says why."""


class _Cut(Exception):
    """The caller's deadline passed: this exchange ends unheard."""


def http_probe(url: str | Url, timeout: float, body: str | None = None,
               read: int = 0) -> Answer:
    """GET url (POST `body`, JSON, when given: the one-token completion of
    [liveness] probe = "generate"), on a connection of its own.  `read`: a
    2xx's body is read, up to that many bytes (more: not ok)."""
    return Session(url, keep=False).probe(timeout, body, read)


@dataclass
class _Outcome:
    ok: bool
    text: str
    kept: http.client.HTTPConnection | None     # to ask on next time
    peer: str | None = None
    body: bytes | None = None


class _Line:
    """One probe's connection in flight, shared by the caller and the thread
    that runs the exchange: the caller cuts it at the deadline; the thread
    registers each connection before it uses it and hands over its outcome,
    both under the lock, so once cut no connection stays open and no
    outcome is taken."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.lock = threading.Lock()
        self.cut = False
        self.conn: http.client.HTTPConnection | None = None
        self.outcome: _Outcome | BaseException | None = None

    def left(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError()
        return remaining

    def open(self, url: Url) -> http.client.HTTPConnection:
        """A new connection to url's origin, connected (TLS included)."""
        conn: http.client.HTTPConnection
        if url.scheme == "https":
            # http.client has loaded ssl already; its default context is
            # what verifies the server's certificate and name.
            import ssl
            conn = http.client.HTTPSConnection(url.host, url.port, timeout=self.left(),
                                               context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(url.host, url.port, timeout=self.left())
        self.use(conn)
        conn.connect()
        self.use(conn)          # cut while it connected: closed here
        return conn

    def use(self, conn: http.client.HTTPConnection) -> None:
        """conn is the connection in flight (its reads bounded by the
        deadline as well); none once the caller cut the exchange."""
        with self.lock:
            if self.cut:
                conn.close()
                raise _Cut()
            self.conn = conn
        if conn.sock is not None:
            conn.sock.settimeout(self.left())

    def close(self, conn: http.client.HTTPConnection) -> None:
        with self.lock:
            conn.close()
            if self.conn is conn:
                self.conn = None

    def hand_over(self, outcome: _Outcome | BaseException) -> None:
        """The thread's last step: the outcome, unless the caller gave up."""
        with self.lock:
            if not self.cut:
                self.outcome = outcome
                return
        if isinstance(outcome, _Outcome) and outcome.kept is not None:
            outcome.kept.close()

    def take_or_cut(self) -> _Outcome | BaseException | None:
        """The caller's last step: the outcome if the thread handed it over,
        else cut the connection in flight and return None."""
        with self.lock:
            if self.outcome is not None:
                return self.outcome
            self.cut = True
            if self.conn is not None and self.conn.sock is not None:
                try:
                    self.conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass            # closed meanwhile: nothing left to cut
            return None


class Session:
    """Probes of one URL.  keep=True: a plain-http connection stays open
    between them while the server allows it (HTTP/1.1 keep-alive), and is
    opened again when the server closed it meanwhile.  close() ends it."""

    def __init__(self, url: str | Url, keep: bool = True) -> None:
        self.url = url
        self.keep = keep
        self.conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def probe(self, timeout: float, body: str | None = None, read: int = 0) -> Answer:
        started = time.monotonic()
        line = _Line(timeout)
        kept, self.conn = self.conn, None       # the thread's until it hands it back
        worker = threading.Thread(target=self._run, args=(line, kept, body, read), daemon=True,
                                  name="infer-units probe")
        outcome: _Outcome | BaseException | None = None
        try:
            worker.start()
            worker.join(timeout)
        finally:
            # Also when a signal handler raised meanwhile (wait-ready's stop):
            # nothing of this exchange outlives the caller's wait.
            outcome = line.take_or_cut()
        seconds = time.monotonic() - started
        if outcome is None:
            return Answer(False, f"no answer within {timeout:g}s", seconds)
        if isinstance(outcome, BaseException):
            raise outcome
        self.conn = outcome.kept
        return Answer(outcome.ok, outcome.text, seconds, outcome.peer, outcome.body)

    def _run(self, line: _Line, kept: http.client.HTTPConnection | None,
             body: str | None, read: int) -> None:
        """The exchange, in the probe's own thread: every way it can end
        becomes the outcome's text."""
        outcome: _Outcome | BaseException
        try:
            outcome = self._exchange(line, kept, body, read)
        except _Cut:
            return
        except TimeoutError:
            outcome = _Outcome(False, f"no answer within {line.timeout:g}s", None)
        except http.client.RemoteDisconnected:
            outcome = _Outcome(False, "closed the connection without an answer", None)
        except (http.client.BadStatusLine, http.client.UnknownProtocol):
            outcome = _Outcome(False, "not HTTP", None)
        except http.client.HTTPException as e:     # a line too long, too many headers
            outcome = _Outcome(False, f"a head without an end ({e})", None)
        except (_Refused, ValueError) as e:
            outcome = _Outcome(False, str(e), None)
        except OSError as e:     # ssl.SSLError included
            reason = getattr(e, "reason", None)     # an ssl.SSLError's
            outcome = _Outcome(False, f"TLS: {reason}" if reason else e.strerror or str(e), None)
        except Exception as e:      # a bug, not an answer: raised in the caller's thread
            outcome = e
        finally:
            with line.lock:
                conn, line.conn = line.conn, None
            if conn is not None:
                conn.close()            # whatever is kept was handed back as kept
        line.hand_over(outcome)

    def _exchange(self, line: _Line, kept: http.client.HTTPConnection | None,
                  body: str | None, read: int) -> _Outcome:
        url = self.url if isinstance(self.url, Url) else parse_url(self.url)
        keeping = self.keep and url.scheme == "http" and body is None
        if kept is not None and not keeping:
            kept.close()
            kept = None
        for hop in range(MAX_REDIRECTS + 1):
            if hop == 0 and keeping:
                conn, response = _ask_kept(line, kept, url)
            else:
                conn = line.open(url)
                response = _ask(conn, url, body, keep=False)
            code = response.status
            if 300 <= code < 400:
                location = response.getheader("Location")
                line.close(conn)
                if location is None:
                    raise _Refused(f"HTTP {code} without a Location")
                url = _redirect(url, location)
                if code not in (307, 308):
                    body = None         # 301, 302, 303: the next request is a GET
                continue
            ok = 200 <= code < 300
            peer = _peer(conn)
            if ok and read > 0:
                # Each read() waits at most the deadline's rest (use() set the
                # socket's timeout); the caller cuts the whole at the deadline.
                data = response.read(read + 1)
                line.close(conn)
                if len(data) > read:
                    return _Outcome(False, f"HTTP {code} with an answer over {read} bytes",
                                    None, peer)
                return _Outcome(True, f"HTTP {code}", None, peer, data)
            reusable = keeping and hop == 0 and not ok and _read_rest(line, conn, response)
            if reusable:
                with line.lock:
                    line.conn = None        # handed back, not in flight
                return _Outcome(False, f"HTTP {code}", conn, peer)
            line.close(conn)
            return _Outcome(ok, f"HTTP {code}", None, peer)
        return _Outcome(False, f"more than {MAX_REDIRECTS} redirects", None)


def _ask(conn: http.client.HTTPConnection, url: Url, body: str | None,
         keep: bool) -> http.client.HTTPResponse:
    """Send the request; the answer's status and headers (its body unread)."""
    headers = {"Host": url.authority, "User-Agent": "infer-units", "Accept": "*/*"}
    if not keep:
        headers["Connection"] = "close"
    payload = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        payload = body.encode("utf-8")
    conn.request("GET" if body is None else "POST", url.target, body=payload, headers=headers)
    return conn.getresponse()


def _ask_kept(line: _Line, kept: http.client.HTTPConnection | None,
              url: Url) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A GET on the kept connection (opened when missing, or again once when
    the server closed it while we slept)."""
    if kept is not None and (kept.sock is None or not _idle(kept.sock)):
        kept.close()            # bytes no request of ours asked for, or closed
        kept = None
    if kept is None:
        conn = line.open(url)
        return conn, _ask(conn, url, None, keep=True)
    line.use(kept)
    try:
        return kept, _ask(kept, url, None, keep=True)
    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
        # Closed by the server meanwhile (a slow answer is a timeout, not
        # this).  A GET: asking again on a new connection changes nothing.
        line.close(kept)
    conn = line.open(url)
    return conn, _ask(conn, url, None, keep=True)


def _read_rest(line: _Line, conn: http.client.HTTPConnection,
               response: http.client.HTTPResponse) -> bool:
    """Read the rest of a non-2xx answer so the connection can carry the
    next request: False where that cannot be known or is not allowed (the
    connection is then closed).  Whatever happens here, the status stands."""
    lengths = set(response.headers.get_all("Content-Length") or [])
    if response.will_close or response.length is None or len(lengths) != 1 \
            or response.length > _KEPT_BODY_MAX or conn.sock is None:
        return False
    try:
        conn.sock.settimeout(min(_REST_WAIT_S, line.left()))
        response.read()
    except (http.client.HTTPException, OSError):
        return False
    return True


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


def _peer(conn: http.client.HTTPConnection) -> str | None:
    """The address conn is connected to; None once it is closed."""
    try:
        return str(conn.sock.getpeername()[0]) if conn.sock is not None else None
    except OSError:
        return None


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
