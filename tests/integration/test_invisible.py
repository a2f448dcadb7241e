"""Holders the first cut could not see and reported as free: the caller's own
parent chain, a process whose leader thread exited while another thread keeps
the device open, processes of other users seen by a non-root caller, and GPU
memory no visible process accounts for (users in another PID namespace).
Plus drain with a leftover of an infer-units service, and a worker that left
another service's cgroup."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ..support import PYTHON, FakeGpus, run_cli, wait_until

SYSTEMD_V1 = Path("/sys/fs/cgroup/systemd")

# ------------------------------------------------------------------ ancestors

PARENT = r"""
import subprocess, sys
f = open(sys.argv[1], "rb")             # this process holds the GPU...
done = subprocess.run(sys.argv[2:], capture_output=True, text=True)   # ...and runs the CLI
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
sys.exit(done.returncode)
"""


def as_parent_holding(fake: FakeGpus, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    p = subprocess.Popen([PYTHON, "-c", PARENT, str(fake.devices[0]), PYTHON, "-m",
                          "infer_units", *args], env=fake.env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), p.pid


def test_the_callers_own_parent_is_reported_not_free_and_never_reaped(fake_gpus: FakeGpus) -> None:
    done, parent = as_parent_holding(fake_gpus, "holders", "--gpus", "0", "--json")
    assert done.returncode == 0, done.stderr
    [h] = json.loads(done.stdout)["holders"]
    assert h["pid"] == parent and h["kind"] == "ancestor"
    table, _ = as_parent_holding(fake_gpus, "holders", "--gpus", "0")
    assert "no process uses GPU 0" not in table.stdout and "ancestor" in table.stdout
    reap, parent = as_parent_holding(fake_gpus, "reap", "--gpus", "0", "--term-grace", "1s")
    assert reap.returncode == 2, reap.stderr       # it survived to report: not signalled
    assert f"pid {parent} holds GPU 0 and is this command's own parent chain" in reap.stderr


# ------------------------------------------------------------------ zombie leader

ZOMBIE_LEADER = r"""
import ctypes, sys, threading, time
f = open(sys.argv[1], "rb")
threading.Thread(target=time.sleep, args=(60,)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)      # the main thread exits; the process lives on
"""


def test_a_zombie_leader_whose_thread_holds_the_device_is_seen_and_reaped(
        fake_gpus: FakeGpus) -> None:
    p = subprocess.Popen([PYTHON, "-c", ZOMBIE_LEADER, str(fake_gpus.devices[1])],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout and p.stdout.readline().strip() == "ready"
        assert wait_until(lambda: _state(p.pid) == "Z")
        assert os.listdir(f"/proc/{p.pid}/fd") == []      # what the first cut looked at
        data = json.loads(run_cli("holders", "--gpus", "1", "--json", env=fake_gpus.env(),
                                  check=0).stdout)
        assert [h["pid"] for h in data["holders"]] == [p.pid]
        done = run_cli("reap", "--gpus", "1", "--term-grace", "1s", "--timeout", "5s",
                       env=fake_gpus.env())
        assert done.returncode == 0, done.stderr
        assert f"sending SIGTERM to pid {p.pid}" in done.stderr
        assert p.wait(5) != 0
    finally:
        p.kill()
        p.wait()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


# ------------------------------------------------------------------ not root

@pytest.fixture
def world_readable_gpus():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a command as nobody")
    d = Path(tempfile.mkdtemp(prefix="infer-units-nobody-"))
    d.chmod(0o755)
    fake = FakeGpus(d / "g", count=2)
    for path in [fake.dir, *fake.devices, fake.table]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield fake
    shutil.rmtree(d)


def as_nobody(fake: FakeGpus, *args: str) -> subprocess.CompletedProcess:
    env = fake.env(PYTHONDONTWRITEBYTECODE="1", HOME="/", INFER_UNITS_RUN_DIR="/nonexistent")
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           PYTHON, "-m", "infer_units", *args], env=env, cwd="/",
                          capture_output=True, text=True, timeout=60)


def test_a_non_root_caller_is_told_it_cannot_see_not_free(world_readable_gpus: FakeGpus,
                                                         holders) -> None:
    fake = world_readable_gpus
    h = holders([fake.devices[0]])          # a root process on GPU 0
    done = as_nobody(fake, "holders", "--gpus", "0")
    assert done.returncode == 0, done.stderr
    assert "no process uses GPU 0" not in done.stdout
    assert "cannot see processes of other users" in done.stdout and "run as root" in done.stdout
    data = json.loads(as_nobody(fake, "holders", "--json").stdout)
    assert data["unseen"] > 0 and data["holders"] == []
    reap = as_nobody(fake, "reap", "--gpus", "0")
    assert reap.returncode == 1
    assert reap.stderr.strip().splitlines() == [
        l for l in reap.stderr.strip().splitlines() if "cannot see processes of other users" in l
        or "reap GPU 0" in l]
    assert h.alive()


# ------------------------------------------------------------------ unaccounted memory

def set_memory(fake: FakeGpus, index: int, used: int | None, per_process: int = 0) -> None:
    table = json.loads(fake.table.read_text())
    gpu = table["gpus"][index]
    gpu["process_memory_mib"] = per_process
    if used is None:
        gpu.pop("memory_used_mib", None)
    else:
        gpu["memory_used_mib"] = used
    tmp = fake.table.with_suffix(".tmp")
    tmp.write_text(json.dumps(table))
    os.replace(tmp, fake.table)       # a new inode: the backend sees the change


def test_memory_no_visible_process_holds_is_never_free(fake_gpus: FakeGpus) -> None:
    set_memory(fake_gpus, 0, 20000)
    text = run_cli("holders", "--gpus", "0", env=fake_gpus.env(), check=0).stdout
    assert "no process uses GPU 0" not in text
    assert "GPU 0: 20000 MiB used by no visible process" in text
    data = json.loads(run_cli("holders", "--json", env=fake_gpus.env(), check=0).stdout)
    assert data["unaccounted_mib"] == {"0": 20000}
    # foreign = fail: blocked at once.
    fail = run_cli("reap", "--gpus", "0", "--foreign", "fail", env=fake_gpus.env())
    assert fail.returncode == 2 and "20000 MiB used by no visible process" in fail.stderr
    # kill: nothing to kill; waits, then exit 3 naming the memory.
    kill = run_cli("reap", "--gpus", "0", "--term-grace", "0s", "--timeout", "0.5s",
                   env=fake_gpus.env())
    assert kill.returncode == 3
    assert "unaccounted 20000 MiB on GPU 0" in kill.stderr
    # The other GPUs are not affected.
    assert run_cli("reap", "--gpus", "1", env=fake_gpus.env()).returncode == 0


def test_waiting_ends_when_the_invisible_memory_comes_back(fake_gpus: FakeGpus) -> None:
    set_memory(fake_gpus, 2, 30000)
    timer = threading.Timer(1.0, set_memory, (fake_gpus, 2, 0))
    timer.start()
    try:
        started = time.monotonic()
        done = run_cli("reap", "--gpus", "2", "--foreign", "wait", "--timeout", "120s",
                       env=fake_gpus.env())
        took = time.monotonic() - started
    finally:
        timer.join()
    assert done.returncode == 0, done.stderr
    assert 0.9 < took < 60                       # when the memory came back, not the timeout


def test_memory_the_listed_processes_hold_and_the_baseline_are_accounted(
        fake_gpus: FakeGpus, holders) -> None:
    holders([fake_gpus.devices[3]])
    holders([fake_gpus.devices[3]])
    set_memory(fake_gpus, 3, 2 * 5000 + 40, per_process=5000)
    data = json.loads(run_cli("holders", "--json", env=fake_gpus.env(), check=0).stdout)
    assert data["unaccounted_mib"] == {}
    assert {h["memory_mib"]["3"] for h in data["holders"]} == {5000}
    # A v1-style driver reservation is what INFER_UNITS_GPU_BASELINE_MIB is for.
    set_memory(fake_gpus, 3, 2 * 5000 + 615, per_process=5000)
    busy = json.loads(run_cli("holders", "--json", env=fake_gpus.env(), check=0).stdout)
    assert busy["unaccounted_mib"] == {"3": 615}
    quiet = json.loads(run_cli("holders", "--json", env=fake_gpus.env(
        INFER_UNITS_GPU_BASELINE_MIB="615"), check=0).stdout)
    assert quiet["unaccounted_mib"] == {}


def test_wait_free_reports_invisible_memory_and_ends_clean(fake_gpus: FakeGpus) -> None:
    set_memory(fake_gpus, 1, 12000)
    started = time.monotonic()
    done = run_cli("wait-free", "--gpus", "1", "--unit", "m", "--timeout", "120s",
                   env=fake_gpus.env())
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60       # not the timeout's 120 s
    assert "not ours: GPU 1: 12000 MiB used by no visible process" in done.stderr


# ------------------------------------------------------------------ services

NEIGHBOUR = f"neighbour-t{os.getpid()}.service"   # another test run's never collides


@pytest.fixture
def service_cgroup(tmp_path: Path):
    if not (SYSTEMD_V1 / "cgroup.procs").exists() or not os.access(SYSTEMD_V1, os.W_OK):
        pytest.skip("cgroup v1 name=systemd not writable here")
    generator = tmp_path / "generator"
    generator.mkdir()
    (generator / NEIGHBOUR).write_text(
        "# Automatically generated by infer-units-generator 0.1.0\n")
    # Where systemd puts a system service (without D-Bus, decide/identity.py
    # takes /system.slice/NAME as NAME's cgroup, and nothing else).
    path = SYSTEMD_V1 / "system.slice" / NEIGHBOUR
    path.mkdir(parents=True)
    yield path, str(generator)
    for pid in (path / "cgroup.procs").read_text().split():
        try:
            (SYSTEMD_V1 / "cgroup.procs").write_text(pid)
        except OSError:
            pass
    path.rmdir()


def test_drain_reaps_the_rest_and_names_a_service_leftover(fake_gpus: FakeGpus, holders,
                                                          service_cgroup) -> None:
    cgroup, generator = service_cgroup
    leftover = holders([fake_gpus.devices[0]])
    (cgroup / "cgroup.procs").write_text(str(leftover.pid))
    a = holders([fake_gpus.devices[1]])
    b = holders([fake_gpus.devices[2]], mode="ignore-term")
    done = run_cli("drain", "--term-grace", "0.3s", "--timeout", "5s",
                   env=fake_gpus.env(INFER_UNITS_GENERATOR_DIR=generator))
    assert done.returncode == 2, done.stderr
    assert wait_until(lambda: not a.alive() and not b.alive()), "drain gave up on the rest"
    assert leftover.alive()
    assert f"spared: pid {leftover.pid} belongs to infer-units service {NEIGHBOUR}" \
        in done.stderr
    assert "not drained: reaped the rest; left alone: pid" in done.stderr


WORKER_OUTSIDE = r"""
import os, sys, time
cgroup = sys.argv[2]
open(cgroup + "/cgroup.procs", "w").write(str(os.getpid()))   # the service's main process
r, w = os.pipe()
if os.fork() == 0:
    open("/sys/fs/cgroup/systemd/cgroup.procs", "w").write(str(os.getpid()))  # leaves it
    f = open(sys.argv[1], "rb")
    os.write(w, b"x")
    time.sleep(60)
