"""The group watch (helpers/act/groupwatch.py) reads real connections from this
host's /proc/net/tcp{,6}: a rendezvous served here, a rank connected to it,
the rank going away.  systemd is the boundary: tests/e2e/test_multinode.py
drives the real one."""

from __future__ import annotations

import socket

import pytest

from infer_units.helpers.act import groupwatch as gw


def _listener(family: int = socket.AF_INET, host: str = "127.0.0.1") -> socket.socket:
    server = socket.socket(family)
    server.bind((host, 0))
    server.listen()
    return server


def test_head_sees_its_ranks_and_loses_one_when_it_dies() -> None:
    server = _listener()
    port = server.getsockname()[1]
    rank = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    peers = gw.group_peers(True, port, set(), gw.established(), own_ranks=True)
    assert peers == {"127.0.0.1"}
    # the head's own ranks (a connection from this host) are not other hosts
    assert gw.group_peers(True, port, set(), gw.established()) == set()
    watch = gw.Watch()
    assert watch.look(peers) == set()
    rank.close()                     # the rank's process died: the kernel closes its end
    peers = gw.group_peers(True, port, set(), gw.established(), own_ranks=True)
    assert peers == set()            # the head's end is CLOSE_WAIT now, not established
    assert watch.look(peers) == set()              # once: maybe a reconnect
    assert watch.look(peers) == {"127.0.0.1"}      # twice: gone
    accepted.close()
    server.close()


def test_worker_sees_its_head_and_loses_it() -> None:
    server = _listener()
    port = server.getsockname()[1]
    conn = socket.create_connection(("127.0.0.1", port))
    head_end, _ = server.accept()
    heads = gw.resolve("127.0.0.1")
    assert gw.group_peers(False, port, heads, gw.established()) == {"head"}
    assert gw.group_peers(False, port + 1, heads, gw.established()) == set()
    head_end.close()
    server.close()                   # the head went away
    assert gw.group_peers(False, port, heads, gw.established()) == set()
    conn.close()


def test_ipv6_and_mapped_addresses() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        server = _listener(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no ::1 here")
    port = server.getsockname()[1]
    conn = socket.create_connection(("::1", port))
    accepted, _ = server.accept()
    assert gw.group_peers(True, port, set(), gw.established(), own_ranks=True) == {"::1"}
    assert gw._address("0000000000000000FFFF00000100007F:1F90") == ("127.0.0.1", 8080)
    conn.close()
    accepted.close()
    server.close()


def test_a_watch_started_late_sees_a_group_already_short() -> None:
    """Started once the model is active: the group formed whole, so a host
    missing at the first look left before the watch began."""
    watch = gw.Watch(expected=2)
    assert watch.look({"10.0.0.2"}) == set()
    assert watch.look({"10.0.0.2"}) == {gw.SHORT}
    worker = gw.Watch(expected=1)
    worker.look(set())
    assert worker.look(set()) == {gw.SHORT}
    whole = gw.Watch(expected=2)
    assert whole.look({"10.0.0.2", "10.0.0.3"}) == set()
    whole.look({"10.0.0.2"})
    assert whole.look({"10.0.0.2"}) == {"10.0.0.3"}


def test_a_forming_group_grows_and_a_reset_forgets_it() -> None:
    watch = gw.Watch()
    assert watch.look({"10.0.0.2"}) == set()
    assert watch.look({"10.0.0.2", "10.0.0.3"}) == set()
    assert watch.look({"10.0.0.2"}) == set()
    assert watch.look({"10.0.0.2", "10.0.0.3"}) == set()    # back: not counted
    watch.look({"10.0.0.2"})
    assert watch.look({"10.0.0.2"}) == {"10.0.0.3"}
    watch.reset()
    assert watch.look(set()) == set() and watch.look(set()) == set()
