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
    `systemctl stop` returns;
  - what a kind promises beyond that (Fault.expect): a killed liveness
    probe or group watch is followed by the next one while the model stays
    active; a start without the model's GPU is refused naming it; a GPU that
    is not the model's going away does not stop it.

Used by tests/e2e/test_faults_e2e.py (a few dozen faults per suite in CI)
and bench/fault_soak.py (thousands, with a summary table).  Each fault says
the seed that reproduces the whole run."""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from ..support import wait_until
from .e2e_support import FAKE_TABLE, FAKES, add_model, fake_gpu_table, model_toml

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
# Liveness probes this often, so that probes run through every fault, each
# answered this slowly, so that a kill can land inside one (a probe of an
# instant answer is over before the finder has seen it).
LIVENESS_S = 1.0
HEALTH_S = 0.15
# A multi-node head (an [nodes] model) whose group watch the group-watch kind
# kills: its other rank is a joiner in the box (GROUP_JOINER), its other
# host's name has no address here, so the watch runs and counts no one missing.
GROUP_NAME = "fault-g"
GROUP_UNIT = f"{GROUP_NAME}.service"
GROUP_GPU = 2
GROUP_PORT = 18602
GROUP_RENDEZVOUS = 29511

# What a process's command line holds, for tests/e2e/faults.py's finder in
# the container (a minbase Debian has no pgrep).
PRE_START = f"pre-start --unit {UNIT}"
WAIT_READY = f"wait-ready --url http://127.0.0.1:{PORT}/"
WAIT_FREE = f"wait-free --gpus {GPU} --unit {UNIT}"
SERVER = f"fake-engine --port {PORT}"
PROBE = f"liveness-probe --unit {UNIT}"
GROUP_WATCH = f"group-watch --unit {GROUP_UNIT}"
GROUP_SERVER = f"--port {GROUP_PORT}"
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


# The group's rank 1: joins the head's rendezvous as torch.distributed would
# (tests/e2e/fake_engine.py's Group), holds the connection while the head
# lives, joins again after.
GROUP_JOINER = f"""import socket, time
while True:
    try:
        conn = socket.create_connection(("127.0.0.1", {GROUP_RENDEZVOUS}), timeout=2)
        conn.sendall(b"rank 1\\n")
        conn.settimeout(None)
        while conn.recv(1024):
            pass
    except OSError:
        pass
    time.sleep(0.2)
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
    broken: str = ""        # what the kind's own promise (Fault.expect) found wrong
    journal: str = ""       # the unit's last lines, for a bad outcome


def install(box, enabled: bool = False) -> None:
    """The finder and the models; `enabled`: the first started at boot."""
    box.write(FINDER, FINDER_SOURCE, mode=0o755)
    box.sh(f"install -d -m 0755 {METRICS}")
    text = model_toml(NAME, [GPU], PORT, ready_timeout="20s", load=LOAD_S,
                      env={"INFER_UNITS_METRICS_DIR": METRICS, "FAKE_HEALTH_S": str(HEALTH_S)})
    text += f'\n[liveness]\ninterval = "{LIVENESS_S:g}s"\n'
    add_model(box, NAME, text + ('[install]\nWantedBy = "multi-user.target"\n' if enabled else ""))
    add_model(box, GROUP_NAME, group_toml())
    box.write("/usr/local/lib/fault-joiner.py", GROUP_JOINER)
    table = json.loads(fake_gpu_table())
    box.write(f"{FAKE_TABLE}.intact", json.dumps(table))
    for gone in (GPU, OTHER_GPU):
        box.write(f"{FAKE_TABLE}.without{gone}", json.dumps(
            {**table, "gpus": [g for g in table["gpus"] if g["index"] != gone]}))
    box.sh("systemctl daemon-reload")


def group_toml() -> str:
    return f"""engine = "sglang"
model = "/models/{GROUP_NAME}"
gpus = [{GROUP_GPU}]
port = {GROUP_PORT}
host = "0.0.0.0"
python = "{FAKES['fake-python']}"

[nodes]
hosts = ["fault-head.invalid", "fault-peer.invalid"]
rank = 0
addr = "127.0.0.1:{GROUP_RENDEZVOUS}"

[env]
INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"
FAKE_LOAD_S = "0.3"
FAKE_WARMUP_S = "0"
FAKE_HEALTH_S = "0"
FAKE_JOIN_TIMEOUT_S = "20"

[reap]
term-grace = "1s"
timeout = "15s"

[ready]
timeout = "20s"
interval = "100ms"

[service]
RestartSec = "1s"
"""


