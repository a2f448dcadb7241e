"""pre-start and the ports the server binds (issue 37 item 5, issue 40's
derived ports): a foreign holder is named at once, the start fails fast or
waits visibly as `[reap] foreign` says, every port given is checked, and the
hook's last line says what its exit code means (systemd shows 2 as
INVALIDARGUMENT and 3 as NOTIMPLEMENTED)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import PYTHON, base_env, run_cli


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
    done = run_cli("pre-start", "--unit", "m", "--foreign", "fail", "--timeout", "60s",
                   "--port", str(held), env=env(tmp_path))
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 30, "it waited for the timeout"
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
