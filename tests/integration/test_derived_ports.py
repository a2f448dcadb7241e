"""The ports an engine derives from the model's settings reach pre-start as
the generator renders them, and a holder on any one of them is named and
refuses the start: SGLang with attention data parallelism binds
its dist-init port (the HTTP port + 233) and five ZMQ ports after it."""

from __future__ import annotations

import os
import random
import socket
import subprocess
from pathlib import Path

import pytest

from ..support import PYTHON, FakeGpus, run_generator
from ..unitfile import exec_argv, values

MODEL = """engine = "sglang"
model = "{model}"
gpus = [0, 1]
port = {port}
args = ["--attn-dp-size", "2"]
[reap]
foreign = "fail"
"""


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def base_port() -> int:
    """An HTTP port whose derived ports (port + 233 ... + 238) are free too."""
    for _ in range(200):
        port = random.randrange(20000, 40000)
        if all(_free(p) for p in (port, *range(port + 233, port + 239))):
            return port
    pytest.skip("no free range of ports found")


@pytest.fixture
def pre_start(tmp_path: Path, base_port: int) -> list[str]:
    """The generated unit's ExecStartPre argv, run with this checkout's CLI."""
    etc = tmp_path / "etc"
    etc.mkdir()
    # The model's path is there: pre-start refuses a missing one first.
    (tmp_path / "model").mkdir()
    (etc / "dp.toml").write_text(MODEL.format(port=base_port, model=tmp_path / "model"))
    out = tmp_path / "out"
    done = run_generator(out, str(etc))
    assert done.returncode == 0 and (out / "dp.service").exists(), done.stderr
    line = values((out / "dp.service").read_text(), "Service", "ExecStartPre")[0]
    argv = exec_argv(line.removeprefix("+"))
    assert argv[0] == "/usr/bin/infer-units", argv
    return [PYTHON, "-m", "infer_units", *argv[1:]]


def _ports(argv: list[str]) -> list[int]:
    return [int(argv[i + 1]) for i, word in enumerate(argv) if word == "--port"]


@pytest.fixture
def env(tmp_path: Path, fake_gpus: FakeGpus) -> dict[str, str]:
    return fake_gpus.env(INFER_UNITS_STATE_DIR=str(tmp_path / "state"))


def test_every_derived_port_is_rendered(pre_start: list[str], base_port: int) -> None:
    assert _ports(pre_start) == [base_port, *range(base_port + 233, base_port + 239)]


def test_a_holder_on_each_derived_port_is_named_and_refuses(pre_start: list[str],
                                                           base_port: int,
                                                           env: dict[str, str]) -> None:
    for port in _ports(pre_start)[1:]:
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", port))
            holder.listen()
            done = subprocess.run(pre_start, capture_output=True, text=True, env=env,
                                  timeout=120)
        assert done.returncode == 2, (port, done.stderr)
        assert f"port {port} held by pid {os.getpid()}" in done.stderr, (port, done.stderr)
    done = subprocess.run(pre_start, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "start checks passed" in done.stderr, done.stderr
