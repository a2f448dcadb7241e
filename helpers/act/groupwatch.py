"""`infer-units group-watch`: run by infer-units-group@NAME.service (its argv,
every setting, from the generator's drop-in)
next to an active rank of a multi-node model; restarts this rank through
systemd the moment the group it belongs to is broken.

No engine lets a rank rejoin a running group (torch.distributed's store
takes no new rank), so once any rank goes away every other rank hangs (an
NCCL collective on a dead peer) until it is restarted, and the [liveness]
timer would notice only after interval x failures (2 minutes by default).
The kernel knows sooner: every rank keeps its connection to the group's
rendezvous (the TCPStore on the head's `addr` port) for the group's life.
So, read once a second from /proc/net/tcp{,6} (no packet sent, nothing the
engine sees):

  head    the other hosts of [nodes] hosts connected to its rendezvous port;
          one that was there when the group formed and is gone (its process
          died: the kernel closed the connection) means a rank crashed or
          restarted.  A rank is known by its host's address, which no one
          elsewhere can take for an established connection: a connection
          from any other address is not a rank, whoever opens and closes
          it, nor one whose socket here is not the model's user's
          (docs/trust.md).  A host whose name has no address here is
          not watched: said once, named by `status`, never counted missing;
  worker  its connection to the head's rendezvous, a socket of the model's
          user (another account's connection to the head is not this
          rank's); gone means the head went away (restarted, stopped,
          crashed): this rank was left behind.

Then `TryRestartUnit` (the same as liveness: ExecStopPost/ExecStartPre clean
the GPUs; a worker parks in pre-start until the head forms a new group), and
the group heals in about the head's load time.  Only while the model is
active and running with no job queued.  Each restart is a journal line and
counts toward [liveness] max-restarts within restart-window, as liveness'
own do, counted and saved before systemd is asked (liveness.restart_or_cap):
at the cap the model is stopped and left failed, so no one can restart a
model without end by what its rank's watch sees.
"""

from __future__ import annotations

import logging
import os
import pwd
import socket
import time
from dataclasses import dataclass
from typing import Any

from ...generator.liveness import state_dir
from ...generator.log import NAMES_UNIT
from ...generator.nodes import Nodes
from .liveness import boottime, load_state, restart_or_cap, state_lock, state_path

log = logging.getLogger(__name__)

POLL_S = 1.0
ESTABLISHED = "01"
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def _address(hex_address: str) -> tuple[str, int]:
    """/proc/net/tcp's "0100007F:1F90" -> ("127.0.0.1", 8080) (IPv4-mapped
    IPv6 addresses as IPv4)."""
    host, _, port = hex_address.partition(":")
    raw = bytes.fromhex(host)
    # the kernel prints each 32-bit word in host byte order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 16:
        if words[:12] == b"\0" * 10 + b"\xff\xff":
            return socket.inet_ntop(socket.AF_INET, words[12:]), int(port, 16)
        return socket.inet_ntop(socket.AF_INET6, words), int(port, 16)
    return socket.inet_ntop(socket.AF_INET, words), int(port, 16)


def established(tables: tuple[str, ...] = TABLES, owner: int | None = None,
                ) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """(local, remote) of every established TCP connection in this network
    namespace; `owner`: only the sockets of that uid (the kernel's column)."""
    found = []
    for table in tables:
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split(None, 8)
                    if len(fields) > 7 and fields[3] == ESTABLISHED and (
                            owner is None or fields[7] == str(owner)):
                        found.append((_address(fields[1]), _address(fields[2])))
        except OSError:
            continue
    return found


def resolve(host: str) -> set[str]:
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return set()


def group_peers(is_head: bool, port: int, head_addrs: set[str],
                conns: list[tuple[tuple[str, int], tuple[str, int]]],
                own_ranks: bool = False, ranks: set[str] | None = None) -> set[str]:
    """Head: the other hosts connected to its rendezvous port (not its own
    ranks: a remote address that is the connection's own, or loopback),
    only from `ranks`, the other hosts' addresses (None: any address, for
    reading the tables alone).  Worker: "head" while it has a connection to
    the head's rendezvous."""
    if is_head:
        return {remote[0] for local, remote in conns
                if local[1] == port and (ranks is None or remote[0] in ranks) and (own_ranks or (
                    remote[0] != local[0] and not remote[0].startswith("127.")
                    and remote[0] != "::1"))}
    return {"head"} if any(remote[1] == port and remote[0] in head_addrs
                           for _local, remote in conns) else set()


SHORT = "(a rank)"      # fewer hosts connected than the group has


