"""A GPU node held through another path to it: a server chrooted into a root
whose /dev is a bind of the real one holds "/host/dev/nvidia0" as the rest of
the system reads its fds.  On an H200 under systemd (tests/gpu/systemd)
`drain` missed such a server and timed out on its memory.  Holders, reap and
drain must count it as a holder of the node (same device), and must not
count a different file that merely has the same tail."""

from __future__ import annotations

import json
import os
import subprocess
import time

from ..support import PYTHON, FakeGpus, run_cli

HOLD = "import sys, time; f = open(sys.argv[1], 'rb'); print('ready', flush=True); time.sleep(600)"


def _hold(path: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([PYTHON, "-c", HOLD, path], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def _chroot_shaped_link(fake: FakeGpus, tmp_path, name: str = "host") -> str:
    """The node again under <tmp>/host/<its absolute path>: what a chroot at
    <tmp>/host with the devices bound in looks like from outside."""
    node = str(fake.devices[0])
    other = str(tmp_path / name) + node
    os.makedirs(os.path.dirname(other), exist_ok=True)
    os.link(node, other)               # the same inode: the same "device"
    return other


def test_a_holder_through_a_chroot_path_is_a_holder(fake_gpus: FakeGpus, tmp_path) -> None:
    p = _hold(_chroot_shaped_link(fake_gpus, tmp_path))
    try:
        done = run_cli("holders", "--gpus", "0", "--json", env=fake_gpus.env())
        assert done.returncode == 0, done.stderr
        assert [h["pid"] for h in json.loads(done.stdout)["holders"]] == [p.pid]
        drain = run_cli("drain", "--term-grace", "1s", "--timeout", "10s", env=fake_gpus.env())
        assert drain.returncode == 0, drain.stderr
        assert f"SIGTERM to pid {p.pid}" in drain.stderr
        assert p.wait(10) is not None
    finally:
        p.kill()
        p.wait()


def test_a_different_file_with_the_same_tail_is_not_a_holder(fake_gpus: FakeGpus, tmp_path) -> None:
    impostor = str(tmp_path / "host") + str(fake_gpus.devices[0])
    os.makedirs(os.path.dirname(impostor), exist_ok=True)
    with open(impostor, "w") as f:
        f.write("not the device")
    p = _hold(impostor)
    try:
        done = run_cli("holders", "--gpus", "0", "--json", env=fake_gpus.env())
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["holders"] == []
        time.sleep(0.1)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()
