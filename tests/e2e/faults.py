"""A seeded fault-injection campaign under real systemd: one fault at a random
moment of a start, a restart or a stop of a model, then the promise of
docs/architecture.md ("Faults") is checked once the unit has had its own
chance to recover, with no operator action:

  - the unit settles (no job left, not activating) within its own bounds:
    active and healthy, or failed with a reason `infer-units status` names,
    or inactive only where the fault was a stop;
  - nothing a dead hook left (claim lock, env file, liveness state) blocks
    the next start: `systemctl start` then succeeds;
  - nothing of the model survives its stop, and its GPU is free when
    `systemctl stop` returns.

Used by tests/e2e/test_faults_e2e.py (a few dozen faults per suite in CI)
and bench/fault_soak.py (thousands, with a summary table).  Each fault says
the seed that reproduces the whole run."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from ..support import wait_until
from .e2e_support import FAKE_TABLE, add_model, model_toml

NAME = "fault-m"
UNIT = f"{NAME}.service"
GPU = 1
PORT = 18601
LOAD_S = 0.6
# What settling may take after a fault: a start's whole bound ([ready]
# timeout 20s below, reap's 1s grace and 15s timeout) and RestartSec.
SETTLE_S = 90.0
# The model's metrics directory: root's, as the hooks require.
METRICS = "/var/lib/fault-metrics"

# What a process's command line holds, for tests/e2e/faults.py's finder in
# the container (a minbase Debian has no pgrep).
PRE_START = f"pre-start --unit {UNIT}"
WAIT_READY = f"wait-ready --url http://127.0.0.1:{PORT}/"
WAIT_FREE = f"wait-free --gpus {GPU} --unit {UNIT}"
SERVER = f"fake-engine --port {PORT}"
FINDER = "/usr/local/bin/fault-finder"
# fault-finder WAIT DELAY TEXT: the oldest process whose command line holds
# TEXT, waited for up to WAIT seconds; printed, and SIGKILLed DELAY seconds
# later unless DELAY is negative.  Exits 1 when none appeared.
FINDER_SOURCE = r"""#!/usr/bin/python3
import os, signal, sys, time
wait, delay, text = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3].encode()
me = os.getpid()
def find():
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # Not this finder, nor the shell that runs it: their command lines hold TEXT too.
        if text in cmdline and state[0] != b"Z" and b"fault-finder" not in cmdline:
            found.append((int(state[19]), int(entry)))
    return min(found)[1] if found else None
deadline = time.monotonic() + wait
pid = find()
while pid is None and time.monotonic() < deadline:
    time.sleep(0.005)
    pid = find()
if pid is None:
    sys.exit(1)
if delay >= 0:
    time.sleep(delay)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        sys.exit(1)
