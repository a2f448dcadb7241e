"""Liveness under real systemd: fake engines that hang with their process
alive (no answer, or 503), answer slowly, load for long, or hang on every
start; the companion timer and probe restart them through systemd, never
while loading, never after an operator's stop, and at most the cap.

Short settings keep this quick: probes every 1 s, 2 failures, 1 s timeout."""

from __future__ import annotations

import json
import time

import pytest

from .e2e_support import add_model, health_status, model_toml, show, wait_until

pytestmark = pytest.mark.e2e

INTERVAL, FAILURES, TIMEOUT = 1.0, 2, 1.0


def liveness_model(name: str, gpus: list[int], port: int, extra_args: list[str] | None = None,
                   env: dict[str, str] | None = None, load: float = 0.5, failures: int = FAILURES,
                   timeout: float = TIMEOUT, max_restarts: int = 3, window: str = "1h") -> str:
    return model_toml(name, gpus, port, extra_args, env=env, load=load) + (
        f'\n[liveness]\ninterval = "{INTERVAL:g}s"\nfailures = {failures}\n'
        f'timeout = "{timeout:g}s"\nmax-restarts = {max_restarts}\nrestart-window = "{window}"\n')


def gpu_free(text: str) -> str:
    """A model that holds no GPU.  Other modules of the session leave their
    model files in the container, some on the GPUs these models would take;
    such an overlap is a config error that `infer-units status` exits 1 on,
    and liveness has nothing to do with GPUs."""
    return text.replace("gpus = []\n", "")


def state(box, name: str) -> dict:
    out = box.sh(f"cat /run/infer-units/{name}.liveness.json 2>/dev/null || echo '{{}}'").stdout
    return json.loads(out)


def unit(box, name: str) -> dict[str, str]:
    return show(box, f"{name}.service", "ActiveState", "SubState", "InvocationID", "MainPID",
                "NRestarts", "Result")


def healthy(box, port: int) -> bool:
    return health_status(box, port, timeout=2) == "200"


def timer_state(box, name: str) -> str:
    return show(box, f"infer-units-liveness@{name}.timer", "ActiveState")["ActiveState"]


def start(box, name: str, *flags: str) -> None:
    done = box.sh(f"systemctl start {' '.join(flags)} {name}", check=False)
    assert done.returncode == 0, done.stderr + box.journal(f"{name}.service")[-3000:]


def hang(box, name: str, how: str) -> None:
    """The fake engine hangs at its next /health (the container's /run is its own tmpfs)."""
    box.sh(f"printf '%s' '{how}' > /run/{name}.hang")


# A liveness restart: both probes fail (each up to the timeout), the timer's
# gaps, the interpreter starting per probe, then the stop and a start (load).
def restart_bound(load: float) -> float:
    return FAILURES * (INTERVAL + TIMEOUT) + load + 8.0


def _hang_and_come_back(box, name: str, port: int, how: str, restarts_before: int) -> float:
    before = unit(box, name)
    started = time.monotonic()
    hang(box, name, how)
    assert wait_until(lambda: unit(box, name)["InvocationID"] != before["InvocationID"]
                and unit(box, name)["ActiveState"] == "active", restart_bound(0.5) + 10), \
        "\n".join([str(unit(box, name)), json.dumps(state(box, name)),
                   box.journal(name + ".service")[-2000:],
                   box.sh(f"journalctl -b --no-pager -u infer-units-liveness@{name}.service "
                          f"-u infer-units-liveness@{name}.timer | tail -15", check=False).stdout])
    took = time.monotonic() - started
    assert healthy(box, port)
    after = unit(box, name)
    assert after["MainPID"] != before["MainPID"]
    assert state(box, name)["restarts_total"] == restarts_before + 1
    return took


