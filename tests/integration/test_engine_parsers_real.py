"""The units against the real SGLang and vLLM: their own argument parsers
(tools/check-engine-parsers) and their own reading of CUDA_VISIBLE_DEVICES.

The engines run from the venvs that `tools/engines/build parsers` builds
(pip: torch's CPU wheel, then tools/engine-venvs/*.txt with --no-deps) into
/var/cache/infer-units-engines, keyed by the pins: built here on a fresh
machine (minutes), found on a warm one.  INFER_UNITS_ENGINE_VENVS names
other venvs (a folder holding sglang/ and vllm/) instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..support import FakeGpus, run_cli

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "engines" / "build"
sys.path.insert(0, str(ROOT / "tools"))

import engine_parsers  # noqa: E402


@pytest.fixture(scope="module")
def venvs() -> Path:
    """The pinned venvs, built (niced: the machine is shared) when missing."""
    given = os.environ.get("INFER_UNITS_ENGINE_VENVS")
    if given:
        found = Path(given)
    else:
        done = subprocess.run(["nice", "-n", "10", str(BUILD), "parsers"], capture_output=True,
                              text=True, timeout=3600)
        assert done.returncode == 0, f"tools/engines/build parsers:\n{done.stderr[-6000:]}"
        done = subprocess.run([str(BUILD), "--print-paths"], capture_output=True, text=True,
                              check=True)
        found = Path(json.loads(done.stdout)["parsers"])
    for engine in engine_parsers.ENGINES:
        assert engine_parsers.venv_python(found, engine).exists(), (found, engine)
    return found


def _probe(venvs: Path, engine: str, argv: list[str], home: Path) -> dict[str, object]:
    return engine_parsers.probe(venvs, engine, argv, {}, home)


@pytest.mark.parametrize("engine,argv", [
    ("sglang", ["/py", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "2",
                "--port", "8100", "--disable-custom-all-reduce"]),
    ("vllm", ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "/m",
              "--tensor-parallel-size", "2", "--port", "8100", "--disable-custom-all-reduce"]),
])
def test_real_parser_accepts_and_reports(venvs: Path, engine: str, argv: list[str],
                                         tmp_path: Path) -> None:
    fields = _probe(venvs, engine, argv, tmp_path)["fields"]
    assert fields["model"] == "/m" and fields["tp"] == 2  # type: ignore[index]
    assert fields["port"] == 8100 and fields["disable_custom_all_reduce"] is True  # type: ignore[index]


@pytest.mark.parametrize("engine,argv,error", [
    ("sglang", ["/py", "-m", "sglang.launch_server", "--model-path", "/m", "--no-such-flag"],
     "unrecognized arguments: --no-such-flag"),
    ("vllm", ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "/m", "--tp-size", "2"],
     "unrecognized arguments: --tp-size"),
    # no __main__ code in sglang/cli/main.py: `-m` of it does nothing, exit 0
    ("sglang", ["/py", "-m", "sglang.cli.main", "serve", "--model-path", "/m"],
     "returned without parsing"),
])
def test_real_parser_rejects(venvs: Path, engine: str, argv: list[str], error: str,
                             tmp_path: Path) -> None:
    assert error in str(_probe(venvs, engine, argv, tmp_path).get("error"))


def test_command_on_this_tree(venvs: Path) -> None:
    done = subprocess.run([str(ROOT / "tools" / "check-engine-parsers"), "--venvs", str(venvs)],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode in (0, 1), done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("OK", "REJECTED", "WRONG"))]
    assert any(r.split()[1] == "sglang" for r in rows) and any(r.split()[1] == "vllm" for r in rows)
    assert done.returncode == (1 if any(not r.startswith("OK") for r in rows) else 0)


# GPU selectors: the units hand the server GPUs named by UUID or
# PCI id as indexes in PCI order (pre-start --resolve-gpus).  Each engine's own
# code that reads CUDA_VISIBLE_DEVICES runs below, in the pinned venvs, on the
# value pre-start wrote; a physical id there is an NVML index, which counts
# GPUs in PCI order, as CUDA does under CUDA_DEVICE_ORDER=PCI_BUS_ID.
MARK = "@@infer-units-gpus@@"

# vLLM: CudaPlatform's mapping of a local rank (device_id_to_physical_device_id)
# and of a visible ordinal (visible_device_id_to_physical_device_id).
# vllm/platforms/cuda.py loads vLLM's compiled CUDA kernels at import
# (vllm._C_stable_libtorch: it needs libcuda, the driver, none here); they
# register kernels and play no part in the mapping, so an empty module stands
# in for them.  Without NVML (as here, and on machines without it) vLLM picks
# NonNvmlCudaPlatform, which reads each entry with int().  NvmlCudaPlatform
# tries int() first too, then NVML's lookup by UUID: its own function runs on
# the same entries without NVML's context (which only opens NVML, and cannot
# here), so an entry that needs NVML fails here where that platform would ask
# the driver.
VLLM_MAP = r"""
import json, os, sys, types
sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
import vllm.platforms.cuda as cuda
out = {"platform": cuda.CudaPlatform.__name__}
count = int(sys.argv[2])
try:
    out["physical"] = [cuda.CudaPlatform.device_id_to_physical_device_id(i) for i in range(count)]
    out["visible"] = [cuda.CudaPlatform.visible_device_id_to_physical_device_id(i)
                      for i in range(count)]
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
nvml = vars(cuda.NvmlCudaPlatform)["device_control_id_to_physical_device_id"].__func__.__wrapped__
try:
    out["nvml_entries"] = [nvml(cuda.NvmlCudaPlatform, entry)
                           for entry in os.environ["CUDA_VISIBLE_DEVICES"].split(",")]
