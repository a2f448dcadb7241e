"""The /proc backend (driver loaded, no NVML) on real files and processes:
GPUs from /proc/driver/nvidia/gpus/*/information, users from holders of the
device nodes, whatever their own environment says.  Like real CUDA
processes, most holders here open every node."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from infer_units.helpers.facts.gpus import select
from ..support import PYTHON, fake_driver

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


def test_a_holders_own_environment_narrows_none_of_its_devices(tmp_path: Path) -> None:
    """A process sets its CUDA_VISIBLE_DEVICES itself: one holding every
    node that names GPU 1 there was no user of GPU 0, and a reap of GPU 0
    said "GPUs free" beside it."""
    b = fake_driver(tmp_path)
    every = [str(p) for p in sorted((tmp_path / "dev").iterdir())]
    on1 = holder(every, "1")
    by_uuid = holder(every, "GPU-41aa0000-1111")
    unknown = holder(every, None)
    only_minor1 = holder([str(tmp_path / "dev/nvidia1"), str(tmp_path / "dev/nvidiactl")], "0")
    try:
        users = b.users(b.gpus())
        for p in (on1, by_uuid, unknown):
            assert users[p.pid].gpus == {0, 1, 2}
        assert users[only_minor1.pid].gpus == {2}      # nvidia1 is GPU 2's node
        only0 = b.users(select(b.gpus(), "0"))
        assert set(only0) == {on1.pid, by_uuid.pid, unknown.pid}
        assert b.exact is False
        assert set(b.device_files()) == set(every)
    finally:
        for p in (on1, by_uuid, unknown, only_minor1):
            p.kill()
            p.wait()
