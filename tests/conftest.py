"""The tiers and the fixtures every tier shares (helpers live in support.py).

A test's tier is the directory it lives in (as pip's tests do): tests/unit
(no root, no other account, no containers, no network), tests/integration
(root, real accounts, real processes killed), tests/e2e (real systemd in
containers) and tests/gpu (the device machine).  Each test gets its tier's
marker, so `-m unit` and `-m "not e2e"` select by directory; a test file
anywhere else is refused rather than run in no tier (docs/testing.md)."""

from __future__ import annotations

import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import ATTACKER, FakeGpus, Holder

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e", "gpu")


def tier_of(path: Path) -> str | None:
    """The tier directory `path` is in, None for a file outside every tier."""
    try:
        top = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return top if top in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            raise pytest.UsageError(
                f"{item.path}: a test outside the tier directories; put it in "
                f"{', '.join('tests/' + t for t in TIERS)}")
        item.add_marker(getattr(pytest.mark, tier))


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
