"""Real NVIDIA GPUs (run on the device machine: tests/gpu/run-on-device).

Holders are torch processes that allocate GPU memory; attribution comes from
NVML.  Skipped where NVML sees no GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ..support import PYTHON, base_env, run_cli, wait_until

pytestmark = pytest.mark.gpu


def _nvml_gpus() -> list[dict]:
    try:
        import pynvml
        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            out.append({"index": i, "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid})
        return out
    except Exception:
        return []


GPUS = _nvml_gpus()
if not GPUS:
    pytest.skip("no NVIDIA GPU visible through NVML", allow_module_level=True)

HOLDER = Path(__file__).with_name("cuda_holder.py")


def cuda_holder(gpu: int, gib: float = 2.0, spawn: bool = False,
                fork: bool = False) -> tuple[subprocess.Popen, list[int]]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    argv = [PYTHON, str(HOLDER), str(gib)] + (["spawn"] if spawn else []) + (["fork"] if fork else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    workers: list[int] = []
    line = proc.stdout.readline().strip()
    if line.startswith("workers"):
        workers = [int(p) for p in line.split()[1:]]
        line = proc.stdout.readline().strip()
    assert line == "ready", line
    return proc, workers


def holders_json(selector: str | None = None) -> dict:
    args = ["holders", "--json"] + (["--gpus", selector] if selector else [])
    return json.loads(run_cli(*args, check=0).stdout)


def memory_used(index: int) -> int:
    import pynvml
    return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used // (1 << 20)


def test_holders_attributes_each_pid_to_its_gpu() -> None:
    procs = [cuda_holder(g["index"])[0] for g in GPUS[:2]]
    try:
        data = holders_json()
        assert data["backend"] == "nvml" and data["exact"] is True
        by_pid = {h["pid"]: h for h in data["holders"]}
        for g, proc in zip(GPUS[:2], procs):
            h = by_pid[proc.pid]
            assert h["gpus"] == [g["index"]], h
            assert int(h["memory_mib"][str(g["index"])]) >= 2048
        # The measured fact: a CUDA process holds device files of every GPU.
        fds = {os.readlink(f"/proc/{procs[0].pid}/fd/{fd}") for fd in os.listdir(f"/proc/{procs[0].pid}/fd")}
        nodes = sorted(f for f in fds if f.startswith("/dev/nvidia") and f[11:].isdigit())
        print(f"pid {procs[0].pid} on GPU 0 holds {nodes}")
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.skipif(len(GPUS) < 2, reason="needs two GPUs")
def test_reap_gpu1_leaves_the_process_on_gpu0() -> None:
    on0, _ = cuda_holder(0)
    on1, _ = cuda_holder(1)
    try:
        report = json.loads(run_cli("reap", "--gpus", "1", "--json", "--term-grace", "5s").stdout)
        assert report["exit"] == 0
        assert [a["pid"] for a in report["actions"]] == [on1.pid]
        assert on1.wait(10) is not None
        time.sleep(0.5)
        assert on0.poll() is None, "reap --gpus 1 killed the process on GPU 0"
        assert on0.pid in {h["pid"] for h in holders_json("0")["holders"]}
    finally:
        for p in (on0, on1):
            p.kill()
            p.wait()


def test_orphaned_workers_are_reaped_and_their_memory_comes_back() -> None:
    baseline = memory_used(0)
    parent, workers = cuda_holder(0, gib=8.0, spawn=True)
    try:
        assert wait_until(lambda: {parent.pid, *workers} <= {h["pid"] for h in holders_json("0")["holders"]}, 60)
        used = memory_used(0)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        time.sleep(1.0)
        # The classic failure: the workers survive their parent and keep their memory.
        alive = [w for w in workers if Path(f"/proc/{w}").exists()]
        still = {h["pid"] for h in holders_json("0")["holders"]}
        print(f"baseline {baseline} MiB, with holders {used} MiB; after SIGKILL of the parent "
              f"workers alive: {alive}, NVML still lists {sorted(still)}, used {memory_used(0)} MiB")
        assert set(workers) <= still
        started = time.monotonic()
        report = json.loads(run_cli("reap", "--gpus", "0", "--json", "--term-grace", "1s",
                                    "--timeout", "30s").stdout)
        took = time.monotonic() - started
        assert report["exit"] == 0, report
        assert {a["pid"] for a in report["actions"] if a["signal"] == "SIGKILL"} == set(workers)
        after = memory_used(0)
        print(f"reap took {report['seconds'] * 1000:.0f} ms inside, {took * 1000:.0f} ms with "
              f"the CLI start; memory used right after: {after} MiB")
        assert after <= baseline + 512, f"memory not back: {after} MiB vs {baseline} MiB before"
        assert holders_json("0")["holders"] == []
    finally:
        for pid in [parent.pid, *workers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_context_kept_by_a_forked_child_is_found_and_reaped() -> None:
    """A creates a context, forks B, A is killed: the driver keeps the
    context in B and NVML lists only A's pid, which no longer exists.  The
    reaper signalled nothing and timed out (exit 3) while B kept the memory."""
    gpu = GPUS[0]["index"]
    base = _used_mib(gpu)
    creator, [heir] = cuda_holder(gpu, gib=4.0, fork=True)
    try:
        creator.kill()
        creator.wait()
        assert wait_until(lambda: creator.pid in holders_pids(gpu), 10), "NVML dropped the creator"
        assert _used_mib(gpu) > base + 3000
        done = run_cli("reap", "--json", "--gpus", str(gpu), "--term-grace", "2s",
                       "--timeout", "30s")
        report = json.loads(done.stdout)
        assert done.returncode == 0, (done.stderr, report)
        assert heir in {a["pid"] for a in report["actions"]}, report
        assert [a for a in report["actions"] if a["pid"] == heir][0]["why"].endswith(
            f"a context NVML names by gone pid {creator.pid}"), report
        assert not _running(heir)
        assert _used_mib(gpu) < base + 500
    finally:
        try:
            os.kill(heir, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's reaper may be slow to wait for it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def holders_pids(gpu: int) -> set[int]:
    import pynvml
    h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}


def _used_mib(gpu: int) -> int:
    import pynvml
    used: int = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu)).used
    return used >> 20


def test_status_without_systemd_still_shows_the_gpus(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text('engine = "sglang"\nmodel = "/m"\ngpus = [0]\nport = 18777\n')
    proc, _ = cuda_holder(0)
    try:
        env = base_env(INFER_UNITS_CONFIG_PATH=str(etc))
        # exit 1: systemd cannot be asked (as systemctl fails then); the GPUs are still shown
        report = json.loads(run_cli("status", "--json", env=env, check=1).stdout)
        [m] = report["models"]
        print(json.dumps(m, indent=1)[:1500])
        assert m["systemd"]["available"] is False
        assert m["gpu"]["backend"] == "nvml"
        assert m["gpu"]["gpus"][0]["memory_used_mib"] >= 2048
        assert proc.pid in {p["pid"] for p in m["gpu"]["processes"]}
        table = run_cli("status", env=env, check=1).stdout
        print(table)
        assert "systemd unavailable" in table
    finally:
        proc.kill()
        proc.wait()


def test_p2p_selftest_on_real_gpus(tmp_path: Path) -> None:
    env_file = tmp_path / "m.env"
    selector = ",".join(str(g["index"]) for g in GPUS)
    done = run_cli("p2p-check", "--gpus", selector, "--env-file", str(env_file),
                   "--python", PYTHON, env=base_env(INFER_UNITS_P2P_CACHE=str(tmp_path / "c"),
                                                    INFER_UNITS_STATE_DIR=str(tmp_path / "s")),
                   check=0)
    print(done.stderr)
    if len(GPUS) < 2:
        assert "one GPU: no peer traffic" in done.stderr
        return
    report = json.loads(next((tmp_path / "c").iterdir()).read_text())
    print(json.dumps(report["report"], indent=1))
    assert len(report["report"]["pairs"]) == len(GPUS) * (len(GPUS) - 1)
    assert ("P2P on" in done.stderr) == report["ok"]
    assert ("NCCL_P2P_DISABLE=1" in env_file.read_text()) == (not report["ok"])


def test_pre_start_and_wait_free_hooks_on_real_gpus(tmp_path: Path) -> None:
    """The unit's hooks as systemd would run them (no systemd here): pre-start
    reaps the foreign user of GPU 0 only; wait-free then finds GPU 0 free."""
    foreign, _ = cuda_holder(0)
    other = cuda_holder(1)[0] if len(GPUS) > 1 else None
    env = base_env(INFER_UNITS_STATE_DIR=str(tmp_path / "state"))
    try:
        done = run_cli("pre-start", "--unit", "m.service", "--gpus", "0", "--term-grace", "5s",
                       "--timeout", "30s", "--port", "18779", env=env)
        print(done.stderr)
        assert done.returncode == 0
        assert f"sending SIGTERM to pid {foreign.pid}" in done.stderr
        assert foreign.wait(10) is not None
        if other is not None:
            assert other.poll() is None
        free = run_cli("wait-free", "--gpus", "0", "--unit", "m", "--timeout", "10s",
                       "--result", "success", env=env)
        print(free.stderr)
        assert free.returncode == 0 and "GPU 0 free after" in free.stderr
    finally:
        for p in (foreign, other):
            if p is not None:
                p.kill()
                p.wait()
