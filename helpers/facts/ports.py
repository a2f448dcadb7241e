"""Is a TCP port free, and if not, which process holds it (listening or only bound)."""

from __future__ import annotations

import errno
import os
import socket
import time

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
_BOUND_DUMP = tuple(int(x) for x in os.uname().release.split(".")[:2]
                    if x.isdigit()) >= (6, 11)


def _diag(states: int) -> list[tuple[int, int, int]]:
    """(state, local port, inode) of the TCP sockets, IPv4 and IPv6, in
    `states` (a bit mask), from the kernel's sock_diag: one request, no text
    to parse, and only the asked-for tables are walked (not every connection)."""
    import struct       # here: a start whose port nothing uses never dumps (unused())
    # family, src_len, dst_len, ext, id (48 bytes), states, dbs
    request = bytes(4) + bytes(48) + struct.pack("=II", states, 0)
    header = struct.pack("=IHHII", 16 + len(request), _TCPDIAG_GETSOCK,
                         _NLM_F_REQUEST_DUMP, 1, 0)
    found: list[tuple[int, int, int]] = []
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
                # struct inet_diag_msg: family, state, timer, retrans, id (sport
                # first, big-endian, 48 bytes), expires, rqueue, wqueue, uid, inode
                state = data[offset + 17]
                sport = struct.unpack_from(">H", data, offset + 20)[0]
                inode = struct.unpack_from("=I", data, offset + 16 + 4 + 48 + 16)[0]
                found.append((state, sport, inode))
                offset += (length + 3) & ~3
            if not data:
                return found
    finally:
        nl.close()


def _proc_tables(port: int) -> dict[str, str]:
    """Listening sockets of `port` from /proc/net/tcp(6): where no sock_diag."""
    inodes: dict[str, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if int(fields[3], 16) == _TCP_LISTEN and \
                            int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes[fields[9]] = "listening"
        except OSError:
            continue
    return inodes


def _holding_inodes(port: int) -> dict[str, str]:
    """Sockets that hold `port` as their local port, inode -> how: listening
    ones, and ones bound but not listening yet (vLLM binds its port ~25 s
    before it listens; with SO_REUSEADDR on both sides a bind() test succeeds
    meanwhile).  TIME_WAIT leftovers (no process) are not holders: the server
    binds over them with SO_REUSEADDR."""
    states = 1 << _TCP_LISTEN | (1 << _TCP_BOUND_INACTIVE if _BOUND_DUMP else 0)
    inodes: dict[str, str] = {}
    try:
        for state, sport, inode in _diag(states):
            if sport == port and inode:
                inodes[str(inode)] = "listening" if state == _TCP_LISTEN else \
                    "bound, not listening yet"
    except OSError:
        return _proc_tables(port)
    return inodes


def _bound_out_of_sight(host: str, port: int) -> bool:
    """Before Linux 6.11 a bound, not listening socket shows nowhere.  A bind()
    without SO_REUSEADDR still collides with it; it collides with TIME_WAIT
    leftovers and live connections of the port too, so it counts only when the
    kernel lists no socket at all on the port."""
    if _BOUND_DUMP:
        return False
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
        return False
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            return False
    finally:
        s.close()
    try:
        every = (1 << 12) - 2        # TCP_ESTABLISHED .. TCP_CLOSING
        return not any(sport == port for _state, sport, _inode in _diag(every))
    except OSError:
        return False


def port_users(port: int) -> list[tuple[ProcInfo, str]] | None:
    """Processes holding `port`, each with how ("listening", "bound, not
    listening yet"): [] when free, None when it is taken but the holder is out
    of sight (another network namespace, no permission)."""
    inodes = _holding_inodes(port)
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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        return True
    except OSError as e:
        # Only "in use" is ours to wait out; a bad address is the server's to report.
        return e.errno != errno.EADDRINUSE
    finally:
        s.close()


def wait_port_free(host: str, port: int, timeout: float, poll_s: float = 0.05) -> bool:
    """True once no socket holds the port (listening or only bound) and it can
    be bound (as the server will, with SO_REUSEADDR); False at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if unused(port) or (not _holding_inodes(port) and can_bind(host, port)
                            and not _bound_out_of_sight(host, port)):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