except Exception as e:
    out["nvml_error"] = f"{type(e).__name__}: {e}"
print(sys.argv[1] + json.dumps(out), flush=True)
"""

# SGLang: its custom all-reduce (on by default with tp > 1) maps each rank's
# device to a physical id from CUDA_VISIBLE_DEVICES and gathers them over the
# group (can_use_custom_all_reduce_with_nvlink), then asks NVML whether those
# GPUs are NVLinked (is_full_nvlink: a GPU is needed).  The real function runs
# in one process per rank over a gloo group on this machine; only the NVML
# question is replaced, by one that records the ids it is asked about.
SGLANG_MAP = r"""
import json, sys
import torch
import torch.distributed as dist
import sglang.srt.distributed.device_communicators.custom_all_reduce_utils as utils

class Asked(Exception):
    pass

mark, rank, world, store = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
asked = []
def is_full_nvlink(physical_device_ids, world_size):
    asked.append([int(i) for i in physical_device_ids])
    raise Asked
utils.is_full_nvlink = is_full_nvlink
try:
    utils.can_use_custom_all_reduce_with_nvlink(dist.group.WORLD, torch.device("cuda", rank),
                                                [2, 4, 6, 8], "CustomAllreduce")
    out = {"error": "returned before asking NVML"}
except Asked:
    out = {"physical": asked[0]}
except Exception as e:
    out = {"error": f"{type(e).__name__}: {e}"}
