"""packaging/build-deb says at the end of its output whether NVML was
bundled, and the package records the same.  Without the
nvidia-ml-py wheel (no index, an empty wheel cache) the .deb still builds,
says "NOT bundled" with the /proc fallback after dpkg's output, and records
NVML=none in /usr/share/infer-units/nvml for `infer-units doctor`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("dpkg-buildpackage") is None, reason="needs dpkg-dev")
@pytest.mark.skipif((ROOT / "vendor/pynvml.py").exists(), reason="a pynvml.py put in vendor/")
def test_a_build_without_nvml_says_so_last_and_records_it(tmp_path: Path) -> None:
    version = f"0.0.0+nonvml{os.getpid()}"
    env = dict(os.environ, PIP_NO_INDEX="1", INFER_UNITS_NVML_CACHE=str(tmp_path / "wheels"),
               INFER_UNITS_DEB_VERSION=version)
    done = subprocess.run([str(ROOT / "packaging/build-deb")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    deb = Path(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    try:
        assert done.returncode == 0, done.stderr[-3000:]
        assert deb is not None and deb.name == f"infer-units_{version}_all.deb"
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("build-deb: NVML: NOT bundled") and "/proc" in last, last
        record = subprocess.run(f"dpkg-deb --fsys-tarfile {deb} | tar -xOf - "
                                "./usr/share/infer-units/nvml", shell=True, check=True,
                                capture_output=True, text=True).stdout
        assert record == "NVML=none\n"
        files = subprocess.run(["dpkg-deb", "-c", str(deb)], check=True, capture_output=True,
                               text=True).stdout
        assert "_vendor/pynvml.py" not in files
        # lintian has nothing to say (its overrides say why, where a rule is
        # deliberately not followed).
        lint = subprocess.run(["lintian", "--allow-root", str(deb)], capture_output=True,
                              text=True, timeout=600)
        assert lint.returncode == 0 and lint.stdout.strip() == "", lint.stdout + lint.stderr
    finally:
        if deb is not None:
            deb.unlink(missing_ok=True)
