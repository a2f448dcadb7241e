"""`infer-units doctor --json` with real NVML and the machine's kernel (run on
the device machine: tests/gpu/run-on-device).  Records every check's real
answer under $OUT and checks that what a real H200 answered (docs/health.md,
"What a real GPU answered") answers here too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ..support import PYTHON, base_env, run_cli

pytestmark = pytest.mark.gpu

try:
    import pynvml
    pynvml.nvmlInit()
    COUNT = pynvml.nvmlDeviceGetCount()
except Exception:       # noqa: BLE001
    COUNT = 0
if not COUNT:
    pytest.skip("no NVIDIA GPU visible through NVML", allow_module_level=True)

OUT = Path(os.environ.get("OUT", "gpu-out"))


def test_doctor_answers_every_check_with_real_nvml_and_records_them(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    # The image's torch python as a vLLM model's interpreter: the engine itself
    # may be missing (an error, recorded), the CUDA runtime comes from torch.
    (etc / "probe.toml").write_text(f'engine = "vllm"\nmodel = "/m"\ngpus = [0]\nport = 18778\n'
                                    f'python = "{PYTHON}"\n')
    env = base_env(INFER_UNITS_CONFIG_PATH=str(etc))
    done = run_cli("doctor", "--json", "probe", env=env)
    text = run_cli("doctor", "-v", "probe", env=env)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "doctor.json").write_text(done.stdout)
    (OUT / "doctor.txt").write_text(f"$ infer-units doctor -v probe  (exit {text.returncode})\n"
                                    + text.stdout + text.stderr)
    print(text.stdout)
    assert done.returncode in (0, 2), done.stderr
    report = json.loads(done.stdout)
    assert report["backend"] == "nvml" and len(report["gpus"]) == COUNT
    assert report["driver"]["version"] and report["driver"]["cuda"], report["driver"]
    for gpu in report["gpus"]:
        levels = {f["check"]: f["level"] for f in gpu["findings"]}
        assert set(levels) == {"remapped-rows", "retired-pages", "xid", "ecc", "persistence",
                               "fabric", "mig", "hmm", "cc", "iommu", "acs"}, levels
        # answered on the H200 (docs/health.md, "What a real GPU answered"): not
        # unknown here either
        for check in ("remapped-rows", "ecc", "persistence", "mig", "hmm", "cc"):
            assert levels[check] != "unknown", (check, gpu["findings"])
    model = {f["check"]: f for f in report["models"][0]["findings"]}
    assert model["python"]["level"] == "ok", model["python"]
    assert model["cuda-driver"]["level"] != "unknown", model["cuda-driver"]
