"""Reaping with real processes and signals on the fake GPU backend: only
"which pids use GPU k" comes from the fake table; attribution, signalling and
waiting are the production code, run through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..support import FakeGpus, run_cli, wait_until

SYSTEMD_V1 = Path("/sys/fs/cgroup/systemd")
FREEZER_V1 = Path("/sys/fs/cgroup/freezer")


def reap_json(fake: FakeGpus, *args: str, **env: str) -> tuple[int, dict]:
    done = run_cli("reap", "--json", *args, env=fake.env(**env))
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}


def test_reap_is_scoped_to_the_selected_gpu(fake_gpus: FakeGpus, holders) -> None:
    on0 = holders([fake_gpus.devices[0]])
    on1 = holders([fake_gpus.devices[1]])
    on12 = holders([fake_gpus.devices[1], fake_gpus.devices[2]])
    code, report = reap_json(fake_gpus, "--gpus", "1", "--term-grace", "5s", "--timeout", "10s")
    assert code == 0, report
    assert wait_until(lambda: not on1.alive() and not on12.alive())
    assert on0.alive(), "a process on GPU 0 was killed by reap --gpus 1"
    assert {a["pid"] for a in report["actions"]} == {on1.pid, on12.pid}
    assert all(a["signal"] == "SIGTERM" for a in report["actions"])


def test_term_ignoring_holder_gets_sigkill_after_grace(fake_gpus: FakeGpus, holders) -> None:
    stubborn = holders([fake_gpus.devices[0]], mode="ignore-term")
    code, report = reap_json(fake_gpus, "--gpus", "0", "--term-grace", "0.5s", "--timeout", "120s")
    assert code == 0, report
    assert [a["signal"] for a in report["actions"]] == ["SIGTERM", "SIGKILL"]
    # SIGKILL at the grace, not at the timeout: the two lie far apart, so a
    # busy machine's scheduling cannot blur them.
    assert 0.5 <= report["actions"][1]["at_s"] < 60, report["actions"]
    assert stubborn.proc.wait(5) == -signal.SIGKILL


def test_every_kill_is_logged_with_pid_cmdline_and_why(fake_gpus: FakeGpus, holders) -> None:
    h = holders([fake_gpus.devices[2]])
    done = run_cli("reap", "--gpus", "2", "--term-grace", "2s", env=fake_gpus.env())
    assert done.returncode == 0
    line = next(l for l in done.stderr.splitlines() if "SIGTERM" in l)
    assert f"pid {h.pid}" in line and "import os, signal" in line and "foreign user of GPU 2" in line


def test_ignore_list_is_never_touched(fake_gpus: FakeGpus, holders) -> None:
    persistenced = holders([fake_gpus.devices[0]], exe="nvidia-persistenced")
    exporter = holders([fake_gpus.devices[0]], exe="my-exporter")
    victim = holders([fake_gpus.devices[0]])
    code, report = reap_json(fake_gpus, "--gpus", "0", "--ignore", "my-exporter",
                             "--term-grace", "2s")
    assert code == 0, report
    assert wait_until(lambda: not victim.alive())
    assert persistenced.alive() and exporter.alive()
    assert {h["pid"] for h in report["ignored"]} == {persistenced.pid, exporter.pid}


def test_a_hog_naming_itself_a_gpu_daemon_is_reaped(fake_gpus: FakeGpus, holders) -> None:
    # The attacker's three ways to be called nvidia-persistenced: argv[0]
    # (exec -a), comm (what prctl sets: here the argv[0] basename at exec) and
    # a copy of some binary under that name that the user owns.
    by_argv0 = holders([fake_gpus.devices[0]], argv0="nvidia-persistenced")
    by_copy = holders([fake_gpus.devices[0]], exe="dcgm-exporter", exe_uid=65534)
    spared = holders([fake_gpus.devices[1]], exe="nvidia-persistenced")
    code, report = reap_json(fake_gpus, "--gpus", "0,1", "--term-grace", "2s")
    assert code == 0, report
    assert wait_until(lambda: not by_argv0.alive() and not by_copy.alive())
    assert spared.alive()
    assert {h["pid"] for h in report["ignored"]} == {spared.pid}


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the daemon's executable as another account")
def test_the_real_daemon_executable_run_by_a_person_is_reaped(fake_gpus: FakeGpus,
                                                              public: Path) -> None:
    # Anyone can run the root-owned /usr/bin/nvidia-persistenced with
    # LD_PRELOAD of their own code (or under ptrace): the executable alone
    # does not make a GPU daemon.  Here the root-owned copy runs as nobody
    # (a person's account) and holds GPU 0 through a descriptor it inherited.
    exe = public / "nvidia-persistenced"
    shutil.copy2(os.path.realpath(sys.executable), exe)
    exe.chmod(0o755)
    fd = os.open(fake_gpus.devices[0], os.O_RDONLY)
    try:
        hog = subprocess.Popen([str(exe), "-I", "-c", "import time; print('ready', flush=True); "
                                "time.sleep(600)"], user=65534, group=65534, pass_fds=[fd],
                               stdout=subprocess.PIPE, text=True, cwd="/")
    finally:
        os.close(fd)
    try:
        assert hog.stdout is not None and hog.stdout.readline().strip() == "ready"
        code, report = reap_json(fake_gpus, "--gpus", "0", "--term-grace", "2s")
        assert code == 0, report
        assert hog.wait(30) is not None
        assert hog.pid not in {h["pid"] for h in report["ignored"]}
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()


def test_drain_reaps_a_hog_named_like_a_gpu_daemon(fake_gpus: FakeGpus, holders) -> None:
    hog = holders([fake_gpus.devices[2]], argv0="nv-hostengine")
    done = run_cli("drain", "--term-grace", "2s", env=fake_gpus.env())
    assert done.returncode == 0, done.stderr
    assert wait_until(lambda: not hog.alive())


def test_name_sharing_the_15_char_prefix_is_not_ignored(fake_gpus: FakeGpus, holders) -> None:
    # comm is cut at 15 characters: "nvidia-persistenced-x" must not pass for the daemon.
    impostor = holders([fake_gpus.devices[0]], argv0="nvidia-persistenced-x")
    code, _ = reap_json(fake_gpus, "--gpus", "0", "--term-grace", "2s")
    assert code == 0
    assert wait_until(lambda: not impostor.alive())


def test_foreign_fail_blocks_with_exit_2_and_touches_nothing(fake_gpus: FakeGpus, holders) -> None:
    h = holders([fake_gpus.devices[3]])
    code, report = reap_json(fake_gpus, "--gpus", "3", "--foreign", "fail")
    assert code == 2
    assert report["actions"] == [] and report["blocked_by"][0]["pid"] == h.pid
    assert h.alive()


def test_foreign_wait_waits_for_exit_without_signalling(fake_gpus: FakeGpus, holders,
                                                       tmp_path) -> None:
    h = holders([fake_gpus.devices[1]])
    killed_at = tmp_path / "killed-at"
    killer = os.fork()
    if killer == 0:   # the holder's own owner ends it 1 s later
        time.sleep(1.0)
        killed_at.write_text(repr(time.time()))
        os.kill(h.pid, signal.SIGUSR1)
        os._exit(0)
    code, report = reap_json(fake_gpus, "--gpus", "1", "--foreign", "wait", "--timeout", "120s")
    returned_at = time.time()
    os.waitpid(killer, 0)
    assert code == 0, report
    assert report["actions"] == []
    # it returned only after the holder's owner ended it, not on its own
    assert returned_at >= float(killed_at.read_text()), report
    # and then, not at its timeout: the two lie far apart, so a busy
    # machine's scheduling cannot blur them.
    assert report["seconds"] < 60


def test_foreign_wait_times_out_with_exit_3(fake_gpus: FakeGpus, holders) -> None:
    h = holders([fake_gpus.devices[1]])
    code, report = reap_json(fake_gpus, "--gpus", "1", "--foreign", "wait", "--timeout", "0.5s")
    assert code == 3
    assert [x["pid"] for x in report["left"]] == [h.pid] and h.alive()


def test_orphaned_workers_of_a_killed_parent_are_reaped(fake_gpus: FakeGpus, holders) -> None:
    parent = holders([fake_gpus.devices[0], fake_gpus.devices[1]], mode="orphans")
    before = json.loads(run_cli("holders", "--json", "--gpus", "0,1",
                                env=fake_gpus.env()).stdout)["holders"]
    workers = {h["pid"] for h in before} - {parent.pid}
    assert len(workers) == 2
    parent.proc.kill()
    parent.proc.wait()
    # The classic failure: the workers outlive their parent and keep the GPUs.
    assert all(Path(f"/proc/{pid}").exists() for pid in workers)
    code, report = reap_json(fake_gpus, "--gpus", "0", "--term-grace", "0.3s", "--timeout", "5s")
    assert code == 0, report
    assert {a["pid"] for a in report["actions"] if a["signal"] == "SIGKILL"} == workers
    assert wait_until(lambda: not any(_running(pid) for pid in workers))


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_dry_run_touches_nothing(fake_gpus: FakeGpus, holders) -> None:
    h = holders([fake_gpus.devices[0]])
    done = run_cli("reap", "--gpus", "0", "--dry-run", env=fake_gpus.env())
    assert done.returncode == 0
    assert f"would send SIGTERM to pid {h.pid}" in done.stderr
    time.sleep(0.2)
    assert h.alive()


def test_gpus_named_by_pci_id_or_uuid_reach_cuda_as_indexes_in_pci_order(
        fake_gpus: FakeGpus, tmp_path: Path) -> None:
    """vLLM parses CUDA_VISIBLE_DEVICES with int(): UUIDs there crashed its
    start.  Under CUDA_DEVICE_ORDER=PCI_BUS_ID an index counts GPUs in PCI
    order, which need not be the backend's (here GPU 0 and 3 swap slots)."""
    table = json.loads(fake_gpus.table.read_text())
    table["gpus"][0]["pci"], table["gpus"][3]["pci"] = table["gpus"][3]["pci"], table["gpus"][0]["pci"]
    fake_gpus.table.write_text(json.dumps(table))
    env_file = tmp_path / "run" / "m.env"
    env_file.parent.mkdir()
    for selector, expected in ((f"{fake_gpus.uuids[0]},{fake_gpus.uuids[2]}", "3,2"),
                               ("0000:42:00.0,41:00.0", "1,0")):
        env_file.write_text("NCCL_P2P_DISABLE=1\n")
        run_cli("reap", "--gpus", selector, "--env-file", str(env_file),
                env=fake_gpus.env(), check=0)
        assert env_file.read_text().splitlines() == [
            "NCCL_P2P_DISABLE=1", f"CUDA_VISIBLE_DEVICES={expected}"], selector