def test_hang_after_ready_is_restarted_and_healthy_again(box) -> None:
    name, port = "lv-hang", 18201
    add_model(box, name, gpu_free(liveness_model(name, [], port,
                                                 ["--hang-file", f"/run/{name}.hang"],
                                                 max_restarts=5)))
    box.sh("systemctl daemon-reload")
    start(box, name)
    assert wait_until(lambda: timer_state(box, name) == "active", 5)
    assert wait_until(lambda: state(box, name).get("last_probe", {}).get("ok") is True, 10), \
        box.sh(f"systemctl status --no-pager infer-units-liveness@{name}.timer "
               f"infer-units-liveness@{name}.service; journalctl -b --no-pager "
               f"-u infer-units-liveness@{name}.service | tail -20", check=False).stdout
    # The timer and its schedule survive a daemon-reload.
    box.sh("systemctl daemon-reload")
    assert timer_state(box, name) == "active"
    probed = state(box, name)["last_probe"]["time"]
    assert wait_until(lambda: state(box, name)["last_probe"]["time"] > probed, 5)

    took = _hang_and_come_back(box, name, port, "", 0)          # no answer at all
    log = box.journal(f"{name}.service")
    line = [l for l in log.splitlines() if l.startswith(f"liveness: restarting {name}.service")]
    assert len(line) == 1, log[-3000:]
    assert "2 health probes in a row failed" in line[0] and "no answer within 1s" in line[0]
    assert took < restart_bound(0.5), f"restarted after {took:.1f}s"

    took_503 = _hang_and_come_back(box, name, port, "503", 1)   # answers, but 503
    log = box.journal(f"{name}.service")
    assert "last answers: HTTP 503; HTTP 503" in log
    assert took_503 < restart_bound(0.5), f"restarted after {took_503:.1f}s"
    print(f"liveness restart after a hang: {took:.1f}s (no answer), {took_503:.1f}s (503)")

    # Healthy again: no further restart, and status says what happened.
    time.sleep(3 * INTERVAL)
    assert state(box, name)["restarts_total"] == 2
    out = box.sh(f"INFER_UNITS_FAKE_GPUS=/etc/infer-units/fakegpus.json "
                 f"infer-units status --json {name}").stdout
    [m] = json.loads(out)["models"]
    live = m["liveness"]
    assert live["restarts_total"] == 2 and live["consecutive_failures"] == 0
    assert live["last_probe"]["ok"] and live["last_restart"]["why"].endswith(
        f"http://127.0.0.1:{port}/health")
    table = box.sh("INFER_UNITS_FAKE_GPUS=/etc/infer-units/fakegpus.json "
                   f"infer-units status {name}").stdout
    assert "LIVENESS" in table and "2 restarts" in table
    prom = box.sh("cat /run/infer-units/state/lv-hang.service.json").stdout
    assert json.loads(prom)["liveness_restarts_total"] == 2
    box.sh(f"systemctl stop {name}")
    assert timer_state(box, name) == "inactive"


def test_slow_answers_within_the_timeout_are_never_restarted(box) -> None:
    name, port = "lv-slow", 18202
    add_model(box, name, liveness_model(name, [1], port, env={"FAKE_HEALTH_S": "0.7"},
                                        timeout=2.0))
    box.sh("systemctl daemon-reload")
    start(box, name)
    first = unit(box, name)
    # Busy clients keep /health slower still while liveness probes.
    box.sh(f"for i in 1 2 3 4; do (for j in 1 2 3 4 5 6; do python3 -c \"import urllib.request "
           f"as u; u.urlopen('http://127.0.0.1:{port}/health', timeout=5)\"; done) & done; wait",
           timeout=120)
    time.sleep(2)
    s = state(box, name)
    assert s["last_probe"]["ok"] and s["last_probe"]["seconds"] >= 0.7
    assert s.get("restarts_total", 0) == 0 and s["consecutive_failures"] == 0
    assert unit(box, name)["InvocationID"] == first["InvocationID"]
    # Healthy probes leave nothing in the journal (LogLevelMax=notice).
    probe_log = box.sh(f"journalctl -u infer-units-liveness@{name}.service -o cat --no-pager").stdout
    assert "Starting" not in probe_log and "Finished" not in probe_log, probe_log[-2000:]
    box.sh(f"systemctl stop {name}")


def test_long_loads_are_never_probed(box) -> None:
    name, port = "lv-load", 18203
    load = 2 * FAILURES * (INTERVAL + TIMEOUT)       # twice what a hang takes to detect
    add_model(box, name, liveness_model(name, [2], port, load=load))
    box.sh("systemctl daemon-reload")
    start(box, name, "--no-block")
    time.sleep(2)
    assert unit(box, name)["ActiveState"] == "activating"
    assert timer_state(box, name) == "inactive", "the timer runs while the model loads"
    assert wait_until(lambda: unit(box, name)["ActiveState"] == "active", load + 30)
    first = unit(box, name)
    assert wait_until(lambda: state(box, name).get("last_probe", {}).get("ok") is True, 10)
    # A crash: systemd's own Restart= reloads it; liveness must not count the reload.
    box.sh(f"kill -KILL {first['MainPID']}")
    assert wait_until(lambda: unit(box, name)["NRestarts"] == "1", 15)
    assert wait_until(lambda: unit(box, name)["ActiveState"] == "active", load + 30)
    # Once a probe finds the reloaded server healthy, liveness sets systemd's
    # NRestarts back to 0 so the crash-loop back-off starts over,
    # and says so once in the model's journal.
    assert wait_until(lambda: unit(box, name)["NRestarts"] == "0", 10), unit(box, name)
    s = state(box, name)
    assert s["last_probe"]["ok"] and s.get("restarts_total", 0) == 0, s
    log = box.journal(f"{name}.service")
    assert "liveness: restarting" not in log
    assert log.count(f"liveness: {name}.service is healthy after 1 automatic restart: "
                     "the crash-loop back-off starts over") == 1, log[-3000:]
    assert unit(box, name)["InvocationID"] != first["InvocationID"]
    box.sh(f"systemctl stop {name}")


