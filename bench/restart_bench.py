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

TIMER = r"""
import json, subprocess, sys, time
units, runs = sys.argv[1].split(","), int(sys.argv[2])
times = {u: [] for u in units}
for _ in range(runs):
    for u in units:
        t = time.perf_counter()
        subprocess.run(["systemctl", "restart", u], check=True)
        times[u].append(time.perf_counter() - t)
print(json.dumps(times))
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
        times = json.loads(out)
        hooked = statistics.median(times["hooked"]) * 1000
        base = statistics.median(times["baseline"]) * 1000
        print(f"systemctl restart, {args.runs} runs each, alternating, one container:")
        print(f"  baseline (Type=notify, no hooks)  median {base:7.1f} ms  "
              f"(min {min(times['baseline']) * 1000:.1f}, max {max(times['baseline']) * 1000:.1f})")
        print(f"  infer-units unit (all hooks)      median {hooked:7.1f} ms  "
              f"(min {min(times['hooked']) * 1000:.1f}, max {max(times['hooked']) * 1000:.1f})")
        print(f"  added by the hooks: {hooked - base:.1f} ms (goal < 60 ms: "
              f"{'met' if hooked - base < 60 else 'NOT met'}); ratio {hooked / base:.2f}")
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
