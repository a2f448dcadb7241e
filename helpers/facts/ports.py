"""Is a TCP port free for a server's bind, and if not, which process holds
it (listening or only bound).

A holder is a socket whose local address would clash with the server's own
bind on `host`, as the kernel decides a bind conflict: the same port, and
the same address or a wildcard on either side, where an IPv6 socket on `::`
without IPV6_V6ONLY (and one on a v4-mapped `::ffff:` address) is also an
IPv4 one.  A user listening on 127.0.0.2 or ::1 at the port of a server
that binds 127.0.0.1 neither blocks that bind nor answers its clients.  The
addresses come from the kernel (sock_diag, else /proc/net/tcp*), never from
anything a process says about itself."""

from __future__ import annotations

import errno
import os
import socket
import time
from dataclasses import dataclass

from .procinfo import ProcInfo, read_proc

# TCP states (include/net/tcp_states.h) and sock_diag's constants (linux/sock_diag.h)
_TCP_TIME_WAIT, _TCP_CLOSE, _TCP_LISTEN = 6, 7, 10
# A socket bound but not listening has no place in the listening or the
# connection tables, so /proc/net/tcp never shows it; sock_diag dumps it (as
# state CLOSE) when asked for this pseudo state, since Linux 6.11.
_TCP_BOUND_INACTIVE = 13
_NETLINK_SOCK_DIAG = 4
# The request of inet_diag's first interface (linux/inet_diag.h: TCPDIAG_GETSOCK,
# struct inet_diag_req).  It asks for no family, so one dump walks each table
# once for IPv4 and IPv6 together; SOCK_DIAG_BY_FAMILY takes one family a
# dump, and on Linux >= 6.11 every dump of bound-but-not-listening sockets
# walks the kernel's whole bind hash: one dump instead of two, on every
# start's path (pre-start).
_TCPDIAG_GETSOCK = 18
_NLM_F_REQUEST_DUMP = 0x301
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
# The attribute inet_diag adds to an IPv6 socket that listens or is only
# bound: whether it is IPV6_V6ONLY (linux/inet_diag.h).
_INET_DIAG_SKV6ONLY = 11
_ANY4, _ANY6 = bytes(4), bytes(16)
_V4MAPPED = bytes(10) + b"\xff\xff"
_BOUND_DUMP = tuple(int(x) for x in os.uname().release.split(".")[:2]
                    if x.isdigit()) >= (6, 11)


@dataclass(frozen=True)
class Sock:
    """A TCP socket as the kernel lists it."""
    state: int
    family: int          # socket.AF_INET or AF_INET6
    address: bytes       # its local address, 4 or 16 bytes
    port: int            # its local port
    inode: int
    v6only: bool = False


def _reaches(family: int, address: bytes, v6only: bool) -> tuple[bytes | None, bytes | None]:
    """(IPv4 address, IPv6 address) a socket bound to `address` takes, each
    None where it takes none of that family; a wildcard is all zeros."""
    if family == socket.AF_INET:
        return address, None
    if address.startswith(_V4MAPPED):
        return address[12:], None
    if address == _ANY6:
        return (None if v6only else _ANY4), _ANY6
    return None, address


def _meet(a: bytes | None, b: bytes | None) -> bool:
    return a is not None and b is not None and (a == b or not any(a) or not any(b))


def clash(a: tuple[int, bytes, bool], b: tuple[int, bytes, bool]) -> bool:
    """Would sockets bound to these (family, address, v6only) at one port
    collide?  Also: would a connection to address `a` reach a listener on
    `b`, since a listener takes the connections its bind reserves."""
    (a4, a6), (b4, b6) = _reaches(*a), _reaches(*b)
    return _meet(a4, b4) or _meet(a6, b6)


