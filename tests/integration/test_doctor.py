"""GPU health and `infer-units doctor` on fakes: every check and level from the
fake table's `health` object and from fake kernel trees (--root-dir, real
files: /proc/modules, /dev/kmsg, sysfs with PCI config space), NVML's "Not
Supported" as unknown, the pre-start gate (refused: exit 2 at err priority;
accepted; warnings), `[health] accept`, status and the metrics gauges, and
the model checks (the engine located by the model's python, the driver vs
its CUDA runtime, the port)."""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ..support import PYTHON, FakeGpus, base_env, run_cli

# ------------------------------------------------------------------ fixtures


def set_health(gpus: FakeGpus, index: int, health: dict[str, Any] | None = None,
               driver: dict[str, Any] | None = None) -> None:
    table = json.loads(gpus.table.read_text())
    if health is not None:
        table["gpus"][index]["health"] = health
    if driver is not None:
        table["driver"] = driver
    gpus.table.write_text(json.dumps(table))


def acs_config(control: int) -> bytes:
    """4 KiB of PCI config space: one extended capability, ACS, at 0x100."""
    space = bytearray(4096)
    space[0x100:0x104] = (0x000D | (1 << 16)).to_bytes(4, "little")   # ACS, v1, next 0
    space[0x104:0x106] = (0x005F).to_bytes(2, "little")               # capabilities
    space[0x106:0x108] = control.to_bytes(2, "little")
    return bytes(space)


class KernelTree:
    """A fake /proc, /sys and /dev under one directory (netplan --root-dir style)."""

    def __init__(self, root: Path, pcis: list[str]) -> None:
        self.root = root
        self.pcis = pcis
        self.modules(["nvidia_uvm", "nvidia_drm", "nvidia"])
        (root / "dev").mkdir(parents=True, exist_ok=True)
        (root / "dev/nvidia-uvm").touch()
        (root / "dev/kmsg").write_bytes(b"6,1,100,-;Linux version 6.1\n")
        self.hmm("N")
        (root / "sys/kernel/iommu_groups").mkdir(parents=True, exist_ok=True)
        devices = root / "sys/bus/pci/devices"
        devices.mkdir(parents=True, exist_ok=True)
        self.bridges: dict[str, Path] = {}
        for i, pci in enumerate(pcis):
            # root port -> switch -> GPU, as the kernel nests them
            bridge = root / f"sys/devices/pci0000:00/0000:00:0{i + 1}.0"
            gpu = bridge / pci
            gpu.mkdir(parents=True)
            (bridge / "config").write_bytes(acs_config(0))
            (gpu / "config").write_bytes(bytes(4096))
            (devices / pci).symlink_to(gpu)
            self.bridges[pci] = bridge

    def modules(self, names: list[str]) -> None:
        (self.root / "proc").mkdir(parents=True, exist_ok=True)
        (self.root / "proc/modules").write_text(
            "".join(f"{n} 1000 0 - Live 0x0000000000000000\n" for n in names))

    def hmm(self, value: str | None) -> None:
        path = self.root / "sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
        if value is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")

    def iommu(self, pci: str, kind: str) -> None:
        group = self.root / f"sys/kernel/iommu_groups/{len(os.listdir(self.root / 'sys/kernel/iommu_groups'))}"
        group.mkdir(parents=True)
        (group / "type").write_text(kind + "\n")
        gpu = self.bridges[pci] / pci
        (gpu / "iommu_group").symlink_to(group)

    def kmsg(self, *lines: str) -> None:
        (self.root / "dev/kmsg").write_bytes(b"".join(
            f"4,{i + 10},{i * 1000},-;{line}\n".encode() for i, line in enumerate(lines)))


@pytest.fixture
def kernel(tmp_path: Path, fake_gpus: FakeGpus) -> KernelTree:
    table = json.loads(fake_gpus.table.read_text())
    return KernelTree(tmp_path / "root", [g["pci"] for g in table["gpus"]])


def doctor(gpus: FakeGpus, *args: str, root: KernelTree | None = None,
           **env: str) -> tuple[int, dict[str, Any]]:
    argv = ["doctor", "--json", *args] + (["--root-dir", str(root.root)] if root else [])
    done = run_cli(*argv, env=gpus.env(**env))
    return done.returncode, json.loads(done.stdout)