print(mark + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def _engine_env(venvs: Path, engine: str, visible: str, home: Path) -> dict[str, str]:
    python = engine_parsers.venv_python(venvs, engine)
    return {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "XDG_CACHE_HOME": str(home / "cache"), "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": visible}


def _result(stdout: str, stderr: str) -> dict[str, object]:
    for line in stdout.splitlines():
        if line.startswith(MARK):
            found: dict[str, object] = json.loads(line[len(MARK):])
            return found
    raise AssertionError(f"no result:\n{stdout[-3000:]}\n{stderr[-3000:]}")


def _vllm_map(venvs: Path, visible: str, count: int, home: Path) -> dict[str, object]:
    done = subprocess.run([str(engine_parsers.venv_python(venvs, "vllm")), "-c", VLLM_MAP, MARK,
                           str(count)], capture_output=True, text=True, cwd=home, timeout=600,
                          env=_engine_env(venvs, "vllm", visible, home))
    return _result(done.stdout, done.stderr)


def _sglang_map(venvs: Path, visible: str, count: int, home: Path) -> list[dict[str, object]]:
    store = home / "rendezvous"
    ranks = [subprocess.Popen([str(engine_parsers.venv_python(venvs, "sglang")), "-c",
                               SGLANG_MAP, MARK, str(rank), str(count), str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=home, env=_engine_env(venvs, "sglang", visible, home))
             for rank in range(count)]
    results = []
    try:
        for p in ranks:
            out, err = p.communicate(timeout=600)
            results.append(_result(out, err))
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def _engine_map(engine: str, venvs: Path, visible: str, count: int,
                home: Path) -> dict[str, object]:
    """What the engine's code makes of CUDA_VISIBLE_DEVICES=visible: every
    rank's physical id ("physical"), or its error."""
    if engine == "vllm":
        return _vllm_map(venvs, visible, count, home)
    results = _sglang_map(venvs, visible, count, home)
    # every rank gathers the same ids (or fails the same way)
    assert all(r == results[0] for r in results), results
    return results[0]


@pytest.fixture
def swapped_gpus(fake_gpus: FakeGpus) -> FakeGpus:
    """GPU 0 and 3 swap PCI slots: PCI order is not the backend's order."""
    table = json.loads(fake_gpus.table.read_text())
    gpus = table["gpus"]
    gpus[0]["pci"], gpus[3]["pci"] = gpus[3]["pci"], gpus[0]["pci"]
    fake_gpus.table.write_text(json.dumps(table))
    return fake_gpus


def _pre_start_visible(fake: FakeGpus, selector: str, run: Path) -> str:
    """CUDA_VISIBLE_DEVICES as the unit's pre-start writes it for `selector`."""
    env_file = run / "m.env"
    run_cli("pre-start", "--unit", "m.service", "--gpus", selector, "--env-file", str(env_file),
            "--resolve-gpus", env=fake.env(INFER_UNITS_STATE_DIR=str(run / "state")), check=0)
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    return values["CUDA_VISIBLE_DEVICES"]


@pytest.mark.parametrize("engine", engine_parsers.ENGINES)
@pytest.mark.parametrize("by", ["uuid", "pci"])
def test_gpus_named_by_uuid_or_pci_reach_the_engine_as_the_same_gpus(
        venvs: Path, swapped_gpus: FakeGpus, tmp_path: Path, engine: str, by: str) -> None:
    gpus = json.loads(swapped_gpus.table.read_text())["gpus"]
    chosen = [gpus[0], gpus[2]] if by == "uuid" else [gpus[1], gpus[3]]
    selector = ",".join(g["uuid"] if by == "uuid" else g["pci"] for g in chosen)
    visible = _pre_start_visible(swapped_gpus, selector, tmp_path / "run")
    mapped = _engine_map(engine, venvs, visible, len(chosen), tmp_path)
    assert "error" not in mapped, (visible, mapped)
    # physical id k: the k-th GPU in PCI order (NVML's and CUDA's count)
    in_pci_order = sorted(gpus, key=lambda g: g["pci"])
    physical = mapped["physical"]
    assert isinstance(physical, list), mapped
    assert [in_pci_order[k]["uuid"] for k in physical] == [g["uuid"] for g in chosen], \
        (visible, mapped)
    if engine == "vllm":
        assert mapped["visible"] == mapped["physical"], mapped
        # the NVML platform reads the same entries with int() first: no NVML needed
        assert mapped["nvml_entries"] == mapped["physical"], mapped


@pytest.mark.parametrize("engine", engine_parsers.ENGINES)
def test_uuids_in_cuda_visible_devices_break_the_engines_reading(
        venvs: Path, fake_gpus: FakeGpus, tmp_path: Path, engine: str) -> None:
    """What the units gave the server before pre-start wrote indexes: the
    UUIDs themselves (and, for PCI selectors, the UUIDs pre-start resolved)."""
    uuids = ",".join(fake_gpus.uuids[:2])
    mapped = _engine_map(engine, venvs, uuids, 2, tmp_path)
    assert "ValueError" in str(mapped.get("error")), mapped
    assert fake_gpus.uuids[0] in str(mapped["error"]), mapped
    if engine == "vllm":
        # vLLM without NVML fails; with NVML it would ask the driver for the
        # UUID (its fallback), which this machine has not.
        assert mapped["platform"] == "NonNvmlCudaPlatform", mapped
        assert "nvml_entries" not in mapped, mapped
