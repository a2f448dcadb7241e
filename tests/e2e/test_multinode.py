"""One model across three hosts under real systemd: three booted containers on
a private network, the same model file on each, the fake SGLang doing a real
TCP rendezvous like torch.distributed (rank 0 serves HTTP only once every
rank joined; a rank that loses its peer hangs; nobody rejoins a running
group).  Nobody touches the workers: the units bring the group back."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from .e2e_support import FAKE_TABLE, FAKES, show, wait_until
from .multihost import HOSTS, Group

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
HEAD, WORKERS = "gpu-a", ("gpu-b", "gpu-c")
LOAD_S = 1.0

MODEL = f"""engine = "sglang"
model = "/models/big"
gpus = [0, 1]
port = 18500
host = "0.0.0.0"
python = "{FAKES['fake-python']}"

[nodes]
hosts = {json.dumps(list(HOSTS))}

[env]
INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"
FAKE_LOAD_S = "{LOAD_S}"
FAKE_WARMUP_S = "0"
FAKE_HEALTH_S = "0.2"
FAKE_JOIN_TIMEOUT_S = "20"

[reap]
term-grace = "1s"
timeout = "10s"

[ready]
timeout = "120s"
interval = "200ms"

[liveness]
interval = "1s"
failures = 2
timeout = "2s"
max-restarts = 20

[service]
RestartSec = "1s"
"""


@pytest.fixture(scope="module")
def group(deb: Path):
    if os.environ.get("INFER_UNITS_E2E_MULTINODE", "1") == "0":
        pytest.skip("INFER_UNITS_E2E_MULTINODE=0")
    g = Group()
    try:
        g.boot(deb, ROOT)
        for name in HOSTS:
            g[name].write("/etc/infer-units/big.toml", MODEL)
            g[name].sh("systemctl daemon-reload")
        yield g
    finally:
        g.shutdown()


def state(g: Group, name: str) -> dict[str, str]:
    return show(g[name], "big.service", "ActiveState", "SubState", "MainPID", "NRestarts")


def head_healthy(g: Group) -> bool:
    out = g[HEAD].sh("python3 -c \"import urllib.request as u; "
                     "print(u.urlopen('http://127.0.0.1:18500/health', timeout=3).status)\"",
                     check=False)
    return out.stdout.strip() == "200"


def group_up(g: Group) -> bool:
    return head_healthy(g) and all(state(g, n)["ActiveState"] == "active" for n in HOSTS)


def wait_for(predicate, timeout: float) -> float:
    """Seconds until `predicate` held; fails after `timeout`."""
    started = time.monotonic()
    assert wait_until(predicate, timeout), f"not within {timeout}s"
    return time.monotonic() - started


def engines_on(g: Group, name: str) -> int:
    out = g[name].sh("pgrep -fc 'fake-python -m sglang' || true").stdout.strip()
    return int(out or 0)


def test_workers_started_first_park_then_the_group_forms(group: Group) -> None:
    for name in WORKERS:
        group[name].sh("systemctl start --no-block big")
    time.sleep(3)
    for name in WORKERS:
        assert state(group, name)["SubState"] == "start-pre", state(group, name)
        assert engines_on(group, name) == 0, "a worker started its engine without a head"
        assert "parked until the head forms a group" in group[name].journal("big.service")
    group[HEAD].sh("systemctl start --no-block big")
    took = wait_for(lambda: group_up(group), 60)
    print(f"group of 3 healthy {took:.1f}s after the head's start")
    status = json.loads(group[WORKERS[0]].sh(
        f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units status --json big").stdout)
    [model] = status["models"]
    assert model["nodes"] == {"rank": 1, "hosts": list(HOSTS), "head": HEAD,
                              "group": "healthy"}, model["nodes"]


def test_head_restart_brings_the_whole_group_back(group: Group) -> None:
    before = {n: state(group, n)["MainPID"] for n in HOSTS}
    started = time.monotonic()
    group[HEAD].sh("systemctl restart big")
    took = wait_for(lambda: group_up(group) and all(
        state(group, n)["MainPID"] != before[n] for n in WORKERS), 90)
    took = time.monotonic() - started
    print(f"head restart -> group of 3 healthy again in {took:.1f}s "
          f"(fake load {LOAD_S:g}s; liveness 2 x 1s)")
    assert took < LOAD_S + 10 + 2 * 1 + 5, took
    for name in WORKERS:
        assert "liveness" in group[name].journal("big.service").lower()


def test_kill_9_of_a_worker_recovers_the_group(group: Group) -> None:
    victim = WORKERS[1]
    pid = state(group, victim)["MainPID"]
    started = time.monotonic()
    group[victim].sh(f"kill -9 {pid}")
    # systemd saw the death (its MainPID is no longer the killed one), then the
    # group is healthy with the victim back: a new server, running.
    wait_for(lambda: state(group, victim)["MainPID"] != pid, 30)

    def back() -> bool:
        now = state(group, victim)
        return (now["MainPID"] not in (pid, "0") and now["SubState"] == "running"
                and group_up(group))
    wait_for(back, 120)
    new = state(group, victim)["MainPID"]
    assert group[victim].sh(f"kill -0 {new}", check=False).returncode == 0, new
    print(f"kill -9 of a worker -> group healthy again in {time.monotonic() - started:.1f}s")


def test_stopping_the_head_parks_the_workers(group: Group) -> None:
    group[HEAD].sh("systemctl stop big")
    for name in WORKERS:
        wait_for(lambda: state(group, name)["SubState"] == "start-pre", 30)
    restarts = {n: state(group, n)["NRestarts"] for n in WORKERS}
    time.sleep(5)
    for name in WORKERS:
        # parked: no engine, no restart loop
        assert state(group, name)["SubState"] == "start-pre"
        assert state(group, name)["NRestarts"] == restarts[name]
        assert engines_on(group, name) == 0
    group[HEAD].sh("systemctl start --no-block big")
    wait_for(lambda: group_up(group), 60)
