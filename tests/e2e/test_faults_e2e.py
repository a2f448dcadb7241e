"""Faults at every step of a start, a restart and a stop end clean, under real
systemd with the .deb (tests/e2e/faults.py says the promise and the faults).
Seeded: INFER_UNITS_FAULT_SEED reproduces a run (default: a new seed, printed
in every failure); INFER_UNITS_FAULT_COUNT sets how many (bench/fault_soak.py
runs thousands)."""

from __future__ import annotations

import json
import os
import random

import pytest

from ..support import wait_until
from .e2e_support import show
from .faults import FAULTS, FINDER, NAME, PRE_START, SETTLE_S, UNIT, bad, campaign, install, \
    summary, uninstall

pytestmark = pytest.mark.e2e


def test_every_fault_ends_serving_or_failed_with_a_reason(box) -> None:
    seed = int(os.environ.get("INFER_UNITS_FAULT_SEED") or random.randrange(1 << 32))
    count = int(os.environ.get("INFER_UNITS_FAULT_COUNT") or len(FAULTS))
    try:
        outcomes = campaign(box, seed, count)
    finally:
        uninstall(box)
    report = f"seed {seed} (INFER_UNITS_FAULT_SEED={seed} reproduces it):\n" + summary(outcomes)
    print(report)
    wrong = [o for o in outcomes if bad(o)]
    assert not wrong, report + "\n" + "\n".join(map(repr, wrong))
    # A campaign whose faults missed their steps proved nothing.
    assert sum(o.hit for o in outcomes) >= len(outcomes) // 2, report


def test_a_power_cut_mid_reap_boots_back_serving(box) -> None:
    """The host loses power while a restart's pre-start reaps: at the next
    boot the enabled model starts by itself and serves.  Nothing a dead
    hook left blocks it (/run starts empty; the claims live there)."""
    install(box, enabled=True)
    try:
        box.sh(f"systemctl start {UNIT}", timeout=120)
        box.sh(f"systemctl restart --no-block {UNIT}")
        assert box.sh(f"{FINDER} 20 -1 '{PRE_START}'", check=False, timeout=60).stdout.strip(), \
            "no pre-start appeared for the restart"
        box.power_cut()

        def serving() -> bool:
            return show(box, UNIT, "ActiveState")["ActiveState"] == "active"
        assert wait_until(serving, SETTLE_S), \
            box.sh(f"journalctl -b -u {UNIT} -n 40 --no-pager", check=False).stdout
        done = box.sh(f"infer-units status --json {NAME}", check=False)
        [model] = json.loads(done.stdout)["models"]
        assert done.returncode == 0 and model["health"]["ok"], model
    finally:
        uninstall(box)
