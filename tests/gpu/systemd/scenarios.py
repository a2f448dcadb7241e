#!/usr/bin/python3
"""The GPU scenarios, run inside the booted container as a boot-time unit
(iu-gpu-scenarios.service, written by boot-scenarios.sh) under real systemd, with
the infer-units .deb installed and the GPU machine's /dev/nvidia* passed in.
GPU memory is read through NVML (infer-units' own backend, libnvidia-ml from
the machine); the CUDA servers run the machine's torch through host-python.

    scenarios.py OUT HANDSHAKE_DIR

Writes OUT/results.json after every scenario (each: ok, summary, figures, the
commands that produced them with their exit codes and wall times) and
OUT/scenarios.log.  IU_FAKE_GPUS=1: the same on fake GPUs (no memory figures).
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

OUT, HS = sys.argv[1], sys.argv[2]
FAKE = os.environ.get("IU_FAKE_GPUS") == "1"
if FAKE:
    os.environ["INFER_UNITS_FAKE_GPUS"] = "/etc/infer-units/fakegpus.json"
os.environ["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
from infer_units.helpers.facts import gpus as gpus_mod  # noqa: E402

sys.path.insert(0, "/opt/iu-gpu/bench-tree")    # the tests' package, carried for s8 and l7
from tests.support import alive  # noqa: E402

HOSTPY = "/usr/local/bin/host-python"
SERVER = "/run/iu-gpu/server.py"
GIB = 0.0 if FAKE else 20.0          # per TP worker, scenario 1
STOP_REPEATS = int(os.environ.get("IU_STOP_REPEATS", "4"))
SLACK_MIB = 256                      # "memory back": within this of the idle figure
T0 = time.monotonic()
LOG = open(os.path.join(OUT, "scenarios.log"), "a", buffering=1)
B = gpus_mod.backend()
GPUS = B.gpus()
# The harness runs on whatever GPU count it finds: TP over the first two (or
# the one there is), two models where there are two GPUs; the scenarios
# that need two (disjoint models, P2P) say they were skipped, and why.
TP = [g.index for g in GPUS][:2]
PAIR = ("left", "right") if len(GPUS) >= 2 else ("left",)
RESULTS: dict[str, Any] = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "fake_gpus": FAKE, "backend": B.name,
                 "gpus": [{"index": g.index, "uuid": g.uuid, "pci": g.pci,
                           "memory_total_mib": g.memory_total_mib} for g in GPUS],
                 "scenarios": {}}


def log(msg: str) -> None:
    line = f"[{time.monotonic() - T0:8.3f}] {msg}"
    print(line, flush=True)
    LOG.write(line + "\n")


def save() -> None:
    with open(os.path.join(OUT, "results.json.tmp"), "w") as f:
        json.dump(RESULTS, f, indent=1, sort_keys=False)
    os.replace(os.path.join(OUT, "results.json.tmp"), os.path.join(OUT, "results.json"))


# ------------------------------------------------------------------ probes

def mem() -> dict[int, int]:
    """GPU index -> used MiB (NVML memory info v2: the driver's reservation excluded)."""
    return {i: used for i, (used, _reserved) in B.memory(GPUS).items()}


def holders() -> dict[int, dict[str, Any]]:
    return {pid: {"gpus": sorted(u.gpus), "mib": {str(k): v for k, v in u.memory_mib.items()}}
            for pid, u in B.users(GPUS).items()}


class Scenario:
    def __init__(self, name: str) -> None:
        self.name = name
        self.data: dict[str, Any] = {"ok": False, "commands": []}
        RESULTS["scenarios"][name] = self.data
        self.since = time.time()

    def sh(self, cmd: str, timeout: float = 300) -> tuple[int, float, str, str]:
        t = time.monotonic()
        try:
            done = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True,
                                  timeout=timeout)
            rc, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = 124, str(e.stdout or ""), str(e.stderr or "")
        s = time.monotonic() - t
        self.data["commands"].append({"cmd": cmd, "rc": rc, "seconds": round(s, 3)})
        log(f"{self.name}: `{cmd}` -> rc {rc} in {s:.3f}s" + (f": {err.strip()[-300:]}" if rc else ""))
        return rc, s, out, err

    def journal(self, unit: str) -> list[str]:
        out = subprocess.run(["journalctl", "-u", unit, "-o", "short-monotonic", "--no-pager",
                              f"--since=@{int(self.since)}"], capture_output=True, text=True).stdout
        return [line for line in out.splitlines()
                if "infer-units" in line or "Main process" in line or "Failed" in line
                or "Started" in line or "Stopped" in line or "SIG" in line
                or "status=" in line or "Control process" in line][-60:]


def show(unit: str, prop: str) -> str:
    return subprocess.run(["systemctl", "show", "-p", prop, "--value", unit],
                          capture_output=True, text=True).stdout.strip()


def unit_pids(unit: str) -> list[int]:
    cg = show(unit, "ControlGroup")
    pids: list[int] = []
    if not cg:
        return pids
    # cgroup v2 (the GPU machine); the hybrid layout of a v1 host (the local run)
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"):
        if not os.path.isdir(base + cg):
            continue
        for root, _dirs, files in os.walk(base + cg):
            if "cgroup.procs" in files:
                with open(os.path.join(root, "cgroup.procs")) as f:
                    pids += [int(x) for x in f.read().split()]
        break
    return sorted(set(pids))


def device_fds(pid: int) -> list[str]:
    """The /dev/nvidia* nodes a process holds open (docs/architecture.md: every
    CUDA process opens every node, whatever CUDA_VISIBLE_DEVICES says)."""
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            # /host/dev/nvidia0: a server in host-python's chroot, seen from here
            if "/dev/nvidia" in target or "/var/lib/fakegpu/" in target:
                out.add(target)
    except OSError:
        pass
    return sorted(out)


def add_model(name: str, text: str) -> None:
    with open(f"/etc/infer-units/{name}.toml", "w") as f:
        f.write(text)
    subprocess.run(["systemctl", "daemon-reload"], check=True)


def model_toml(port: int, gpus: list[int], gib: float, reap: str = "", extra: str = "") -> str:
    argv = [HOSTPY, SERVER, "--gib", str(gib), "--port", str(port)]
    return "\n".join([
        'engine = "command"', f"command = {json.dumps(argv)}", f"gpus = {gpus}", f"port = {port}",
        extra,
        "[reap]", 'term-grace = "2s"', 'timeout = "30s"', reap,
        "[ready]", f'url = "http://127.0.0.1:{port}/health"', 'timeout = "240s"',
        'interval = "100ms"',
        "[service]", 'RestartSec = "2s"', ""])


def health(port: int, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                answer: dict[str, Any] = json.load(r)
                return answer
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Sampler:
    """Used memory of every GPU, as fast as NVML answers (docs/performance.md
    has what a query costs)."""

    def __init__(self, period: float = 0.002) -> None:
        self.period = period
        self.samples: list[tuple[float, dict[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), mem()))
            time.sleep(self.period)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self) -> dict[int, int]:
        return {g.index: max((s[1].get(g.index, 0) for s in self.samples), default=0) for g in GPUS}

    def span(self, index: int) -> tuple[int, int]:
        values = [s[1].get(index, 0) for s in self.samples]
        return (min(values), max(values)) if values else (0, 0)

    def trace(self, t0: float) -> list[list[float]]:
        """[ms since t0, MiB of GPU 0, MiB of GPU 1, ...] where a figure changed."""
        out: list[list[float]] = []
        last = None
        for t, m in self.samples:
            row = [m.get(g.index, 0) for g in GPUS]
            if row != last:
                out.append([round((t - t0) * 1000, 1), *row])
                last = row
        return out

    def back_at(self, idle: dict[int, int]) -> float | None:
        """First time from which every GPU stays within SLACK_MIB of idle."""
        t_back = None
        for t, m in self.samples:
            ok = all(m.get(i, 0) <= idle.get(i, 0) + SLACK_MIB for i in idle)
            if ok and t_back is None:
                t_back = t
            elif not ok:
                t_back = None
        return t_back


