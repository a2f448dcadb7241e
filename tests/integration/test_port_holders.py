"""pre-start and the ports the server binds (the HTTP port and
the ports the engine derives from it): a foreign holder is named at once, the start fails fast or
waits visibly as `[reap] foreign` says, every port given is checked, and the
hook's last line says what its exit code means (systemd shows 2 as
INVALIDARGUMENT and 3 as NOTIMPLEMENTED)."""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import PYTHON, FakeGpus, base_env, run_cli


@pytest.fixture
def held() -> Iterator[int]:
    """A port this test process listens on: a holder of no infer-units unit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(tmp_path: Path) -> dict[str, str]:
    return base_env(INFER_UNITS_STATE_DIR=str(tmp_path / "state"),
                    INFER_UNITS_RUN_DIR=str(tmp_path / "run"))


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    return done.stderr.strip().splitlines()[-1]


def test_foreign_fail_refuses_at_once_naming_the_holder(held: int, tmp_path: Path) -> None:
    started = time.monotonic()
    done = run_cli("pre-start", "--unit", "m", "--foreign", "fail", "--timeout", "300s",
                   "--port", str(held), env=env(tmp_path))
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 60, "it waited for the timeout"
    assert f"port {held} held by pid {os.getpid()}" in done.stderr, done.stderr
    assert last_line(done).startswith("<3>infer-units: exit 2 = blocked: port "), done.stderr


@pytest.mark.parametrize("foreign", ["wait", "kill"])
def test_wait_names_the_holder_at_once_then_exit_3_explained(held: int, tmp_path: Path,
                                                             foreign: str) -> None:
    done = run_cli("pre-start", "--unit", "m", "--foreign", foreign, "--timeout", "0.3s",
                   "--port", str(held), env=env(tmp_path))
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("<4>") and f"port {held} held by pid {os.getpid()}" in lines[0], \
        lines
    assert last_line(done).startswith("<3>infer-units: exit 3 = timed out with holders left: "
                                      f"port {held} still in use after 0.3s: pid {os.getpid()}"), \
        lines


def test_waiting_says_so_again_until_the_holder_lets_go(tmp_path: Path) -> None:
    port = free_port()
    holder = subprocess.Popen([PYTHON, "-c", (
        "import socket, sys; s = socket.socket(); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); "
        "sys.stdin.readline()")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout and holder.stdin and holder.stdout.readline().strip() == "up"
    waiting = subprocess.Popen([PYTHON, "-m", "infer_units", "pre-start", "--unit", "m",
                                "--foreign", "wait", "--timeout", "600s", "--port", str(port)],
                               stderr=subprocess.PIPE, text=True, env=env(tmp_path))
    assert waiting.stderr
    first = waiting.stderr.readline()
    assert f"port {port} held by pid {holder.pid}" in first and "waiting up to" in first, first
    again = waiting.stderr.readline()        # the reminder, while it still waits
    assert f"port {port} still held by pid {holder.pid}" in again and "left" in again, again
    holder.stdin.write("go\n")
    holder.stdin.close()
    holder.wait()
    rest = waiting.stderr.read()
    assert waiting.wait(60) == 0, rest
    assert f"port {port} free after" in rest and "start checks passed" in rest, rest


def test_every_port_given_is_checked(held: int, tmp_path: Path) -> None:
    """--port repeated: the HTTP port free, a derived port held: named, refused."""
    done = run_cli("pre-start", "--unit", "m", "--foreign", "fail", "--port", str(free_port()),
                   "--port", str(held), env=env(tmp_path))
    assert done.returncode == 2 and f"port {held} held by pid {os.getpid()}" in done.stderr, \
        done.stderr
    ok = run_cli("pre-start", "--unit", "m", "--port", str(free_port()), "--port",
                 str(free_port()), env=env(tmp_path))
    assert ok.returncode == 0 and "start checks passed" in ok.stderr, ok.stderr


# A listener answering 200 to anything, on argv's address and port (IPv6 when
# the address has a colon; dual-stack on "::").
ANSWERS_200 = r"""
import socket, sys
address, port = sys.argv[1], int(sys.argv[2])
listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
if address == "::":
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
listener.bind((address, port))
listener.listen(16)
print("up", flush=True)
while True:
    conn, _ = listener.accept()
    conn.recv(4096)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    conn.close()
