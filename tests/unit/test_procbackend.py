"""The /proc backend (driver loaded, no NVML) on real files and processes:
GPUs from /proc/driver/nvidia/gpus/*/information, users from holders of the
device nodes narrowed by their CUDA_VISIBLE_DEVICES.  Like real CUDA
processes, every holder here opens every node."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from infer_units.helpers.facts.gpus import ProcBackend, select
from ..support import PYTHON

INFO = """Model: \t\t NVIDIA H200
IRQ:   \t\t 94
GPU UUID: \t {uuid}
Video BIOS: \t 96.00.a5.00.01
Bus Type: \t PCIe
Device Minor: \t {minor}
"""


def fake_driver(tmp: Path) -> ProcBackend:
    proc, dev = tmp / "proc", tmp / "dev"
    dev.mkdir(parents=True)
    # Minor numbers need not follow PCI order.
    for pci, minor in (("0000:41:00.0", 2), ("0000:42:00.0", 0), ("0000:c1:00.0", 1)):
        (proc / pci).mkdir(parents=True)
        (proc / pci / "information").write_text(INFO.format(uuid=f"GPU-{pci[5:7]}aa0000-1111",
                                                            minor=minor))
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    return ProcBackend(str(proc), str(dev))


def holder(devices: list[str], visible: str | None) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    code = "import sys, time; fs = [open(p) for p in sys.argv[1:]]; print('ready', flush=True); time.sleep(60)"
    p = subprocess.Popen([PYTHON, "-c", code, *devices], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_gpus_come_in_pci_order_with_their_minor_and_uuid(tmp_path: Path) -> None:
    b = fake_driver(tmp_path)
    gpus = b.gpus()
    assert [(g.index, g.pci, g.device.rsplit("/", 1)[1]) for g in gpus] == [
        (0, "0000:41:00.0", "nvidia2"), (1, "0000:42:00.0", "nvidia0"),
        (2, "0000:c1:00.0", "nvidia1")]
    assert gpus[0].uuid == "GPU-41aa0000-1111"
    assert [g.index for g in select(gpus, "c1:00.0,GPU-41aa0000-1111")] == [2, 0]


def test_users_are_narrowed_by_cuda_visible_devices(tmp_path: Path) -> None:
    b = fake_driver(tmp_path)
    every = [str(p) for p in sorted((tmp_path / "dev").iterdir())]
    on1 = holder(every, "1")
    by_uuid = holder(every, "GPU-41aa0000-1111")
    unknown = holder(every, None)              # no hint: could be any GPU
    try:
        users = b.users(b.gpus())
        assert users[on1.pid].gpus == {1}
        assert users[by_uuid.pid].gpus == {0}
        assert users[unknown.pid].gpus == {0, 1, 2}
        only2 = b.users(select(b.gpus(), "2"))
        assert set(only2) == {unknown.pid}
        assert b.exact is False
        assert set(b.device_files()) == set(every)
    finally:
        for p in (on1, by_uuid, unknown):
            p.kill()
            p.wait()