os.read(r, 1)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_worker_that_left_another_services_cgroup_is_not_foreign(fake_gpus: FakeGpus,
                                                                   service_cgroup) -> None:
    cgroup, generator = service_cgroup
    p = subprocess.Popen([PYTHON, "-c", WORKER_OUTSIDE, str(fake_gpus.devices[3]), str(cgroup)],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout and p.stdout.readline().strip() == "ready"
        done = run_cli("reap", "--gpus", "3", "--unit", "mine", "--json",
                       env=fake_gpus.env(INFER_UNITS_GENERATOR_DIR=generator))
        assert done.returncode == 2, done.stderr
        [blocker] = json.loads(done.stdout)["blocked_by"]
        assert f"child of infer-units service {NEIGHBOUR}" in blocker["why"]
        assert json.loads(done.stdout)["actions"] == []
    finally:
        os.killpg(p.pid, 9)
        p.wait()


SERVICE_ZOMBIE_LEADER = r"""
import ctypes, os, sys, threading, time
open(sys.argv[2] + "/cgroup.procs", "w").write(str(os.getpid()))
f = open(sys.argv[1], "rb")
threading.Thread(target=time.sleep, args=(60,)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_services_zombie_leader_is_still_that_services(fake_gpus: FakeGpus,
                                                         service_cgroup) -> None:
    """/proc/PID/cgroup of a zombie leader reads "/" (measured, cgroup v1):
    read naively, a service whose main thread exited is "foreign" and the
    neighbour's start kills it.  Its live threads say where it belongs."""
    cgroup, generator = service_cgroup
    p = subprocess.Popen([PYTHON, "-c", SERVICE_ZOMBIE_LEADER, str(fake_gpus.devices[2]),
                          str(cgroup)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout and p.stdout.readline().strip() == "ready"
        assert wait_until(lambda: _state(p.pid) == "Z")
        done = run_cli("reap", "--gpus", "2", "--unit", "mine", "--json",
                       env=fake_gpus.env(INFER_UNITS_GENERATOR_DIR=generator))
        assert done.returncode == 2, done.stderr
        report = json.loads(done.stdout)
        assert [b["unit"] for b in report["blocked_by"]] == [NEIGHBOUR]
        assert report["actions"] == [] and p.poll() is None
    finally:
        p.kill()
        p.wait()