"""


def listening(address: str, port: int, account: pwd.struct_passwd | None = None
              ) -> subprocess.Popen[str]:
    """A process answering 200 on address:port: as `account` (setpriv, no
    root, no groups), or as this test's root."""
    if ":" in address and not os.path.exists("/proc/net/if_inet6"):
        pytest.skip("no IPv6 on this host")
    drop = [] if account is None else [
        "setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups",
        "--"]
    p = subprocess.Popen([*drop, PYTHON, "-I", "-c", ANSWERS_200, address, str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    if p.stdout.readline() != "up\n":
        p.kill()
        pytest.fail(f"no listener on {address} port {port}: {p.communicate()[1]}")
    return p


def ended(*processes: subprocess.Popen[str]) -> None:
    for p in processes:
        p.kill()
        p.communicate()


@pytest.mark.parametrize("address", ["127.0.0.2", "::1"])
def test_a_users_listener_on_another_address_does_not_block_the_start(
        attacker: pwd.struct_passwd, tmp_path: Path, address: str) -> None:
    """The server binds 127.0.0.1: an account listening at the same port on
    127.0.0.2 or ::1 takes nothing the server needs (its bind succeeds),
    so the start goes on and that account is named nowhere."""
    port = free_port()
    user = listening(address, port, attacker)
    try:
        done = run_cli("pre-start", "--unit", "m", "--foreign", "fail", "--timeout", "10s",
                       "--host", "127.0.0.1", "--port", str(port), env=env(tmp_path))
        assert done.returncode == 0, done.stderr
        assert "start checks passed" in done.stderr and f"pid {user.pid}" not in done.stderr, \
            done.stderr
        # And the server's own bind indeed succeeds beside it.
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
    finally:
        ended(user)


@pytest.mark.parametrize("address", ["0.0.0.0", "127.0.0.1", "::", "::ffff:127.0.0.1"])
def test_a_users_listener_that_clashes_with_the_servers_bind_blocks_it_and_is_named(
        attacker: pwd.struct_passwd, tmp_path: Path, address: str) -> None:
    """The wildcard, the server's own address, a dual-stack IPv6 wildcard and
    the v4-mapped form of the address all take the server's bind."""
    port = free_port()
    user = listening(address, port, attacker)
    try:
        done = run_cli("pre-start", "--unit", "m", "--foreign", "fail", "--timeout", "10s",
                       "--host", "127.0.0.1", "--port", str(port), env=env(tmp_path))
        assert done.returncode == 2, done.stderr
        assert f"port {port} held by pid {user.pid}" in done.stderr, done.stderr
    finally:
        ended(user)


def test_a_derived_port_is_held_by_a_listener_on_any_address(
        attacker: pwd.struct_passwd, tmp_path: Path) -> None:
    """The ports an engine derives from its HTTP port (torch's store, TGI's
    metrics) are bound on every address, whatever `host` says: an account on
    127.0.0.2 at one of them takes it, and is named."""
    http, derived = free_port(), free_port()
    user = listening("127.0.0.2", derived, attacker)
    try:
        done = run_cli("pre-start", "--unit", "m", "--foreign", "fail", "--timeout", "10s",
                       "--host", "127.0.0.1", "--port", str(http), "--port", str(derived),
                       env=env(tmp_path))
        assert done.returncode == 2, done.stderr
        assert f"port {derived} held by pid {user.pid}" in done.stderr, done.stderr
    finally:
        ended(user)

@pytest.mark.parametrize("address", ["127.0.0.2", "::1"])
def test_a_users_listener_on_another_address_is_not_taken_for_the_servers_health(
        attacker: pwd.struct_passwd, address: str) -> None:
    """wait-ready: the server's own 200 on 127.0.0.1 is its readiness, whoever
    else listens at the same port on another address (their listener never
    saw the probe)."""
    from infer_units.helpers.act.ready import wait_ready
    port = free_port()
    user = listening(address, port, attacker)
    server = listening("127.0.0.1", port)
    try:
        result = wait_ready(f"http://127.0.0.1:{port}/health", server.pid, 10.0, 0.1)
        assert result.ready, result
    finally:
        ended(user, server)


def test_a_users_wildcard_listener_is_still_not_the_servers_health(
        attacker: pwd.struct_passwd) -> None:
    """While the server loads, an account's listener on 0.0.0.0 answers the
    probe to 127.0.0.1: named, never the server's readiness."""
    from infer_units.helpers.act.ready import wait_ready
    port = free_port()
    user = listening("0.0.0.0", port, attacker)
    server = subprocess.Popen(["sleep", "60"])          # the model's server, loading
    try:
        result = wait_ready(f"http://127.0.0.1:{port}/health", server.pid, 1.0, 0.1)
        assert not result.ready, result
        assert f"pid {user.pid}" in result.reason and "not this server's" in result.reason, \
            result
    finally:
        server.kill()
        server.wait()
        ended(user)


@pytest.mark.parametrize("address", ["127.0.0.2", "::1", "0.0.0.0"])
def test_status_calls_foreign_only_a_listener_that_clashes_with_the_models_address(
        attacker: pwd.struct_passwd, fake_gpus: FakeGpus, tmp_path: Path, address: str) -> None:
    """`status`: an account's listener on 127.0.0.2 or ::1 at the port of a
    model bound to 127.0.0.1 is not the model's health nor a holder of its
    port; one on 0.0.0.0 is both, by pid."""
    port = free_port()
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text(f'engine = "sglang"\nmodel = "/m"\ngpus = [0]\n'
                                f'port = {port}\nhost = "127.0.0.1"\n')
    user = listening(address, port, attacker)
    try:
        report = json.loads(run_cli("status", "--json", env=fake_gpus.env(
            INFER_UNITS_CONFIG_PATH=str(etc),
            DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent")).stdout)
        [m] = report["models"]
        foreign = [p["pid"] for p in m["port_view"]["foreign"]]
        if address == "0.0.0.0":
            assert foreign == [user.pid] and m["health"].get("foreign") is True, m
        else:
            assert foreign == [] and not m["health"].get("foreign"), m
    finally:
        ended(user)


HOLDER_ADDRESSES = ["0.0.0.0", "127.0.0.1", "127.0.0.2", "::", ":: v6only", "::1",
                    "::ffff:127.0.0.1", "::ffff:0.0.0.0"]


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::1", "::", "::ffff:127.0.0.1"])
def test_a_holder_is_exactly_what_the_kernel_refuses_the_servers_bind_for(host: str) -> None:
    """For every kind of listener address, port_users(host) names it exactly
    when the kernel refuses the server's own bind of `host` (SO_REUSEADDR,
    dual-stack on ::), and wait_port_free agrees."""
    from infer_units.helpers.facts.ports import port_users, wait_port_free
    if not os.path.exists("/proc/net/if_inet6"):
        pytest.skip("no IPv6 on this host")
    for holder in HOLDER_ADDRESSES:
        address, _, v6only = holder.partition(" ")
        port = free_port()
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
            if ":" in address:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1 if v6only else 0)
            s.bind((address, port))
            s.listen()
            server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            try:
                server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if ":" in host:
                    server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                server.bind((host, port))
                refused = False
            except OSError:
                refused = True
            finally:
                server.close()
            named = [i.pid for i, _how in port_users(host, port) or []]
            assert named == ([os.getpid()] if refused else []), (holder, host, refused)
            assert wait_port_free(host, port, 0.0) is not refused, (holder, host)
