"""Session fixtures for the end-to-end tests: the .deb built on this machine by
packaging/build-deb, and one booted container per Debian suite with it
installed (INFER_UNITS_E2E_SUITES="bookworm trixie", the default: both; the
same .deb on every suite)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .container import Container, available, kept_or_shut_down, suites
from .e2e_support import install_fake_gpus, install_fakes, model_toml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The e2e marker comes from the directory (tests/conftest.py); this hook
    # sees every collected item, so it skips only those under this directory.
    reason = available()
    if reason:
        for item in items:
            if item.path.resolve().is_relative_to(HERE):
                item.add_marker(pytest.mark.skip(reason=f"e2e: {reason}"))


@pytest.fixture(scope="session")
def deb() -> Path:
    done = subprocess.run([str(ROOT / "packaging/build-deb")], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    path = Path(done.stdout.strip().splitlines()[-1])
    assert path.exists() and path.suffix == ".deb"
    return path


@pytest.fixture(scope="session", params=suites())
def box(request: pytest.FixtureRequest, deb: Path) -> Iterator[Container]:
    with kept_or_shut_down(Container(request.param)) as c:
        c.boot()
        install_fakes(c, ROOT)
        install_fake_gpus(c)
        # A model present before the package: installing must generate its unit.
        c.write("/etc/infer-units/preinstalled.toml", model_toml("preinstalled", [5], 18099))
        done = c.install_deb(deb)
        c.install_output = done.stdout + done.stderr  # type: ignore[attr-defined]
        yield c
