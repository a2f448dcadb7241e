"""A GPU context outlives the process that created it: a child forked after
cuInit inherits it (the device file's descriptors and mappings), and NVML
goes on naming the dead creator while the child holds the memory (measured
on an H100; tests/gpu/test_gpu.py proves it there).  The fake table's
`listed_pids` answers as NVML does; the processes, their descriptors and
mappings, the signals and the reaper are real."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ..support import PYTHON, FakeGpus, needs_root, wait_until

pytestmark = needs_root

# Opens and maps the device files named (argv[2], comma-separated; argv[1]
# "map" or "open"), forks a child that keeps them (argv[3] == "fork": then
# the parent exits), becomes nobody, says its pid and sleeps.
CREATOR = r"""
import mmap, os, sys, time
files = [open(p, "rb") for p in sys.argv[2].split(",")]
maps = [mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ) for f in files] if sys.argv[1] == "map" else []
if sys.argv[3] == "fork" and os.fork() != 0:
    os._exit(0)
os.setgroups([]); os.setgid(65534); os.setuid(65534)
print(os.getpid(), flush=True)
time.sleep(120)
"""


def _start(mode: str, devices: list[Path], fork: bool) -> tuple[subprocess.Popen[str], int]:
    p = subprocess.Popen([PYTHON, "-I", "-c", CREATOR, mode, ",".join(map(str, devices)),
                          "fork" if fork else "stay"],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout is not None
    pid = int(p.stdout.readline())
    return p, pid


def _table(fake: FakeGpus, listed: dict[int, list[int]]) -> None:
    table = json.loads(fake.table.read_text())
    for g in table["gpus"]:
        g.pop("listed_pids", None)
        if g["index"] in listed:
            g["listed_pids"] = listed[g["index"]]
    tmp = fake.table.with_suffix(".new")
    tmp.write_text(json.dumps(table))
    os.replace(tmp, fake.table)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_child_holding_a_gone_creators_context_is_reaped(fake_gpus: FakeGpus) -> None:
    for d in fake_gpus.devices:
        d.write_bytes(bytes(4096))             # a node CUDA maps; here a file it can map
    creator, heir = _start("map", [fake_gpus.devices[1]], fork=True)
    creator.wait()                             # the creator is gone, its pid with it
    # Not heirs: a monitor that holds the device file and maps none of it,
    # and a process whose own context NVML lists on GPU 2 (it maps GPU 1's node too).
    monitor_p, monitor = _start("open", [fake_gpus.devices[1]], fork=False)
    elsewhere_p, elsewhere = _start("map", [fake_gpus.devices[1], fake_gpus.devices[2]],
                                    fork=False)
    _table(fake_gpus, {1: [creator.pid], 2: [elsewhere]})
    reap = subprocess.Popen([PYTHON, "-m", "infer_units", "reap", "--json", "--gpus", "1",
                             "--term-grace", "1s", "--timeout", "20s"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=fake_gpus.env())
    try:
        # The driver drops the creator's pid once the context's last holder is gone.
        assert wait_until(lambda: not _alive(heir) or reap.poll() is not None, 30)
        _table(fake_gpus, {1: [], 2: [elsewhere]})
        out, err = reap.communicate(timeout=60)
        report = json.loads(out)
        assert reap.returncode == 0, (err, report)
        assert {a["pid"] for a in report["actions"]} == {heir}, (heir, report["actions"])
        for action in report["actions"]:
            assert f"a context NVML names by gone pid {creator.pid}" in action["why"], action
        assert not _alive(heir)
        assert _alive(monitor) and _alive(elsewhere)
    finally:
        if reap.poll() is None:
            reap.kill()
            reap.communicate()
        for pid in (heir, monitor, elsewhere):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        for p in (monitor_p, elsewhere_p):
            p.wait()


def test_a_gone_creator_with_no_heir_still_times_out_naming_it(fake_gpus: FakeGpus) -> None:
    """No live process holds the context (memory held by another PID
    namespace, or a driver that has not let go): nothing is signalled, and
    the reaper says which pid it waited for (exit 3)."""
    done = subprocess.run([PYTHON, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    gone = int(done.stdout)
    _table(fake_gpus, {0: [gone]})
    reap = subprocess.run([PYTHON, "-m", "infer_units", "reap", "--json", "--gpus", "0",
                           "--term-grace", "1s", "--timeout", "2s"],
                          capture_output=True, text=True, env=fake_gpus.env(), timeout=60)
    report = json.loads(reap.stdout)
    assert reap.returncode == 3, (reap.stderr, report)
    assert report["actions"] == []
    assert [item["pid"] for item in report["left"]] == [gone]
