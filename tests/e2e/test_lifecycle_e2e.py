"""A unit's life against servers that behave as the real ones did (docs/engines.md,
"What each does on SIGTERM"), under real systemd: a stop or restart while the
server loads (vLLM ignores SIGTERM part of the way through), a server that
exits 0 by itself (vLLM's API server when EngineCore dies), an operator's
quick restarts, a port bound but not listening yet, the file-descriptor limit."""

from __future__ import annotations

import json
import time

import pytest

from .e2e_support import add_model, alive, engine_toml, health_status, holders, show, wait_until

pytestmark = pytest.mark.e2e

GPU = [4]
STATE = ("ActiveState", "SubState", "Result", "MainPID", "NRestarts")


def state(box, name: str) -> dict[str, str]:
    return show(box, f"{name}.service", *STATE)


def start_loading(box, name: str) -> str:
    """Start without waiting; return once wait-ready runs (the server loads)."""
    box.sh(f"systemctl daemon-reload && systemctl reset-failed {name} 2>/dev/null; "
           f"systemctl start --no-block {name}")
    assert wait_until(lambda: state(box, name)["SubState"] == "start-post", 20, 0.05), \
        state(box, name)
    return state(box, name)["MainPID"]


def timed(box, script: str) -> float:
    started = time.monotonic()
    box.sh(script)
    return time.monotonic() - started


def loading_model(box, name: str, engine: str, port: int, load: float, **env: str) -> None:
    add_model(box, name, engine_toml(name, engine, GPU, port,
                                     env={"FAKE_LOAD_S": str(load), **env},
                                     extra='[stop]\ntimeout = "40s"'))


@pytest.mark.parametrize("engine,env", [
    # vLLM 0.32 ignored SIGTERM 20-25 s into its load and went on to serve
    ("vllm", {"FAKE_IGNORE_TERM_FROM_S": "0"}),
    ("llamacpp", {}),                      # dies at SIGTERM while loading
])
def test_stop_while_loading_ends_inactive_within_seconds(box, engine: str, env) -> None:
    name = f"lc-stop-{engine}"
    loading_model(box, name, engine, 18301, 120, **env)
    pid = start_loading(box, name)
    if engine == "vllm":      # past the point where it stops listening to SIGTERM
        assert wait_until(lambda: "SIGTERM is ignored" in box.journal(f"{name}.service"), 20)
    took = timed(box, f"systemctl stop {name}")
    props = state(box, name)
    log = box.journal(f"{name}.service")
    assert props["ActiveState"] == "inactive" and props["Result"] == "success", (props, log[-3000:])
    assert took < 5, f"stop while loading took {took:.1f}s (TimeoutStopSec is 55s)"
    assert not alive(box, int(pid)) and holders(box, "4") == []
    if engine == "vllm":
        assert f"killing the server pid {pid}" in log, log[-3000:]
    print(f"{engine}: stop while loading {took:.2f}s")


def test_restart_while_loading_starts_again(box) -> None:
    name = "lc-restart"
    loading_model(box, name, "vllm", 18302, 3, FAKE_IGNORE_TERM_FROM_S="0")
    old = start_loading(box, name)
    assert wait_until(lambda: "SIGTERM is ignored" in box.journal(f"{name}.service"), 20)
    took = timed(box, f"systemctl restart {name}")
    props = state(box, name)
    assert props["ActiveState"] == "active" and props["MainPID"] != old, props
    log = box.journal(f"{name}.service")
    assert "Failed with result" not in log and f"killing the server pid {old}" in log, log[-3000:]
    assert not alive(box, int(old))
    assert took < 3 + 5, f"restart while loading took {took:.1f}s (a 3 s load)"
    box.sh(f"systemctl stop {name}")
    print(f"restart while loading: {took:.2f}s, 3 s of it the new load")


def test_a_ready_server_gets_its_drain_window(box) -> None:
    name = "lc-drain"
    loading_model(box, name, "vllm", 18303, 0.5, FAKE_DRAIN_S="2")
    box.sh(f"systemctl daemon-reload && systemctl start {name}")
    took = timed(box, f"systemctl stop {name}")
    log = box.journal(f"{name}.service")
    assert took >= 2, f"stopped after {took:.1f}s: the 2 s drain was cut short"
    assert state(box, name)["Result"] == "success"
    # it drained and exited: nothing SIGKILLed it
    assert "killing the server" not in log and "code=killed" not in log, log[-3000:]


