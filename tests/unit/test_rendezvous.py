"""A multi-node worker joins only a head that is forming a group: real
sockets on loopback stand for the head's rendezvous and HTTP ports."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from infer_units.helpers.act.rendezvous import head_state, wait_rendezvous


def listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_head_states() -> None:
    rendezvous, http = listener(), listener()
    addr = f"127.0.0.1:{rendezvous.getsockname()[1]}"
    url = f"http://127.0.0.1:{http.getsockname()[1]}/health"
    # the head serves HTTP: a group formed without this rank
    assert head_state(addr, url) == "serving a group formed without this rank"
    refused = f"http://127.0.0.1:{free_port()}/health"
    assert head_state(addr, refused) == "forming"
    assert head_state(f"127.0.0.1:{free_port()}", refused) == "rendezvous closed"
    rendezvous.close()
    http.close()


def test_worker_parks_until_the_head_forms_a_group(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="infer_units")
    port = free_port()
    opened: list[float] = []

    joined = threading.Event()

    def head_comes_up() -> None:
        time.sleep(0.6)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        opened.append(time.monotonic())
        joined.wait(60)         # forming a group until the worker saw it, however busy
        s.close()

    threading.Thread(target=head_comes_up, daemon=True).start()
    url = f"http://127.0.0.1:{free_port()}/health"
    try:
        assert wait_rendezvous(f"127.0.0.1:{port}", url, timeout=60, poll_s=0.05)
    finally:
        joined.set()
    said = caplog.messages
    assert opened and time.monotonic() >= opened[0]
    assert any("parked until the head forms a group" in line for line in said)
    assert "is forming a group" in said[-1]


def test_worker_does_not_join_a_serving_head(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="infer_units")
    rendezvous, http = listener(), listener()
    ok = wait_rendezvous(f"127.0.0.1:{rendezvous.getsockname()[1]}",
                         f"http://127.0.0.1:{http.getsockname()[1]}/",
                         timeout=0.3, poll_s=0.05)
    assert not ok and "serving a group formed without this rank" in caplog.messages[-1]
    rendezvous.close()
    http.close()