def test_unknown_gpu_is_a_usage_error(fake_gpus: FakeGpus) -> None:
    done = run_cli("reap", "--gpus", "7", env=fake_gpus.env())
    assert done.returncode == 1 and "GPU '7' not found" in done.stderr


def test_bad_duration_is_a_usage_error(fake_gpus: FakeGpus) -> None:
    done = run_cli("reap", "--gpus", "0", "--timeout", "soon", env=fake_gpus.env())
    assert done.returncode == 1 and "--timeout" in done.stderr


def test_holders_reports_pid_gpu_and_cmdline(fake_gpus: FakeGpus, holders) -> None:
    a = holders([fake_gpus.devices[0]])
    b = holders([fake_gpus.devices[2], fake_gpus.devices[3]])
    data = json.loads(run_cli("holders", "--json", env=fake_gpus.env(), check=0).stdout)
    by_pid = {h["pid"]: h for h in data["holders"]}
    assert by_pid[a.pid]["gpus"] == [0] and by_pid[b.pid]["gpus"] == [2, 3]
    assert by_pid[a.pid]["user"] == "root" or by_pid[a.pid]["user"]
    assert "import os, signal" in by_pid[a.pid]["cmdline"]
    table = run_cli("holders", "--gpus", "2", env=fake_gpus.env(), check=0).stdout
    assert str(b.pid) in table and str(a.pid) not in table