def test_a_server_that_exits_0_by_itself_is_restarted(box) -> None:
    name = "lc-exit0"
    loading_model(box, name, "vllm", 18304, 0.5)
    box.sh(f"systemctl daemon-reload && systemctl start {name}")
    old = state(box, name)["MainPID"]
    # vLLM's EngineCore dies: its API server exits 0
    core = box.sh("python3 -c \"import os; print(*[p for p in os.listdir('/proc') if p.isdigit() "
                  f"and open('/proc/' + p + '/stat').read().rsplit(')', 1)[1].split()[1] == '{old}'])\"").stdout.split()[0]
    box.sh(f"kill -KILL {core}")
    assert wait_until(lambda: state(box, name)["ActiveState"] == "active"
                      and state(box, name)["MainPID"] not in (old, "0"), 20), state(box, name)
    assert state(box, name)["NRestarts"] == "1"
    # systemctl stop still ends it for good: no restart is scheduled
    box.sh(f"systemctl stop {name}")
    props = state(box, name)
    assert (props["ActiveState"], props["SubState"]) == ("inactive", "dead"), props


def test_manual_restarts_never_hit_the_start_limit(box) -> None:
    """An operator's six `systemctl restart`s within a minute (seven starts)
    leave the model active, and a crash after them is restarted (crash loops
    back off instead of hitting a start limit: tests/e2e/test_backoff_e2e.py)."""
    name = "lc-manual"
    add_model(box, name, engine_toml(name, "llamacpp", GPU, 18307, env={"FAKE_LOAD_S": "0.2"}))
    box.sh(f"systemctl daemon-reload && systemctl reset-failed {name} 2>/dev/null; "
           f"systemctl start {name}")
    started = time.monotonic()
    pids = {state(box, name)["MainPID"]}
    for i in range(6):
        done = box.sh(f"systemctl restart {name}", check=False)
        props = state(box, name)
        assert done.returncode == 0 and props["ActiveState"] == "active", \
            (i + 1, done.stderr, props, box.journal(f"{name}.service")[-2000:])
        pids.add(props["MainPID"])
    assert time.monotonic() - started < 60, "the restarts must fall within StartLimitIntervalSec"
    assert len(pids) == 7 and state(box, name)["NRestarts"] == "0", (pids, state(box, name))
    assert "repeated too quickly" not in box.journal(f"{name}.service")
    # A crash after them is still restarted (the limit was not spent by the operator).
    old = state(box, name)["MainPID"]
    box.sh(f"kill -KILL {old}")
    assert wait_until(lambda: state(box, name)["ActiveState"] == "active"
                      and state(box, name)["MainPID"] not in (old, "0"), 20), state(box, name)
    assert state(box, name)["NRestarts"] == "1"
    # pre-start asks through facts/systemd.py (pystemd, the private socket
    # as root): the same answer, from this systemd.
    ask = ("import sys; sys.path.append('/usr/lib/python3/dist-packages'); "
           "from infer_units.helpers.facts import systemd; "
           "print(systemd.restarts_since_asked(sys.argv[1]))")
    asked = box.sh(f'python3 -IS -c "{ask}" {name}.service')
    assert asked.stdout.strip() == "1", (asked.stdout, asked.stderr)
    box.sh(f"systemctl stop {name}")


def test_a_port_bound_but_not_listening_is_taken_and_named(box) -> None:
    name = "lc-port"
    port = 18306
    add_model(box, name, engine_toml(name, "llamacpp", GPU, port, env={"FAKE_LOAD_S": "0.2"}))
    # bound as vLLM binds it (SO_REUSEADDR), not listening
    box.sh("systemd-run --unit=lc-binder /usr/bin/python3 -c 'import socket, time; "
           "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
           f"s.bind((\"0.0.0.0\", {port})); time.sleep(3600)'")
    binder = show(box, "lc-binder.service", "MainPID")["MainPID"]
    box.sh(f"systemctl daemon-reload && systemctl start --no-block {name}")
    assert wait_until(lambda: "bound, not listening yet" in box.journal(f"{name}.service"), 20), \
        box.journal(f"{name}.service")[-2000:]
    log = box.journal(f"{name}.service")
    assert f"port {port} held by pid {binder}" in log, log[-2000:]
    assert state(box, name)["ActiveState"] == "activating"
    box.sh("systemctl stop lc-binder")
    assert wait_until(lambda: state(box, name)["ActiveState"] == "active", 20), state(box, name)
    box.sh(f"systemctl stop {name}")


