#!/usr/bin/python3
"""Generator wall time on 64 model files against a bare interpreter start.

    /usr/bin/python3 bench/generator_bench.py [--runs 40] [--python /usr/bin/python3]

Runs, alternating in one process so both see the same machine load:
  bare       python3 -I -c pass
  generator  python3 <the .deb launcher's #! flags> <generator> OUT
             (INFER_UNITS_CONFIG_PATH = 64 files, 2 dirs, drop-ins, host defaults, liveness on)
and prints both medians and their ratio against the goal in docs/performance.md
(the generator within 10x a bare interpreter start).  Every run writes the same
units (checked).  If a C fstab generator is installed it is timed too, as a
reference.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL = 10.0     # docs/performance.md: the generator within 10x a bare interpreter start
ENGINES = ("sglang", "vllm", "trtllm", "tgi", "llamacpp", "command")


def make_models(base: str, count: int = 64) -> list[str]:
    etc, lib = os.path.join(base, "etc"), os.path.join(base, "lib")
    os.makedirs(os.path.join(etc, "defaults.toml.d"))
    os.makedirs(lib)
    with open(os.path.join(etc, "defaults.toml.d", "10-nccl.toml"), "w") as f:
        f.write('[nccl]\np2p = "off"\nsocket-ifname = "eth0"\n')
    for i in range(count):
        engine = ENGINES[i % len(ENGINES)]
        body = [f'engine = "{engine}"', f"gpus = [{i}]", f"port = {9000 + 4 * i}"]
        if engine == "command":
            body.append(f'command = ["/opt/srv/bin/serve", "--id", "{i}", "100% $HOME"]')
        else:
            body.append(f'model = "/models/m{i}"')
        body += ['args = ["--max-model-len", "32768"]', "[env]", f'MODEL_ID = "{i}"',
                 "[install]", 'WantedBy = "multi-user.target"']
        target = etc if i % 2 else lib
        with open(os.path.join(target, f"model-{i:02d}.toml"), "w") as f:
            f.write("\n".join(body) + "\n")
        if i % 4 == 0:
            d = os.path.join(etc, f"model-{i:02d}.toml.d")
            os.makedirs(d)
            with open(os.path.join(d, "50-ready.toml"), "w") as f:
                f.write('[ready]\ntimeout = "30min"\n')
    return [etc, lib]


def snapshot(out: str) -> dict[str, str]:
    found = {}
    for base, _dirs, files in os.walk(out):
        for name in files:
            path = os.path.join(base, name)
            found[os.path.relpath(path, out)] = (
                "-> " + os.readlink(path) if os.path.islink(path)
                else open(path, encoding="utf-8").read())
    return found


def timed(argv: list[str], env: dict[str, str], cpu: list[float] | None = None) -> float:
    """Wall seconds of one run; with `cpu`, its CPU seconds (user + system,
    the kernel's account of the child) appended there."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    if cpu is not None:
        cpu.append(usage.ru_utime + usage.ru_stime)
    return wall


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--liveness-off", action="store_true",
                   help='[liveness] interval = "0" host-wide: the model units only')
    args = p.parse_args()
    # Generators write to /run/systemd/generator, a tmpfs: so does the benchmark.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    work = tempfile.mkdtemp(prefix="iu-bench-", dir=shm)
    try:
        dirs = make_models(work)
        if args.liveness_off:
            with open(os.path.join(dirs[0], "defaults.toml.d", "20-liveness.toml"), "w") as f:
                f.write('[liveness]\ninterval = "0"\n')
        out = os.path.join(work, "out")
        env = dict(os.environ, INFER_UNITS_CONFIG_PATH=":".join(dirs),
                   SYSTEMD_LOG_TARGET="console")
        # As the .deb's launcher starts it (its #! flags), from this checkout.
        with open(os.path.join(ROOT, "packaging/infer-units-generator"), encoding="utf-8") as f:
            flags = f.readline().split()[1:]
        launcher = (f"import sys; sys.path.insert(0, {ROOT!r}); "
                    "from infer_units.generator.main import main; sys.exit(main())")
        gen = [args.python, *flags, "-c", launcher, out]
        bare = [args.python, "-I", "-c", "pass"]
        fstab = "/usr/lib/systemd/system-generators/systemd-fstab-generator"
        runs: dict[str, list[float]] = {"bare": [], "generator": []}
        # CPU time as well: on a busy machine wall time grows with the waits
        # for a core, which a short run (bare) suffers less than a long one.
        cpu: dict[str, list[float]] = {"bare": [], "generator": []}
        if os.access(fstab, os.X_OK):
            runs["fstab (C)"] = []
        for _ in range(3):   # warm the page cache and .pyc files
            shutil.rmtree(out, ignore_errors=True); os.makedirs(out)
            timed(gen, env)
        first = snapshot(out)
        for _ in range(args.runs):
            runs["bare"].append(timed(bare, env, cpu["bare"]))
            shutil.rmtree(out); os.makedirs(out)
            runs["generator"].append(timed(gen, env, cpu["generator"]))
            if "fstab (C)" in runs:
                fs = os.path.join(work, "fstab-out"); shutil.rmtree(fs, ignore_errors=True); os.makedirs(fs)
                runs["fstab (C)"].append(timed([fstab, fs, fs, fs], dict(env, SYSTEMD_LOG_LEVEL="emerg")))
        units = [n for n in os.listdir(out)      # the models' own units, not liveness probes
                 if n.endswith(".service") and not n.startswith("infer-units-")]
        assert len(units) == 64, f"generated {len(units)} units, expected 64"
        assert snapshot(out) == first, "two runs on the same files wrote different units"
        shutil.rmtree(out); os.makedirs(out)
        logged = subprocess.run(gen, env=env, check=True, capture_output=True, text=True).stderr
        assert not logged, f"the generator logged errors on the benchmark's files:\n{logged}"
        med = {k: statistics.median(v) * 1000 for k, v in runs.items()}
        print(f"python: {args.python} ({sys.version.split()[0]} here), {args.runs} runs, 64 model files; "
              f"generator as its launcher starts it: {args.python} {' '.join(flags)}")
        for k, v in med.items():
            print(f"  {k:12s} median {v:7.2f} ms   (min {min(runs[k]) * 1000:.2f}, max {max(runs[k]) * 1000:.2f})")
        ratio = med["generator"] / med["bare"]
        print(f"  ratio generator/bare = {ratio:.2f}  (goal <= {GOAL:.2f}: "
              f"{'met' if ratio <= GOAL else 'NOT met'})  wall time")
        cpu_med = {k: statistics.median(v) * 1000 for k, v in cpu.items()}
        cpu_ratio = cpu_med["generator"] / cpu_med["bare"]
        print(f"  CPU time (user + system): bare median {cpu_med['bare']:.2f} ms, generator "
              f"median {cpu_med['generator']:.2f} ms, ratio {cpu_ratio:.2f}  "
              f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs)")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
