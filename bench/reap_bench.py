#!/usr/bin/env python3
"""Reap benchmark: return latency after the last holder is gone, and the cost
of deciding whom to reap on a host with many idle processes.

    python3 bench/reap_bench.py [--trials 20] [--idle 10000] [--gib 20 | --gib 10,6]

Backend: NVML when GPUs are there (holders are torch processes holding --gib
GiB each, or one size each: `--gib 10,6` is the scene reap is measured on), else the fake
backend (holders hold fake device files).

1. Latency.  Each trial starts holders, then runs the reaper (in this
   process: the same Reaper the CLI runs).  A watcher thread notes when each
   holder's pidfd became readable and, with NVML, when the GPU's used memory
   was back to its level before the holders.  Printed: the reaper's return
   after the last of those events, next to the anchors of the
   scripts it replaces (a fixed `sleep 2`; polling /proc at 100 ms).
2. End to end, as an operator or a hook runs it: `infer-units reap --gpus 0
   --term-grace 0s` as a process (interpreter and imports included) against
   TERM-ignoring holders, next to its two floors measured in the same run:
   the teardown (SIGKILL of the same holders straight from here until the
   last is gone, and with NVML its memory back) and a bare `python3 -I -c
   pass`.  Goal (docs/performance.md): wall <= teardown + 300 ms, and at
   least 15x faster than SGLang's killall.py on the same holders: run here, side by side,
   with --killall PATH (sglang/cli/killall.py from SGLang's wheel, which
   tests/gpu/systemd/build-carry fetches; it needs nvidia-smi and NVML, and
   kills every process on the GPUs of CUDA_VISIBLE_DEVICES: only on a GPU
   machine of its own); else against --killall-s, its wall recorded once.
3. Decision cost.  attribute() (whom to reap) against `fuser` on the device
   files, each timed with 0 and with --idle extra idle processes, so the
   growth with the process count shows side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infer_units.helpers.decide.attribution import attribute  # noqa: E402
from infer_units.helpers.facts.gpus import NvmlBackend, backend, fd_holders  # noqa: E402
from infer_units.helpers.act import reaper as reaper_module  # noqa: E402
from infer_units.helpers.act.reaper import Reaper, ReapPolicy  # noqa: E402

# One line per signal is right for the journal, noise for a benchmark.
reaper_module._log = lambda message: None

FAKE_HOLDER = r"""
import os, signal, sys
f = open(sys.argv[1], "rb")
signal.signal(signal.SIGTERM, (lambda *a: os._exit(0)) if len(sys.argv) < 3 else signal.SIG_IGN)
print("ready", flush=True)
signal.pause()
"""

CUDA_HOLDER = r"""
import os, signal, sys, torch
x = torch.empty(int(float(sys.argv[1]) * (1 << 30)), dtype=torch.uint8, device="cuda")
x.fill_(1); torch.cuda.synchronize()
signal.signal(signal.SIGTERM, (lambda *a: os._exit(0)) if len(sys.argv) < 3 else signal.SIG_IGN)
print("ready", flush=True)
signal.pause()
"""


def setup_fake(tmp: Path) -> None:
    devices = [tmp / f"nvidia{i}" for i in range(2)]
    for d in devices:
        d.touch()
    table = {"gpus": [{"index": i, "uuid": f"GPU-bench{i:04d}-0000-0000-0000-000000000000",
                       "pci": f"0000:{0x41 + i:02x}:00.0", "device": str(d),
                       "memory_mib": 143771} for i, d in enumerate(devices)]}
    (tmp / "gpus.json").write_text(json.dumps(table))
    os.environ["INFER_UNITS_FAKE_GPUS"] = str(tmp / "gpus.json")


def start_holders(b, sizes: list[float],  # type: ignore[no-untyped-def]
                  ignore_term: bool = False) -> list[subprocess.Popen[str]]:
    procs = []
    stubborn = ["ignore-term"] if ignore_term else []
    for gib in sizes:
        if isinstance(b, NvmlBackend):
            argv = [sys.executable, "-c", CUDA_HOLDER, str(gib), *stubborn]
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=b.gpus()[0].uuid)
        else:
            argv = [sys.executable, "-c", FAKE_HOLDER, b.gpus()[0].device, *stubborn]
            env = dict(os.environ)
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
        procs.append(p)
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return procs


# The goals (docs/performance.md): reap's wall within the holders' teardown
# + this, and at least this many times faster than SGLang's killall.py.
GOAL_OVER_TEARDOWN_MS = 300
GOAL_FASTER = 15

# The scene reap is measured on has, beside the GPU's holders, a process whose
# command line names sglang and that uses no GPU (killall.py kills it too): here an
# operator's benchmark client, as its command line reads.  It holds no GPU,
# so it is no one's to kill; every run of reap and of killall.py has one.
BYSTANDER = ("import signal; signal.pause()", "sglang.bench_serving", "--backend", "sglang")


def start_bystander() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", *BYSTANDER])


def bystander_killed(p: subprocess.Popen[bytes]) -> bool:
    """Whether something killed it; if not, it is ended here."""
    if p.poll() is None:
        p.kill()
        p.wait()
        return False
    return True


def _no_fds(pid: int) -> bool:
    try:
        return not os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True


class Watcher(threading.Thread):
    """Notes when every holder is gone (pidfd) and when GPU memory is back."""

    def __init__(self, b, procs: list[subprocess.Popen[str]], baseline_mib: int | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.b, self.baseline = b, baseline_mib
        self.fds = [os.pidfd_open(p.pid) for p in procs]
        self.pids = [p.pid for p in procs]
        self.gone_at: float | None = None
        self.memory_back_at: float | None = None
        self.fds_empty_at: float | None = None   # /proc/PID/fd empty for every holder

    def run(self) -> None:
        poller = select.poll()
        for fd in self.fds:
            poller.register(fd, select.POLLIN)
        left = len(self.fds)
        nvml = isinstance(self.b, NvmlBackend)
        while left or (nvml and self.memory_back_at is None):
            for _fd, _ in poller.poll(1 if nvml else 1000):
                poller.unregister(_fd)
                left -= 1
                if not left:
                    self.gone_at = time.monotonic()
            if nvml and self.memory_back_at is None and \
                    self.b.memory_used_mib(0) <= (self.baseline or 0) + 64:
                self.memory_back_at = time.monotonic()
            if nvml and self.fds_empty_at is None and all(_no_fds(pid) for pid in self.pids):
                self.fds_empty_at = time.monotonic()


def latency(b, trials: int, sizes: list[float]) -> list[dict[str, float]]:  # type: ignore[no-untyped-def]
    gpu = b.gpus()[:1]
    nvml = isinstance(b, NvmlBackend)
    rows = []
    for _ in range(trials):
        baseline = b.memory_used_mib(0) if nvml else None
        procs = start_holders(b, sizes)
        watcher = Watcher(b, procs, baseline)
        watcher.start()
        t0 = time.monotonic()
        result = Reaper(b, gpu, None, ReapPolicy("kill", 30.0, 60.0)).run()
        returned = time.monotonic()
        watcher.join(30)
        for p in procs:
            p.wait()
        assert result.exit_code == 0, result.as_json()
        last = max(t for t in (watcher.gone_at, watcher.memory_back_at) if t is not None)
        rows.append({"return_after_last_ms": (returned - last) * 1000,
                     "total_ms": (returned - t0) * 1000,
                     "memory_back_after_exit_ms":
                         ((watcher.memory_back_at - watcher.gone_at) * 1000
                          if watcher.memory_back_at and watcher.gone_at else float("nan")),
                     "memory_back_after_fds_empty_ms":
                         ((watcher.memory_back_at - watcher.fds_empty_at) * 1000
                          if watcher.memory_back_at and watcher.fds_empty_at else float("nan"))})
    return rows


def _timed_run(argv: list[str]) -> float:
    t = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t


def _timed_reap(argv: list[str]) -> tuple[float, float]:
    """The CLI's wall, and when its first SIGKILL line reached us (the reaper
    logs each signal, flushed, just before sending it): where the wall goes,
    before the kill (start-up, NVML, deciding) and after it (the teardown,
    noticing it, leaving)."""
    t = time.monotonic()
    killed_at = float("nan")
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    for line in p.stderr:
        if killed_at != killed_at and "sending SIGKILL" in line:
            killed_at = time.monotonic() - t
    assert p.wait() == 0
    return time.monotonic() - t, killed_at


# A fresh process's NVML start: the module, nvmlInit, the GPU's handle and
# the two queries reap makes of it.  Printed beside the bare interpreter so
# that what is left of wall - teardown - floor can be read as NVML's or ours.
NVML_FLOOR = ("import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); "
              "n.nvmlDeviceGetComputeRunningProcesses(h); n.nvmlDeviceGetMemoryInfo(h)")


def end_to_end(b, trials: int, sizes: list[float]) -> dict[str, list[float]]:  # type: ignore[no-untyped-def]
    """Wall of the CLI's reap, the teardown of the same holders, the bare interpreter."""
    nvml = isinstance(b, NvmlBackend)
    # As the .deb's launcher starts it: its #! flags (-IS: no site module, so
    # no .pth files), this interpreter's site-packages appended where the
    # launcher appends Debian's dist-packages.
    with open(ROOT / "packaging/infer-units", encoding="utf-8") as f:
        flags = f.readline().split()[1:]
    import site
    deps = [d for d in site.getsitepackages() if os.path.isdir(d)]
    launcher = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); sys.path += {deps!r}; "
                "sys.argv[0] = 'infer-units'; from infer_units.helpers.entry import main; main()")
    cli = [sys.executable, *flags, "-c", launcher, "reap", "--gpus", "0", "--term-grace", "0s",
           "--timeout", "60s"]
    out: dict[str, list[float]] = {"wall": [], "to_kill": [], "after_kill": [], "teardown": [],
                                   "floor": [], "floor_flags": [], "bystander_killed": []}
    if nvml:
        out["nvml"] = []
    for _ in range(trials):
        out["floor"].append(_timed_run([sys.executable, "-I", "-c", "pass"]))
        out["floor_flags"].append(_timed_run([sys.executable, *flags, "-c", "pass"]))
        if nvml:     # what NVML itself costs a fresh process: its import, init, one query
            out["nvml"].append(_timed_run([sys.executable, "-I", "-c", NVML_FLOOR]))
        baseline = b.memory_used_mib(0) if nvml else None
        procs = start_holders(b, sizes, ignore_term=True)
        watcher = Watcher(b, procs, baseline)
        watcher.start()
        t0 = time.monotonic()
        for p in procs:
            p.kill()
        watcher.join(60)
        last = max(t for t in (watcher.gone_at, watcher.memory_back_at) if t is not None)
        out["teardown"].append(last - t0)
        for p in procs:
            p.wait()
        procs = start_holders(b, sizes, ignore_term=True)
        bystander = start_bystander()
        wall, to_kill = _timed_reap(cli)
        out["bystander_killed"].append(float(bystander_killed(bystander)))
        out["wall"].append(wall)
        out["to_kill"].append(to_kill)
        out["after_kill"].append(wall - to_kill)
        for p in procs:
            assert p.wait(10) is not None
    return out


