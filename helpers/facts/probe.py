"""The one HTTP health probe: readiness (wait-ready), liveness, status and the
multi-node worker all ask a server's health through it, on a URL read by the
one parser (generator/urls.py), so a URL means the same request everywhere.

Plain sockets for http:// (http.client alone costs more than the rest of a
probe); urllib only for https:// and to follow a redirect, on the same
parsed URL.  Healthy is a 2xx status line within the timeout, judged after
redirects; the body is not read (SGLang's /health sends its status only
after generating a token)."""

from __future__ import annotations

import socket
import time

from ...generator.urls import Url, parse_url


class Answer:
    __slots__ = ("ok", "text", "seconds")

    def __init__(self, ok: bool, text: str, seconds: float) -> None:
        self.ok = ok            # a 2xx status line within the timeout
        self.text = text        # "HTTP 200", "HTTP 503", "no answer within 10s", ...
        self.seconds = seconds


def http_probe(url: str | Url, timeout: float, body: str | None = None) -> Answer:
    """GET url (POST `body`, JSON, when given: the one-token completion of
    [liveness] probe = "generate")."""
    started = time.monotonic()
    deadline = started + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout()
        return remaining

    try:
        parsed = url if isinstance(url, Url) else parse_url(url)
        if parsed.scheme == "https":
            return _urllib_probe(parsed, timeout, timeout, started, body)
        with socket.create_connection((parsed.host, parsed.port), timeout=left()) as sock:
            sock.settimeout(left())
            payload = body.encode("utf-8") if body is not None else b""
            extra = (f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                     if body is not None else "")
            sock.sendall(f"{'POST' if body is not None else 'GET'} {parsed.target} HTTP/1.1\r\n"
                         f"Host: {parsed.authority}\r\nUser-Agent: infer-units\r\n"
                         f"Accept: */*\r\n{extra}Connection: close\r\n\r\n"
                         .encode("ascii") + payload)
            data = b""
            while b"\r\n" not in data and len(data) < 4096:
                sock.settimeout(left())
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        seconds = time.monotonic() - started
        words = data.split(b"\r\n", 1)[0].split()
        if len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
            what = "closed the connection without an answer" if not data else "not HTTP"
            return Answer(False, what, seconds)
        code = int(words[1])
        if 300 <= code < 400:
            # Judged after redirects, the same for readiness and liveness.
            return _urllib_probe(parsed, left(), timeout, started, body)
        return Answer(200 <= code < 300, f"HTTP {code}", seconds)
    except socket.timeout:
        return Answer(False, f"no answer within {timeout:g}s", time.monotonic() - started)
    except ValueError as e:
        return Answer(False, str(e), time.monotonic() - started)
    except OSError as e:
        return Answer(False, e.strerror or str(e), time.monotonic() - started)


def _urllib_probe(url: Url, left: float, timeout: float, started: float,
                  body: str | None = None) -> Answer:
    """https, and redirects: urllib (slower to import), on the parsed URL's text."""
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url.text()) if body is None else urllib.request.Request(
        url.text(), data=body.encode("utf-8"), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=left) as response:
            code = response.status
    except urllib.error.HTTPError as e:
        code = e.code
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