class ExitWatch:
    """The moment each pid exits, from its pidfd (readable within 1 ms of the exit)."""

    def __init__(self, pids: list[int]) -> None:
        self.fds: dict[int, int] = {}
        for pid in pids:
            try:
                self.fds[os.pidfd_open(pid)] = pid
            except OSError:
                pass
        self.exited: dict[int, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        for fd in self.fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + 120
        while len(self.exited) < len(self.fds) and time.monotonic() < deadline:
            for fd, _ev in poller.poll(100):
                if self.fds[fd] not in self.exited:
                    self.exited[self.fds[fd]] = time.monotonic()
                    poller.unregister(fd)

    def join(self) -> None:
        self._thread.join(130)
        for fd in self.fds:
            os.close(fd)


def gpu_pids(h: dict[int, dict[str, Any]], index: int) -> list[int]:
    return sorted(p for p, v in h.items() if index in v["gpus"])


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 1)


# ------------------------------------------------------------------ scenarios

def s1_lifecycle(sc: Scenario) -> None:
    d = sc.data
    add_model("tp", model_toml(8101, TP, GIB))
    idle = mem()
    d["memory_idle_mib"] = idle
    rc, s, _, _ = sc.sh("systemctl start tp")
    d["start"] = {"rc": rc, "seconds": round(s, 3), "memory_mib": mem()}
    h = holders()
    first: dict[str, Any] = {"main": int(show("tp", "MainPID")), "gpu_pids": {i: gpu_pids(h, i) for i in TP},
             "holders": h}
    d["start"]["pids"] = first
    d["start"]["device_fds"] = {p: device_fds(p) for p in sorted(h)}
    d["start"]["unit_pids"] = unit_pids("tp")
    with Sampler() as smp:
        rc2, s2, _, _ = sc.sh("systemctl restart tp")
    h2 = holders()
    second: dict[str, Any] = {"main": int(show("tp", "MainPID")), "gpu_pids": {i: gpu_pids(h2, i) for i in TP},
              "holders": h2}
    old = {p for i in TP for p in first["gpu_pids"][i]}
    new = {p for i in TP for p in second["gpu_pids"][i]}
    d["restart"] = {"rc": rc2, "seconds": round(s2, 3), "pids": second, "memory_mib": mem(),
                    "peak_during_mib": smp.peak(), "new_pids_only": not (old & new),
                    "old_pids_alive": sorted(p for p in old if alive(p))}
    d["stop"] = measured_stop(sc, "tp", idle, second)
    rc3, at_return = d["stop"]["rc"], d["stop"]["memory_at_return_mib"]
    s3 = d["stop"]["seconds"]
    per_gpu = d["stop"]["per_gpu"]
    # More stops for a distribution of "memory back minus pidfd exit".
    d["stop_repeats"] = []
    for _ in range(STOP_REPEATS):
        rc_r, _, _, _ = sc.sh("systemctl start tp")
        h_r = holders()
        pids_r = {"main": int(show("tp", "MainPID")),
                  "gpu_pids": {i: gpu_pids(h_r, i) for i in TP}}
        d["stop_repeats"].append(measured_stop(sc, "tp", idle, pids_r) if rc_r == 0 else {"start_rc": rc_r})
    deltas = [v["memory_back_minus_exit_ms"] for st in [d["stop"], *d["stop_repeats"]]
              for v in st.get("per_gpu", {}).values() if v.get("memory_back_minus_exit_ms") is not None]
    d["memory_back_minus_exit_ms_all"] = sorted(deltas)
    d["journal"] = sc.journal("tp.service")
    alloc = GIB * 1024
    ok = rc == rc2 == rc3 == 0 and d["restart"]["new_pids_only"] and not d["restart"]["old_pids_alive"]
    ok = ok and all(st.get("rc") == 0 for st in d["stop_repeats"])
    if not FAKE:
        ok = ok and all(d["start"]["memory_mib"][i] - idle[i] >= alloc for i in TP)
        ok = ok and all(d["restart"]["peak_during_mib"][i] < idle[i] + 1.5 * alloc for i in TP)
        ok = ok and all(at_return[i] <= idle[i] + SLACK_MIB for i in TP)
    d["ok"] = bool(ok)
    d["summary"] = (f"start {s:.2f}s, restart {s2:.2f}s (new pids only: {d['restart']['new_pids_only']}, "
                    f"peak {d['restart']['peak_during_mib']} MiB), stop {s3:.2f}s, memory at return "
                    f"{at_return} MiB (idle {idle}); memory back minus the worker's pidfd exit, per GPU and "
                    f"stop ({1 + STOP_REPEATS} stops): {deltas} ms")


def measured_stop(sc: Scenario, unit: str, idle: dict[int, int],
                  running: dict[str, Any]) -> dict[str, Any]:
    """`systemctl stop` with every process's exit (pidfd) and the memory (NVML,
    every ~2 ms) timed from the moment the stop was asked for."""
    new = {p for i in TP for p in running["gpu_pids"][i]}
    pids = sorted(set(unit_pids(unit)) | new | {running["main"]})
    watch = ExitWatch(pids)
    with Sampler() as smp:
        t_stop = time.monotonic()
        rc, s, _, _ = sc.sh(f"systemctl stop {unit}")
        t_ret = time.monotonic()
        at_return = mem()
        time.sleep(0.5)
    watch.join()
    last_exit = max(watch.exited.values()) if watch.exited else None
    back = smp.back_at(idle)
    per_gpu = {}
    for i in TP:
        worker = (running["gpu_pids"][i] or [None])[-1]
        gpu_back = smp.back_at({i: idle[i]})
        exit_t = watch.exited.get(worker)
        per_gpu[i] = {"worker": worker, "exit_ms": ms(exit_t - t_stop) if exit_t else None,
                      "memory_back_ms": ms(gpu_back - t_stop) if gpu_back else None,
                      "memory_back_minus_exit_ms": ms(gpu_back - exit_t) if gpu_back and exit_t else None}
    return {"rc": rc, "seconds": round(s, 3), "memory_at_return_mib": at_return,
            "pids_watched": pids,
            "exit_ms_after_stop": {p: ms(t - t_stop) for p, t in sorted(watch.exited.items())},
            "last_exit_ms_after_stop": ms(last_exit - t_stop) if last_exit else None,
            "memory_back_ms_after_stop": ms(back - t_stop) if back else None,
            "memory_back_ms_after_last_exit": ms(back - last_exit) if back and last_exit else None,
            "memory_back_before_stop_returned": back is not None and back <= t_ret,
            "per_gpu": per_gpu, "returned_ms_after_stop": ms(t_ret - t_stop),
            "trace_ms_mib": smp.trace(t_stop), "samples": len(smp.samples)}


