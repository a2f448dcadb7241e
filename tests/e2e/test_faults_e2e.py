"""Faults at every step of a start, a restart and a stop end clean, under real
systemd with the .deb (tests/e2e/faults.py says the promise and the faults).
Seeded: INFER_UNITS_FAULT_SEED reproduces a run (default: a new seed, printed
in every failure); INFER_UNITS_FAULT_COUNT sets how many (bench/fault_soak.py
runs thousands)."""

from __future__ import annotations

import os
import random

import pytest

from .faults import FAULTS, bad, campaign, summary

pytestmark = pytest.mark.e2e


def test_every_fault_ends_serving_or_failed_with_a_reason(box) -> None:
    seed = int(os.environ.get("INFER_UNITS_FAULT_SEED") or random.randrange(1 << 32))
    count = int(os.environ.get("INFER_UNITS_FAULT_COUNT") or len(FAULTS) + 4)
    try:
        outcomes = campaign(box, seed, count)
    finally:
        box.sh("systemctl stop fault-m; rm -f /etc/infer-units/fault-m.toml; "
               "systemctl daemon-reload; systemctl reset-failed fault-m || true", check=False)
    report = f"seed {seed} (INFER_UNITS_FAULT_SEED={seed} reproduces it):\n" + summary(outcomes)
    print(report)
    wrong = [o for o in outcomes if bad(o)]
    assert not wrong, report + "\n" + "\n".join(map(repr, wrong))
    # A campaign whose faults missed their steps proved nothing.
    assert sum(o.hit for o in outcomes) >= len(outcomes) // 2, report