def test_operator_stop_while_failures_count_is_never_undone(box) -> None:
    name, port = "lv-stop", 18204
    add_model(box, name, liveness_model(name, [3], port, ["--hang-file", f"/run/{name}.hang"],
                                        failures=3))
    box.sh("systemctl daemon-reload")
    start(box, name)
    hang(box, name, "")
    assert wait_until(lambda: state(box, name).get("consecutive_failures", 0) >= 1, 15)
    box.sh(f"systemctl stop {name}")
    time.sleep(3 * (INTERVAL + TIMEOUT) + 2)
    u = unit(box, name)
    assert u["ActiveState"] == "inactive", u
    assert timer_state(box, name) == "inactive"
    assert state(box, name).get("restarts_total", 0) == 0
    assert "liveness: restarting" not in box.journal(f"{name}.service")
    # Nor does the timer start a stopped model on its own (Requisite=).
    assert box.sh(f"systemctl start infer-units-liveness@{name}.timer", check=False).returncode != 0
    assert unit(box, name)["ActiveState"] == "inactive"


def test_hang_on_every_start_is_capped_and_left_failed(box) -> None:
    name, port = "lv-cap", 18205
    add_model(box, name, gpu_free(liveness_model(name, [], port, env={"FAKE_HANG_AFTER_S": "0.3"},
                                                 load=0.3, max_restarts=2)))
    box.sh("systemctl daemon-reload")
    started = time.monotonic()
    start(box, name)
    assert wait_until(lambda: unit(box, name)["ActiveState"] == "failed", 3 * restart_bound(0.3) + 20), \
        (unit(box, name), box.journal(name + ".service")[-3000:])
    took = time.monotonic() - started
    log = box.journal(f"{name}.service")
    assert log.count(f"liveness: restarting {name}.service") == 2, log[-4000:]
    cap = [l for l in log.splitlines()
           if l.startswith(f"liveness: stopping {name}.service and leaving it failed")]
    assert len(cap) == 1 and "2 liveness restarts within 1h is the cap" in cap[0]
    assert f"systemctl start {name}.service" in cap[0]
    u = unit(box, name)
    assert u["Result"] == "exit-code", u
    time.sleep(3)        # RestartSec is 1 s: Restart= must not bring it back
    assert unit(box, name)["ActiveState"] == "failed"
    assert timer_state(box, name) == "inactive"
    done = box.sh("INFER_UNITS_FAKE_GPUS=/etc/infer-units/fakegpus.json "
                  f"infer-units status --json {name}", check=False)
    assert done.returncode == 3, done.stderr       # status: 3 = a model is failed
    assert json.loads(done.stdout)["models"][0]["liveness"]["capped"]
    print(f"hang on every start: capped after 2 liveness restarts in {took:.1f}s")
    # The operator's start still works, with no reset-failed needed, and
    # liveness watches it again with a whole budget.
    start(box, name)
    assert unit(box, name)["ActiveState"] == "active"
    assert wait_until(lambda: timer_state(box, name) == "active", 5)
    box.sh(f"systemctl stop {name}")
    assert unit(box, name)["ActiveState"] == "inactive"


def test_interval_zero_turns_liveness_off(box) -> None:
    name = "lv-off"
    add_model(box, name, model_toml(name, [5], 18206) + '\n[liveness]\ninterval = "0"\n')
    box.sh("systemctl daemon-reload")
    # one generated file, no liveness drop-in or Wants=
    assert box.sh(f"ls /run/systemd/generator/ | grep -c '{name}'").stdout.strip() == "1"
    assert show(box, f"{name}.service", "Wants")["Wants"].find("liveness") < 0