def bind_targets(host: str) -> list[tuple[int, bytes, bool]]:
    """The addresses a server told to bind `host` may bind, as
    (family, address, v6only): an address is itself; a name is every address
    it resolves to (engines differ in which one they take).  A server on
    `::` is taken as dual-stack, as Linux binds it by default.  [] when the
    name does not resolve (then every socket on the port counts)."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    found: list[tuple[int, bytes, bool]] = []
    for family, _kind, _proto, _name, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        target = (int(family), socket.inet_pton(family, str(sockaddr[0]).partition("%")[0]),
                  False)
        if target not in found:
            found.append(target)
    return found


def _clashes(sock: Sock, targets: list[tuple[int, bytes, bool]]) -> bool:
    return not targets or any(clash(t, (sock.family, sock.address, sock.v6only))
                              for t in targets)


def _diag(states: int) -> list[Sock]:
    """The TCP sockets, IPv4 and IPv6, in `states` (a bit mask), from the
    kernel's sock_diag: one request, no text to parse, and only the
    asked-for tables are walked (not every connection)."""
    import struct       # here: a start whose port nothing uses never dumps (unused())
    # family, src_len, dst_len, ext, id (48 bytes), states, dbs
    request = bytes(4) + bytes(48) + struct.pack("=II", states, 0)
    header = struct.pack("=IHHII", 16 + len(request), _TCPDIAG_GETSOCK,
                         _NLM_F_REQUEST_DUMP, 1, 0)
    found: list[Sock] = []
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    try:
        nl.sendto(header + request, (0, 0))
        while True:
            data = nl.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    code = -struct.unpack_from("=i", data, offset + 16)[0]
                    raise OSError(code, os.strerror(code))
                # struct inet_diag_msg: family, state, timer, retrans, id (sport,
                # dport, both big-endian, src and dst 16 bytes each, if, cookie),
                # expires, rqueue, wqueue, uid, inode; then its attributes.
                msg = offset + 16
                family, state = data[msg], data[msg + 1]
                sport = struct.unpack_from(">H", data, msg + 4)[0]
                size = 4 if family == socket.AF_INET else 16
                src = bytes(data[msg + 8:msg + 8 + size])
                inode = struct.unpack_from("=I", data, msg + 68)[0]
                v6only = False
                attr, end = msg + 72, offset + length
                while attr + 4 <= end:
                    alen, atype = struct.unpack_from("=HH", data, attr)
                    if alen < 4:
                        break
                    if atype == _INET_DIAG_SKV6ONLY and alen > 4:
                        v6only = bool(data[attr + 4])
                    attr += (alen + 3) & ~3
                found.append(Sock(state, family, src, sport, inode, v6only))
                offset += (length + 3) & ~3
            if not data:
                return found
    finally:
        nl.close()


def _proc_tables(port: int) -> list[Sock]:
    """Listening sockets of `port` from /proc/net/tcp(6): where no sock_diag.
    The tables say nothing of IPV6_V6ONLY: an IPv6 wildcard counts as
    dual-stack, the wider of the two."""
    import struct
    found: list[Sock] = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    address, _, sport = fields[1].partition(":")
                    if int(fields[3], 16) != _TCP_LISTEN or int(sport, 16) != port:
                        continue
                    # The address as the kernel's 32-bit words, each printed in
                    # this host's byte order.
                    raw = b"".join(struct.pack("=I", int(address[i:i + 8], 16))
                                   for i in range(0, len(address), 8))
                    found.append(Sock(_TCP_LISTEN, family, raw, port, int(fields[9])))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _holding_inodes(targets: list[tuple[int, bytes, bool]], port: int,
                    listening_only: bool = False) -> dict[str, str]:
    """Sockets on `port` whose address clashes with one of `targets`, inode ->
    how: listening ones, and ones bound but not listening yet (vLLM binds its
    port ~25 s before it listens; with SO_REUSEADDR on both sides a bind()
    test succeeds meanwhile).  TIME_WAIT leftovers (no process) are not
    holders: the server binds over them with SO_REUSEADDR."""
    states = 1 << _TCP_LISTEN
    if _BOUND_DUMP and not listening_only:
        states |= 1 << _TCP_BOUND_INACTIVE
    try:
        socks = _diag(states)
    except OSError:
        socks = _proc_tables(port)
    return {str(s.inode): "listening" if s.state == _TCP_LISTEN else "bound, not listening yet"
            for s in socks if s.port == port and s.inode and _clashes(s, targets)}


def _bound_out_of_sight(host: str, port: int) -> bool:
    """Before Linux 6.11 a bound, not listening socket shows nowhere.  A bind()
    without SO_REUSEADDR still collides with it; it collides with TIME_WAIT
    leftovers and live connections on the address too, so it counts only
    when the kernel lists no socket at all there."""
    if _BOUND_DUMP:
        return False
    targets = bind_targets(host)
    for family, address, _v6only in targets or [(_family(host), b"", False)]:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue         # a family this kernel lacks: the server cannot bind it either
        try:
            s.bind((socket.inet_ntop(family, address) if address else host, port))
            continue
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                continue
        finally:
            s.close()
        try:
            every = (1 << 12) - 2        # TCP_ESTABLISHED .. TCP_CLOSING
            if not any(s.port == port and _clashes(s, targets) for s in _diag(every)):
                return True
        except OSError:
            return False
    return False


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _processes(inodes: dict[str, str]) -> list[tuple[ProcInfo, str]] | None:
    """The processes that hold these sockets, each with how: [] for no
    socket, None when no holder is in sight (another network namespace, no
    permission)."""
    if not inodes:
        return []
    wanted = {f"socket:[{i}]": how for i, how in inodes.items()}
    found: list[tuple[ProcInfo, str]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                how = wanted.get(os.readlink(f"/proc/{entry}/fd/{fd}"))
                if how is not None:
                    info = read_proc(int(entry))
                    if info is not None:
                        found.append((info, how))
                    break
            except OSError:
                continue
    return found or None


def port_users(host: str, port: int) -> list[tuple[ProcInfo, str]] | None:
    """Processes holding `port` where a server's bind on `host` would clash
    with them, each with how ("listening", "bound, not listening yet"): []
    when free, None when it is taken but the holder is out of sight
    (another network namespace, no permission)."""
    return _processes(_holding_inodes(bind_targets(host), port))


def listeners(address: str, port: int) -> list[tuple[ProcInfo, str]] | None:
    """Processes listening where a connection to `address`:`port` lands (the
    address a probe connected to): [] when none, None when out of sight."""
    family = _family(address)
    target = (family, socket.inet_pton(family, address.partition("%")[0]), False)
    return _processes(_holding_inodes([target], port, listening_only=True))


def unused(port: int) -> bool:
    """True when no TCP socket of this network namespace has `port` as its
    local port: listening, only bound, connected or in TIME_WAIT, IPv4 or
    IPv6.  A bind() of the wildcard address, dual-stack, without SO_REUSEADDR
    or SO_REUSEPORT collides with every one of them, and costs a hash lookup
    where a sock_diag dump walks the kernel's bind hash (Linux >= 6.11).  A port that served connections in the last minute still has
    TIME_WAIT leftovers, so a restart of a busy server mostly dumps; a first
    start, a boot's, does not.  False says nothing: look closer.  The socket
    is closed at once; it never listens, so no client sees it.

    Not where VRFs can exist (the vrf module loaded: /proc/sys/net/vrf): a
    holder bound to a VRF device sits in a bind bucket of its own there
    (tcp_l3mdev_accept=0), which an unbound bind() never meets."""
    if os.path.exists("/proc/sys/net/vrf"):
        return False
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue         # no IPv6 in this kernel: IPv4 alone says it all
        try:
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind((address, port))
            return True
        except OSError:
            return False     # in use, or not ours to bind (a low port, a policy)
        finally:
            s.close()
    return False


def can_bind(host: str, port: int) -> bool:
    """Can every address the server may bind for `host` be bound, as the
    server binds (SO_REUSEADDR)?"""
    targets = bind_targets(host)
    for family, address, _v6only in targets or [(_family(host), b"", False)]:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue         # a family this kernel lacks: the server cannot bind it either
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((socket.inet_ntop(family, address) if address else host, port))
        except OSError as e:
            # Only "in use" is ours to wait out; a bad address is the server's to report.
            if e.errno == errno.EADDRINUSE:
                return False
        finally:
            s.close()
    return True


def wait_port_free(host: str, port: int, timeout: float, poll_s: float = 0.05) -> bool:
    """True once no socket holds the port on an address that clashes with
    `host` (listening or only bound) and it can be bound there (as the
    server will, with SO_REUSEADDR); False at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if unused(port) or (not _holding_inodes(bind_targets(host), port)
                            and can_bind(host, port) and not _bound_out_of_sight(host, port)):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
