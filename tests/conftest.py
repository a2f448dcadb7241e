"""Fixtures for the tests in tests/ (helpers live in support.py)."""

from __future__ import annotations

import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import ATTACKER, FakeGpus, Holder


@pytest.fixture
def fake_gpus(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path / "fakegpu")


@pytest.fixture
def holders():
    started: list[Holder] = []

    def start(devices: list[Path], mode: str = "plain", argv0: str | None = None,
              exe: str | None = None, exe_uid: int = 0) -> Holder:
        h = Holder(devices, mode, argv0, exe, exe_uid)
        started.append(h)
        return h

    yield start
    for h in started:
        h.stop()


@pytest.fixture(scope="session")
def attacker() -> pwd.struct_passwd:
    """The local attacker of the trust tests: a real account without root
    (created once, needs root), whose commands run through setpriv."""
    try:
        return pwd.getpwnam(ATTACKER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        ATTACKER], check=True)
        return pwd.getpwnam(ATTACKER)


@pytest.fixture
def public() -> Iterator[Path]:
    """A root-owned 0755 directory other users can reach (pytest's tmp is 0700)."""
    path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="iu-public-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)