def finding(report: dict[str, Any], check: str, gpu: int | None = None) -> dict[str, Any]:
    where = report["host"] if gpu is None else report["gpus"][gpu]["findings"]
    matches = [f for f in where if f["check"] == check]
    assert len(matches) == 1, (check, gpu, where)
    return matches[0]


# ------------------------------------------------------------------ the fake table's health

def test_healthy_fake_gpus_and_a_healthy_kernel_exit_0(fake_gpus: FakeGpus,
                                                       kernel: KernelTree) -> None:
    code, report = doctor(fake_gpus, root=kernel)
    assert code == 0 and report["exit"] == 0 and report["level"] == "ok", report
    for g in report["gpus"]:
        assert {f["check"] for f in g["findings"]} == {
            "remapped-rows", "retired-pages", "xid", "ecc", "persistence", "fabric", "mig",
            "hmm", "cc", "iommu", "acs"}
        assert all(f["level"] == "ok" for f in g["findings"]), g
    assert finding(report, "nvidia-uvm")["level"] == "ok"


# (health object, check, level, words the fact or fix must contain)
CASES = [
    ({"xid": [79]}, "xid", "error", "fallen off the bus"),
    ({"xid": [48, 13]}, "xid", "error", "XID 48"),
    ({"xid": [119]}, "xid", "error", "GSP"),
    ({"xid": [13]}, "xid", "warning", "XID 13"),
    ({"xid": []}, "xid", "ok", "no XID"),
    ({"remapped_rows": {"pending": True, "failure": False}}, "remapped-rows", "error",
     "nvidia-smi -r -i 2"),
    ({"remapped_rows": {"pending": False, "failure": True}}, "remapped-rows", "error", "RMA"),
    ({"remapped_rows": {"pending": False, "failure": False}}, "remapped-rows", "ok", "none pending"),
    ({"retired_pages_pending": True}, "retired-pages", "error", "nvidia-smi -r -i 2"),
    ({"ecc_uncorrected_volatile": 3}, "ecc", "warning", "3 uncorrected"),
    ({"ecc_uncorrected_volatile": 0}, "ecc", "ok", "0 uncorrected"),
    ({"persistence": False}, "persistence", "warning", "nvidia-persistenced"),
    ({"fabric": "in-progress"}, "fabric", "error", "nvidia-fabricmanager"),
    ({"fabric": "not-started"}, "fabric", "error", "nvidia-fabricmanager"),
    ({"fabric": "failed"}, "fabric", "error", "nvidia-fabricmanager"),
    ({"fabric": "completed"}, "fabric", "ok", "completed"),
    ({"mig": True}, "mig", "warning", "MIG devices in `gpus` are refused"),
    ({"addressing": "hmm"}, "hmm", "warning", "uvm_disable_hmm=1"),
    ({"addressing": "ats"}, "hmm", "ok", "ats"),
    ({"cc": "on"}, "cc", "warning", 'p2p = "auto"'),
    ({"cc": "devtools"}, "cc", "warning", 'p2p = "auto"'),
]