def uninstall(box) -> None:
    _restore_table(box)
    box.sh(f"systemctl stop {UNIT} {GROUP_UNIT} fault-joiner; "
           f"rm -f /etc/infer-units/{NAME}.toml /etc/infer-units/{GROUP_NAME}.toml; "
           f"systemctl daemon-reload; systemctl reset-failed {UNIT} {GROUP_UNIT} || true",
           check=False, timeout=120)


# Where a kill leaves its victim's pid and the box's clock after it, for
# the kind's own check.
KILLED_PID = "/run/fault-killed.pid"
KILLED_AT = "/run/fault-killed.at"


def _killed_at(box, text: str, delay: float) -> bool:
    """_kill_when, remembering what was killed and when."""
    killed = box.sh(f"{FINDER} 20 {delay:.3f} '{text}' > {KILLED_PID}; rc=$?; "
                    f"date +%s.%N > {KILLED_AT}; cat {KILLED_PID}; exit $rc",
                    check=False, timeout=60).stdout.strip()
    return bool(killed)


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


@dataclass(frozen=True)
class Target:
    """A model the checks of a kind are about."""
    name: str
    gpu: int
    server: str         # what its server's command line holds

    @property
    def unit(self) -> str:
        return f"{self.name}.service"


MAIN = Target(NAME, GPU, SERVER)
GROUP = Target(GROUP_NAME, GROUP_GPU, GROUP_SERVER)
OTHER_GPU = 0           # neither model's


# Each fault: inject(box, rng) -> whether it landed in its step.
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
    # The writer holds the FIFO open for a second after its table: a reader
    # that opened the FIFO just before the table went back still finds a
    # writer (the table, or an end of file), never a FIFO left without one,
    # which no GPU call ever is (that one waits for the start's bound).
    return _during_job(box, rng.uniform(0.0, 0.5),
                       f"cp {table} {table}.whole; rm -f {table}.fifo; mkfifo {table}.fifo; "
                       f"mv {table}.fifo {table}; sleep {rng.uniform(0.1, 6.0):.3f}; "
                       f"(timeout 4 sh -c 'exec 3>{table}; cat {table}.whole >&3; sleep 1' "
                       f">/dev/null 2>&1 &); sleep 0.2; mv {table}.whole {table}")


def _metrics_dir_full(box, rng: random.Random) -> bool:
    """Metrics never fail a start."""
    return _full_during_start(box, rng, METRICS, "16k")


def _probe_killed(box, rng: random.Random) -> bool:
    """The liveness probe SIGKILLed at a random moment of its run (its
    start, its HTTP probe, its decision and save)."""
    _ensure_active(box)
    return _killed_at(box, PROBE, rng.uniform(0.0, HEALTH_S + 0.1))


def _group_watch_killed(box, rng: random.Random) -> bool:
    """The group watch SIGKILLed at a random moment of its life: its start,
    a look at the connections, the sleep between two."""
    box.sh("systemctl is-active -q fault-joiner || systemd-run --unit fault-joiner "
           "-p Restart=always -p RestartSec=200ms /usr/bin/python3 /usr/local/lib/fault-joiner.py",
           check=False)
    box.sh(f"systemctl start {GROUP_UNIT}", check=False, timeout=120)
    return _killed_at(box, GROUP_WATCH, rng.uniform(0.0, 2.5))


def _swap_table(name: str) -> str:
    """The shell that puts the fake table `name` in place of the GPU facts
    at once (a new file renamed over it: a reader sees one or the other)."""
    return f"cp {FAKE_TABLE}.{name} {FAKE_TABLE}.swap && mv {FAKE_TABLE}.swap {FAKE_TABLE}"


def _restore_table(box) -> None:
    box.sh(_swap_table("intact"), check=False)


def _gpu_gone_before_start(box, rng: random.Random) -> bool:
    """The model's GPU fell off the bus between a stop and a start: the GPU
    facts no longer list it."""
    _ensure_inactive(box)
    box.sh(_swap_table(f"without{GPU}"))
    box.sh(f"systemctl start {UNIT}", check=False, timeout=120)
    return True


def _gpu_gone_during_start(box, rng: random.Random) -> bool:
    """The model's GPU gone from the GPU facts at a random moment of a
    start, back a moment later (a GPU that fell off and was rescanned)."""
    _ensure_inactive(box)
    _start_async(box)
    return _during_job(box, rng.uniform(0.0, 1.0),
                       f"{_swap_table(f'without{GPU}')}; sleep {rng.uniform(0.1, 1.5):.3f}; "
                       f"{_swap_table('intact')}")