print(pid)
"""


@dataclass
class Outcome:
    fault: str
    hit: bool               # the fault happened (its process was there to kill)
    state: str              # active | failed | inactive | stuck
    reason: str = ""        # what status names for a failed unit
    leaked: list[str] = field(default_factory=list)
    silent: bool = False    # failed, and status names no reason
    recovered_start: bool = True
    journal: str = ""       # the unit's last lines, for a bad outcome


def install(box, enabled: bool = False) -> None:
    """The finder and the model; `enabled`: started at boot."""
    box.write(FINDER, FINDER_SOURCE, mode=0o755)
    box.sh(f"install -d -m 0755 {METRICS}")
    text = model_toml(NAME, [GPU], PORT, ready_timeout="20s", load=LOAD_S,
                      env={"INFER_UNITS_METRICS_DIR": METRICS})
    add_model(box, NAME, text + ('[install]\nWantedBy = "multi-user.target"\n' if enabled else ""))
    box.sh("systemctl daemon-reload")


def _kill_when(box, text: str, delay: float) -> str:
    """SIGKILL the oldest process whose command line holds `text`, `delay`
    seconds after it appears (within 20 s); what was killed, or ""."""
    return box.sh(f"{FINDER} 20 {delay:.3f} '{text}'", check=False, timeout=60).stdout.strip()


def _during_job(box, delay: float, command: str) -> bool:
    """Run `command` `delay` seconds on; whether the unit's job was still
    queued or running then (the fault landed inside the step)."""
    out = box.sh(f"sleep {delay:.3f}; systemctl list-jobs --no-legend {UNIT}; {command}",
                 check=False).stdout
    return bool(out.strip())


def _start_async(box) -> None:
    box.sh(f"systemctl start --no-block {UNIT}")


def _ensure_active(box) -> None:
    box.sh(f"systemctl start {UNIT}", check=False, timeout=120)


def _ensure_inactive(box) -> None:
    box.sh(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT} 2>/dev/null || true",
           check=False, timeout=120)


# Each fault: (name, is it about a stop, inject(box, rng)).
def _pre_start_killed(box, rng: random.Random) -> bool:
    _ensure_inactive(box)
    _start_async(box)
    return bool(_kill_when(box, PRE_START, rng.uniform(0.0, 0.3)))


def _wait_ready_killed(box, rng: random.Random) -> bool:
    _ensure_inactive(box)
    _start_async(box)
    return bool(_kill_when(box, WAIT_READY, rng.uniform(0.0, LOAD_S)))


def _wait_free_killed(box, rng: random.Random) -> bool:
    _ensure_active(box)
    box.sh(f"systemctl stop --no-block {UNIT}")
    return bool(_kill_when(box, WAIT_FREE, rng.uniform(0.0, 0.1)))


def _server_killed_loading(box, rng: random.Random) -> bool:
    _ensure_inactive(box)
    _start_async(box)
    return bool(_kill_when(box, SERVER, rng.uniform(0.0, LOAD_S * 0.8)))


def _server_killed_ready(box, rng: random.Random) -> bool:
    _ensure_active(box)
    return bool(_kill_when(box, SERVER, rng.uniform(0.0, 0.5)))


def _restart_killed_mid_reap(box, rng: random.Random) -> bool:
    _ensure_active(box)
    box.sh(f"systemctl restart --no-block {UNIT}")
    return bool(_kill_when(box, PRE_START, rng.uniform(0.0, 0.2)))


def _reload_during_start(box, rng: random.Random) -> bool:
    _ensure_inactive(box)
    _start_async(box)
    return _during_job(box, rng.uniform(0.0, 1.5), "systemctl daemon-reload")


def _reexec_during_start(box, rng: random.Random) -> bool:
    _ensure_inactive(box)
    _start_async(box)
    return _during_job(box, rng.uniform(0.0, 1.5), "systemctl daemon-reexec")


def _reload_during_stop(box, rng: random.Random) -> bool:
    _ensure_active(box)
    box.sh(f"systemctl stop --no-block {UNIT}")
    return _during_job(box, rng.uniform(0.0, 0.3), "systemctl daemon-reload")


def _stop_races_restart(box, rng: random.Random) -> bool:
    _ensure_active(box)
    first, second = ("restart", "stop") if rng.random() < 0.5 else ("stop", "restart")
    box.sh(f"systemctl {first} --no-block {UNIT}")
    return _during_job(box, rng.uniform(0.0, 0.5), f"systemctl {second} --no-block {UNIT}")


def _gpu_table_half_written(box, rng: random.Random) -> bool:
    """The GPU facts unreadable for a moment of a start (the fake table
    stands where NVML answers): cut in half, then put back."""
    table = FAKE_TABLE
    _ensure_inactive(box)
    _start_async(box)
    return _during_job(box, rng.uniform(0.0, 0.5),
                       f"cp {table} {table}.whole; head -c 40 {table}.whole > {table}.cut; "
                       f"mv {table}.cut {table}; sleep {rng.uniform(0.1, 1.5):.3f}; "
                       f"mv {table}.whole {table}")


def _full_during_start(box, rng: random.Random, directory: str, size: str) -> bool:
    """`directory` full during a start (a small tmpfs over it, filled), then
    as it was."""
    _ensure_inactive(box)
    _start_async(box)
    return _during_job(box, rng.uniform(0.0, 0.5),
                       f"mount -t tmpfs -o size={size},mode=0755 none {directory} && "
                       f"(cat /dev/zero > {directory}/filler 2>/dev/null; true) && "
                       f"sleep {rng.uniform(0.1, 1.5):.3f}; umount -l {directory}")


def _run_dir_full(box, rng: random.Random) -> bool:
    return _full_during_start(box, rng, "/run/infer-units", "64k")


def _gpu_facts_hang(box, rng: random.Random) -> bool:
    """The GPU facts do not answer for a while during a start, as NVML
    does for a GPU in trouble: a FIFO stands in the fake table's place, so
    a reader blocks in open() until the table is written into it."""
    table = FAKE_TABLE
    _ensure_inactive(box)
    _start_async(box)
    return _during_job(box, rng.uniform(0.0, 0.5),
                       f"cp {table} {table}.whole; rm -f {table}.fifo; mkfifo {table}.fifo; "
                       f"mv {table}.fifo {table}; sleep {rng.uniform(0.1, 6.0):.3f}; "
                       f"(timeout 2 sh -c 'cat {table}.whole > {table}' >/dev/null 2>&1 &); "
                       f"sleep 0.2; mv {table}.whole {table}")


def _metrics_dir_full(box, rng: random.Random) -> bool:
    """Metrics never fail a start."""
    return _full_during_start(box, rng, METRICS, "16k")


FAULTS: list[tuple[str, bool, Callable[..., bool]]] = [
    ("pre-start SIGKILLed during a start", False, _pre_start_killed),
    ("wait-ready SIGKILLed while the server loads", False, _wait_ready_killed),
    ("wait-free SIGKILLed during a stop", True, _wait_free_killed),
    ("server SIGKILLed while loading", False, _server_killed_loading),
    ("server SIGKILLed once ready", False, _server_killed_ready),
    ("pre-start SIGKILLed during a restart's reap", False, _restart_killed_mid_reap),
    ("daemon-reload during a start", False, _reload_during_start),
    ("daemon-reexec during a start", False, _reexec_during_start),
    ("daemon-reload during a stop", True, _reload_during_stop),
    ("stop and restart racing", True, _stop_races_restart),
    ("GPU facts half-written during a start", False, _gpu_table_half_written),
    ("/run/infer-units full during a start", False, _run_dir_full),
    ("GPU facts hanging during a start", False, _gpu_facts_hang),
    ("metrics directory full during a start", False, _metrics_dir_full),
]


def _settled(box) -> str | None:
    """The unit's state once no job is queued and it is not on its way
    somewhere (activating, deactivating, an automatic restart pending)."""
    out = box.sh(f"systemctl show -p ActiveState -p SubState {UNIT}; "
                 f"systemctl list-jobs --no-legend {UNIT}", check=False).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    jobs = [line for line in out.splitlines() if "=" not in line and line.strip()]
    state = values.get("ActiveState", "")
    if jobs or state not in ("active", "failed", "inactive"):
        return None
    return state


def _status_reason(box) -> tuple[int, str]:
    done = box.sh(f"infer-units status {NAME} --json", check=False)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return done.returncode, ""
    models = doc.get("models") or []
    model = models[0] if models and isinstance(models[0], dict) else {}
    text = " ".join(str(model.get(key) or "") for key in ("why", "note", "reason", "result"))
    return done.returncode, text.strip()


def _leaks(box) -> list[str]:
    """What of the model is left once `systemctl stop` returned."""
    leaked = []
    if box.sh(f"{FINDER} 0 -1 '{SERVER}'", check=False).stdout.strip():
        leaked.append("a server process outlived the stop")
    out = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units holders "
                 f"--json --gpus {GPU}", check=False).stdout
    try:
        holders = json.loads(out)["holders"]
    except (ValueError, KeyError):
        holders = []
    if holders:
        leaked.append(f"GPU {GPU} still held: {[h.get('pid') for h in holders]}")
    return leaked


def run_fault(box, rng: random.Random, index: int | None = None) -> Outcome:
    name, about_stop, inject = FAULTS[rng.randrange(len(FAULTS)) if index is None else index]
    hit = inject(box, rng)
    seen: list[str | None] = [None]

    def settled() -> bool:
        seen[0] = _settled(box)
        return seen[0] is not None
    wait_until(settled, SETTLE_S)
    state = seen[0]
    outcome = Outcome(name, hit, state or "stuck")
    if state == "failed":
        code, reason = _status_reason(box)
        outcome.reason = reason
        outcome.silent = code != 3 or not reason
    elif state == "inactive" and not about_stop:
        outcome.silent = True       # a start that ended as if nobody had asked for it
    # Whatever the fault left, the next start must not be blocked by it.
    started = box.sh(f"systemctl start {UNIT}", check=False, timeout=120)
    outcome.recovered_start = started.returncode == 0
    box.sh(f"systemctl stop {UNIT}", check=False, timeout=120)
    outcome.leaked = _leaks(box)
    if bad(outcome):
        outcome.journal = box.sh(f"journalctl -u {UNIT} -n 60 -o short-monotonic --no-pager",
                                 check=False).stdout
    box.sh(f"systemctl reset-failed {UNIT} 2>/dev/null || true", check=False)
    return outcome


def campaign(box, seed: int, count: int) -> list[Outcome]:
    """`count` faults drawn with `seed`; every kind at least once when
    `count` allows (the first len(FAULTS) in order, then drawn)."""
    rng = random.Random(seed)
    install(box)
    outcomes = []
    for i in range(count):
        outcomes.append(run_fault(box, rng, i if i < len(FAULTS) else None))
    return outcomes


def bad(outcome: Outcome) -> bool:
    return (outcome.state == "stuck" or outcome.silent or bool(outcome.leaked)
            or not outcome.recovered_start)


def summary(outcomes: list[Outcome]) -> str:
    rows = ["| fault | injected | landed in its step | recovered | failed with a reason | stuck "
            "| silent | leaked | next start blocked |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, _stop, _inject in FAULTS:
        mine = [o for o in outcomes if o.fault == name]
        if not mine:
            continue
        rows.append(f"| {name} | {len(mine)} | {sum(o.hit for o in mine)} | "
                    f"{sum(o.state in ('active', 'inactive') and not o.silent for o in mine)} | "
                    f"{sum(o.state == 'failed' and not o.silent for o in mine)} | "
                    f"{sum(o.state == 'stuck' for o in mine)} | {sum(o.silent for o in mine)} | "
                    f"{sum(bool(o.leaked) for o in mine)} | "
                    f"{sum(not o.recovered_start for o in mine)} |")
    return "\n".join(rows)
