"""The GPU machine's systemd harness (tests/gpu/systemd), run here with fake
GPUs: the carried root built from this tree, booted the same way, the same
seven scenarios.  Opt-in (it builds a root: minutes, and apt downloads):
INFER_UNITS_E2E_GPU_HARNESS=1."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests/gpu/systemd"

pytestmark = pytest.mark.skipif(os.environ.get("INFER_UNITS_E2E_GPU_HARNESS") != "1",
                                reason="opt-in: INFER_UNITS_E2E_GPU_HARNESS=1")


def test_the_gpu_harness_passes_on_fake_gpus(tmp_path: Path) -> None:
    carry = tmp_path / "carry"
    built = subprocess.run([str(HARNESS / "build-carry"), str(carry)], capture_output=True,
                           text=True, timeout=1800)
    assert built.returncode == 0, built.stderr[-3000:]
    out = tmp_path / "out"
    done = subprocess.run([str(HARNESS / "run-local"), str(carry)], capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, OUT=str(out),
                                                IU_WORK=str(tmp_path / "work")))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    failed = {k: v.get("summary", v.get("error")) for k, v in results["scenarios"].items()
              if not v["ok"]}
    assert len(results["scenarios"]) == 7 and not failed, failed
