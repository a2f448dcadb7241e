"""drain, the fence and resume under real systemd: drain --dry-run predicts
the real run, a start (and its Restart=) is refused while fenced, resume
starts exactly what drain stopped; the three man pages are installed."""

from __future__ import annotations

import json
import time

import pytest

from .e2e_support import FAKE_TABLE, add_model, model_toml, show, wait_until

pytestmark = pytest.mark.e2e
FENCE = "/run/infer-units/drain.fence"


def _state(box, unit: str) -> str:
    return show(box, unit, "ActiveState")["ActiveState"]


def test_drain_fences_and_resume_starts_exactly_what_it_stopped(box) -> None:
    # Ports no other module uses: the box is shared by the session, and a unit
    # another module left running (its test failed before its stop) on a port
    # of these models would block their start here, a failure not this test's.
    for i, name in enumerate(("ops-a", "ops-b", "ops-c")):
        add_model(box, name, model_toml(name, [i], 18241 + i))
    box.sh("systemctl daemon-reload && systemctl start ops-a ops-b")   # ops-c: stopped
    drain = f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units drain --json --term-grace 1s --timeout 30s"
    dry = box.sh(drain + " --dry-run", check=False)
    assert dry.returncode == 0, dry.stderr
    predicted = json.loads(dry.stdout)
    assert _state(box, "ops-a.service") == "active" and box.sh(f"test -e {FENCE}", check=False).returncode == 1
    try:
        real = box.sh(drain, check=False)
        assert real.returncode == 0, real.stderr
        done = json.loads(real.stdout)
        for key in ("stop", "signal", "fence"):
            assert predicted[key] == done[key], (key, predicted[key], done[key])
        assert {"ops-a.service", "ops-b.service"} <= set(done["stop"])
        assert "ops-c.service" not in done["stop"]
        assert _state(box, "ops-a.service") == "inactive" and _state(box, "ops-b.service") == "inactive"
        assert json.loads(box.sh(f"cat {FENCE}").stdout)["stopped"] == done["stop"]
        # A second drain finds them stopped by the first: it says so, stops
        # nothing, and the fence still records them.
        second = box.sh(drain, check=False)
        assert second.returncode == 0, second.stderr
        assert json.loads(second.stdout)["stop"] == [], second.stdout
        assert ("already drained (an earlier drain stopped them): " + ", ".join(done["stop"])
                + "; resume starts them") in second.stderr, second.stderr
        assert "left active" not in second.stderr and "stopping" not in second.stderr, \
            second.stderr
        assert json.loads(box.sh(f"cat {FENCE}").stdout)["stopped"] == done["stop"]

        # While fenced: a start fails at pre-start, and Restart=on-failure (RestartSec=1s) does not retry it.
        assert box.sh("systemctl start ops-c", check=False).returncode != 0
        time.sleep(3)
        props = show(box, "ops-c.service", "NRestarts", "ActiveState")
        assert props["NRestarts"] == "0" and props["ActiveState"] in ("failed", "inactive"), props
        assert "start of ops-c.service refused: GPUs drained by `infer-units drain`" \
            in box.journal("ops-c.service")
        box.sh("systemctl reset-failed ops-c", check=False)

        resumed = box.sh("infer-units resume --json --timeout 60s", check=False)
        assert resumed.returncode == 0, resumed.stderr
        report = json.loads(resumed.stdout)
        assert report["start"] == done["stop"]
        assert report["states"] == {unit: "active" for unit in done["stop"]}
        assert _state(box, "ops-c.service") == "inactive", "resume started a unit drain did not stop"
        assert box.sh(f"test -e {FENCE}", check=False).returncode == 1
        box.sh("systemctl stop " + " ".join(done["stop"]))
    finally:
        # A failure above leaves no fence behind: it would refuse every later
        # start in this shared box (test_package.py's, among others).
        box.sh(f"rm -f {FENCE}; systemctl stop ops-a ops-b ops-c; "
               "systemctl reset-failed ops-a ops-b ops-c", check=False)


def _fence_as_a_clock_jump_leaves_it(box, jump_s: float) -> None:
    """The fence a drain writes, then the wall clock set by `jump_s` (back:
    negative): its wall-clock "since" is as far off the new clock, its
    CLOCK_MONOTONIC one is not (no clock setting moves that clock)."""
    box.sh("python3 -c 'import json, time; now = time.time(); print(json.dumps({"
           "\"since\": now - %r, \"since_text\": \"before the jump\", "
           "\"since_monotonic\": time.monotonic(), \"stopped\": [], \"by_pid\": 1}))' "
           "> %s" % (jump_s, FENCE))


def _crashed(box, name: str) -> None:
    """Its server killed by a signal the unit does not take for success, and
    no Restart=: failed, so systemd keeps the unit loaded with its exit
    stamps (an inactive one it may unload, stamps and all)."""
    box.sh(f"systemctl kill -s USR1 --kill-whom=main {name}")
    assert wait_until(lambda: _state(box, f"{name}.service") == "failed", 30)


def test_a_clock_set_back_or_forward_leaves_what_resume_starts_as_it_was(box) -> None:
    """drain records the units that left active after its fence went up
    (resume starts them) and not those that left before it.  Their exit
    times are compared with the fence's moment on the monotonic clock: on
    the wall clock an hour set back forgot a unit that left after the fence
    (it stayed down after resume), an hour set forward started one that had
    failed before it."""
    names = ("ops-d", "ops-e")
    for i, name in enumerate(names):
        add_model(box, name, model_toml(name, [3 + i], 18251 + i) + 'Restart = "no"\n')
    drain = f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units drain --json --term-grace 1s --timeout 30s"
    box.sh("systemctl daemon-reload && systemctl start ops-d ops-e")
    try:
        # ops-e fails before the fence; the clock is set forward an hour after it.
        _crashed(box, "ops-e")
        _fence_as_a_clock_jump_leaves_it(box, 3600.0)
        done = box.sh(drain, check=False)
        assert done.returncode == 0, done.stderr
        assert "ops-e" not in done.stderr, done.stderr
        resumed = box.sh("infer-units resume --json --timeout 60s", check=False)
        assert resumed.returncode == 0, resumed.stderr
        assert _state(box, "ops-e.service") == "failed", "resume started a unit that failed before the fence"
        assert _state(box, "ops-d.service") == "active"
        # The clock set back an hour after the fence; ops-d fails after it.
        _fence_as_a_clock_jump_leaves_it(box, -3600.0)
        _crashed(box, "ops-d")
        done = box.sh(drain, check=False)
        assert done.returncode == 0, done.stderr
        assert "ops-d.service left active after the fence went up: resume starts it" \
            in done.stderr, done.stderr
        resumed = box.sh("infer-units resume --json --timeout 60s", check=False)
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["states"] == {"ops-d.service": "active"}, resumed.stdout
    finally:
        box.sh(f"rm -f {FENCE}; systemctl stop ops-d ops-e; "
               "systemctl reset-failed ops-d ops-e", check=False)


def test_the_man_pages_are_installed(box) -> None:
    for page in ("man1/infer-units.1.gz", "man5/infer-units.toml.5.gz",
                 "man8/infer-units-generator.8.gz"):
        assert box.sh(f"test -s /usr/share/man/{page}", check=False).returncode == 0, page
    assert "reap.term-grace" in box.sh("zcat /usr/share/man/man5/infer-units.toml.5.gz "
                                       "| sed 's/\\\\-/-/g'").stdout
