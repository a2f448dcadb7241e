#!/usr/bin/python3
"""A long fault-injection soak under real systemd (tests/e2e/faults.py): many
faults at random moments of starts, restarts and stops of a model, each
followed by the checks of the promise, and a summary table (faults injected,
landed in their step, recovered by themselves, failed with a reason, stuck,
silent, leaked, next start blocked, the kind's own promise broken: the goal
is 0 in the last five).

    sudo /usr/bin/python3 bench/fault_soak.py [--faults 1000] [--seed N] [--suite bookworm]

Boots one container with the .deb this checkout builds; the seed is printed
first, and the same seed replays the same faults at the same moments.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))      # the tests are a package

from tests.e2e.container import Container, available  # noqa: E402
from tests.e2e.e2e_support import install_fake_gpus, install_fakes  # noqa: E402
from tests.e2e.faults import bad, install, run_fault, summary  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", type=int, default=1000)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--suite", default="bookworm")
    args = p.parse_args()
    reason = available()
    if reason:
        print(f"cannot run: {reason}")
        return 1
    seed = random.randrange(1 << 32) if args.seed is None else args.seed
    print(f"seed {seed}, {args.faults} faults, {args.suite}", flush=True)
    deb = subprocess.run([str(ROOT / "packaging/build-deb")], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    box = Container(args.suite)
    outcomes = []
    started = time.monotonic()
    try:
        box.boot()
        install_fakes(box, ROOT)
        install_fake_gpus(box)
        box.install_deb(Path(deb))
        install(box)
        rng = random.Random(seed)
        for i in range(args.faults):
            outcome = run_fault(box, rng)
            outcomes.append(outcome)
            if bad(outcome):
                print(f"fault {i}: {outcome!r}", flush=True)
            if (i + 1) % 50 == 0:
                print(f"{i + 1} faults, {time.monotonic() - started:.0f} s", flush=True)
    finally:
        box.shutdown()
        print(summary(outcomes))
        print(f"seed {seed}: {len(outcomes)} faults in {time.monotonic() - started:.0f} s, "
              f"{sum(bad(o) for o in outcomes)} stuck, silent, leaking or blocking")
    return 1 if any(bad(o) for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