def s2_orphan(sc: Scenario) -> None:
    d = sc.data
    gib = 0.0 if FAKE else 8.0
    add_model("tp", model_toml(8101, TP, GIB))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, TP)),
               CUDA_DEVICE_ORDER="PCI_BUS_ID")
    crashed = subprocess.Popen([HOSTPY, SERVER, "--gib", str(gib), "--port", "8199"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    info = health(8199)
    os.kill(crashed.pid, signal.SIGKILL)      # the server crashes; its TP workers stay
    crashed.wait()
    time.sleep(0.5)
    orphans = info["workers"]
    d["orphans"] = {"crashed_main": crashed.pid, "workers": orphans,
                    "alive": [p for p in orphans if alive(p)], "holders": holders(),
                    "memory_mib": mem(), "ppid": {p: _ppid(p) for p in orphans}}
    rc, s, _, _ = sc.sh("systemctl start tp")
    d["start"] = {"rc": rc, "seconds": round(s, 3), "memory_mib": mem(), "holders": holders(),
                  "orphans_alive": [p for p in orphans if alive(p)]}
    d["journal"] = sc.journal("tp.service")
    sc.sh("systemctl stop tp")
    killed = [line for line in d["journal"] if "SIGKILL" in line]
    d["ok"] = (rc == 0 and len(d["orphans"]["alive"]) == len(orphans) > 0
               and not d["start"]["orphans_alive"] and bool(killed)
               and (FAKE or all(d["orphans"]["memory_mib"][i] >= gib * 1024 for i in TP)))
    d["summary"] = (f"{len(orphans)} orphaned TERM-ignoring workers ({gib:g} GiB each) reaped by the "
                    f"start in {s:.2f}s; {len(killed)} SIGKILL line(s) in the journal")


Fn = TypeVar("Fn", bound=Callable[..., Any])


def _needs_two(fn: Fn) -> Fn:
    setattr(fn, "needs_gpus", 2)
    return fn


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


@_needs_two
def s3_disjoint(sc: Scenario) -> None:
    d = sc.data
    rc, s = _two_models(sc)
    before: dict[str, Any] = {"right_unit_pids": unit_pids("right"), "right_main": show("right", "MainPID"),
              "right_gpu1": gpu_pids(holders(), 1), "memory_mib": mem(),
              "left_gpu0": gpu_pids(holders(), 0)}
    with Sampler() as smp:
        rc2, s2, _, _ = sc.sh("systemctl restart left")
    after: dict[str, Any] = {"right_unit_pids": unit_pids("right"), "right_main": show("right", "MainPID"),
             "right_gpu1": gpu_pids(holders(), 1), "memory_mib": mem(),
             "left_gpu0": gpu_pids(holders(), 0)}
    lo, hi = smp.span(1)
    # A CUDA process opens every /dev/nvidiaN, whatever CUDA_VISIBLE_DEVICES says
    # (docs/architecture.md, "A start")
    d["left_worker_device_fds"] = {p: device_fds(p) for p in after["left_gpu0"]}
    d.update(before=before, after=after, restart_left={"rc": rc2, "seconds": round(s2, 3)},
             gpu1_during_restart_mib={"min": lo, "max": hi, "samples": len(smp.samples)},
             start_both={"rc": rc, "seconds": round(s, 3)}, journal=sc.journal("left.service"))
    d["ok"] = (rc == rc2 == 0 and before["right_unit_pids"] == after["right_unit_pids"]
               and before["right_gpu1"] == after["right_gpu1"] and bool(before["right_gpu1"])
               and not set(before["left_gpu0"]) & set(after["left_gpu0"])
               and hi - lo <= 64)
    d["summary"] = (f"restart of left (GPU 0) in {s2:.2f}s; right's pids unchanged: "
                    f"{before['right_unit_pids'] == after['right_unit_pids']}, GPU 1 memory during "
                    f"it {lo}..{hi} MiB")


def _two_models(sc: Scenario) -> tuple[int, float]:
    """left on GPU 0 and (with two GPUs) right on GPU 1, 10 GiB each, started."""
    gib = 0.0 if FAKE else 10.0
    add_model("left", model_toml(8201, [0], gib))
    if "right" in PAIR:
        add_model("right", model_toml(8202, [1], gib))
    rc, s, _, _ = sc.sh("systemctl start " + " ".join(PAIR))
    return rc, s


@_needs_two
def s4_p2p(sc: Scenario) -> None:
    d = sc.data
    gib = 0.0 if FAKE else 2.0
    # server.py loads no model, but pre-start refuses a model path that is missing
    os.makedirs("/models/peer", exist_ok=True)
    text = "\n".join([
        'engine = "sglang"', 'model = "/models/peer"', f'python = "{HOSTPY}"', "gpus = [0, 1]",
        "port = 8301", f'args = ["--gib", "{gib}"]',
        "[nccl]", 'p2p = "auto"',
        "[reap]", 'term-grace = "2s"', 'timeout = "30s"',
        "[ready]", 'timeout = "240s"', 'interval = "100ms"', "[service]", 'RestartSec = "2s"',
        "[canary]", "enabled = false", ""])      # server.py has no completion API
    add_model("peer", text)
    rc, s, _, _ = sc.sh("systemctl start peer")
    try:
        with open("/run/infer-units/peer.env") as f:
            env_file = f.read()
    except OSError as e:
        env_file = f"<{e.strerror}>"
    cache = {}
    cache_dir = "/run/infer-units/p2p"
    for name in sorted(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else []:
        with open(os.path.join(cache_dir, name)) as f:
            cache[name] = json.load(f)
    try:
        server = health(8301, 5)
    except OSError:
        server = {}
    d.update(start={"rc": rc, "seconds": round(s, 3)}, env_file=env_file, selftest_cache=cache,
             server_saw=server, exec_start=show("peer", "ExecStart")[:600],
             journal=sc.journal("peer.service"))
    rc2, s2, _, _ = sc.sh("systemctl restart peer")     # the verdict is cached for this boot
    d["restart"] = {"rc": rc2, "seconds": round(s2, 3), "journal": sc.journal("peer.service")[-8:]}
    sc.sh("systemctl stop peer")
    verdicts = [line for line in d["journal"] if "P2P" in line]
    d["verdict_lines"] = verdicts
    d["ok"] = rc == 0 and bool(verdicts) and (FAKE or any("P2P on" in v for v in verdicts))
    d["summary"] = (verdicts[-1].split("infer-units: ", 1)[-1] if verdicts else "no P2P line") + \
        f"; env file: {env_file.strip()!r}"


def s5_status(sc: Scenario) -> None:
    d = sc.data
    d["start_both_rc"] = _two_models(sc)[0]
    rc, s, out, err = sc.sh("infer-units status --json")
    try:
        d["status_json"] = json.loads(out)
    except ValueError:
        d["status_json"] = {"unparsed": out[-3000:], "stderr": err[-1000:]}
    rc2, s2, out2, _ = sc.sh("infer-units status")
    d["status_text"] = out2.splitlines()[-20:]
    rc3, _, out3, _ = sc.sh("infer-units holders --json")
    try:
        d["holders_json"] = json.loads(out3)
    except ValueError:
        d["holders_json"] = out3[-2000:]
    try:
        with open("/run/iu-metrics/infer-units.prom") as f:
            d["metrics"] = f.read().splitlines()
    except OSError as e:
        d["metrics"] = [f"<{e.strerror}>"]
    d["memory_mib"] = mem()
    models = d["status_json"].get("models", []) if isinstance(d["status_json"], dict) else []
    d["models_seen"] = {m.get("name"): {"active": m.get("systemd", {}).get("active_state"),
                                        "health": m.get("health", {}).get("ok"),
                                        "processes": len(m.get("gpu", {}).get("processes", []))}
                        for m in models}
    d["ok"] = (rc == rc2 == rc3 == 0 and len(d["metrics"]) > 1 and len(models) == len(PAIR)
               and all(v["active"] == "active" and v["health"] and v["processes"] >= 1
                       for v in d["models_seen"].values()))
    d["summary"] = (f"status --json {s * 1000:.0f} ms: {d['models_seen']}; "
                    f"{len(d['metrics'])} metric lines")


def s6_drain(sc: Scenario) -> None:
    d = sc.data
    d["start_both_rc"] = _two_models(sc)[0]
    gib = 0.0 if FAKE else 4.0
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    stray = subprocess.Popen([HOSTPY, SERVER, "--gib", str(gib), "--port", "8299"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    info = health(8299)
    d["stray"] = {"main": stray.pid, "workers": info["workers"]}
    d["before"] = {"memory_mib": mem(), "holders": holders(),
                   "active": {u: show(u, "ActiveState") for u in PAIR}}
    # This runner's own NVML handles hold /dev/nvidia*: let go of them, or
    # drain (which reaps every device holder) finds its own parent.
    _nvml_off()
    try:
        rc, s, out, err = sc.sh("infer-units drain --timeout 60s --term-grace 2s")
        d["drain"] = {"rc": rc, "seconds": round(s, 3), "stderr": err.splitlines()[-30:],
                      "active_after": {u: show(u, "ActiveState") for u in PAIR}}
        d["drain"]["holders_after"] = _fd_holders_count()
    finally:
        _nvml_on()
    d["drain"]["memory_mib_after"] = mem()
    d["drain"]["stray_workers_alive"] = [p for p in info["workers"] if alive(p)]
    rc_f, _, _, err_f = sc.sh("systemctl start left")
    d["start_while_drained"] = {"rc": rc_f, "stderr": err_f.splitlines()[-5:],
                                "journal": sc.journal("left.service")[-6:]}
    d["after"] = {"memory_mib": mem(), "holders": holders(),
                  "active": {u: show(u, "ActiveState") for u in PAIR},
                  "stray_workers_alive": [p for p in info["workers"] if alive(p)],
                  # drain reaps device holders; the stray's main process holds none
                  "stray_main_alive": alive(stray.pid)}
    if stray.poll() is None:
        stray.kill()
    stray.wait(10)
    # Starts stay fenced until `resume` (docs/architecture.md).  Recorded, not part of "ok":
    # whether this build fences at all is what the run finds out.
    rc2, s2, _, err2 = sc.sh("infer-units resume")
    d["resume"] = {"rc": rc2, "seconds": round(s2, 3), "stderr": err2.splitlines()[-10:],
                   "active": {u: show(u, "ActiveState") for u in PAIR},
                   "memory_mib": mem()}
    d["fence"] = {"start_while_drained_refused": rc_f != 0, "resume_rc": rc2}
    sc.sh("systemctl stop " + " ".join(PAIR))
    d["ok"] = (rc == 0 and not d["after"]["stray_workers_alive"]
               and all(v != "active" for v in d["drain"]["active_after"].values())
               and d["drain"]["holders_after"] == 0)
    d["summary"] = (f"drain rc {rc} in {s:.2f}s ({len(PAIR)} model(s) + a stray TERM-ignoring server), "
                    f"device holders after: {d['drain']['holders_after']}; fence: start while drained "
                    f"rc {rc_f}, resume rc {rc2}")


def _fd_holders_count() -> int:
    """Processes holding a GPU device node (what drain must leave at zero)."""
    from infer_units.helpers.facts.gpus import fd_holders
    return len(fd_holders(set(B.device_files())))


def _nvml_off() -> None:
    if isinstance(B, gpus_mod.NvmlBackend):
        B.nvml.nvmlShutdown()


def _nvml_on() -> None:
    """NVML again, in the same backend object (every scenario holds it)."""
    if isinstance(B, gpus_mod.NvmlBackend):
        n = B.nvml
        n.nvmlInit()
        gpus_mod.NvmlBackend.__init__(
            B, n, [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())])


def _fake_used(index: int, mib: int) -> None:
    path = "/etc/infer-units/fakegpus.json"
    with open(path) as f:
        table = json.load(f)
    table["gpus"][index]["memory_used_mib"] = mib
    with open(path + ".tmp", "w") as f:
        json.dump(table, f)
    os.replace(path + ".tmp", path)


def s7_container(sc: Scenario) -> None:
    d = sc.data
    gib = 8.0
    idle = mem()
    with open(os.path.join(HS, "request-outer.tmp"), "w") as f:
        f.write(str(gib))
    os.replace(os.path.join(HS, "request-outer.tmp"), os.path.join(HS, "request-outer"))
    ready = os.path.join(HS, "outer-ready")
    deadline = time.monotonic() + 120
    while not os.path.exists(ready):
        if time.monotonic() > deadline:
            raise RuntimeError("the outer holder never became ready")
        time.sleep(0.1)
    with open(ready) as f:
        outer = json.load(f)
    if FAKE:
        _fake_used(0, int(gib * 1024))
    d["outer"] = {"process": outer, "memory_mib": mem(), "idle_mib": idle,
                  "visible_holders": holders()}
    rc_h, _, out_h, _ = sc.sh("infer-units holders --gpus 0 --json")
    try:
        d["holders_json"] = json.loads(out_h)
    except ValueError:
        d["holders_json"] = out_h[-2000:]
    runs: dict[str, dict[str, Any]] = {}
    for policy, expect in (("kill", 3), ("fail", 2)):
        name = f"guard{policy}"
        add_model(name, model_toml(8400 + expect, [0], 0.0 if FAKE else 2.0,
                                   reap=f'foreign = "{policy}"').replace(
            'term-grace = "2s"\ntimeout = "30s"', 'term-grace = "1s"\ntimeout = "5s"'))
        rc, s, _, err = sc.sh(f"systemctl start {name}")
        time.sleep(0.3)
        runs[policy] = {"rc": rc, "seconds": round(s, 3), "expected_pre_start_exit": expect,
                        "ExecMainPID": show(name, "ExecMainPID"),
                        "Result": show(name, "Result"), "ActiveState": show(name, "ActiveState"),
                        "journal": sc.journal(f"{name}.service")}
        sc.sh(f"systemctl stop {name}; systemctl reset-failed {name}")
        pre = [line for line in runs[policy]["journal"] if "ExecStartPre" in line or "status=" in line]
        runs[policy]["pre_start_status_lines"] = pre
        reason = "timed out: unaccounted" if policy == "kill" else "blocked (foreign = fail)"
        runs[policy]["reason_logged"] = any(reason in line for line in runs[policy]["journal"])
        # The pre-start's own exit status; a refused start cancels its own job,
        # and that stop's SIGTERM can end the hook first (status=15/TERM).
        runs[policy]["exit_status_seen"] = (
            expect if any(f"status={expect}/" in line for line in pre)
            else "TERM" if any("status=15/TERM" in line for line in pre) else None)
        runs[policy]["as_expected"] = (rc != 0 and runs[policy]["ExecMainPID"] in ("0", "")
                                       and runs[policy]["reason_logged"]
                                       and runs[policy]["exit_status_seen"] is not None)
    d["starts"] = runs
    # The outsider leaves: the same start now succeeds.
    open(os.path.join(HS, "release-outer"), "w").close()
    if FAKE:
        _fake_used(0, 0)
    t = time.monotonic()
    while mem().get(0, 0) > idle.get(0, 0) + SLACK_MIB and time.monotonic() - t < 30:
        time.sleep(0.01)
    d["outer_released_memory_back_s"] = round(time.monotonic() - t, 3)
    rc, s, _, _ = sc.sh("systemctl start guardkill")
    d["start_after_release"] = {"rc": rc, "seconds": round(s, 3),
                                "journal": sc.journal("guardkill.service")[-6:]}
    sc.sh("systemctl stop guardkill")
    unacc = [line for r in runs.values() for line in r["journal"] if "unaccounted" in line
             or "no visible process" in line]
    d["unaccounted_lines"] = unacc
    d["ok"] = (all(r["as_expected"] for r in runs.values()) and rc == 0 and bool(unacc)
               and not d["outer"]["visible_holders"])
    d["summary"] = (f"outsider {gib:g} GiB on GPU 0 invisible to NVML inside "
                    f"(holders: {len(d['outer']['visible_holders'])}, used {d['outer']['memory_mib'].get(0)} MiB); "
                    f"foreign=kill: pre-start exit {runs['kill']['exit_status_seen']}, foreign=fail: "
                    f"{runs['fail']['exit_status_seen']}, server never started: "
                    f"{all(r['ExecMainPID'] in ('0', '') for r in runs.values())}; "
                    f"after it left the start succeeded: {rc == 0}")


MODELS = ("tp", "left", "right", "peer", "guardkill", "guardfail", "ll", "llbad", "llc")


HARNESS_DEFAULTS = "/etc/infer-units/defaults.toml.d/50-harness.toml"


def s8_restart_cost(sc: Scenario) -> None:
    """bench/restart_bench.py against this container's systemd (--here): the
    time the hooks add to `systemctl restart`, beside a unit without hooks and
    one with three no-op hooks, on fake GPUs (no CUDA: the hooks' cost, as
    on the 2-core VM).  The harness's metrics drop-in is set aside meanwhile,
    so the unit is the bench's own."""
    runs = int(os.environ.get("IU_RESTART_RUNS", "15"))
    aside = HARNESS_DEFAULTS + ".s8"
    if os.path.exists(HARNESS_DEFAULTS):
        os.rename(HARNESS_DEFAULTS, aside)
    try:
        # Longer than the bench's own limits (its restarts 1200 s), so that its
        # clean-up always runs.
        rc, _s, out, err = sc.sh(f"python3 /opt/iu-gpu/bench-tree/bench/restart_bench.py --here "
                                 f"--runs {runs}", timeout=1500)
    finally:
        if os.path.exists(aside):
            os.rename(aside, HARNESS_DEFAULTS)
            subprocess.run(["systemctl", "daemon-reload"], capture_output=True, timeout=60)
    sc.data["output"] = out[-6000:] + err[-2000:]
    figures = {}
    for line in out.splitlines():
        text = line.strip()
        for key, label in (("added_ms", "added by the hooks: "),
                           ("noop_added_ms", "added by three no-op hooks: ")):
            if text.startswith(label):
                figures[key] = float(text[len(label):].split()[0])
    sc.data["figures"] = figures
    sc.data["ok"] = rc == 0 and "added_ms" in figures
    if sc.data["ok"]:
        added = figures["added_ms"]
        # (the restart goal, bare unit + 250 ms, is l7's: a real server's restart)
        sc.data["summary"] = (f"{runs} restarts each: the hooks add {added:.1f} ms to a fake "
                              f"server's restart; three no-op hooks add "
                              f"{figures.get('noop_added_ms', float('nan')):.1f} ms")
    else:
        sc.data["summary"] = f"restart bench rc {rc}: {(err or out)[-300:]}"


# ------------------------------------------------------------------ llama.cpp

# llama.cpp's llama-server as the model's server (tests/gpu/systemd/boot-scenarios.sh
# IU_LLAMA_DIR: the machine's CUDA build; the local run: the CPU build).
LLAMA_DIR = "/run/iu-llama"
LLAMA_WRAPPER = "/usr/local/bin/iu-llama-server"
HAVE_LLAMA = os.access(f"{LLAMA_DIR}/bin/llama-server", os.X_OK)
LL_PORT = 8501


def llama_args(context: int | None = None) -> list[str]:
    """On the GPU every layer offloaded and the context the build chose (its
    KV cache is the GBs); on fake GPUs the CPU, one thread, a small context."""
    if FAKE:
        return ["-ngl", "0", "-c", str(context or 2048), "--parallel", "1", "--threads", "1"]
    if context is None:
        with open(f"{LLAMA_DIR}/CONTEXT") as f:
            context = int(f.read())
    return ["-ngl", "99", "-c", str(context), "--parallel", "1"]


def llama_toml(port: int = LL_PORT, reap: str = "", liveness: str = 'interval = "0"',
               env: str = "") -> str:
    return "\n".join([
        'engine = "llamacpp"', f'executable = "{LLAMA_WRAPPER}"',
        f'model = "{LLAMA_DIR}/model.gguf"', f"gpus = {TP}", f"port = {port}",
        f"args = {json.dumps(llama_args())}",
        "[env]", env,
        "[reap]", 'term-grace = "2s"', 'timeout = "30s"', reap,
        "[ready]", 'timeout = "120s"',
        "[liveness]", liveness,
        "[service]", 'RestartSec = "1s"', ""])


def http_status(port: int, path: str = "/health") -> int:
    """The HTTP status of GET path, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


class Poller:
    """/health every 5 ms: the first 2xx at or after a moment."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            code = http_status(self.port)
            self.samples.append((time.monotonic(), code))
            time.sleep(0.005)

    def __enter__(self) -> "Poller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def first_2xx(self, since: float, after_down: bool = False) -> float | None:
        down = not after_down
        for t, code in self.samples:
            if t < since:
                continue
            if not 200 <= code < 300:
                down = True
            elif down:
                return t
        return None


def monotonic_prop(unit: str, prop: str) -> float | None:
    """A systemd *TimestampMonotonic property in seconds (CLOCK_MONOTONIC, as time.monotonic)."""
    value = show(unit, prop)
    return int(value) / 1e6 if value and value != "0" else None


def wait_state(what: str, check: Callable[[], bool], timeout: float) -> bool:
    """Until check() holds (True) or timeout passes (False); `what` names it for the reader."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def main_pid(unit: str) -> int:
    return int(show(unit, "MainPID") or 0)


def _needs_llama(fn: Fn) -> Fn:
    setattr(fn, "needs_llama", True)
    return fn


def _refused(journal: list[str]) -> bool:
    """pre-start refused the start: systemd's status line for its exit 2, or
    (when the journal does not have that yet) the hook's own refusal line."""
    return any("status=2/" in line or ("infer-units: start of" in line and "refused" in line)
               for line in journal)


@_needs_llama
def l1_llama_lifecycle(sc: Scenario) -> None:
    """Start gated on health, restart with a new pid and one server's memory at
    the peak, stop returning with the memory back."""
    d = sc.data
    add_model("ll", llama_toml())
    idle = mem()
    d["memory_idle_mib"] = idle
    with Poller(LL_PORT) as poll:
        t0 = time.monotonic()
        rc, s, _, _ = sc.sh("systemctl start ll")
        at_return = http_status(LL_PORT)
    active = monotonic_prop("ll", "ActiveEnterTimestampMonotonic")
    first = poll.first_2xx(t0)
    # Gated: active no earlier than the first 2xx (the poller's 5 ms period and
    # wait-ready's own poll may put either first by a few ms).
    gated = at_return == 200 and first is not None and active is not None and active >= first - 0.010
    held = {i: mem()[i] - idle[i] for i in TP}
    pid1 = main_pid("ll")
    d["start"] = {"rc": rc, "seconds": round(s, 3), "health_at_return": at_return,
                  "first_2xx_ms": ms(first - t0) if first else None,
                  "active_ms": ms(active - t0) if active else None,
                  "active_minus_first_2xx_ms": ms(active - first) if first and active else None,
                  "gated_on_health": gated, "server_mib": held, "main_pid": pid1,
                  "device_fds": device_fds(pid1)}
    with Sampler() as smp, Poller(LL_PORT) as poll:
        t1 = time.monotonic()
        rc2, s2, _, _ = sc.sh("systemctl restart ll")
        wait_state("ll", lambda: http_status(LL_PORT) == 200, 60)
    pid2 = main_pid("ll")
    back = poll.first_2xx(t1, after_down=True)
    peak = smp.peak()
    d["restart"] = {"rc": rc2, "seconds": round(s2, 3), "first_2xx_ms": ms(back - t1) if back else None,
                    "old_pid": pid1, "new_pid": pid2, "old_alive": alive(pid1),
                    "peak_during_mib": peak, "trace_ms_mib": smp.trace(t1)}
    d["stop"] = measured_stop(sc, "ll", idle, {"main": pid2, "gpu_pids": {i: [pid2] for i in TP}})
    d["journal"] = sc.journal("ll.service")
    ok = (rc == rc2 == d["stop"]["rc"] == 0 and gated and pid2 not in (0, pid1) and not alive(pid1)
          and back is not None)
    if not FAKE:
        ok = ok and all(held[i] >= 1024 for i in TP)
        ok = ok and all(peak[i] < idle[i] + 1.5 * held[i] for i in TP)
        ok = ok and all(d["stop"]["memory_at_return_mib"][i] <= idle[i] + SLACK_MIB for i in TP)
    d["ok"] = bool(ok)
    d["summary"] = (f"start {s:.2f}s (first 2xx {d['start']['first_2xx_ms']} ms, active "
                    f"{d['start']['active_ms']} ms: gated {gated}), server {held} MiB; restart {s2:.2f}s, "
                    f"new pid {pid2 != pid1}, peak {peak} MiB (idle {idle}); stop "
                    f"{d['stop']['seconds']:.2f}s, memory at return {d['stop']['memory_at_return_mib']} MiB")


@_needs_llama
def l2_llama_killed(sc: Scenario) -> None:
    """The server SIGKILLed: systemd restarts it (Restart=always), the start
    cleans up first; active again with one server's memory."""
    d = sc.data
    idle = mem()
    add_model("ll", llama_toml())
    rc, _, _, _ = sc.sh("systemctl start ll")
    pid1 = main_pid("ll")
    held = {i: mem()[i] - idle[i] for i in TP}
    with Sampler() as smp, Poller(LL_PORT) as poll:
        t0 = time.monotonic()
        os.kill(pid1, signal.SIGKILL)
        again = wait_state("ll", lambda: main_pid("ll") not in (0, pid1)
                           and show("ll", "ActiveState") == "active", 120)
        t_active = time.monotonic()
    first = poll.first_2xx(t0, after_down=True)
    peak = smp.peak()
    d.update(start_rc=rc, killed_pid=pid1, new_pid=main_pid("ll"), active_again=again,
             active_again_s=round(t_active - t0, 3), first_2xx_s=round(first - t0, 3) if first else None,
             n_restarts=show("ll", "NRestarts"), peak_during_mib=peak, server_mib=held,
             journal=sc.journal("ll.service"))
    ok = rc == 0 and again and not alive(pid1) and first is not None
    if not FAKE:
        ok = ok and all(peak[i] < idle[i] + 1.5 * max(held[i], 1) for i in TP)
    d["ok"] = bool(ok)
    d["summary"] = (f"SIGKILL of the server: active again in {t_active - t0:.2f}s (RestartSec 1s), "
                    f"first 2xx {d['first_2xx_s']}s, NRestarts {d['n_restarts']}, peak {peak} MiB")


@_needs_llama
def l3_llama_hang(sc: Scenario) -> None:
    """The server SIGSTOPped: liveness (llama.cpp's default probe generates one
    token) restarts it through systemd."""
    d = sc.data
    add_model("ll", llama_toml(liveness='interval = "1s"\nfailures = 2\ntimeout = "2s"'))
    rc, _, _, _ = sc.sh("systemctl start ll")
    pid1 = main_pid("ll")
    t0 = time.monotonic()
    os.kill(pid1, signal.SIGSTOP)
    again = wait_state("ll", lambda: main_pid("ll") not in (0, pid1)
                       and show("ll", "ActiveState") == "active", 120)
    t_active = time.monotonic()
    healthy = http_status(LL_PORT) == 200
    journal = sc.journal("ll.service")
    lines = [line for line in journal + sc.journal("infer-units-liveness@ll.service")
             if "liveness" in line]
    d.update(start_rc=rc, stopped_pid=pid1, new_pid=main_pid("ll"), active_again=again,
             active_again_s=round(t_active - t0, 3), healthy=healthy, liveness_lines=lines,
             journal=journal)
    d["ok"] = bool(rc == 0 and again and healthy and not alive(pid1)
                   and any("liveness: restarting" in line for line in lines))
    d["summary"] = (f"SIGSTOP of the server: liveness restarted it, active again in "
                    f"{t_active - t0:.2f}s (interval 1s, 2 failures, 2s timeout); "
                    f"{(lines or ['no liveness line'])[-1].split(': ', 1)[-1][:160]}")


@_needs_llama
def l4_llama_foreign(sc: Scenario) -> None:
    """A llama-server no unit owns holds GPU 0: foreign = "fail" refuses the
    start (exit 2) and leaves it; foreign = "kill" reaps it and starts."""
    d = sc.data
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    stray = subprocess.Popen([LLAMA_WRAPPER, "--model", f"{LLAMA_DIR}/model.gguf", "--host",
                              "127.0.0.1", "--port", "8599", *llama_args(8192)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        wait_state("stray", lambda: http_status(8599) == 200, 120)
        d["stray"] = {"pid": stray.pid, "holders": holders(), "memory_mib": mem()}
        runs: dict[str, dict[str, Any]] = {}
        for policy in ("fail", "kill"):
            add_model("ll", llama_toml(reap=f'foreign = "{policy}"'))
            rc, s, _, _ = sc.sh("systemctl start ll")
            runs[policy] = {"rc": rc, "seconds": round(s, 3), "ExecMainPID": show("ll", "ExecMainPID"),
                            "stray_alive": stray.poll() is None and alive(stray.pid),
                            "health": http_status(LL_PORT), "journal": sc.journal("ll.service")}
            if policy == "fail":
                sc.sh("systemctl stop ll; systemctl reset-failed ll")
        stray.wait(30)
        killed = [line for line in runs["kill"]["journal"] if str(stray.pid) in line]
        d.update(starts=runs, kill_lines=killed)
        d["ok"] = bool(runs["fail"]["rc"] != 0 and runs["fail"]["stray_alive"]
                       and runs["fail"]["ExecMainPID"] in ("0", "")
                       and _refused(runs["fail"]["journal"])
                       and runs["kill"]["rc"] == 0 and runs["kill"]["health"] == 200
                       and not alive(stray.pid) and bool(killed))
        d["summary"] = (f"stray llama-server pid {stray.pid} on GPU 0: foreign=fail: start rc "
                        f"{runs['fail']['rc']}, stray alive {runs['fail']['stray_alive']}; foreign=kill: "
                        f"start rc {runs['kill']['rc']} in {runs['kill']['seconds']:.2f}s, stray reaped "
                        f"{not alive(stray.pid)}, {len(killed)} journal line(s) naming it")
    finally:
        if stray.poll() is None:
            stray.kill()
        stray.wait(30)


@_needs_llama
def l5_llama_drain(sc: Scenario) -> None:
    """drain stops the model and leaves no device holder, a start is refused
    until resume, which starts it again."""
    d = sc.data
    add_model("ll", llama_toml())
    rc0, _, _, _ = sc.sh("systemctl start ll")
    pid1 = main_pid("ll")
    _nvml_off()      # this runner's NVML handles are device holders too (s6)
    try:
        rc, s, _, err = sc.sh("infer-units drain --timeout 60s --term-grace 2s")
        holders_after = _fd_holders_count()
    finally:
        _nvml_on()
    state_after = show("ll", "ActiveState")
    rc_f, _, _, err_f = sc.sh("systemctl start ll")
    rc_r, s_r, _, err_r = sc.sh("infer-units resume")
    again = wait_state("ll", lambda: show("ll", "ActiveState") == "active"
                       and http_status(LL_PORT) == 200, 120)
    pid2 = main_pid("ll")
    d.update(start_rc=rc0, drain={"rc": rc, "seconds": round(s, 3), "stderr": err.splitlines()[-20:],
                                  "state_after": state_after, "device_holders_after": holders_after},
             start_while_drained={"rc": rc_f, "stderr": err_f.splitlines()[-5:]},
             resume={"rc": rc_r, "seconds": round(s_r, 3), "stderr": err_r.splitlines()[-10:],
                     "active_again": again, "new_pid": pid2},
             memory_mib=mem(), journal=sc.journal("ll.service"))
    d["ok"] = bool(rc0 == rc == rc_r == 0 and state_after != "active" and holders_after == 0
                   and rc_f != 0 and again and pid2 not in (0, pid1))
    d["summary"] = (f"drain rc {rc} in {s:.2f}s (ll {state_after}, device holders {holders_after}); "
                    f"start while drained rc {rc_f}; resume rc {rc_r}: ll active again {again}")


@_needs_llama
def l6_llama_health(sc: Scenario) -> None:
    """A start refused on a GPU whose health has an error.  What is faked: the
    GPU's facts, for this one model, come from a fake table (its [env]
    INFER_UNITS_FAKE_GPUS, honoured on a host marked for tests) with XID 79
    on GPU 0 and a device file nobody holds; the refusal (pre-start exit 2,
    the server never run, no automatic retry) is the real path."""
    d = sc.data
    marker = "/etc/infer-units/hooks-test-mode"
    table = "/etc/infer-units/badgpu.json"
    wrote_marker = not os.path.exists(marker)
    os.makedirs("/var/lib/iu-badgpu", exist_ok=True)
    open("/var/lib/iu-badgpu/nvidia0", "w").close()
    g = GPUS[0]
    try:
        if wrote_marker:
            with open(marker, "w") as f:
                f.write("test host (the GPU harness, scenario l6)\n")
        with open(table, "w") as f:
            json.dump({"gpus": [{"index": 0, "uuid": g.uuid, "pci": g.pci,
                                 "device": "/var/lib/iu-badgpu/nvidia0",
                                 "memory_mib": g.memory_total_mib,
                                 "health": {"xid": [79]}}]}, f)
        add_model("llbad", llama_toml(reap='foreign = "fail"',
                                      env=f'INFER_UNITS_FAKE_GPUS = "{table}"').replace(
                                          f"gpus = {TP}", "gpus = [0]"))
        rc, s, _, err = sc.sh("systemctl start llbad")
        # RestartSec is 1s: three of it without a restart is "no automatic retry".
        retried = wait_state("llbad", lambda: show("llbad", "NRestarts") not in ("0", ""), 3.0)
        journal = sc.journal("llbad.service")
        d.update(rc=rc, seconds=round(s, 3), ExecMainPID=show("llbad", "ExecMainPID"),
                 state=show("llbad", "ActiveState"), n_restarts=show("llbad", "NRestarts"),
                 retried=retried, journal=journal)
        refused = [line for line in journal if "refused" in line]
        d["refused_lines"] = refused
        d["ok"] = bool(rc != 0 and d["ExecMainPID"] in ("0", "") and not retried
                       and _refused(journal))
        d["summary"] = (f"GPU 0 with XID 79 (fake table): start rc {rc} in {s:.2f}s, server never "
                        f"run {d['ExecMainPID'] in ('0', '')}, retried {retried}; "
                        f"{(refused or ['no refusal line'])[-1].split(': ', 1)[-1][:160]}")
    finally:
        sc.sh("systemctl stop llbad; systemctl reset-failed llbad")
        os.unlink(table)
        if wrote_marker:
            os.unlink(marker)


@_needs_llama
def l7_llama_bench(sc: Scenario) -> None:
    """bench/llama_restart_bench.py --here: the generated unit, a bare unit with
    its ExecStart and no hooks, and the seeds' recipe, side by side, with two
    bystanders.  The seeds' `fuser -k` kills whatever holds a device file:
    this runner lets go of its NVML handles meanwhile."""
    runs = int(os.environ.get("IU_LLAMA_BENCH_RUNS", "5"))
    model = "/run/iu-llama-bench.toml"
    with open(model, "w") as f:
        f.write(llama_toml(port=18601).replace(f"gpus = {TP}", "gpus = [0]"))
    devices = "/var/lib/fakegpu/nvidia*" if FAKE else "/dev/nvidia*"
    holds = ["--monitor-holds", "/var/lib/fakegpu/nvidiactl"] if FAKE else []
    out = os.path.join(OUT, "llama-bench.json")
    _nvml_off()
    try:
        rc, _s, text, err = sc.sh(shlex.join(
            ["python3", "/opt/iu-gpu/bench-tree/bench/llama_restart_bench.py", "--here",
             "--model-file", model, "--runs", str(runs), "--devices", devices, *holds,
             "--json", out]), timeout=900)
    finally:
        _nvml_on()
        os.unlink(model)
    sc.data["output"] = text[-4000:] + err[-2000:]
    try:
        with open(out) as f:
            result = json.load(f)
    except (OSError, ValueError) as e:
        result = {"error": str(e)}
    sc.data["bench"] = {k: result.get(k) for k in ("summary", "added_ms", "goal_met", "ok", "idle_mib")}
    sc.data["ok"] = rc == 0 and bool(result.get("ok"))
    lines = [line for line in text.splitlines() if line.startswith(("(a)", "(b)", "(c)", "added"))]
    sc.data["summary"] = " | ".join(lines) if lines else f"bench rc {rc}: {(err or text)[-300:]}"


# A silent fault: bytes of the weights changed in place, the file's size and
# mtime kept (what the known answer's key cannot see).
def _corrupt(path: str) -> None:
    st = os.stat(path)
    with open(path, "r+b") as f:
        size = st.st_size
        for at in range(size // 20, size * 19 // 20, max(64, size // 4096)):
            f.seek(at)
            word = f.read(4)        # every byte of a weight, whatever its alignment
            f.seek(at)
            f.write(bytes(b ^ 0x55 for b in word))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@_needs_llama
def l8_llama_canary(sc: Scenario) -> None:
    """The known-answer check with llama.cpp's CUDA build: the first start
    records the answer, restarts match it, then a silent fault in the
    weights (bytes changed in place, size and mtime kept) changes the answer
    and the start is refused with no automatic restart."""
    d = sc.data
    # Under /run: iu-llama-server runs in /host, which sees the container's /run.
    weights = "/run/iu-canary/model.gguf"
    os.makedirs(os.path.dirname(weights), exist_ok=True)
    subprocess.run(["cp", "-p", f"{LLAMA_DIR}/model.gguf", weights], check=True)
    try:
        add_model("llc", llama_toml().replace(f"{LLAMA_DIR}/model.gguf", weights))
        rc, s, _, _ = sc.sh("systemctl start llc")
        starts = [{"rc": rc, "seconds": round(s, 3)}]
        for _ in range(3):
            rc, s, _, _ = sc.sh("systemctl restart llc")
            starts.append({"rc": rc, "seconds": round(s, 3)})
        journal = sc.journal("llc.service")
        known = [line.split("known answer: ", 1)[1] for line in journal if "known answer: " in line]
        recorded = sum("first check on this host" in k for k in known)
        matched = sum("answer matches the one recorded" in k for k in known)
        before = os.stat(weights)
        _corrupt(weights)
        after = os.stat(weights)
        restarts = show("llc", "NRestarts")
        rc_bad, s_bad, _, _ = sc.sh("systemctl restart llc")
        settled = wait_state("llc", lambda: show("llc", "ActiveState") in ("failed", "inactive")
                             and show("llc", "SubState") != "auto-restart", 30)
        journal = sc.journal("llc.service")
        differs = [line for line in journal if "known answer: answer differs" in line]
        d.update(starts=starts, known_lines=known, refused_restart={
            "rc": rc_bad, "seconds": round(s_bad, 3), "settled": settled,
            "state": show("llc", "ActiveState"), "n_restarts_before": restarts,
            "n_restarts": show("llc", "NRestarts"), "mismatch_lines": differs},
            size_mtime_kept=(before.st_size, before.st_mtime_ns) == (after.st_size,
                                                                      after.st_mtime_ns),
            status=sc.sh("infer-units status llc")[2][-1500:])
        d["ok"] = bool(all(x["rc"] == 0 for x in starts) and recorded == 1 and matched == 3
                       and d["size_mtime_kept"] and rc_bad != 0 and settled and differs
                       and show("llc", "NRestarts") == restarts and _refused(journal))
        check_ms = [k.rsplit("(", 1)[-1].rstrip(")") for k in known]
        d["summary"] = (f"recorded {recorded}, matched {matched} of 3 restarts (check {check_ms}); "
                        f"weights changed in place (size and mtime kept {d['size_mtime_kept']}): "
                        f"restart rc {rc_bad}, {show('llc', 'ActiveState')}, restarted "
                        f"{show('llc', 'NRestarts') != restarts}; "
                        f"{(differs or ['no mismatch line'])[-1].split('known answer: ', 1)[-1][:200]}")
    finally:
        sc.sh("systemctl stop llc; systemctl reset-failed llc")
        subprocess.run(["rm", "-rf", os.path.dirname(weights), "/var/lib/infer-units/canary/llc.json"])


def cleanup(sc: Scenario) -> None:
    """Every model stopped after each scenario, whatever happened in it, so one
    failure does not block the next scenario's GPUs."""
    units = " ".join(f"{m}.service" for m in MODELS)
    subprocess.run(f"systemctl stop {units}; systemctl reset-failed {units}", shell=True,
                   capture_output=True, timeout=120)
    # Each scenario writes its own models: none overlaps another's GPUs
    # (an overlap is a config error that status and check report).
    for m in MODELS:
        try:
            os.unlink(f"/etc/infer-units/{m}.toml")
        except FileNotFoundError:
            pass
    subprocess.run(["systemctl", "daemon-reload"], capture_output=True, timeout=60)
    sc.data["left_after"] = {"holders": holders(), "memory_mib": mem()}


def main() -> int:
    log(f"scenarios start: backend {B.name}, {len(GPUS)} GPU(s), package "
        f"{open('/etc/infer-units-version').read().strip()}")
    RESULTS["package_version"] = open("/etc/infer-units-version").read().strip()
    # What an NVML query of all GPUs costs, processes and memory (docs/performance.md,
    # "Facts the code is built on", has the figure)
    t = time.perf_counter()
    for _ in range(200):
        B.users(GPUS)
    users_ms = (time.perf_counter() - t) / 200 * 1000
    t = time.perf_counter()
    for _ in range(200):
        mem()
    RESULTS["query_ms"] = {"users_all_gpus": round(users_ms, 4),
                           "memory_all_gpus": round((time.perf_counter() - t) / 200 * 1000, 4)}
    only = os.environ.get("IU_SCENARIOS", "").split()
    for fn in (s1_lifecycle, s2_orphan, s3_disjoint, s4_p2p, s5_status, s6_drain, s7_container,
               s8_restart_cost, l1_llama_lifecycle, l2_llama_killed, l3_llama_hang, l4_llama_foreign,
               l5_llama_drain, l6_llama_health, l7_llama_bench, l8_llama_canary):
        name = fn.__name__
        if only and name.split("_")[0] not in only:
            continue
        sc = Scenario(name)
        needs = getattr(fn, "needs_gpus", 1)
        skipped = None
        if len(GPUS) < needs:
            skipped = f"needs {needs} GPUs, this machine has {len(GPUS)}"
        elif getattr(fn, "needs_llama", False) and not HAVE_LLAMA:
            skipped = f"needs llama-server under {LLAMA_DIR} (boot-scenarios.sh IU_LLAMA_DIR)"
        if skipped:
            sc.data.update(ok=True, skipped=skipped)
            log(f"{name}: SKIP ({skipped})")
            save()
            continue
        t = time.monotonic()
        try:
            fn(sc)
        except Exception as e:
            sc.data["error"] = f"{type(e).__name__}: {e}"
            sc.data["traceback"] = traceback.format_exc()[-3000:]
        sc.data["wall_s"] = round(time.monotonic() - t, 3)
        cleanup(sc)
        log(f"{name}: {'PASS' if sc.data['ok'] else 'FAIL'} {sc.data.get('summary', sc.data.get('error'))}")
        save()
    RESULTS["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    RESULTS["all_ok"] = all(s["ok"] for s in RESULTS["scenarios"].values())
    save()
    log(f"scenarios done: all ok {RESULTS['all_ok']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
