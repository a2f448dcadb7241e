#!/usr/bin/python3
"""Time the infer-units hooks add to `systemctl restart`, under real systemd.

    sudo /usr/bin/python3 bench/restart_bench.py [--runs 15]

In a bookworm container (tests/e2e/container.py) with the .deb installed, two
units run the same fake server (loads 0.5 s, two workers, one ignoring
SIGTERM) on their own fake GPUs:
  infer-units  the generated unit: reap + wait-port before, wait-ready after,
               wait-free after stop
  baseline     a hand-written Type=notify unit: the server itself says READY=1
               when loaded; no hooks
Restarts alternate; the difference of the medians is the hooks' cost
(DESIGN's goal: < 60 ms; 86 ms on 2026-12-01 before issue 21).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))      # the tests are a package

from tests.e2e.container import Container, available  # noqa: E402
from tests.e2e.e2e_support import FAKE_TABLE, install_fake_gpus, model_toml  # noqa: E402

BASELINE = f"""[Unit]
Description=baseline: the same fake server without infer-units hooks
StartLimitIntervalSec=0
[Service]
Type=notify
NotifyAccess=main
Environment=INFER_UNITS_FAKE_GPUS={FAKE_TABLE} CUDA_VISIBLE_DEVICES=2,3
ExecStart=/usr/local/bin/fake-engine --port 18502 --load 0.5 --notify
KillMode=mixed
TimeoutStopSec=30s
"""

# Each restart, and where it went by systemd's own clock (its monotonic
# timestamps of the unit's state changes, read after the restart): stop
# (deactivating), start up to the server's exec (ExecStartPre), and from the
# exec until active (the load, then wait-ready's notice, or READY=1).
TIMER = r"""
import json, subprocess, sys, time
units, runs = sys.argv[1].split(","), int(sys.argv[2])
from datetime import datetime
props = ["ActiveExitTimestampMonotonic", "InactiveEnterTimestampMonotonic",
         "InactiveExitTimestampMonotonic", "ExecMainStartTimestampMonotonic",
         "ActiveEnterTimestampMonotonic"]
hooks = ["ExecStopPost", "ExecStartPre", "ExecStartPost"]
times = {u: [] for u in units}
phases = {u: {"stop": [], "pre": [], "up": []} for u in units}
spans = {u: {h: [] for h in hooks} for u in units}

def span(value):
    # "{ path=... ; start_time=[Wed 2026-12-02 18:59:01.123456 UTC] ; stop_time=[...] ...}"
    def at(key):
        text = value.split(key + "=[", 1)[1].split("]", 1)[0].rsplit(" ", 1)[0]
        return datetime.strptime(text, "%a %Y-%m-%d %H:%M:%S.%f").timestamp()
    return at("stop_time") - at("start_time")

for _ in range(runs):
    for u in units:
        t = time.perf_counter()
        subprocess.run(["systemctl", "restart", u], check=True)
        times[u].append(time.perf_counter() - t)
        out = subprocess.run(["systemctl", "show", u] + ["-p" + p for p in props],
                             capture_output=True, text=True, check=True).stdout
        v = dict(line.split("=", 1) for line in out.splitlines())
        us = [int(v[p]) for p in props]
        phases[u]["stop"].append((us[1] - us[0]) / 1e6)
        phases[u]["pre"].append((us[3] - us[2]) / 1e6)
        phases[u]["up"].append((us[4] - us[3]) / 1e6)
        out = subprocess.run(["systemctl", "show", "--timestamp=us+utc", u]
                             + ["-p" + h for h in hooks],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            name, _, value = line.partition("=")
            if "stop_time=[" in value and "start_time=[" in value and "=[n/a]" not in value:
                spans[u][name].append(span(value))
print(json.dumps({"times": times, "phases": phases, "spans": spans}))
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=15)
    args = p.parse_args()
    reason = available()
    if reason:
        print(f"cannot run: {reason}")
        return 1
    deb = subprocess.run([str(ROOT / "packaging/build-deb")], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    box = Container()
    try:
        box.boot()
        box.write("/usr/local/bin/fake-engine", (ROOT / "tests/e2e/fake_engine.py").read_text(),
                  mode=0o755)
        install_fake_gpus(box)     # the table, its files and the hooks' test marker
        box.install_deb(Path(deb))
        box.write("/etc/infer-units/hooked.toml", model_toml("hooked", [0, 1], 18501, load=0.5)
                  .replace('interval = "100ms"', 'interval = "1s"')
                  + "[unit]\nStartLimitIntervalSec = 0\n")
        box.write("/etc/systemd/system/baseline.service", BASELINE)
        box.write("/root/timer.py", TIMER)
        box.sh("systemctl daemon-reload && systemctl start hooked baseline")
        out = box.sh(f"python3 /root/timer.py hooked,baseline {args.runs}", timeout=1200).stdout
        measured = json.loads(out)
        times, phases = measured["times"], measured["phases"]
        hooked = statistics.median(times["hooked"]) * 1000
        base = statistics.median(times["baseline"]) * 1000
        print(f"systemctl restart, {args.runs} runs each, alternating, one container:")
        print(f"  baseline (Type=notify, no hooks)  median {base:7.1f} ms  "
              f"(min {min(times['baseline']) * 1000:.1f}, max {max(times['baseline']) * 1000:.1f})")
        print(f"  infer-units unit (all hooks)      median {hooked:7.1f} ms  "
              f"(min {min(times['hooked']) * 1000:.1f}, max {max(times['hooked']) * 1000:.1f})")
        print(f"  added by the hooks: {hooked - base:.1f} ms (goal < 60 ms: "
              f"{'met' if hooked - base < 60 else 'NOT met'}); ratio {hooked / base:.2f}")
        print("  where it goes (medians, systemd's timestamps):   baseline  infer-units  added")
        for key, what in (("stop", "stop (deactivating; ExecStopPost)"),
                          ("pre", "start to the server's exec (ExecStartPre)"),
                          ("up", "exec to active (load, then the ready notice)")):
            b = statistics.median(phases["baseline"][key]) * 1000
            h = statistics.median(phases["hooked"][key]) * 1000
            print(f"    {what:44s} {b:8.1f} {h:10.1f} {h - b:8.1f} ms")
        print("  the hooks' own runs (medians, systemd's exec records):")
        for hook, what in (("ExecStopPost", "wait-free"), ("ExecStartPre", "pre-start"),
                           ("ExecStartPost", "wait-ready (beside the load)")):
            runs = measured["spans"]["hooked"][hook]
            if runs:
                print(f"    {hook:14s} {what:28s} {statistics.median(runs) * 1000:8.1f} ms "
                      f"(min {min(runs) * 1000:.1f}, max {max(runs) * 1000:.1f})")
        # One more restart, traced: where the time goes.
        box.sh("journalctl --rotate --vacuum-time=1s -q; systemctl restart hooked", check=False)
        log = box.sh("journalctl -u hooked -o short-monotonic --no-pager | tail -20",
                     check=False).stdout
        print("  journal of one restart:\n    " + "\n    ".join(log.strip().splitlines()))
        return 0
    finally:
        box.shutdown()


if __name__ == "__main__":
    sys.exit(main())
