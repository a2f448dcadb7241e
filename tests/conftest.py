"""Fixtures for the tests in tests/ (helpers live in support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .support import FakeGpus, Holder


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
