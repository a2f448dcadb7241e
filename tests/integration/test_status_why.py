"""`infer-units status` says why, through the real
command: an unknown name gets a did-you-mean, a drained host is named, a
foreign process on a model's port is named as such and never shown as the
model's health.  Under real systemd (crash loops, exit codes):
tests/e2e/test_status_e2e.py."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import base_env, run_cli

MODEL = 'engine = "command"\ncommand = ["/bin/true"]\nport = {port}\n'


@pytest.fixture
def squatted() -> Iterator[int]:
    """A port this test listens on: no infer-units unit's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def host(tmp_path: Path, port: int) -> dict[str, str]:
    etc = tmp_path / "etc"
    etc.mkdir(parents=True)
    (etc / "qwen-small.toml").write_text(MODEL.format(port=port))
    (tmp_path / "run").mkdir()
    return base_env(INFER_UNITS_CONFIG_PATH=str(etc), INFER_UNITS_RUN_DIR=str(tmp_path / "run"),
                    INFER_UNITS_STATE_DIR=str(tmp_path / "state"))


def test_an_unknown_name_says_which_it_may_mean(tmp_path: Path, squatted: int) -> None:
    done = run_cli("status", "qwen-smal", env=host(tmp_path, squatted))
    assert done.returncode == 1, done
    assert "no model file named qwen-smal.toml on the search path (did you mean qwen-small?)" \
        in done.stderr, done.stderr
    far = run_cli("status", "zzz", env=host(tmp_path / "b", squatted))
    assert far.returncode == 1 and "did you mean" not in far.stderr, far.stderr


def test_a_foreign_port_holder_is_named_not_shown_as_health(tmp_path: Path,
                                                            squatted: int) -> None:
    done = run_cli("status", "--json", "qwen-small", env=host(tmp_path, squatted))
    [model] = json.loads(done.stdout)["models"]
    assert model["health"]["ok"] is False and model["health"].get("foreign"), model["health"]
    [holder] = model["port_view"]["foreign"]
    assert holder["pid"] == os.getpid(), holder
    assert any(f"port {squatted} is held by a process not of qwen-small.service: "
               f"pid {os.getpid()}" in why for why in model["why"]), model["why"]
    table = run_cli("status", "qwen-small", env=host(tmp_path / "t", squatted))
    row = table.stdout.splitlines()[1].split()
    assert row[0] == "qwen-small" and "foreign" in row, table.stdout


def test_a_drained_host_is_named(tmp_path: Path, squatted: int) -> None:
    env = host(tmp_path, squatted)
    (tmp_path / "run" / "drain.fence").write_text(
        json.dumps({"stopped": ["qwen-small.service"], "since_text": "2026-12-05 10:00"}))
    done = run_cli("status", "qwen-small", env=env)
    assert "this host is drained" in done.stdout and "infer-units resume" in done.stdout, \
        done.stdout
    assert "qwen-small: drained by `infer-units drain` since 2026-12-05 10:00" in done.stdout
    # Its liveness is not probed while it is not active: no stale "ok ... ago".
    assert " ago" not in done.stdout.splitlines()[1], done.stdout


def test_a_server_the_ready_timeout_stopped_is_said_so() -> None:
    """wait-ready gave up (exit 3) and systemd's stop ended the server with
    status 15: the ready timeout stopped it, not the server's own exit."""
    from infer_units.helpers.cli.status import _why
    said = ("exit 3 = timed out: no healthy answer within 1200s "
            "(last: connection refused)")
    entry = {"unit": "m.service", "last_error": said,
             "last_exit": "main process exit status 15",
             "systemd": {"available": True, "active_state": "failed", "result": "exit-code",
                         "exec_main_code": 1, "exec_main_status": 15}}
    [why] = _why(entry, None)
    assert why.startswith("failed (last result exit-code, the ready timeout stopped it "
                          "([ready] timeout)): exit 3 = timed out: no healthy answer"), why
    assert "status 15" not in why, why
    # a server that exited by itself keeps its own exit status
    entry["last_error"] = "server pid 9 exited while loading; exit 7 = the server's own exit status"
    entry["last_exit"] = "main process exit status 7"
    [why] = _why(entry, None)
    assert "main process exit status 7" in why and "ready timeout" not in why, why