class Watch:
    """The decision, over successive looks at the connections.  `expected`:
    how many peers a whole group shows (head: the other hosts; worker: 1).
    The watch starts once the model is active, i.e. once the group formed,
    so a group already short then is broken too."""

    def __init__(self, expected: int = 0) -> None:
        self.expected = expected
        self.baseline: set[str] = set()
        self.missing_since: dict[str, int] = {}

    def look(self, peers: set[str]) -> set[str]:
        """The peers of the formed group that are gone (two looks in a row,
        so a reconnecting client is not a crash)."""
        self.baseline |= peers
        gone = self.baseline - peers
        if len(peers) < self.expected:
            gone = gone | {SHORT}
        self.missing_since = {p: self.missing_since.get(p, 0) + 1 for p in gone}
        found = {p for p, n in self.missing_since.items() if n >= 2}
        if len(found) > 1:
            found.discard(SHORT)    # the named ones say it better
        return found

    def reset(self) -> None:
        self.baseline.clear()
        self.missing_since.clear()


@dataclass(frozen=True)
class Watched:
    """What the watch knows of its model: all of it from its unit's argv."""
    unit: str
    user: str
    nodes: Nodes
    max_restarts: int
    restart_window: float


def restart_counted(model: Watched, state: Any, why: str, systemd: Any,
                    now: float | None = None, clock: float | None = None) -> bool:
    """Restart the model through systemd, counted with liveness' restarts
    in its state file (liveness.restart_or_cap: counted and saved before
    systemd is asked, since the restart stops this watch at once, PartOf=);
    at [liveness] max-restarts within restart-window, stop it and leave it
    failed instead.  True when systemd took the job."""
    unit = model.unit
    directory = state_dir(dict(os.environ))
    why = f"{why} (no engine lets a rank rejoin a running group; group watch)"
    with state_lock(unit, directory):
        saved = load_state(state_path(unit, directory))
        return restart_or_cap(unit, directory, saved, time.time() if now is None else now, why,
                              model.max_restarts, model.restart_window, state.invocation,
                              systemd, boottime() if clock is None else clock) is not None


def other_ranks(nodes: Any) -> tuple[dict[str, set[str]], list[tuple[int, str]]]:
    """The head's view of the other ranks: {host: its addresses here} of
    those it can see, and (rank, host) of those whose name has no address
    here.  A rank the head cannot see is not watched at all (neither its
    joining nor its leaving shows, so counting it missing would restart a
    whole group for a name); liveness still probes the group's health."""
    seen: dict[str, set[str]] = {}
    unseen: list[tuple[int, str]] = []
    for rank, host in enumerate(nodes.hosts):
        if rank != nodes.rank:
            found = resolve(host)
            if found:
                seen[host] = found
            else:
                unseen.append((rank, host))
    return seen, unseen


def not_watched(host: str) -> str:
    """How `status` and the watch's journal name a rank the head cannot see."""
    return f"not watched: {host} has no address here"


def run(model: Watched, poll_s: float = POLL_S, systemd: Any = None,
        looks: int | None = None) -> int:
    from ..facts.systemd import Liveness as Systemd
    nodes, unit = model.nodes, model.unit
    systemd = systemd or Systemd()
    head_addrs = resolve(nodes.addr_host)
    seen: dict[str, set[str]] = {}
    if nodes.is_head:
        seen, unseen = other_ranks(nodes)
        for rank, host in unseen:
            log.warning(f"{unit}: rank {rank}: {not_watched(host)} (its leaving cannot be seen "
                        "and is not counted missing; liveness still probes the group)",
                        extra=NAMES_UNIT)
    ranks: set[str] = set().union(*seen.values())
    what = (f"rank 0: the ranks connected to port {nodes.addr_port}" if nodes.is_head
            else f"rank {nodes.rank}: its connection to the head's rendezvous {nodes.addr}")
    log.info(f"{unit}: watching {what}", extra=NAMES_UNIT)
    # A rank's connection is a socket of the model's user at both ends: the
    # worker's to the head is its server's, the head's accepted ones are its
    # server's.  Another account can hold a connection of its own between
    # the same addresses: on a worker, to the head's rendezvous; on the head,
    # one bound to the rendezvous port (SO_REUSEADDR, before the server
    # listens) and connected to any port of a rank's host.  Counted, either
    # would hide a leaving; the kernel's uid column tells them apart.
    owner = pwd.getpwnam(model.user).pw_uid
    watch = Watch(len(seen) if nodes.is_head else 1)
    n = 0
    while looks is None or n < looks:
        n += 1
        peers = group_peers(nodes.is_head, nodes.addr_port, head_addrs,
                            established(owner=owner), ranks=ranks)
        if nodes.is_head:       # a rank is there when one of its host's addresses is
            peers = {host for host, addresses in seen.items() if addresses & peers}
        gone = watch.look(peers)
        if gone:
            state = systemd.model_state(unit)
            if state is None or not state.serving:
                watch.reset()       # loading, stopping: the group is forming anew
                watch.missing_since.clear()
            else:
                why = ("a rank left the group (fewer hosts connected than it has)"
                       if gone == {SHORT} else
                       "the rank(s) on " + ", ".join(sorted(gone)) + " left the group"
                       if nodes.is_head else f"the head at {nodes.addr} left the group")
                if restart_counted(model, state, why, systemd):
                    return 0       # systemd restarts (or stops) this watch with the model
        time.sleep(poll_s)
    return 0
