"""`infer-units check` against this host: no `ok` for a
file it reports an error for, GPUs the host does not have are an error
(when the GPU backend answers), and an absolute model path missing here is
a warning; a hub id is fine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..support import FakeGpus, base_env, run_cli

MODEL = 'engine = "vllm"\nmodel = "{model}"\ngpus = [{gpus}]\nport = {port}\n'


def etc(tmp_path: Path, **models: str) -> Path:
    d = tmp_path / "etc"
    d.mkdir(exist_ok=True)
    for name, text in models.items():
        (d / f"{name}.toml").write_text(text)
    return d


def test_no_ok_for_a_file_an_error_is_reported_for(tmp_path: Path) -> None:
    """Two models on one port: the error is b.toml's, so b is not ok (a,
    named in it as the other, is)."""
    d = etc(tmp_path, a=MODEL.format(model="org/a", gpus=0, port=18700),
            b=MODEL.format(model="org/b", gpus=1, port=18700),
            c=MODEL.format(model="org/c", gpus=2, port=18701))
    done = run_cli("check", "--no-verify", env=base_env(INFER_UNITS_CONFIG_PATH=str(d)))
    assert done.returncode == 1, done
    assert f"error: {d}/b.toml: port: port 18700 also used by a" in done.stderr, done.stderr
    assert "b.toml" not in done.stdout, done.stdout
    assert f"ok: {d}/a.toml -> a.service" in done.stdout, done.stdout
    assert f"ok: {d}/c.toml -> c.service" in done.stdout, done.stdout


def test_gpus_this_host_does_not_have_are_an_error(tmp_path: Path) -> None:
    fake = FakeGpus(tmp_path / "gpus", count=2)
    d = etc(tmp_path, big=MODEL.format(model="org/m", gpus="0, 7", port=18702),
            fits=MODEL.format(model="org/m", gpus=1, port=18703))
    done = run_cli("check", "--no-verify", "--json",
                   env=fake.env(INFER_UNITS_CONFIG_PATH=str(d)))
    assert done.returncode == 1, done
    report = json.loads(done.stdout)
    assert report["ok"] == [{"path": f"{d}/fits.toml", "unit": "fits.service"}], report
    [error] = report["errors"]
    assert error.startswith(f"{d}/big.toml: gpus: GPU '7' not found; GPUs here: 0 ("), error
    # the host's GPUs are listed once
    assert error.count("GPUs here") == 1 and "this host's GPUs" not in error, error
    assert error.count("1 (") == 1, error


def test_without_a_gpu_backend_the_gpus_are_not_judged(tmp_path: Path) -> None:
    d = etc(tmp_path, big=MODEL.format(model="org/m", gpus=7, port=18704))
    done = run_cli("check", "--no-verify", env=base_env(
        INFER_UNITS_CONFIG_PATH=str(d), INFER_UNITS_FAKE_GPUS=str(tmp_path / "none.json")))
    assert done.returncode == 0 and f"ok: {d}/big.toml -> big.service" in done.stdout, done


def test_a_missing_model_path_is_a_warning_a_hub_id_is_not(tmp_path: Path) -> None:
    there = tmp_path / "weights"
    there.mkdir()
    d = etc(tmp_path, gone=MODEL.format(model=str(tmp_path / "nope"), gpus=0, port=18705),
            here=MODEL.format(model=str(there), gpus=1, port=18706),
            hub=MODEL.format(model="Qwen/Qwen3-8B", gpus=2, port=18707))
    done = run_cli("check", "--no-verify", env=base_env(INFER_UNITS_CONFIG_PATH=str(d)))
    assert done.returncode == 0, done
    warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("warning: ")]
    assert warnings == [f"warning: {d}/gone.toml: model: {tmp_path / 'nope'} does not exist "
                        "on this host"], done.stderr
    assert done.stdout.count("ok: ") == 3


def test_a_user_this_host_does_not_have_is_a_warning_with_the_command_to_create_it(
        tmp_path: Path) -> None:
    """systemd would fail the server's start with 217/USER at every try."""
    d = etc(tmp_path, ghost=MODEL.format(model="org/m", gpus=0, port=18705)
            + 'user = "no-such-account-here"\n',
            own=MODEL.format(model="org/m", gpus=1, port=18706) + 'user = "root"\n')
    done = run_cli("check", "--no-verify", "--json", env=base_env(
        INFER_UNITS_CONFIG_PATH=str(d), INFER_UNITS_FAKE_GPUS=str(tmp_path / "none.json")))
    assert done.returncode == 0, done
    [warning] = json.loads(done.stdout)["warnings"]
    assert warning.startswith(f"{d}/ghost.toml: user: no-such-account-here does not exist on "
                              "this host") and "217/USER" in warning \
        and "useradd --system" in warning, warning


def test_a_host_without_nvidia_hears_of_nvml_only_where_gpus_are_asked_about(
        tmp_path: Path) -> None:
    """NVML's library is there (pynvml installed) but no driver: `check`
    says nothing of NVML; `holders`, which asks for the GPUs, says why."""
    if Path("/proc/driver/nvidia").is_dir():
        pytest.skip("this host has an NVIDIA driver")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "pynvml.py").write_text(
        "class NVMLError(Exception):\n    pass\n\n\n"
        "def nvmlInit():\n    raise NVMLError('NVML Shared Library Not Found')\n")
    d = etc(tmp_path, m=MODEL.format(model="org/m", gpus=0, port=18708))
    env = base_env(INFER_UNITS_CONFIG_PATH=str(d))
    env["PYTHONPATH"] += f":{lib}"
    checked = run_cli("check", "--no-verify", env=env)
    assert checked.returncode == 0 and "NVML" not in checked.stderr, checked
    asked = run_cli("holders", env=env)
    assert asked.returncode != 0
    assert "neither NVML (NVML Shared Library Not Found) nor /proc/driver/nvidia" \
        in asked.stderr, asked.stderr
    assert asked.stderr.count("NVML Shared Library Not Found") == 1, asked.stderr
