"""Every unit the generator writes for the fixtures (services, drop-ins), and
the instances of the package's liveness template units they want (with the
drop-ins the generator writes for them), pass `systemd-analyze verify`.

verify checks that executables exist, so it runs against a root (--root) that
holds a copy of this host's systemd units and an executable stub for every
program the units name."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from infer_units.generator.paths import DEB_CLI
from infer_units.generator.render import shipped_names, shipped_units
from ..support import run_generator
from .test_generator_cases import case_names, prepare
from ..unitfile import exec_argv, parse_unit, values

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
    return make_verify_root(tmp_path_factory.mktemp("verify-root"))


def make_verify_root(root: Path) -> Path:
    """This host's units and the package's template units, in `root`."""
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    for template in shipped_units(DEB_CLI, shipped_names()):     # as the .deb installs them
        (root / "usr/lib/systemd/system" / template.name).write_text(template.text)
        for key, value in parse_unit(template.text).get("Service", []):
            if key.startswith("Exec"):
                _stub(root, exec_argv(value)[0])
    return root


def instances(units: list[Path]) -> list[str]:
    """The liveness template instances the generated services want (those
    of services verified under their own names: their Requisite= needs it)."""
    found = []
    for unit in units:
        if values(unit.read_text(), "Service", "SyslogIdentifier") != [unit.stem]:
            continue
        for value in values(unit.read_text(), "Unit", "Wants"):
            for name in value.split():
                if name.startswith("infer-units-liveness@"):
                    found += [name, name.removesuffix(".timer") + ".service"]
                elif name.startswith("infer-units-group@"):
                    found.append(name)
    return found


def verify(verify_root: Path, units: list[Path], out: Path | None = None,
           ) -> subprocess.CompletedProcess[str]:
    """systemd-analyze verify on these units in one call (it is slow to start),
    with a stub for every program they run; with `out`, the generator's whole
    output goes in (drop-ins X.service.d/*.conf and links with the units)."""
    system = verify_root / "etc/systemd/system"
    shutil.rmtree(system, ignore_errors=True)
    if out is not None:
        shutil.copytree(out, system, symlinks=True)
        files = [*units, *out.glob("*.service.d/*.conf"), *out.glob("*.timer.d/*.conf")]
    else:
        system.mkdir(parents=True)
        for unit in units:
            shutil.copy(unit, system / unit.name)
        files = list(units)
    for unit in files:
        for key, value in parse_unit(unit.read_text()).get("Service", []):
            if key.startswith("Exec") and value:      # not a reset (`ExecStart=`)
                _stub(verify_root, exec_argv(value)[0])
    return subprocess.run([ANALYZE, "verify", "--man=no", f"--root={verify_root}",
                           *[u.name for u in units], *instances(units)],
                          capture_output=True, text=True, timeout=300)


def assert_verify_clean(verify_root: Path, units: list[Path], what: str,
                        out: Path | None = None) -> None:
    done = verify(verify_root, units, out)
    # verify exits 0 on "Failed to parse ..., ignoring" warnings: any output fails the test.
    assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), \
        f"{what}:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("case", [c for c in case_names() if not c.startswith("err-")])
def test_systemd_analyze_verify(case: str, tmp_path: Path, verify_root: Path) -> None:
    _root, dirs = prepare(case, tmp_path)
    out = tmp_path / "out"
    assert run_generator(out, ":".join(dirs)).returncode == 0
    # Services, and drop-ins (X.service.d/*.conf, X.timer.d/*.conf) with them.
    units = sorted(out.glob("*.service"))
    assert units, f"{case}: nothing generated"
    assert_verify_clean(verify_root, units, case, out)


def test_hostile_but_accepted_corpus_passes_verify(tmp_path: Path, verify_root: Path) -> None:
    """What is escaped rather than refused (tests/integration/test_hostile_inputs.py's
    ACCEPTED: newlines in drop-in names and argv, control characters in env
    values, microsecond and ten-year durations, ...) under a config directory
    whose path holds '%' and a space (SourcePath= expands specifiers)."""
    from ..integration.test_hostile_inputs import ACCEPTED, env_for, make_tree
    root = tmp_path / "conf 100%n"
    root.mkdir()
    etc, units = make_tree(root, ACCEPTED)
    out = tmp_path / "out"
    done = run_generator(out, str(etc), **{k: v for k, v in env_for(etc, units).items()
                                           if k == "INFER_UNITS_UNIT_PATH"})
    assert done.returncode == 0 and done.stderr == ""
    generated = sorted([*out.glob("*.service"), *out.glob("*.timer")])
    assert len([u for u in generated if u.suffix == ".service"]) == 5
    assert values((out / "good.service").read_text(), "Unit", "SourcePath") == \
        [f"{etc}/good.toml".replace("%", "%%")]
    assert_verify_clean(verify_root, generated, "hostile-but-accepted corpus", out)