# ------------------------------------------------------------- real cgroups

def _cgroup_v1(hierarchy: Path, name: str) -> Path:
    if not (hierarchy / "cgroup.procs").exists() or not os.access(hierarchy, os.W_OK):
        pytest.skip(f"{hierarchy} (cgroup v1) not writable here")
    path = hierarchy / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _move(cgroup: Path, pid: int) -> None:
    (cgroup / "cgroup.procs").write_text(str(pid))


TAG = f"t{os.getpid()}"      # unit names of this run: another run's never collide


@pytest.fixture
def unit_cgroups():
    """Cgroups where systemd puts a system service (decide/identity.py: without
    D-Bus, /system.slice/NAME is a service's cgroup; nothing else is)."""
    made: list[Path] = []

    def make(unit: str) -> Path:
        path = _cgroup_v1(SYSTEMD_V1, f"system.slice/{unit}")
        made.append(path)
        return path

    yield make
    for path in made:
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                _move(SYSTEMD_V1, int(pid))
            except OSError:
                pass
        path.rmdir()


def test_another_infer_units_service_blocks_with_exit_2(fake_gpus: FakeGpus, holders,
                                                        unit_cgroups, tmp_path: Path) -> None:
    generator_dir = tmp_path / "generator"
    generator_dir.mkdir()
    (generator_dir / f"neighbour-{TAG}.service").write_text(
        "# Automatically generated by infer-units-generator 0.1.0\n")
    neighbour = holders([fake_gpus.devices[1]])
    _move(unit_cgroups(f"neighbour-{TAG}.service"), neighbour.pid)
    stale = holders([fake_gpus.devices[1]])
    code, report = reap_json(fake_gpus, "--gpus", "1", "--unit", f"mine-{TAG}.service",
                             INFER_UNITS_GENERATOR_DIR=str(generator_dir))
    assert code == 2
    assert report["blocked_by"][0]["unit"] == f"neighbour-{TAG}.service"
    assert report["actions"] == []
    assert neighbour.alive() and stale.alive()


