"""Races the reaper must win with real processes: a pid that stops being a GPU
user (or is reused by an innocent process) between the backend's listing and
the signal, and two start hooks racing for one GPU."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from infer_units.helpers.facts.gpus import FakeBackend, GpuUse
from infer_units.helpers.act.reaper import Reaper, ReapPolicy
from ..support import PYTHON, FakeGpus, run_cli, wait_until

SYSTEMD_V1 = Path("/sys/fs/cgroup/systemd")

# Holds the device until told "close" on stdin, then lives on without it.
CLOSER = r"""
import sys, time
f = open(sys.argv[1], "rb")
print("ready", flush=True)
sys.stdin.readline()
f.close()
print("closed", flush=True)
time.sleep(60)
"""


class RacingBackend(FakeBackend):
    """The fake backend, with something happening right after its first
    listing: the window between "who uses the GPU" and the signal."""

    def __init__(self, path: str, after_first_listing) -> None:  # type: ignore[no-untyped-def]
        super().__init__(path)
        self.after = after_first_listing
        self.calls = 0

    def users(self, gpus) -> dict[int, GpuUse]:  # type: ignore[no-untyped-def]
        listing = super().users(gpus)
        self.calls += 1
        if self.calls == 1:
            self.after(listing)
        return listing


def test_a_process_that_lets_go_after_the_listing_is_not_signalled(fake_gpus: FakeGpus) -> None:
    p = subprocess.Popen([PYTHON, "-c", CLOSER, str(fake_gpus.devices[0])],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout and p.stdin and p.stdout.readline().strip() == "ready"

        def let_go(listing: dict[int, GpuUse]) -> None:
            assert p.pid in listing
            p.stdin.write("close\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "closed"

        b = RacingBackend(str(fake_gpus.table), let_go)
        result = Reaper(b, b.gpus()[:1], None, ReapPolicy(term_grace=1.0, timeout=2.0)).run()
        assert result.exit_code == 0, result.message
        assert result.actions == [], "signalled a process that no longer used the GPU"
        time.sleep(0.1)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def _spawn_at_pid(pid: int, attempts: int = 300) -> subprocess.Popen | None:
    """An innocent process (sleep) under exactly `pid`, through ns_last_pid."""
    for _ in range(attempts):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        p = subprocess.Popen(["sleep", "60"])
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


def test_a_reused_pid_is_never_signalled(fake_gpus: FakeGpus) -> None:
    if os.geteuid() != 0 or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs root to choose the next pid (ns_last_pid)")
    holder = subprocess.Popen([PYTHON, "-c", CLOSER, str(fake_gpus.devices[0])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout and holder.stdout.readline().strip() == "ready"
    innocent: list[subprocess.Popen] = []

    def reuse(listing: dict[int, GpuUse]) -> None:
        assert holder.pid in listing
        holder.kill()
        holder.wait()
        p = _spawn_at_pid(holder.pid)
        if p is not None:
            innocent.append(p)

    try:
        b = RacingBackend(str(fake_gpus.table), reuse)
        result = Reaper(b, b.gpus()[:1], None, ReapPolicy(term_grace=1.0, timeout=2.0)).run()
        if not innocent:
            pytest.skip("could not get the pid reused (a busy host took it)")
        assert innocent[0].pid == holder.pid
        assert result.actions == [], f"signalled the innocent process: {result.actions}"
        assert result.exit_code == 0
        time.sleep(0.1)
        assert innocent[0].poll() is None, "the innocent process was killed"
    finally:
        for p in innocent:
            p.kill()
            p.wait()


# ------------------------------------------------------------- two starts at once

def _remove_cgroup_root(root: Path) -> None:
    """Move what is left back to the top and remove the test's cgroups.  The
    last _stop() waits for each unit's shell only: a child it SIGKILLed with
    it (the loser's `sleep`) may still be exiting in the cgroup, and rmdir
    answers EBUSY until it is gone (seen in CI): wait for that state."""
    def removed(cg: Path) -> bool:
        for pid in (cg / "cgroup.procs").read_text().split():
            try:
                (SYSTEMD_V1 / "cgroup.procs").write_text(pid)
            except ProcessLookupError:
                pass                    # it finished exiting meanwhile
        try:
            cg.rmdir()
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            return False
        return True

    for cg in root.iterdir():
        if cg.is_dir():
            assert wait_until(lambda: removed(cg), timeout=30), \
                f"{cg} stays busy: {(cg / 'cgroup.procs').read_text().split()}"
    root.rmdir()


def _cgroup_root(name: str) -> Path:
    if not (SYSTEMD_V1 / "cgroup.procs").exists() or not os.access(SYSTEMD_V1, os.W_OK):
        pytest.skip("cgroup v1 name=systemd not writable here")
    path = SYSTEMD_V1 / name
    path.mkdir(exist_ok=True)
    return path


def _unit(root: Path, fake: FakeGpus, unit: str, rc_file: Path) -> subprocess.Popen:
    """A stand-in for systemd running a unit: a supervisor in the unit's own
    cgroup runs pre-start, then, if it passed, the "server" (a GPU holder)
    in the same cgroup, as ExecStartPre and ExecStart share it."""
    cgroup = root / unit
    cgroup.mkdir(exist_ok=True)
    server = ("import sys, time; f = open(sys.argv[1], 'rb'); time.sleep(60)")
    script = (f'{PYTHON} -m infer_units pre-start --unit {unit} --gpus 0 --term-grace 1s '
              f'--timeout 5s 2>{rc_file}.err; rc=$?; echo $rc > {rc_file}; '
              f'[ $rc = 0 ] && exec {PYTHON} -c "{server}" {fake.devices[0]}; sleep 60')

    def enter() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        os.setsid()

    return subprocess.Popen(["sh", "-c", script], preexec_fn=enter,
                            env=fake.env(DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent",
                                         INFER_UNITS_STATE_DIR=str(fake.dir / "state")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def test_two_pre_starts_racing_for_one_gpu_exactly_one_wins(fake_gpus: FakeGpus) -> None:
    root = _cgroup_root(f"infer-units-race-{os.getpid()}")
    iterations = 30
    try:
        outcomes = []
        for i in range(iterations):
            rcs = [fake_gpus.dir / f"a-{i}.rc", fake_gpus.dir / f"b-{i}.rc"]
            units = [_unit(root, fake_gpus, "a.service", rcs[0]),
                     _unit(root, fake_gpus, "b.service", rcs[1])]
            try:
                assert wait_until(lambda: all(r.exists() and r.read_text().strip()
                                              for r in rcs), timeout=30)
                codes = sorted(int(r.read_text()) for r in rcs)
                outcomes.append(codes)
                assert codes == [0, 2], (i, codes, [Path(f"{r}.err").read_text() for r in rcs])
            finally:
                for u in units:
                    _stop(u)
        assert outcomes == [[0, 2]] * iterations
    finally:
        _remove_cgroup_root(root)


def test_a_claim_of_a_stopped_unit_is_stale_and_wait_free_clears_its_own(
        fake_gpus: FakeGpus) -> None:
    root = _cgroup_root(f"infer-units-claim-{os.getpid()}")
    try:
        rc = fake_gpus.dir / "a.rc"
        a = _unit(root, fake_gpus, "a.service", rc)
        assert wait_until(lambda: rc.exists() and rc.read_text().strip(), timeout=30)
        assert rc.read_text().strip() == "0"
        locks = list((fake_gpus.dir / "run" / "gpu").iterdir())
        assert len(locks) == 1 and '"unit": "a.service"' in locks[0].read_text()
        # While a runs, b is refused with the claim named.
        b = run_cli("pre-start", "--unit", "b", "--gpus", "0", env=fake_gpus.env(
            DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent"))
        assert b.returncode == 2
        assert "GPU 0 belongs to infer-units service a.service (its start claim" in b.stderr
        _stop(a)          # a is gone, its cgroup empty: the claim is stale
        again = run_cli("pre-start", "--unit", "b", "--gpus", "0", env=fake_gpus.env(
            DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent"))
        assert again.returncode == 0, again.stderr
        assert '"unit": "b.service"' in locks[0].read_text()
        # b's ExecStopPost clears b's claim (never another unit's).
        run_cli("wait-free", "--gpus", "0", "--unit", "a", env=fake_gpus.env(), check=0)
        assert '"unit": "b.service"' in locks[0].read_text()
        run_cli("wait-free", "--gpus", "0", "--unit", "b", env=fake_gpus.env(), check=0)
        assert locks[0].read_text() == ""
    finally:
        _remove_cgroup_root(root)
