#!/usr/bin/python3
"""What `infer-units doctor` and pre-start's health gate cost.

    /usr/bin/python3 bench/doctor_bench.py [--runs 20] [--gpus 8]

On fake GPUs (INFER_UNITS_FAKE_GPUS, every XID from the kernel log) with
this machine's real kernel (--root-dir /: /proc/modules, sysfs, /dev/kmsg
read to its end), or with real NVML when run where the driver is
(--real).  Prints the medians side by side:
  gate       check_gpus() for one GPU (what pre-start adds to every start)
  doctor     doctor.collect([]) in process: every GPU and host check
  cli        `infer-units doctor --json` as a process, against a bare
             `python3 -c pass` and `infer-units --version` (the CLI's own start)
The figures: docs/performance.md, "doctor and the health gate".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))      # the checkout's infer_units (as PYTHONPATH=. does)


def _median_ms(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--real", action="store_true", help="real NVML and kernel (the GPU machine)")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="doctor-bench-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    root: str | None = "/"
    if not a.real:
        devices = []
        for i in range(a.gpus):
            (tmp / f"nvidia{i}").touch()
            devices.append({"index": i, "uuid": f"GPU-{i:08x}-0000-0000-0000-{i:012x}",
                            "pci": f"0000:{0x41 + i:02x}:00.0", "device": str(tmp / f"nvidia{i}"),
                            "memory_mib": 143771, "health": {"xid": None}})
        (tmp / "gpus.json").write_text(json.dumps({"gpus": devices,
                                                   "driver": {"version": "x", "cuda": 13000}}))
        os.environ["INFER_UNITS_FAKE_GPUS"] = env["INFER_UNITS_FAKE_GPUS"] = str(tmp / "gpus.json")
    else:
        root = None
    from infer_units.helpers.cli.doctor import collect
    from infer_units.helpers.facts.gpus import backend
    from infer_units.helpers.decide.health import check_gpus
    from infer_units.helpers.facts.health import Kernel

    b = backend()
    gpus = b.gpus()
    log = Kernel("/").kernel_log()
    gate = _median_ms(lambda: check_gpus(b, gpus[:1], root), a.runs)
    kmsg = _median_ms(lambda: Kernel("/").kernel_log(), a.runs)
    doctor = _median_ms(lambda: collect([], root), a.runs)
    argv = [sys.executable, "-m", "infer_units", "doctor", "--json"] + (
        ["--root-dir", "/"] if root else [])
    cli = _median_ms(lambda: subprocess.run(argv, env=env, capture_output=True, check=False),
                     max(5, a.runs // 2))
    version = _median_ms(lambda: subprocess.run([sys.executable, "-m", "infer_units", "--version"],
                                                env=env, capture_output=True, check=False),
                         max(5, a.runs // 2))
    bare = _median_ms(lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
                      max(5, a.runs // 2))
    report = collect([], root)
    print(f"backend {b.name}, {len(gpus)} GPU(s); kernel log readable: {log.readable} "
          f"({sum(len(v) for v in log.xids.values())} XID lines) {log.why}")
    print(f"gate (1 GPU, pre-start)        {gate:8.2f} ms")
    print(f"kernel log read to its end     {kmsg:8.2f} ms")
    print(f"doctor in process ({len(gpus)} GPUs)    {doctor:8.2f} ms")
    print(f"infer-units doctor --json      {cli:8.1f} ms   = {cli / bare:.1f}x bare python "
          f"({bare:.1f} ms); infer-units --version {version:.1f} ms")
    print(f"findings: {report['level']} overall, exit {report['exit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