@pytest.mark.parametrize("health,check,level,words", CASES,
                         ids=[f"{c[1]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_each_check_and_level_from_the_fake_health(fake_gpus: FakeGpus, kernel: KernelTree,
                                                   health: dict[str, Any], check: str,
                                                   level: str, words: str) -> None:
    set_health(fake_gpus, 2, health)
    code, report = doctor(fake_gpus, root=kernel)
    got = finding(report, check, 2)
    assert got["level"] == level, got
    assert words in got["fact"] + got["fix"], got
    assert got["gpu"] == 2 and got["uuid"] == fake_gpus.uuids[2]
    assert (got["fix"] != "") == (level != "ok")
    # the other GPUs stay healthy, and the exit code follows the worst level
    assert all(f["level"] == "ok" for f in report["gpus"][1]["findings"])
    assert code == (2 if level == "error" else 0), report["level"]


def test_null_in_the_health_object_is_unknown_never_ok(fake_gpus: FakeGpus,
                                                       kernel: KernelTree) -> None:
    set_health(fake_gpus, 0, {"retired_pages_pending": None, "remapped_rows": None,
                              "ecc_uncorrected_volatile": None, "persistence": None,
                              "fabric": None, "mig": None, "cc": None})
    code, report = doctor(fake_gpus, root=kernel)
    for check in ("retired-pages", "remapped-rows", "ecc", "persistence", "fabric", "mig", "cc"):
        assert finding(report, check, 0)["level"] == "unknown", check
    assert code == 0      # unknown is not an error


def test_a_bad_health_object_names_the_gpu_and_the_key(fake_gpus: FakeGpus) -> None:
    set_health(fake_gpus, 1, {"xid": "79"})
    code, report = doctor(fake_gpus)
    assert code == 2
    bad = finding(report, "gpus")
    assert bad["level"] == "error" and "GPU 1: health.xid" in bad["fact"], bad
    set_health(fake_gpus, 1, {"xids": [79]})
    _, report = doctor(fake_gpus)
    assert "unknown key" in finding(report, "gpus")["fact"]


def test_without_a_root_dir_fake_gpus_leave_the_kernel_side_unknown(fake_gpus: FakeGpus) -> None:
    code, report = doctor(fake_gpus)
    assert code == 0
    assert finding(report, "nvidia-uvm")["level"] == "unknown"
    assert finding(report, "iommu", 0)["level"] == "unknown"


# ------------------------------------------------------------------ the kernel tree

def test_nvidia_uvm_not_loaded_is_an_error_with_the_modprobe_fix(fake_gpus: FakeGpus,
                                                                 kernel: KernelTree) -> None:
    kernel.modules(["nvidia"])
    code, report = doctor(fake_gpus, root=kernel)
    uvm = finding(report, "nvidia-uvm")
    assert code == 2 and uvm["level"] == "error" and "modprobe nvidia_uvm" in uvm["fix"], uvm


def test_nvidia_uvm_loaded_without_its_device_node_is_an_error(fake_gpus: FakeGpus,
                                                               kernel: KernelTree) -> None:
    (kernel.root / "dev/nvidia-uvm").unlink()
    code, report = doctor(fake_gpus, root=kernel)
    uvm = finding(report, "nvidia-uvm")
    assert code == 2 and uvm["level"] == "error" and "nvidia-modprobe -u" in uvm["fix"], uvm


def test_xid_lines_in_the_kernel_log_are_matched_to_gpus_by_pci(fake_gpus: FakeGpus,
                                                                kernel: KernelTree) -> None:
    # NVML cannot say what happened since boot: null sends the check to the kernel log
    for i in range(4):
        set_health(fake_gpus, i, {"xid": None})
    kernel.kmsg("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04",
                "NVRM: Xid (PCI:0000:42:00): 79, pid='<unknown>', name=<unknown>, "
                "GPU has fallen off the bus.",
                "NVRM: Xid (PCI:0000:43:00): 13, pid=1234, name=python3, Graphics Exception",
                "NVRM: Xid (PCI:0000:99:00): 48, pid=1, name=x, DBE")
    code, report = doctor(fake_gpus, root=kernel)
    assert code == 2
    assert finding(report, "xid", 0)["level"] == "ok"
    lost = finding(report, "xid", 1)
    assert lost["level"] == "error" and "XID 79" in lost["fact"], lost
    assert "dmesg --clear" in lost["fix"] and lost["source"].endswith("/dev/kmsg")
    assert finding(report, "xid", 2)["level"] == "warning"
    orphan = finding(report, "xid")          # an address no listed GPU has
    assert orphan["level"] == "error" and "0000:99:00" in orphan["fact"], orphan


def test_an_unreadable_kernel_log_is_unknown(fake_gpus: FakeGpus, kernel: KernelTree) -> None:
    set_health(fake_gpus, 0, {"xid": None})
    (kernel.root / "dev/kmsg").unlink()
    _, report = doctor(fake_gpus, root=kernel)
    got = finding(report, "xid", 0)
    assert got["level"] == "unknown" and "kernel log not readable" in got["fact"], got


def test_hmm_from_the_module_parameter_when_nvml_cannot_say(fake_gpus: FakeGpus,
                                                            kernel: KernelTree) -> None:
    set_health(fake_gpus, 0, {"addressing": None})
    _, report = doctor(fake_gpus, root=kernel)
    assert finding(report, "hmm", 0)["level"] == "unknown"      # uvm_disable_hmm=N
    kernel.hmm("Y")
    _, report = doctor(fake_gpus, root=kernel)
    assert finding(report, "hmm", 0)["level"] == "ok"


def test_iommu_translation_warns_and_passthrough_is_ok(fake_gpus: FakeGpus,
                                                      kernel: KernelTree) -> None:
    kernel.iommu(kernel.pcis[0], "DMA-FQ")
    kernel.iommu(kernel.pcis[1], "identity")
    code, report = doctor(fake_gpus, root=kernel)
    dma = finding(report, "iommu", 0)
    assert dma["level"] == "warning" and "iommu=pt" in dma["fix"] and "p2p" in dma["fix"], dma
    assert finding(report, "iommu", 1)["level"] == "ok"
    # a GPU without a group while others have one: not known
    assert finding(report, "iommu", 2)["level"] == "unknown"
    assert code == 0


def test_acs_redirect_on_a_bridge_warns_naming_the_bridge(fake_gpus: FakeGpus,
                                                          kernel: KernelTree) -> None:
    bridge = kernel.bridges[kernel.pcis[3]]
    (bridge / "config").write_bytes(acs_config(0x001D))    # SV, RR, CR, UF
    (kernel.bridges[kernel.pcis[2]] / "config").write_bytes(bytes(64))   # not root: 64 bytes
    _, report = doctor(fake_gpus, root=kernel)
    acs = finding(report, "acs", 3)
    assert acs["level"] == "warning" and bridge.name in acs["fact"], acs
    assert f"setpci -s {bridge.name} ECAP_ACS+0x6.w=0000" in acs["fix"]
    assert finding(report, "acs", 2)["level"] == "unknown"
    assert finding(report, "acs", 0)["level"] == "ok"


# ------------------------------------------------------------------ NVML "Not Supported"

class _NvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class NotSupportedNvml:
    """An NVML module (nvidia-ml-py's names) whose every device query answers
    NVML_ERROR_NOT_SUPPORTED, as on many VMs; one also missing in the driver."""

    NVMLError = _NvmlError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            def not_supported(*args: Any) -> Any:
                raise _NvmlError(13 if name == "nvmlDeviceGetAddressingMode" else 3)
            return not_supported
        raise AttributeError(name)


def test_nvml_not_supported_is_unknown_never_ok() -> None:
    from infer_units.helpers.facts.gpus import Gpu
    from infer_units.helpers.decide.health import judge_gpu
    from infer_units.helpers.facts.health import nvml_facts
    got = nvml_facts(NotSupportedNvml(), object())
    assert all(v is None for v in got.facts.values()), got.facts
    assert "Not Supported" in got.why["remapped_rows"]
    assert "not in this driver's NVML" in got.why["addressing"]
    gpu = Gpu(0, "GPU-x", "0000:41:00.0", "/dev/nvidia0", 1)
    findings = judge_gpu(gpu, got, None, None, "no kernel here")
    assert findings and all(f.level == "unknown" for f in findings), findings
    assert next(f for f in findings if f.check == "retired-pages").source == \
        "NVML nvmlDeviceGetRetiredPagesPendingStatus"


def test_nvml_answers_become_the_fake_tables_shape() -> None:
    from infer_units.helpers.facts.health import nvml_facts

    class Answering(NotSupportedNvml):
        NVML_FEATURE_ENABLED = 1

        def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
            return (1, 0, 0, 0)         # one correctable row, none pending: an H200's answer

        def nvmlDeviceGetPersistenceMode(self, h: Any) -> int:
            return 1

        def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
            return [0, 0]

        def nvmlDeviceGetAddressingMode(self, h: Any) -> int:
            return 1

    got = nvml_facts(Answering(), object())
    assert got.facts["remapped_rows"] == {"pending": False, "failure": False,
                                          "correctable": 1, "uncorrectable": 0}
    assert got.facts["persistence"] is True and got.facts["mig"] is False
    assert got.facts["addressing"] == "hmm" and got.facts["retired_pages_pending"] is None


# ------------------------------------------------------------------ pre-start

def pre_start(gpus: FakeGpus, *args: str, **env: str):  # type: ignore[no-untyped-def]
    return run_cli("pre-start", "--unit", "sick-model", "--gpus", "1", "--timeout", "5s", *args,
                   env=gpus.env(**env))


def test_pre_start_refuses_an_error_level_gpu_at_err_priority(fake_gpus: FakeGpus,
                                                              tmp_path: Path) -> None:
    set_health(fake_gpus, 1, {"xid": [79], "persistence": False})
    done = pre_start(fake_gpus, INFER_UNITS_STATE_DIR=str(tmp_path / "state"),
                     INFER_UNITS_METRICS_DIR=str(tmp_path))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    refused = [ln for ln in lines if ln.startswith("<3>")]
    assert any(f"GPU 1 ({fake_gpus.uuids[1]}): xid error: XID 79" in ln for ln in refused), lines
    assert any('[health] accept = ["xid"]' in ln for ln in refused), lines
    assert any(ln.startswith("<4>") and "persistence warning" in ln for ln in lines), lines
    assert "reap GPU" not in done.stderr        # refused before anything is touched
    prom = (tmp_path / "infer-units.prom").read_text()
    assert f'infer_units_gpu_health{{gpu="1",uuid="{fake_gpus.uuids[1]}",check="xid"}} 2' in prom
    assert f'infer_units_gpu_health{{gpu="1",uuid="{fake_gpus.uuids[1]}",check="persistence"}} 1' \
        in prom
    assert "# TYPE infer_units_gpu_health gauge" in prom
    # a healthy GPU of the same host does not block another model
    ok = run_cli("pre-start", "--unit", "other", "--gpus", "0", "--timeout", "5s",
                 env=fake_gpus.env())
    assert ok.returncode == 0, ok.stderr


def test_pre_start_accepts_a_check_the_model_file_names(fake_gpus: FakeGpus) -> None:
    set_health(fake_gpus, 1, {"xid": [79], "remapped_rows": {"pending": True, "failure": False}})
    partly = pre_start(fake_gpus, "--accept-health", "xid")
    assert partly.returncode == 2
    assert "remapped-rows error" in partly.stderr and "refused: GPU 1" in partly.stderr
    done = pre_start(fake_gpus, "--accept-health", "xid,remapped-rows")
    assert done.returncode == 0, done.stderr
    assert "<4>infer-units: GPU 1" in done.stderr and "accepted by [health] accept" in done.stderr
    assert "<3>" not in done.stderr
    bad = pre_start(fake_gpus, "--accept-health", "xids")
    assert bad.returncode == 1 and "'xids' is not a health check" in bad.stderr


def test_pre_start_refuses_when_nvidia_uvm_is_missing(fake_gpus: FakeGpus,
                                                      kernel: KernelTree) -> None:
    kernel.modules(["nvidia"])
    done = pre_start(fake_gpus, "--root-dir", str(kernel.root))
    assert done.returncode == 2 and "<3>infer-units: refused: host: nvidia-uvm error" in done.stderr


# ------------------------------------------------------------------ model files

def write_model(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


def test_health_accept_is_rendered_into_pre_start_and_checked(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    write_model(conf, "acc", 'engine = "command"\ncommand = ["/bin/true"]\ngpus = [0]\n'
                '[health]\naccept = ["xid", "remapped-rows"]\n')
    env = base_env(INFER_UNITS_CONFIG_PATH=str(conf))
    out = run_cli("render", "acc", env=env, check=0).stdout
    pre = next(ln for ln in out.splitlines() if ln.startswith("ExecStartPre="))
    assert "--accept-health xid,remapped-rows" in pre
    write_model(conf, "acc", 'engine = "command"\ncommand = ["/bin/true"]\ngpus = [0]\n'
                '[health]\naccept = ["xids"]\n')
    bad = run_cli("check", "acc", "--no-verify", env=env)
    assert bad.returncode == 1
    assert "health.accept" in bad.stderr and "'xids' is not a health check" in bad.stderr


@pytest.fixture
def site() -> Path:
    """A fake engine and torch that nobody (the probe's user here) can read."""
    top = Path(tempfile.mkdtemp(prefix="doctor-site-"))
    (top / "vllm").mkdir()
    (top / "vllm/__init__.py").write_text("raise SystemExit('imported: must not be')\n")
    (top / "torch").mkdir()
    (top / "torch/__init__.py").write_text("")
    (top / "torch/version.py").write_text("__version__ = '2.9.0+cu128'\ncuda: Optional[str] = "
                                          "'12.8'\n")
    for path in [top, *top.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IRGRP | stat.S_IROTH |
                   (stat.S_IXGRP | stat.S_IXOTH if path.is_dir() else 0))
    yield top
    import shutil
    shutil.rmtree(top)


def engine_model(conf: Path, site: Path, port: int, python: str = PYTHON) -> None:
    write_model(conf, "eng", f'engine = "vllm"\nmodel = "/models/x"\ngpus = [0]\nport = {port}\n'
                f'python = "{python}"\n[env]\nPYTHONPATH = "{site}"\n')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("driver_cuda,level", [(13000, "ok"), (12080, "ok"), (12020, "warning"),
                                               (11080, "error")])
def test_driver_against_the_engines_cuda_runtime(fake_gpus: FakeGpus, tmp_path: Path, site: Path,
                                                 driver_cuda: int, level: str) -> None:
    set_health(fake_gpus, 0, driver={"version": "580.159.04", "cuda": driver_cuda})
    engine_model(tmp_path / "conf", site, free_port())
    code, report = doctor(fake_gpus, "eng", INFER_UNITS_CONFIG_PATH=str(tmp_path / "conf"))
    found = {f["check"]: f for f in report["models"][0]["findings"]}
    assert found["python"]["level"] == "ok", found
    assert found["engine"]["level"] == "ok" and str(site / "vllm") in found["engine"]["fact"]
    cuda = found["cuda-driver"]
    assert cuda["level"] == level and "12.8" in cuda["fact"], cuda
    assert code == (2 if level == "error" else 0)
    if os.geteuid() == 0:
        assert "runs as nobody" in found["python"]["fact"]   # never root running user code


def test_import_flag_really_imports_the_engine(fake_gpus: FakeGpus, tmp_path: Path,
                                               site: Path) -> None:
    engine_model(tmp_path / "conf", site, free_port())
    code, report = doctor(fake_gpus, "eng", "--import",
                          INFER_UNITS_CONFIG_PATH=str(tmp_path / "conf"))
    engine = next(f for f in report["models"][0]["findings"] if f["check"] == "engine")
    assert code == 2 and engine["level"] == "error" and "imported: must not be" in engine["fact"]


def test_a_missing_engine_a_bad_python_and_a_taken_port(fake_gpus: FakeGpus, tmp_path: Path,
                                                        site: Path) -> None:
    (site / "vllm/__init__.py").unlink()
    (site / "vllm").rmdir()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        engine_model(tmp_path / "conf", site, held.getsockname()[1])
        code, report = doctor(fake_gpus, "eng", INFER_UNITS_CONFIG_PATH=str(tmp_path / "conf"))
    found = {f["check"]: f for f in report["models"][0]["findings"]}
    assert code == 2
    assert found["engine"]["level"] == "error" and "pip install vllm" in found["engine"]["fix"]
    assert found["port"]["level"] == "error" and "taken" in found["port"]["fact"], found["port"]
    engine_model(tmp_path / "conf", site, free_port(), python="/nonexistent/python")
    _, report = doctor(fake_gpus, "eng", INFER_UNITS_CONFIG_PATH=str(tmp_path / "conf"))
    bad = next(f for f in report["models"][0]["findings"] if f["check"] == "python")
    assert bad["level"] == "error" and "/nonexistent/python" in bad["fact"]


def test_a_models_sick_gpu_and_its_accept(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    set_health(fake_gpus, 1, {"xid": [79]})
    write_model(conf, "on1", 'engine = "command"\ncommand = ["/bin/sleep", "9"]\ngpus = [1]\n')
    write_model(conf, "on9", 'engine = "command"\ncommand = ["/bin/sleep", "9"]\ngpus = [9]\n')
    code, report = doctor(fake_gpus, "on1", "on9", "nope", INFER_UNITS_CONFIG_PATH=str(conf))
    assert code == 1 and report["unknown"] == ["nope"]        # usage error wins: exit 1
    models = {m["name"]: {f["check"]: f for f in m["findings"]} for m in report["models"]}
    assert models["on1"]["gpu-health"]["level"] == "error"
    assert '[health] accept = ["xid"]' in models["on1"]["gpu-health"]["fix"]
    assert models["on9"]["gpus"]["level"] == "error" and "not found" in models["on9"]["gpus"]["fact"]
    assert models["on1"]["executable"]["level"] == "ok"
    write_model(conf, "on1", 'engine = "command"\ncommand = ["/bin/sleep", "9"]\ngpus = [1]\n'
                '[health]\naccept = ["xid"]\n')
    code, report = doctor(fake_gpus, "on1", INFER_UNITS_CONFIG_PATH=str(conf))
    mine = {f["check"]: f for f in report["models"][0]["findings"]}
    assert mine["gpu-health"]["level"] == "ok" and "accepted: xid" in mine["gpu-health"]["fact"]
    assert code == 2      # the GPU itself is still an error in the host report


def test_doctor_text_names_problems_and_json_is_one_document(fake_gpus: FakeGpus,
                                                             kernel: KernelTree) -> None:
    set_health(fake_gpus, 0, {"mig": True})
    done = run_cli("doctor", "--root-dir", str(kernel.root), env=fake_gpus.env())
    assert done.returncode == 0
    assert "GPU 0  mig" in done.stdout and "warning" in done.stdout
    assert "remapped-rows" not in done.stdout          # ok lines only with --verbose
    verbose = run_cli("doctor", "-v", "--root-dir", str(kernel.root), env=fake_gpus.env())
    assert "remapped-rows" in verbose.stdout
    broken = run_cli("doctor", "--json", env=base_env(INFER_UNITS_FAKE_GPUS="/nonexistent.json"))
    assert broken.returncode == 2
    assert json.loads(broken.stdout)["host"][0]["check"] == "gpus"


def test_status_shows_each_gpus_findings(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    set_health(fake_gpus, 1, {"xid": [79]})
    write_model(conf, "st", 'engine = "command"\ncommand = ["/bin/sleep", "9"]\ngpus = [0, 1]\n')
    done = run_cli("status", "--json", "st", env=fake_gpus.env(INFER_UNITS_CONFIG_PATH=str(conf)))
    report = json.loads(done.stdout)
    gpus = report["models"][0]["gpu"]["gpus"]
    assert gpus[0]["health"]["level"] in ("ok", "unknown")
    assert gpus[1]["health"]["level"] == "error"
    assert [f["check"] for f in gpus[1]["health"]["findings"] if f["level"] == "error"] == ["xid"]
    text = run_cli("status", "st", env=fake_gpus.env(INFER_UNITS_CONFIG_PATH=str(conf))).stdout
    assert "st: GPU 1 xid error: XID 79 since boot" in text


def test_doctor_write_metrics_refreshes_the_gauges(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    set_health(fake_gpus, 3, {"fabric": "in-progress"})
    env = dict(INFER_UNITS_STATE_DIR=str(tmp_path / "state"), INFER_UNITS_METRICS_DIR=str(tmp_path))
    run_cli("doctor", "--write-metrics", env=fake_gpus.env(**env))
    prom = (tmp_path / "infer-units.prom").read_text()
    assert f'infer_units_gpu_health{{gpu="3",uuid="{fake_gpus.uuids[3]}",check="fabric"}} 2' in prom
    assert 'infer_units_gpu_health{gpu="",uuid="",check="nvidia-uvm"} -1' in prom
    set_health(fake_gpus, 3, {})
    run_cli("doctor", "--write-metrics", env=fake_gpus.env(**env))
    prom = (tmp_path / "infer-units.prom").read_text()
    assert f'infer_units_gpu_health{{gpu="3",uuid="{fake_gpus.uuids[3]}",check="fabric"}} 0' in prom