def _other_gpu_gone_during_start(box, rng: random.Random) -> bool:
    """A GPU that is not the model's gone at a random moment of its start."""
    _ensure_inactive(box)
    _start_async(box)
    return _during_job(box, rng.uniform(0.0, 1.0), _swap_table(f"without{OTHER_GPU}"))


def _gpu_gone_during_stop(box, rng: random.Random) -> bool:
    """The model's GPU gone at a random moment of its stop."""
    _ensure_active(box)
    box.sh(f"systemctl stop --no-block {UNIT}")
    return _during_job(box, rng.uniform(0.0, 0.3), _swap_table(f"without{GPU}"))


# What a kind promises beyond the common checks: "" when kept, else what is wrong.
def _probed_again(box, outcome: Outcome) -> str:
    """A killed probe is not the end of liveness: the timer starts the next
    one (OnUnitInactiveSec counts from the failed run too) while the model
    stays active, and that one saves its probe."""
    if outcome.state != "active":
        return f"the model is {outcome.state} after its probe was killed"

    killed_at = float(box.sh(f"cat {KILLED_AT}", check=False).stdout.strip() or "0")

    def probed() -> bool:
        text = box.sh(f"cat /run/infer-units/{NAME}.liveness.json", check=False).stdout
        try:
            return float(json.loads(text)["last_probe"]["time"]) > killed_at
        except (ValueError, KeyError, TypeError):
            return False
    if not wait_until(probed, LIVENESS_S * 3 + 15):
        return "no probe ran after the killed one: the model is not supervised"
    return ""


def _watched_again(box, outcome: Outcome) -> str:
    """systemd restarts a killed group watch (Restart=on-failure) while the
    model stays active."""
    if outcome.state != "active":
        return f"the model is {outcome.state} after its group watch was killed"
    killed = box.sh(f"cat {KILLED_PID}", check=False).stdout.strip()

    def watching() -> bool:
        now = box.sh(f"{FINDER} 0 -1 '{GROUP_WATCH}'", check=False).stdout.strip()
        return bool(now) and now != killed
    if not wait_until(watching, 15):
        return "the group watch was not restarted after its kill"
    return ""


def _refused_naming_the_gpu(box, outcome: Outcome) -> str:
    if outcome.state != "failed":
        return f"a start without GPU {GPU} ended {outcome.state}, not refused"
    if f"GPU '{GPU}'" not in outcome.reason and f"GPU {GPU}" not in outcome.reason:
        return f"the refusal does not name GPU {GPU}: {outcome.reason!r}"
    return ""


def _serving(box, outcome: Outcome) -> str:
    return "" if outcome.state == "active" else \
        f"the model's GPU is intact but the start ended {outcome.state}"


def _nothing_survived(box, outcome: Outcome) -> str:
    if outcome.state == "active":
        return ""
    left = box.sh(f"{FINDER} 0 -1 '{SERVER}'", check=False).stdout.strip()
    return f"server {left} outlived the stop" if left else ""


@dataclass(frozen=True)
class Fault:
    name: str
    about_stop: bool        # inactive is the right end
    inject: Callable[..., bool]
    target: Target = MAIN
    expect: Callable[..., str] | None = None   # after settling
    restore: Callable[..., None] | None = None  # after `expect`, before the next start


FAULTS: list[Fault] = [
    Fault("pre-start SIGKILLed during a start", False, _pre_start_killed),
    Fault("wait-ready SIGKILLed while the server loads", False, _wait_ready_killed),
    Fault("wait-free SIGKILLed during a stop", True, _wait_free_killed),
    Fault("server SIGKILLed while loading", False, _server_killed_loading),
    Fault("server SIGKILLed once ready", False, _server_killed_ready),
    Fault("pre-start SIGKILLed during a restart's reap", False, _restart_killed_mid_reap),
    Fault("daemon-reload during a start", False, _reload_during_start),
    Fault("daemon-reexec during a start", False, _reexec_during_start),
    Fault("daemon-reload during a stop", True, _reload_during_stop),
    Fault("stop and restart racing", True, _stop_races_restart),
    Fault("GPU facts half-written during a start", False, _gpu_table_half_written),
    Fault("/run/infer-units full during a start", False, _run_dir_full),
    Fault("GPU facts hanging during a start", False, _gpu_facts_hang),
    Fault("metrics directory full during a start", False, _metrics_dir_full),
    Fault("liveness probe SIGKILLed", False, _probe_killed, expect=_probed_again),
    Fault("group watch SIGKILLed", False, _group_watch_killed, GROUP, _watched_again),
    Fault("the model's GPU gone before a start", False, _gpu_gone_before_start,
          expect=_refused_naming_the_gpu, restore=_restore_table),
    Fault("the model's GPU gone during a start", False, _gpu_gone_during_start),
    Fault("another GPU gone during a start", False, _other_gpu_gone_during_start,
          expect=_serving, restore=_restore_table),
    Fault("the model's GPU gone during a stop", True, _gpu_gone_during_stop,
          expect=_nothing_survived, restore=_restore_table),
]