def killall_walls(b, killall: Path, trials: int, sizes: list[float],  # type: ignore[no-untyped-def]
                  bystander: bool) -> tuple[list[float], str, int]:
    """SGLang's killall.py against the holders end_to_end() gives reap:
    its wall (process start to exit), each trial.  It picks the GPUs by
    index from CUDA_VISIBLE_DEVICES, kills what nvidia-smi lists on them and
    exits 0 once their memory is under 10% (its 1 s and 3 s sleeps are part
    of what it is).  Also its own verdict, the last trial's status line,
    and how many bystanders it killed (with `bystander`: one a trial)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(b.gpus()[0].index), PYTHONIOENCODING="utf-8")
    walls, killed = [], 0
    for _ in range(trials):
        procs = start_holders(b, sizes, ignore_term=True)
        other = start_bystander() if bystander else None
        t = time.monotonic()
        done = subprocess.run([sys.executable, str(killall)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              encoding="utf-8", errors="replace")   # its boxes are drawn
        walls.append(time.monotonic() - t)
        if other is not None:
            killed += bystander_killed(other)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise RuntimeError(f"killall.py left holder {p.pid} alive:\n{done.stdout}")
        if done.returncode != 0:
            raise RuntimeError(f"killall.py exited {done.returncode}:\n{done.stdout}")
        verdict = next((line.strip("│ ") for line in done.stdout.splitlines()
                        if "PASS" in line or "FAIL" in line), "no verdict printed")
    return walls, verdict, killed


def spawn_idle(count: int) -> subprocess.Popen[str]:
    """One helper that forks `count` idle children (each holds nothing)."""
    code = ("import os, signal, sys\nn = int(sys.argv[1])\n"
            "for _ in range(n):\n    if os.fork() == 0:\n        signal.pause()\n        os._exit(0)\n"
            "print('ready', flush=True)\nsignal.pause()\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(count)], stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def decision_cost(b, runs: int = 15) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    gpus = b.gpus()
    ours, fuser = [], []
    devices = b.device_files()
    have_fuser = shutil.which("fuser") is not None
    for _ in range(runs):
        t = time.perf_counter()
        attribute(b, gpus, None)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        if have_fuser:
            subprocess.run(["fuser", *devices], capture_output=True)
        else:   # what fuser does: every process's every fd, in Python
            fd_holders(set(devices))
        fuser.append(time.perf_counter() - t)
    return statistics.median(ours) * 1000, statistics.median(fuser) * 1000


def _ratio(x: float) -> str:
    """One decimal, rounded down: 19.96x printed as "20.0x" would read as met."""
    return f"{int(x * 10) / 10:.1f}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--holders", type=int, default=2)
    p.add_argument("--gib", default="20",
                   help="GPU memory per holder (NVML), GiB: one figure for --holders of that "
                        "size, or one per holder (\"10,6\": a 10 GB and a 6 GB holder)")
    p.add_argument("--idle", type=int, default=10000)
    p.add_argument("--killall", type=Path, metavar="PATH",
                   help="SGLang's sglang/cli/killall.py: run on the same holders, side by "
                        "side (it kills every process on the GPU: a GPU machine of its own)")
    p.add_argument("--killall-trials", type=int, default=3)
    p.add_argument("--killall-s", type=float, default=5.35,
                   help="without --killall: SGLang killall.py's wall on the same holders as "
                        "recorded once (docs/performance.md)")
    args = p.parse_args()
    sizes = [float(x) for x in args.gib.split(",")]
    if len(sizes) == 1:
        sizes *= args.holders
    with tempfile.TemporaryDirectory() as tmp:
        try:
            b = backend()
            if not isinstance(b, NvmlBackend):
                raise RuntimeError
        except Exception:
            setup_fake(Path(tmp))
            import infer_units.helpers.facts.gpus as g
            g._backend = None
            b = backend()
        print(f"backend: {b.name}; GPUs: {len(b.gpus())}; python {sys.version.split()[0]}")
        rows = latency(b, args.trials, sizes)
        ret = sorted(r["return_after_last_ms"] for r in rows)
        print(f"\n1. reap return latency, {args.trials} trials, {len(sizes)} holder(s)"
              + (f" of {'+'.join(f'{s:g}' for s in sizes)} GiB" if isinstance(b, NvmlBackend)
                 else ""))
        print("   after the last holder was gone"
              + (" and its memory back" if isinstance(b, NvmlBackend) else "")
              + f": median {statistics.median(ret):.2f} ms, max {ret[-1]:.2f} ms")
        for key, what in (("memory_back_after_fds_empty_ms", "GPU memory back after /proc/PID/fd emptied"),
                          ("memory_back_after_exit_ms", "GPU memory back after the pidfds were readable")):
            vals = [r[key] for r in rows if r[key] == r[key]]
            if vals:
                print(f"   {what}: median {statistics.median(vals):.1f} ms "
                      f"(min {min(vals):.1f}, max {max(vals):.1f})")
        print(f"   whole reap (TERM to return): median {statistics.median(r['total_ms'] for r in rows):.1f} ms")
        print(f"   anchors: `sleep 2` script 2000 ms -> {2000 / max(statistics.median(ret), 0.01):.0f}x slower; "
              f"/proc poll every 100 ms ~50 ms average -> {50 / max(statistics.median(ret), 0.01):.0f}x")
        e2e = end_to_end(b, args.trials, sizes)
        med = {k: statistics.median(v) * 1000 for k, v in e2e.items()}
        goal = med["teardown"] + GOAL_OVER_TEARDOWN_MS
        print(f"\n2. end to end: `infer-units reap --gpus 0 --term-grace 0s` as a process started as "
              f"the .deb's launcher starts it, {args.trials} trials, {len(sizes)} TERM-ignoring holder(s)")
        for k, what in (("wall", "reap's wall (process start to exit)"),
                        ("to_kill", "  start to its first SIGKILL"),
                        ("after_kill", "  first SIGKILL to exit"),
                        ("teardown", "teardown (SIGKILL to the last gone"
                         + (" and its memory back)" if isinstance(b, NvmlBackend) else ")")),
                        ("floor", "bare interpreter (python3 -I -c pass)"),
                        ("floor_flags", "  the same with the launcher's flags (-IS)"),
                        ("nvml", "NVML in a fresh process (import+init+query)")):
            if k not in e2e:
                continue
            v = e2e[k]
            print(f"   {what:42s} median {med[k]:7.1f} ms (min {min(v) * 1000:.1f}, max {max(v) * 1000:.1f})")
        print(f"   wall - teardown - floor = {med['wall'] - med['teardown'] - med['floor']:.1f} ms; "
              f"goal wall <= teardown + {GOAL_OVER_TEARDOWN_MS} = {goal:.1f} ms: "
              f"{'met' if med['wall'] <= goal else 'NOT met'}")
        reap_killed = int(sum(e2e["bystander_killed"]))
        print(f"   a bystander (`python3 -c ... {' '.join(BYSTANDER[1:])}`, no GPU) beside each "
              f"reap: killed {reap_killed} of {args.trials} times (goal 0)")
        killall_ms, how = args.killall_s * 1000, "recorded, not run here"
        if args.killall and not (isinstance(b, NvmlBackend) and shutil.which("nvidia-smi")):
            how += " (--killall needs NVML and nvidia-smi)"
        elif args.killall:
            try:
                for bystander in (False, True):     # the goal's scene last: the issue's
                    walls, verdict, killall_killed = killall_walls(
                        b, args.killall, args.killall_trials, sizes, bystander)
                    killall_ms = statistics.median(walls) * 1000
                    how = (f"run here on the same holders{' and bystander' if bystander else ''}, "
                           f"{len(walls)} trials, min {min(walls):.2f} s, max {max(walls):.2f} s; "
                           f"it said \"{verdict}\"")
                    if not bystander:
                        print(f"   SGLang killall.py without the bystander: {how}: "
                              f"{_ratio(killall_ms / med['wall'])}x reap's wall")
                    else:
                        how += f"; the bystander killed {killall_killed} of {len(walls)} times"
            except (RuntimeError, OSError) as e:
                killall_ms, how = args.killall_s * 1000, "recorded, not run here"
                print(f"   killall.py failed, the recorded wall stands in: {e}")
        faster = killall_ms / med['wall']
        print(f"   vs SGLang killall.py {killall_ms / 1000:.2f} s ({how}): "
              f"{_ratio(faster)}x faster (goal >= {GOAL_FASTER}x: "
              f"{'met' if faster >= GOAL_FASTER else 'NOT met'})")
        print(f"\n3. deciding whom to reap vs `fuser {' '.join(b.device_files()[:3])}...`")
        quiet = decision_cost(b)
        idle = spawn_idle(args.idle)
        try:
            busy = decision_cost(b)
        finally:
            os.killpg(idle.pid, signal.SIGKILL)
            idle.wait()
        nprocs = len([d for d in os.listdir('/proc') if d.isdigit()])
        print(f"   {'':22s} {'as is':>10s} {'+%d idle' % args.idle:>14s}  growth")
        print(f"   {'infer-units attribute':22s} {quiet[0]:8.2f}ms {busy[0]:12.2f}ms  {busy[0] / quiet[0]:5.1f}x")
        label = "fuser" if shutil.which("fuser") else "fd scan (no fuser here)"
        print(f"   {label:22s} {quiet[1]:8.2f}ms {busy[1]:12.2f}ms  {busy[1] / quiet[1]:5.1f}x")
        print(f"   (processes on the host during the busy run: about {nprocs + args.idle})")
        if not isinstance(b, NvmlBackend):
            print("   note: the fake backend finds users by scanning fds, like fuser; only NVML "
                  "answers without touching every process.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
