"""The GPU machine's systemd harness (tests/gpu/systemd), run here with fake
GPUs: the carried root built from this tree, booted the same way, the same
scenarios (s8: the restart bench against the container's systemd; l1-l8:
llama.cpp as the models' server, here the CPU build of tools/engines/build
where it is built, else they say they were skipped), once with one fake GPU
(the path of the one-GPU machine, the two-GPU scenarios reported as skipped)
and once with two.

It runs in CI because nothing else does: the harness is only run on the GPU
machine by hand, and a harness that is broken here (it once was: a name used
before it was defined) wastes the device time it is given.  Several minutes;
INFER_UNITS_E2E_GPU_HARNESS=0 skips it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests/gpu/systemd"
TWO_GPU_SCENARIOS = {"s3_disjoint", "s4_p2p"}
LLAMA_SCENARIOS = {"l1_llama_lifecycle", "l2_llama_killed", "l3_llama_hang", "l4_llama_foreign",
                   "l5_llama_drain", "l6_llama_health", "l7_llama_bench", "l8_llama_canary"}

pytestmark = pytest.mark.skipif(os.environ.get("INFER_UNITS_E2E_GPU_HARNESS") == "0",
                                reason="INFER_UNITS_E2E_GPU_HARNESS=0")


@pytest.fixture(scope="module")
def carry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("gpucarry") / "carry"
    built = subprocess.run([str(HARNESS / "build-carry"), str(dest)], capture_output=True,
                           text=True, timeout=1800)
    assert built.returncode == 0, built.stderr[-3000:]
    return dest


def llama_dir(tmp: Path) -> Path | None:
    """The CPU llama-server and its GGUF (tools/engines/build), as boot-scenarios.sh's
    IU_LLAMA_DIR wants them, where they are built."""
    printed = subprocess.run([str(ROOT / "tools/engines/build"), "--print-paths"],
                             capture_output=True, text=True, check=True)
    paths = json.loads(printed.stdout)
    server, model = Path(paths["llama_server"]), Path(paths["gguf_model"])
    if not (server.is_file() and model.is_file()):
        return None
    found = tmp / "llama"
    (found / "bin").mkdir(parents=True)
    shutil.copy2(server, found / "bin/llama-server")
    shutil.copy2(model, found / "model.gguf")
    (found / "CONTEXT").write_text("2048\n")
    return found


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_gpu_harness_passes_on_fake_gpus(carry: Path, tmp_path: Path, gpus: int) -> None:
    out = tmp_path / "out"
    llama = llama_dir(tmp_path)
    env = dict(os.environ, OUT=str(out), IU_WORK=str(tmp_path / "work"), IU_FAKE_GPU_COUNT=str(gpus))
    if llama is not None:
        env["IU_LLAMA_DIR"] = str(llama)
    done = subprocess.run([str(HARNESS / "run-local"), str(carry)], capture_output=True, text=True,
                          timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    scenarios = results["scenarios"]
    assert len(results["gpus"]) == gpus
    failed = {k: v.get("summary", v.get("error")) for k, v in scenarios.items() if not v["ok"]}
    assert len(scenarios) == 16 and not failed, failed
    skipped = {k for k, v in scenarios.items() if v.get("skipped")}
    # Only the scenarios that need two GPUs may skip, and only where there is
    # one; the llama.cpp ones only where no llama-server is built.
    assert skipped == ((TWO_GPU_SCENARIOS if gpus == 1 else set())
                       | (LLAMA_SCENARIOS if llama is None else set())), skipped
    for name in scenarios.keys() - skipped:
        assert scenarios[name].get("summary"), f"{name} ran but reported nothing"
