"""The one reader of URLs, hosts and host:port addresses: the generator checks
model files with it ([ready] url, host, [nodes] hosts/addr/head-url) and every
hook reads its argv with it (wait-ready, liveness-probe, pre-start's
rendezvous and head URL), so what the generator accepts the hooks read the
same way, and what the hooks would refuse the generator refuses first, with
the file and key named.

Deliberately narrower than RFC 3986 (and than urllib, which reads "a#b" and
"user@host" without a word): an http(s) URL to a health endpoint has an
ASCII host name or IP address, an optional port 1-65535, a path and a query;
no user info (never sent, and "a@b" hides the real host), no fragment (never
sent: one probe that sends it and one that does not disagree), no spaces,
control or non-ASCII characters (percent-encode them).  IP addresses are
the ipaddress module's.
"""

from __future__ import annotations

from dataclasses import dataclass

_DIGITS = frozenset("0123456789")
_LABEL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Url:
    """A parsed health URL.  `target` is what goes on the request line."""

    scheme: str             # "http" | "https"
    host: str               # a name or IP address, IPv6 without brackets
    port: int               # explicit, else the scheme's
    explicit_port: bool
    target: str             # path and query, "/" at least

    @property
    def authority(self) -> str:
        """host[:port] as the Host: header and the URL carry it."""
        host = bracketed(self.host)
        return f"{host}:{self.port}" if self.explicit_port else host

    def text(self) -> str:
        return f"{self.scheme}://{self.authority}{self.target}"

    def with_target(self, target: str) -> Url:
        return Url(self.scheme, self.host, self.port, self.explicit_port, target)

    def __repr__(self) -> str:
        return f"Url({self.text()!r})"


def bracketed(host: str) -> str:
    """An IPv6 address in brackets, as URLs and host:port carry it."""
    return f"[{host}]" if ":" in host else host


def _is_ipv4(text: str) -> bool:
    """A dotted-quad IPv4 address (no leading zeros: "010" is octal to some)."""
    import ipaddress    # here: only a URL with an address needs it, not every hook
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def is_ipv6(text: str) -> bool:
    """An IPv6 address as inet_pton() reads it (no zone: "%eth0" is refused)."""
    if "%" in text:
        return False
    import ipaddress
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _is_name(text: str) -> bool:
    """An RFC 1123 host name ('_' allowed: some clusters use it)."""
    if not text or len(text) > 253:
        return False
    labels = text.split(".")
    if all(_DIGITS.issuperset(label) for label in labels if label):
        return False          # all digits and dots: an IPv4 address or nothing
    return all(label and len(label) <= 63 and _LABEL.issuperset(label)
               and label[0] != "-" and label[-1] != "-" for label in labels)


def check_host(text: str) -> str:
    """A host to bind or connect to: a name, an IPv4 address or a bare IPv6
    address (as the engines' --host takes it).  ValueError: why not."""
    if not isinstance(text, str):
        raise ValueError(f"expected a host name or address, got {type(text).__name__}")
    _refuse_bad_characters(text, "host")
    if text.startswith("[") and text.endswith("]") and is_ipv6(text[1:-1]):
        raise ValueError(f"{text!r}: give the IPv6 address without brackets ({text[1:-1]})")
    if _is_ipv4(text) or is_ipv6(text) or _is_name(text):
        return text
    if text.startswith("-"):
        raise ValueError(f"{_show(text)} starts with '-', so the server would read it as a flag")
    if ":" in text and not is_ipv6(text):
        raise ValueError(f"{text!r} is not a host name or IP address (a port does not "
                         "belong here)")
    raise ValueError(f"{text!r} is not a host name or IP address")


def _refuse_bad_characters(text: str, what: str) -> None:
    for ch in text:
        if not "\x21" <= ch <= "\x7e":
            kind = ("a NUL character" if ch == "\0" else "a space" if ch == " " else
                    "a control character" if ch < " " or ch == "\x7f" else
                    f"the non-ASCII character {ch!r}")
            raise ValueError(f"{what} {_show(text)} contains {kind}"
                             + (" (percent-encode it)" if what == "URL" else ""))
    if not text:
        raise ValueError(f"{what} is empty")


def _show(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _port(text: str, whole: str) -> int:
    if not text or not _DIGITS.issuperset(text) or len(text) > 5:
        raise ValueError(f"{_show(whole)}: port {text!r} is not a number in 1-65535")
    number = int(text)
    if not 1 <= number <= 65535:
        raise ValueError(f"{_show(whole)}: port {number} is not in 1-65535")
    return number


def split_host_port(text: str, whole: str, default: int | None) -> tuple[str, int, bool]:
    """(host, port, explicit) of "host[:port]" or "[v6][:port]"."""
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(f"{_show(whole)}: '[' without ']'")
        host, rest = text[1:close], text[close + 1:]
        if not is_ipv6(host):
            raise ValueError(f"{_show(whole)}: {host!r} in brackets is not an IPv6 address")
        if rest and not rest.startswith(":"):
            raise ValueError(f"{_show(whole)}: {rest!r} after the IPv6 address")
        port_text = rest[1:] if rest else None
    else:
        if text.count(":") > 1:
            raise ValueError(f"{_show(whole)}: more than one ':' in {text!r} (one port at "
                             "most; an IPv6 address goes in brackets, e.g. [::1]:8000)")
        host, colon, port_text_ = text.partition(":")
        port_text = port_text_ if colon else None
        if not (_is_ipv4(host) or _is_name(host)):
            raise ValueError(f"{_show(whole)}: {host!r} is not a host name or IP address")
    if port_text is None:
        if default is None:
            raise ValueError(f"{_show(whole)}: no port (expected HOST:PORT)")
        return host, default, False
    return host, _port(port_text, whole), True


def parse_url(text: str) -> Url:
    """An http:// or https:// URL, or ValueError with the reason."""
    if not isinstance(text, str):
        raise ValueError(f"expected a URL, got {type(text).__name__}")
    _refuse_bad_characters(text, "URL")
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in DEFAULT_PORTS:
        raise ValueError(f"{_show(text)}: must start with http:// or https://")
    if "#" in rest:
        raise ValueError(f"{_show(text)}: has a #fragment, which is never sent to the "
                         "server (remove it)")
    if "\\" in rest:
        raise ValueError(f"{_show(text)}: has a backslash (clients disagree on it)")
    end = len(rest)
    for stop in "/?":
        at = rest.find(stop)
        if 0 <= at < end:
            end = at
    authority, target = rest[:end], rest[end:]
    if "@" in authority:
        raise ValueError(f"{_show(text)}: user info (user@host) is not supported; "
                         "name the host only")
    if not authority:
        raise ValueError(f"{_show(text)}: no host")
    host, port, explicit = split_host_port(authority, text, DEFAULT_PORTS[scheme])
    if not target.startswith("/"):
        target = "/" + target           # "http://h?x" asks for "/?x"
    return Url(scheme, host, port, explicit, target)


def parse_host_port(text: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" (a rendezvous address), or ValueError."""
    if not isinstance(text, str):
        raise ValueError(f"expected \"host:port\", got {type(text).__name__}")
    _refuse_bad_characters(text, "address")
    host, port, _ = split_host_port(text, text, None)
    return host, port


def host_port(host: str, port: int) -> str:
    return f"{bracketed(host)}:{port}"
