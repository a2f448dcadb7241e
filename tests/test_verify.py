"""Every unit the generator writes for the fixtures (services, liveness timers,
drop-ins) passes `systemd-analyze verify`.

verify checks that executables exist, so it runs against a root (--root) that
holds a copy of this host's systemd units and an executable stub for every
program the units name."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from support import run_generator
from test_generator_cases import case_names, prepare
from unitfile import exec_argv, parse_unit

ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(not ANALYZE or not Path("/usr/lib/systemd/system").is_dir(),
                                reason="systemd-analyze and /usr/lib/systemd/system needed")


def _stub(root: Path, program: str) -> None:
    path = root / program.lstrip("/") if program.startswith("/") else root / "usr/bin" / program
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)


@pytest.fixture(scope="module")
def verify_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify-root")
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    return root


@pytest.mark.parametrize("case", [c for c in case_names() if not c.startswith("err-")])
def test_systemd_analyze_verify(case: str, tmp_path: Path, verify_root: Path) -> None:
    _root, dirs = prepare(case, tmp_path)
    out = tmp_path / "out"
    assert run_generator(out, ":".join(dirs)).returncode == 0
    # Services, the liveness timers, and drop-ins (X.service.d/*.conf) with them.
    units = sorted([*out.glob("*.service"), *out.glob("*.timer")])
    assert units, f"{case}: nothing generated"
    system = verify_root / "etc/systemd/system"
    shutil.rmtree(system, ignore_errors=True)
    shutil.copytree(out, system, symlinks=True)
    for unit in [*units, *out.glob("*.service.d/*.conf")]:
        for key, value in parse_unit(unit.read_text()).get("Service", []):
            if key.startswith("Exec"):
                _stub(verify_root, exec_argv(value)[0])
    done = subprocess.run([ANALYZE, "verify", "--man=no", f"--root={verify_root}",
                           *[u.name for u in units]], capture_output=True, text=True, timeout=120)
    # verify exits 0 on "Failed to parse ..., ignoring" warnings: any output fails the test.
    assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), \
        f"{case}:\n{done.stdout}{done.stderr}"