def test_own_cgroup_leftovers_are_reaped_even_with_foreign_fail(fake_gpus: FakeGpus, holders,
                                                                unit_cgroups) -> None:
    leftover = holders([fake_gpus.devices[2]], mode="ignore-term")
    _move(unit_cgroups(f"mine-{TAG}.service"), leftover.pid)
    code, report = reap_json(fake_gpus, "--gpus", "2", "--unit", f"mine-{TAG}", "--foreign", "fail",
                             "--term-grace", "0.2s")
    assert code == 0, report
    assert "own cgroup" in report["actions"][0]["why"]
    assert leftover.proc.wait(5) == -signal.SIGKILL


def test_unkillable_holder_gives_exit_3_with_pid_state_and_wchan(fake_gpus: FakeGpus,
                                                                 holders) -> None:
    freezer = _cgroup_v1(FREEZER_V1, f"infer-units-test-{os.getpid()}")
    h = holders([fake_gpus.devices[0]])
    try:
        _move(freezer, h.pid)
        (freezer / "freezer.state").write_text("FROZEN")
        assert wait_until(lambda: (freezer / "freezer.state").read_text().strip() == "FROZEN")
        code, report = reap_json(fake_gpus, "--gpus", "0", "--term-grace", "0.2s",
                                 "--timeout", "1s")
        assert code == 3, report
        [left] = report["left"]
        assert left["pid"] == h.pid and left["state"] and left["wchan"]
        assert [a["signal"] for a in report["actions"]][-1] == "SIGKILL"
        done = run_cli("reap", "--gpus", "0", "--timeout", "0.3s", "--term-grace", "0s",
                       env=fake_gpus.env())
        assert done.returncode == 3
        assert f"pid {h.pid} still holds the GPU, state" in done.stderr
    finally:
        (freezer / "freezer.state").write_text("THAWED")
        h.stop()
        for pid in (freezer / "cgroup.procs").read_text().split():
            _move(FREEZER_V1, int(pid))
        freezer.rmdir()


# ------------------------------------------------------------- wait-free, drain

def _orphaned_workers(device: str, unit: str, holders, unit_cgroups) -> list[int]:
    """A server and its TP workers holding `device` in `unit`'s cgroup, the
    server then SIGKILLed: its orphaned workers' pids, still in the cgroup."""
    parent = holders([device], mode="orphans")
    cgroup = unit_cgroups(unit)
    workers = [int(p) for p in _children_holding(parent.pid)]
    for pid in [parent.pid, *workers]:
        _move(cgroup, pid)
    parent.proc.kill()
    parent.proc.wait()
    return workers


def test_wait_free_waits_for_its_own_orphans_only(fake_gpus: FakeGpus, holders,
                                                  unit_cgroups) -> None:
    """ExecStopPost: the unit's orphaned TP workers (still in its cgroup) are
    reaped and waited for; a foreign user of the same GPU is reported, neither
    signalled nor waited on, and the stop ends clean (exit 0)."""
    workers = _orphaned_workers(fake_gpus.devices[3], f"m-{TAG}.service", holders, unit_cgroups)
    foreign = holders([fake_gpus.devices[3]])
    started = time.monotonic()
    done = run_cli("wait-free", "--gpus", "3", "--unit", f"m-{TAG}", "--timeout", "120s",
                   "--result", "success", env=fake_gpus.env())
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert all(not _running(pid) for pid in workers)
    assert foreign.alive(), "wait-free must not kill foreign processes"
    # Waiting on the foreign user would last the whole timeout, far above this.
    assert took < 60, f"waited {took:.1f}s: it waited on the foreign user"
    line = next(l for l in done.stderr.splitlines() if f"pid {foreign.pid}" in l)
    assert "not touching it" in line and "foreign user of GPU 3" in line
    assert "1 other user(s) left, not waited on" in done.stderr
    assert not any(f"SIGTERM to pid {foreign.pid}" in l for l in done.stderr.splitlines())


