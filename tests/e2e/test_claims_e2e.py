"""Under real systemd (runs before test_e2e.py, on the same container, and
leaves nothing behind): two units sharing a GPU started at once, where the
start claims are judged by the units' systemd state; and a stop with a
foreign GPU user left behind, which must return at once with the unit
inactive, not failed."""

from __future__ import annotations

import json
import time

import pytest

from .e2e_support import model_toml

pytestmark = pytest.mark.e2e

GPU = 4
NAMES = ("race-a", "race-b")


def state(box, unit: str) -> str:
    return box.sh(f"systemctl show -p ActiveState --value {unit}").stdout.strip()


def settle(box, units: list[str], timeout: float = 30.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        states = {u: state(box, u) for u in units}
        if all(s in ("active", "failed", "inactive") for s in states.values()) \
                or time.monotonic() > deadline:
            return states
        time.sleep(0.1)


@pytest.fixture
def racing_models(box):
    for i, name in enumerate(NAMES):
        box.write(f"/etc/infer-units/{name}.toml", model_toml(name, [GPU], 18041 + i, load=0.3))
    box.sh("systemctl daemon-reload")
    yield [f"{n}.service" for n in NAMES]
    box.sh("systemctl stop " + " ".join(NAMES) + "; systemctl reset-failed " +
           " ".join(NAMES) + "; rm -f " + " ".join(f"/etc/infer-units/{n}.toml" for n in NAMES)
           + "; systemctl daemon-reload", check=False)


def test_two_units_sharing_a_gpu_started_at_once_exactly_one_runs(box, racing_models) -> None:
    outcomes = []
    for _ in range(5):
        box.sh("systemctl start --no-block " + " ".join(racing_models))
        states = settle(box, racing_models)
        outcomes.append(sorted(states.values()))
        assert list(states.values()).count("active") == 1, states
        loser = next(u for u, s in states.items() if s != "active")
        winner = next(u for u, s in states.items() if s == "active")
        assert f"belongs to infer-units service {winner}" in box.journal(loser)
        box.sh("systemctl stop " + " ".join(racing_models) + "; systemctl reset-failed "
               + " ".join(racing_models), check=False)
    assert all(o.count("active") == 1 for o in outcomes)


def test_stop_with_a_foreign_user_left_behind_is_quick_and_clean(box, racing_models) -> None:
    unit = racing_models[0]
    box.sh(f"systemctl start {unit}")
    box.sh("systemd-run --unit=left-behind --property=KillMode=process /usr/bin/python3 -c "
           f"'import signal,time; f=open(\"/var/lib/fakegpu/nvidia{GPU}\"); "
           "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)'")
    try:
        deadline = time.monotonic() + 10
        pid = None
        while pid is None and time.monotonic() < deadline:
            out = box.sh("INFER_UNITS_FAKE_GPUS=/etc/infer-units/fakegpus.json "
                         f"infer-units holders --json --gpus {GPU}").stdout
            pid = next((h["pid"] for h in json.loads(out)["holders"]
                        if h["unit"] == "left-behind.service"), None)
            time.sleep(0.1)
        assert pid is not None
        started = time.monotonic()
        box.sh(f"systemctl stop {unit}")
        took = time.monotonic() - started
        assert took < 5, f"stop took {took:.1f}s: wait-free waited on a foreign user"
        props = box.sh(f"systemctl show -p ActiveState -p Result {unit}").stdout
        assert "ActiveState=inactive" in props and "Result=success" in props, props
        log = box.journal(unit)
        assert f"pid {pid} foreign user of GPU {GPU}" in log and "not touching it" in log
        assert "other user(s) left, not waited on" in log
        assert box.sh(f"test -d /proc/{pid}", check=False).returncode == 0
    finally:
        box.sh("systemctl kill -s KILL left-behind; systemctl stop left-behind; "
               "systemctl reset-failed left-behind", check=False)
