"""The package on a fresh Debian with real systemd, in a container of its own
(the shared one has /etc/infer-units before the package): the README's quick
start as written, what the package records of NVML, and postinst repairing
a /run/infer-units an older version left writable by others."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest

from .container import Container, suites

pytestmark = pytest.mark.e2e

NOBODY = "setpriv --reuid=65534 --regid=65534 --clear-groups --"


@pytest.fixture(scope="module", params=suites())
def fresh(request: pytest.FixtureRequest, deb: Path) -> Iterator[Container]:
    c = Container(request.param)
    try:
        c.boot()
        yield c
    finally:
        c.shutdown()


def load_state(box: Container, unit: str) -> str:
    return box.sh(f"systemctl show -p LoadState --value {unit}").stdout.strip()


def test_the_readme_quick_start_runs_as_written(fresh: Container, deb: Path) -> None:
    assert fresh.sh("test -e /etc/infer-units", check=False).returncode != 0
    fresh.install_deb(deb)
    assert fresh.sh("stat -c '%U:%G %a' /etc/infer-units").stdout.split() == ["root:root", "755"]
    # README, "A first model": the two lines as the operator types them.
    fresh.sh("cp /usr/share/doc/infer-units/examples/llamacpp-small.toml /etc/infer-units/")
    fresh.sh("systemctl daemon-reload")
    assert load_state(fresh, "llamacpp-small.service") == "loaded"


def test_the_package_records_whether_nvml_is_bundled(fresh: Container, deb: Path) -> None:
    """/usr/share/infer-units/nvml (what `doctor` reads) agrees with what is
    installed: NVML=bundled with the version and the vendored pynvml, or
    NVML=none and no pynvml of ours."""
    record = fresh.sh("cat /usr/share/infer-units/nvml").stdout
    vendored = fresh.sh("test -f /usr/lib/python3/dist-packages/infer_units/_vendor/pynvml.py",
                        check=False).returncode == 0
    if vendored:
        assert re.fullmatch(r"NVML=bundled\nNVIDIA_ML_PY=[0-9][0-9.]*\n", record), record
    else:
        assert record == "NVML=none\n"


def test_postinst_repairs_a_run_directory_left_writable(fresh: Container, deb: Path) -> None:
    """An older version left /run/infer-units 0777; an unprivileged account
    put a link to a root-owned model file (a unit running as root) and an
    empty mask there.  Configuring the package makes the directory root's
    0755 again, removes both, naming each, and the reload that follows
    generates the operator's model and not the link."""
    fresh.sh("mkdir -p /run/infer-units && chmod 0777 /run/infer-units")
    fresh.sh(f"{NOBODY} ln -s /usr/share/doc/infer-units/examples/vllm-llama.toml "
             "/run/infer-units/evil.toml")
    fresh.sh(f"{NOBODY} touch /run/infer-units/llamacpp-small.toml")
    fresh.sh("systemctl daemon-reload")
    assert load_state(fresh, "evil.service") == "not-found"         # refused whole already
    done = fresh.sh(f"dpkg -i /root/{deb.name} 2>&1")
    assert "removed /run/infer-units/evil.toml" in done.stdout, done.stdout
    assert "removed /run/infer-units/llamacpp-small.toml" in done.stdout, done.stdout
    assert fresh.sh("stat -c '%U:%G %a' /run/infer-units").stdout.split() == ["root:root", "755"]
    assert fresh.sh("ls -A /run/infer-units").stdout.split() == []
    assert load_state(fresh, "evil.service") == "not-found"
    assert load_state(fresh, "llamacpp-small.service") == "loaded"