def test_an_edit_before_daemon_reload_is_not_what_liveness_probes(box) -> None:
    """Liveness probed the port in the model file on disk: an edit waiting
    for its daemon-reload made it probe a port nobody listens on, restart a
    healthy server, then cap it and leave it stopped."""
    name, port = "lv-edit", 18207

    def text(port: int) -> str:
        return gpu_free(liveness_model(name, [], port))
    add_model(box, name, text(port))
    box.sh("systemctl daemon-reload")
    start(box, name)
    first = unit(box, name)
    add_model(box, name, text(port + 1))         # not reloaded
    seen = state(box, name).get("last_probe", {}).get("time", 0)
    # Probes after the edit (every INTERVAL): each one healthy, on the running port.
    assert wait_until(lambda: state(box, name).get("last_probe", {}).get("time", 0) > seen + 3,
                      30), state(box, name)
    s = state(box, name)
    assert s["url"] == f"http://127.0.0.1:{port}/health", s
    assert s["last_probe"]["ok"] and s.get("restarts_total", 0) == 0, s
    assert unit(box, name)["InvocationID"] == first["InvocationID"]
    box.sh(f"systemctl stop {name}; rm -f /etc/infer-units/{name}.toml; systemctl daemon-reload")


# The liveness state as the wall clock set by JUMP seconds leaves it, written
# under the probe's own lock: every wall-clock stamp as far off the new
# clock; the restarts, when the file says they are this boot's boot-clock
# stamps (a boot id), as they were (no clock setting moves that clock).
SHIFT = """import fcntl, json, os, sys
name, jump = sys.argv[1], float(sys.argv[2])
lock = os.open(f"/run/infer-units/{name}.liveness.lock", os.O_RDWR)
fcntl.flock(lock, fcntl.LOCK_EX)
path = f"/run/infer-units/{name}.liveness.json"
with open(path) as f:
    state = json.load(f)
for key in ("last_probe", "last_restart", "capped"):
    if isinstance(state.get(key), dict):
        state[key]["time"] -= jump
if "last_ok" in state:
    state["last_ok"] -= jump
if "boot_id" not in state:
    state["restarts"] = [t - jump for t in state.get("restarts", [])]
with open(path + ".new", "w") as f:
    json.dump(state, f)
os.rename(path + ".new", path)
"""


def _clock_jumped(box, name: str, jump_s: float) -> None:
    box.write("/usr/local/lib/lv-shift.py", SHIFT)
    box.sh(f"python3 /usr/local/lib/lv-shift.py {name} {jump_s!r}")


def _restarts_in_window(box, name: str) -> int:
    out = box.sh("INFER_UNITS_FAKE_GPUS=/etc/infer-units/fakegpus.json "
                 f"infer-units status --json {name}", check=False).stdout
    return int(json.loads(out)["models"][0]["liveness"]["restarts_in_window"])


def test_a_clock_set_forward_forgets_no_liveness_restart(box) -> None:
    """One liveness restart of one allowed within the hour, then the clock
    set an hour forward: the next hang is the cap (stopped, left failed),
    not a second restart."""
    name, port = "lv-clock-fwd", 18281
    add_model(box, name, gpu_free(liveness_model(name, [], port,
                                                 ["--hang-file", f"/run/{name}.hang"],
                                                 max_restarts=1)))
    box.sh("systemctl daemon-reload")
    try:
        start(box, name)
        _hang_and_come_back(box, name, port, "", 0)
        _clock_jumped(box, name, 3600.0)
        assert _restarts_in_window(box, name) == 1
        hang(box, name, "")
        assert wait_until(lambda: unit(box, name)["ActiveState"] == "failed",
                          restart_bound(0.5) + 10), box.journal(f"{name}.service")[-3000:]
        assert state(box, name)["restarts_total"] == 1 and state(box, name)["capped"]
    finally:
        box.sh(f"systemctl stop {name}; systemctl reset-failed {name}", check=False)


def test_a_clock_set_back_keeps_no_liveness_restart_past_its_window(box) -> None:
    """One liveness restart of one allowed within 8 s, then the clock set an
    hour back: once 8 s passed the restart is out of the window (status says
    so) and the next hang is restarted, not the cap."""
    name, port = "lv-clock-back", 18282
    add_model(box, name, gpu_free(liveness_model(name, [], port,
                                                 ["--hang-file", f"/run/{name}.hang"],
                                                 max_restarts=1, window="8s")))
    box.sh("systemctl daemon-reload")
    try:
        start(box, name)
        _hang_and_come_back(box, name, port, "", 0)
        _clock_jumped(box, name, -3600.0)
        assert wait_until(lambda: _restarts_in_window(box, name) == 0, 20), state(box, name)
        _hang_and_come_back(box, name, port, "", 1)
        assert unit(box, name)["ActiveState"] == "active"
    finally:
        box.sh(f"systemctl stop {name}; systemctl reset-failed {name}", check=False)