def test_a_worker_reaps_its_last_runs_leftovers_before_it_parks(fake_gpus: FakeGpus, holders,
                                                                  unit_cgroups) -> None:
    """Seen in CI: a multi-node worker restarted (its head stopped) parked
    in pre-start with its last run's two TP workers still holding its GPUs:
    the restart's wait-free leaves the reaping to the start, and systemd's
    SIGKILL of the cgroup failed ("Failed to kill control group ...
    Input/output error").  The parked start now reaps them first; a foreign
    user of the same GPU is reported, untouched, and the worker still parks."""
    workers = _orphaned_workers(fake_gpus.devices[2], f"w-{TAG}.service", holders, unit_cgroups)
    foreign = holders([fake_gpus.devices[2]])
    with socket.socket() as s:        # a rendezvous port nobody listens on: it parks
        s.bind(("127.0.0.1", 0))
        head = s.getsockname()[1]
    env = fake_gpus.env(DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent")
    worker = subprocess.Popen(
        [sys.executable, "-m", "infer_units", "pre-start", "--unit", f"w-{TAG}", "--gpus", "2",
         "--timeout", "20s", "--wait-rendezvous", f"127.0.0.1:{head}",
         "--head-url", f"http://127.0.0.1:{head}/health"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    try:
        assert worker.stderr is not None
        for line in worker.stderr:
            said.append(line)
            if "parked until the head" in line:
                break
        assert said and "parked until the head" in said[-1], "".join(said)
        assert all(not _running(pid) for pid in workers), "".join(said)
        assert foreign.alive(), "a parking worker must not kill foreign processes"
        text = "".join(said)
        for pid in workers:
            assert f"SIGKILL to pid {pid}" in text, text
        assert "reaped 2 process(es) of" in text and "before parking" in text, text
        assert f"pid {foreign.pid} foreign user of GPU 2" in text and "not touching it" in text
        assert worker.poll() is None, "the worker must still wait for its head"
    finally:
        worker.kill()
        worker.wait()
        for pid in workers:           # left alive when the test fails
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _children_holding(pid: int) -> list[str]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kids = [p for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == pid]
        if len(kids) == 2:
            return kids
        time.sleep(0.02)
    raise AssertionError("orphan workers did not start")


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def test_wait_free_reports_a_foreign_user_and_returns_at_once(fake_gpus: FakeGpus,
                                                              holders) -> None:
    h = holders([fake_gpus.devices[3]])
    started = time.monotonic()
    done = run_cli("wait-free", "--gpus", "3", "--timeout", "120s", "--unit", "x",
                   "--result", "timeout", env=fake_gpus.env())
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60       # not the timeout's 120 s
    assert f"pid {h.pid} foreign user of GPU 3" in done.stderr and "import os, signal" in done.stderr
    assert "x.service stopped: timeout" in done.stderr
    assert h.alive(), "wait-free must not kill foreign processes"


def test_drain_reaps_every_holder_but_the_ignore_list(fake_gpus: FakeGpus, holders) -> None:
    a = holders([fake_gpus.devices[0]])
    b = holders([fake_gpus.devices[3]], mode="ignore-term")
    keep = holders([fake_gpus.devices[1]], exe="nv-hostengine")
    done = run_cli("drain", "--term-grace", "0.3s", "--timeout", "5s", env=fake_gpus.env())
    assert done.returncode == 0, done.stderr
    assert wait_until(lambda: not a.alive() and not b.alive())
    assert keep.alive()
    assert "1 process(es) hold /dev/nvidia*" in done.stderr
    assert "refcount" in done.stderr


def test_with_a_cheap_backend_the_killed_process_letting_go_ends_the_wait(
        fake_gpus: FakeGpus, holders, monkeypatch) -> None:
    """The NVML path after SIGKILL (users() asked every few ms, not only the
    pidfd), on the fake backend made to say it is cheap: a TERM-ignoring
    holder is killed, the reap returns clean, nothing else is signalled."""
    from infer_units.helpers.facts.gpus import FakeBackend, select
    from infer_units.helpers.act.reaper import Reaper, ReapPolicy

    class CheapFake(FakeBackend):
        cheap_users = True

    stubborn = holders([fake_gpus.devices[0]], mode="ignore-term")
    bystander = holders([fake_gpus.devices[1]], mode="ignore-term")
    backend = CheapFake(str(fake_gpus.table))
    gpus = select(backend.gpus(), "0")
    result = Reaper(backend, gpus, None, ReapPolicy("kill", 0.3, 120.0)).run()
    assert result.exit_code == 0, result.as_json()
    assert [(a.pid, a.signal) for a in result.actions] == [
        (stubborn.pid, "SIGTERM"), (stubborn.pid, "SIGKILL")]
    assert not stubborn.alive() and bystander.alive()
    assert result.seconds < 60                   # at the grace, not the timeout's 120 s