def _settled(box, unit: str) -> str | None:
    """The unit's state once no job is queued and it is not on its way
    somewhere (activating, deactivating, an automatic restart pending)."""
    out = box.sh(f"systemctl show -p ActiveState -p SubState {unit}; "
                 f"systemctl list-jobs --no-legend {unit}", check=False).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    jobs = [line for line in out.splitlines() if "=" not in line and line.strip()]
    state = values.get("ActiveState", "")
    if jobs or state not in ("active", "failed", "inactive"):
        return None
    return state


def _status_reason(box, name: str) -> tuple[int, str]:
    done = box.sh(f"infer-units status {name} --json", check=False)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return done.returncode, ""
    models = doc.get("models") or []
    model = models[0] if models and isinstance(models[0], dict) else {}
    text = " ".join(str(model.get(key) or "") for key in ("why", "note", "reason", "result"))
    return done.returncode, text.strip()


def _leaks(box, target: Target) -> list[str]:
    """What of the model is left once `systemctl stop` returned."""
    leaked = []
    if box.sh(f"{FINDER} 0 -1 '{target.server}'", check=False).stdout.strip():
        leaked.append("a server process outlived the stop")
    out = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units holders "
                 f"--json --gpus {target.gpu}", check=False).stdout
    try:
        holders = json.loads(out)["holders"]
    except (ValueError, KeyError):
        holders = []
    if holders:
        leaked.append(f"GPU {target.gpu} still held: {[h.get('pid') for h in holders]}")
    return leaked


def run_fault(box, rng: random.Random, index: int | None = None) -> Outcome:
    fault = FAULTS[rng.randrange(len(FAULTS)) if index is None else index]
    unit = fault.target.unit
    hit = fault.inject(box, rng)
    seen: list[str | None] = [None]

    def settled() -> bool:
        seen[0] = _settled(box, unit)
        return seen[0] is not None
    wait_until(settled, SETTLE_S)
    state = seen[0]
    outcome = Outcome(fault.name, hit, state or "stuck")
    if state == "failed":
        code, reason = _status_reason(box, fault.target.name)
        outcome.reason = reason
        outcome.silent = code != 3 or not reason
    elif state == "inactive" and not fault.about_stop:
        outcome.silent = True       # a start that ended as if nobody had asked for it
    if fault.expect is not None and state is not None:
        outcome.broken = fault.expect(box, outcome)
    if fault.restore is not None:
        fault.restore(box)
    # Whatever the fault left, the next start must not be blocked by it.
    try:
        started = box.sh(f"systemctl start {unit}", check=False, timeout=120)
        outcome.recovered_start = started.returncode == 0
    except subprocess.TimeoutExpired:
        outcome.recovered_start = False     # said in the table, with its seed
    box.sh(f"systemctl stop {unit}", check=False, timeout=120)
    outcome.leaked = _leaks(box, fault.target)
    if bad(outcome):
        outcome.journal = box.sh(f"journalctl -u {unit} -n 60 -o short-monotonic --no-pager",
                                 check=False).stdout
    box.sh(f"systemctl reset-failed {unit} 2>/dev/null || true", check=False)
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
            or not outcome.recovered_start or bool(outcome.broken))


def summary(outcomes: list[Outcome]) -> str:
    rows = ["| fault | injected | landed in its step | recovered | failed with a reason | stuck "
            "| silent | leaked | next start blocked | its own promise broken |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for fault in FAULTS:
        name = fault.name
        mine = [o for o in outcomes if o.fault == name]
        if not mine:
            continue
        rows.append(f"| {name} | {len(mine)} | {sum(o.hit for o in mine)} | "
                    f"{sum(o.state in ('active', 'inactive') and not o.silent for o in mine)} | "
                    f"{sum(o.state == 'failed' and not o.silent for o in mine)} | "
                    f"{sum(o.state == 'stuck' for o in mine)} | {sum(o.silent for o in mine)} | "
                    f"{sum(bool(o.leaked) for o in mine)} | "
                    f"{sum(not o.recovered_start for o in mine)} | "
                    f"{sum(bool(o.broken) for o in mine)} |")
    return "\n".join(rows)