def test_servers_get_a_file_descriptor_limit(box) -> None:
    name = "lc-nofile"
    add_model(box, name, engine_toml(name, "llamacpp", GPU, 18307, env={"FAKE_LOAD_S": "0.2"}))
    box.sh(f"systemctl daemon-reload && systemctl start {name}")
    pid = state(box, name)["MainPID"]

    def open_files(path: str) -> tuple[int, int]:
        line = [l for l in box.sh(f"cat {path}").stdout.splitlines()
                if l.startswith("Max open files")][0].split()
        return int(line[3]), int(line[4])

    _soft, cap = open_files("/proc/1/limits")     # what this machine lets systemd give
    assert open_files(f"/proc/{pid}/limits") == (min(65535, cap), min(524288, cap))
    box.sh(f"systemctl stop {name}")


def liveness_model(box, name: str, port: int, args: tuple[str, ...] = (), **env: str) -> None:
    add_model(box, name, engine_toml(name, "vllm", GPU, port, env={"FAKE_LOAD_S": "0.3", **env},
                                     extra=f"args = {json.dumps(list(args))}\n"
                                           '[liveness]\ninterval = "1s"\nfailures = 2\n'
                                           'timeout = "2s"'))


def test_generation_probe_restarts_a_wedged_engine_whose_health_says_200(box) -> None:
    name = "lc-wedged"
    liveness_model(box, name, 18308)
    box.sh(f"systemctl daemon-reload && systemctl start {name}")
    old = state(box, name)["MainPID"]
    core = box.sh("python3 -c \"import os; print(*[p for p in os.listdir('/proc') if p.isdigit() "
                  f"and open('/proc/' + p + '/stat').read().rsplit(')', 1)[1].split()[1] == '{old}'])\"").stdout.split()[0]
    box.sh(f"kill -STOP {core}")        # the engine hangs; /health still answers 200
    assert health_status(box, 18308) == "200"
    assert wait_until(lambda: state(box, name)["ActiveState"] == "active"
                      and state(box, name)["MainPID"] not in (old, "0"), 40), state(box, name)
    log = box.journal(f"{name}.service")
    assert "one-token generations in a row failed" in log, log[-3000:]
    box.sh(f"systemctl stop {name}")


def test_generation_probe_spares_a_slow_but_working_server(box) -> None:
    name = "lc-slow"
    # Under the 2 s timeout; served under another name, as real vLLM answers
    # 404 for a name it does not serve: the probe must ask for this one.
    liveness_model(box, name, 18309, ("--served-model-name", "slow-alias"), FAKE_GENERATE_S="1.2")
    box.sh(f"systemctl daemon-reload && systemctl start {name}")
    pid = state(box, name)["MainPID"]
    seen: dict[float, dict] = {}

    def probes() -> int:     # the probe's own record of each run (helpers/act/liveness.py)
        out = box.sh(f"cat /run/infer-units/{name}.liveness.json 2>/dev/null || true").stdout
        if out.strip():
            last = json.loads(out)["last_probe"]
            seen[last["time"]] = last
        return len(seen)

    assert wait_until(lambda: probes() >= 4, 40), seen
    assert all(p["ok"] and p["seconds"] >= 1.2 for p in seen.values()), seen
    assert state(box, name)["MainPID"] == pid and state(box, name)["NRestarts"] == "0"
    assert "in a row failed" not in box.journal(f"{name}.service")
    box.sh(f"systemctl stop {name}")


def test_stop_while_the_start_checks_wait_ends_inactive(box) -> None:
    name = "lc-prestop"
    port = 18310
    add_model(box, name, engine_toml(name, "llamacpp", GPU, port, env={"FAKE_LOAD_S": "0.2"}))
    box.sh("systemd-run --unit=lc-binder2 /usr/bin/python3 -c 'import socket, time; "
           f"s = socket.socket(); s.bind((\"0.0.0.0\", {port})); time.sleep(3600)'")
    box.sh(f"systemctl daemon-reload && systemctl reset-failed {name} 2>/dev/null; "
           f"systemctl start --no-block {name}")
    assert wait_until(lambda: f"port {port} held by" in box.journal(f"{name}.service"), 20)
    took = timed(box, f"systemctl stop {name}")     # pre-start gets the stop's SIGTERM
    props = state(box, name)
    assert (props["ActiveState"], props["Result"]) == ("inactive", "success"), props
    assert took < 5, f"stop during the start checks took {took:.1f}s"
    box.sh("systemctl stop lc-binder2")
