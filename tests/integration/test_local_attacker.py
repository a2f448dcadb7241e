"""Written as the attacker: a local account without root (the
`attacker` fixture, setpriv; real processes, the real kernel log) tries to
block, fake or hang what root's hooks do.  Each test failed on the code
before the fix of its class (docs/trust.md)."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from infer_units.helpers.decide.claims import GpuClaims
from infer_units.helpers.facts.gpus import Gpu
from infer_units.helpers.facts.health import Kernel

pytestmark = pytest.mark.integration


def as_attacker(attacker: pwd.struct_passwd, *argv: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(["setpriv", f"--reuid={attacker.pw_uid}",
                             f"--regid={attacker.pw_gid}", "--clear-groups", "--", *argv],
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


# ------------------------------------------------------------------ 1: the kernel log

def test_a_users_mount_option_in_the_kernel_log_is_no_xid(attacker) -> None:
    """`unshare -Urm mount -o 'NVRM: Xid (PCI:...): 79'` puts the text into
    /dev/kmsg inside tmpfs's own record; only the driver's records count."""
    bus = f"{secrets.randbelow(0x20) + 0xd0:02x}"    # far from the fake GPUs' 0x41..
    where = f"0000:{bus}:1f"
    text = f"NVRM: Xid (PCI:{where}): 79"
    done = as_attacker(attacker, "unshare", "-Urm", "mount", "-t", "tmpfs", "-o", text,
                       "none", "/mnt")
    done.communicate(timeout=30)
    records = _kmsg_records()
    if not any(text.encode() in r for r in records):
        pytest.skip("the attacker's mount option did not reach the kernel log here "
                    "(no unprivileged user namespaces?)")
    assert Kernel("/").kernel_log().xids.get(where) is None


def test_the_drivers_own_record_still_counts(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_bytes(
        b"4,10,1000,-;NVRM: Xid (PCI:0000:41:00): 79, pid='<unknown>', GPU has fallen off\n"
        b"3,11,2000,-;tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:42:00): 79'\n"
        b"12,12,3000,-;NVRM: Xid (PCI:0000:43:00): 79, written by root as user facility\n")
    assert Kernel(str(tmp_path)).kernel_log().xids == {"0000:41:00": [79]}


@pytest.mark.parametrize("record", [
    b"4,10,1000,-; NVRM: Xid (PCI:0000:41:00): 79, a leading space\n",
    b"11,10,1000,-;NVRM: Xid (PCI:0000:41:00): 79, facility user\n",
    b"28,10,1000,-;NVRM: Xid (PCI:0000:41:00): 79, facility daemon\n",
    b"x,10,1000,-;NVRM: Xid (PCI:0000:41:00): 79, no priority\n",
    # A newline inside a message comes escaped (\x0a), never as a record of its own.
    b"4,10,1000,-;tmpfs: Unknown parameter '\\x0aNVRM: Xid (PCI:0000:41:00): 79'\n",
    # A continuation line (" KEY=value") carries no message.
    b"4,10,1000,-;bridge: x\n NVRM: Xid (PCI:0000:41:00): 79, a continuation line\n",
])
def test_what_only_looks_like_the_drivers_record_is_no_xid(tmp_path: Path, record: bytes) -> None:
    """Variants of the class: a leading space, another facility than the
    kernel's, an escaped newline, a continuation line."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_bytes(record)
    assert Kernel(str(tmp_path)).kernel_log().xids == {}, record


def _kmsg_records() -> list[bytes]:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    out = []
    try:
        while True:
            try:
                out.append(os.read(fd, 16384))
            except BlockingIOError:
                return out
            except OSError:
                continue
    finally:
        os.close(fd)


# ------------------------------------------------------------------ 2: claim locks

GPU = Gpu(index=0, uuid="GPU-feedface-0000-0000-0000-000000000000", pci="0000:41:00.0",
          device="/dev/null", memory_total_mib=None)


def _hold_shared(attacker: pwd.struct_passwd, lock: Path) -> subprocess.Popen[str]:
    """The attacker's `flock --shared <lock> sleep`: 'locked' once held."""
    return as_attacker(attacker, "flock", "--shared", "--nonblock", str(lock), "-c",
                       "echo locked; exec sleep 300")


@pytest.mark.parametrize("older_modes", [False, True])
def test_a_user_cannot_hold_a_gpus_claim_lock(attacker, public: Path, monkeypatch,
                                              older_modes: bool) -> None:
    """A lock file others can open is one they can flock: every pre-start on
    that GPU then failed "still locked by another start hook".  Also where
    an older version left the directory 0755 and the lock 0644."""
    monkeypatch.setenv("INFER_UNITS_RUN_DIR", str(public / "run"))
    lock = public / "run" / "gpu" / f"{GPU.uuid}.lock"
    if older_modes:
        lock.parent.mkdir(parents=True, mode=0o755)
        lock.parent.chmod(0o755)
        lock.touch(mode=0o644)
        lock.chmod(0o644)
    first = GpuClaims([GPU], "model-a.service")
    assert first.acquire(timeout=1.0) == []
    first.release()
    assert (lock.parent.stat().st_mode & 0o7777, lock.stat().st_mode & 0o7777) == (0o700, 0o600)
    holder = _hold_shared(attacker, lock)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() != "locked", "the attacker holds root's claim lock"
        assert GpuClaims([GPU], "model-b.service").acquire(timeout=1.0) == []
    finally:
        holder.kill()
        holder.communicate()


# ------------------------------------------------------------------ 3: a holder is a set

FORKS_ON_TERM = r"""
import os, signal, sys, time
held = open(sys.argv[1], "rb")
def again(*_):
    # A copy that keeps the GPU's fd goes on; this one leaves.
    if os.fork() != 0:
        os._exit(0)
signal.signal(signal.SIGTERM, again)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_holder_that_forks_on_sigterm_is_ended_with_its_copies(attacker, public: Path) -> None:
    """Signalled pid by pid with a cap on rounds, such a holder made
    `reap --term-grace 2s --timeout 20s` end "timed out with holders left"
    in under a second, and the user kept the GPU."""
    from infer_units.helpers.act.reaper import Reaper, ReapPolicy
    from infer_units.helpers.facts.gpus import FakeBackend, fd_holders
    from tests.support import PYTHON, FakeGpus
    gpus = FakeGpus(public / "gpus", count=1)
    device = str(gpus.devices[0])
    holder = as_attacker(attacker, PYTHON, "-I", "-c", FORKS_ON_TERM, device)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        backend = FakeBackend(str(gpus.table))
        started = time.monotonic()
        result = Reaper(backend, backend.gpus(), None, ReapPolicy("kill", 2.0, 20.0)).run()
        took = time.monotonic() - started
        assert result.exit_code == 0, (result.message, result.left)
        assert fd_holders({device}) == {}, "the attacker's copy kept the GPU"
        assert took >= 2.0, took           # the grace was given before SIGKILL
        assert any(a.signal == "SIGKILL" for a in result.actions), result.actions
    finally:
        for pid in fd_holders({device}):
            os.kill(pid, signal.SIGKILL)
        holder.kill()
        holder.communicate()


# ------------------------------------------------------------------ 5: one deadline per probe

TRICKLER = r"""
import socket, sys, threading, time
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print(listener.getsockname()[1], flush=True)
where = sys.argv[1].replace("PORT", str(listener.getsockname()[1]))
def serve(conn):
    request = conn.recv(4096)
    path = request.split(b" ")[1] if b" " in request else b"/"
    if path == b"/health":
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: " + where.encode() +
                     b"\r\nContent-Length: 0\r\n\r\n")
    else:
        # The status line and a header, one byte at a time (about 90 s in
        # all): each recv() is quick.
        for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"." * 100 + b"\r\n\r\n":
            time.sleep(0.7)
            conn.sendall(bytes([byte]))
    conn.close()
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


@pytest.mark.parametrize("where,refused", [
    ("/slow", ""),                              # same origin: followed, within the deadline
    ("http://127.0.0.2:9/slow", "redirect to http://127.0.0.2:9 refused"),
    ("https://127.0.0.1:9/slow", "redirect to https://127.0.0.1:9 refused"),
    # The same host by other names is another origin: not followed either.
    ("http://localhost:PORT/slow", "redirect to http://localhost:PORT refused"),
    ("http://[::1]:PORT/slow", "redirect to http://[::1]:PORT refused"),
    ("https://127.0.0.1:PORT/slow", "redirect to https://127.0.0.1:PORT refused"),
    ("//127.0.0.1:PORT/slow", ""),              # scheme-relative, same origin
    ("slow", ""),                               # path-relative
])
def test_a_redirect_is_bounded_by_the_probes_deadline_and_stays_on_its_origin(
        attacker, where: str, refused: str) -> None:
    """A listener on the model's port (anyone's) that redirects /health to a
    path that trickles its status line held `liveness-probe --timeout 2s`
    past 40 s; a redirect was followed to any host and scheme."""
    from infer_units.helpers.facts.probe import http_probe
    from tests.support import PYTHON
    server = as_attacker(attacker, PYTHON, "-I", "-c", TRICKLER, where)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        started = time.monotonic()
        answer = http_probe(f"http://127.0.0.1:{port}/health", 2.0)
        took = time.monotonic() - started
        # The deadline, not the trickle's end (about 90 s): far apart.
        assert not answer.ok and took < 30, (answer, took)
        if refused:
            assert refused.replace("PORT", str(port)) in answer.text, answer
        else:
            assert answer.text == "no answer within 2s", answer
    finally:
        server.kill()
        server.communicate()


ANSWERS_200 = r"""
import socket, sys
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print(listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    conn.recv(4096)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    conn.close()
"""


def test_a_strangers_listener_on_the_models_port_is_not_its_readiness(attacker) -> None:
    """While the server loads (minutes, before it binds its port), any
    account can listen on the model's port and answer 200: wait-ready took
    that for the server's health and the unit turned active with its server
    still loading (and liveness then probed the stranger)."""
    from infer_units.helpers.act.ready import wait_ready
    from tests.support import PYTHON
    stranger = as_attacker(attacker, PYTHON, "-I", "-c", ANSWERS_200)
    server = subprocess.Popen(["sleep", "60"])          # the model's server, loading
    try:
        assert stranger.stdout is not None
        port = int(stranger.stdout.readline())
        result = wait_ready(f"http://127.0.0.1:{port}/health", server.pid, 2.0, 0.1)
        assert not result.ready, result
        assert f"pid {stranger.pid}" in result.reason and "not this server's" in result.reason, \
            result
    finally:
        for p in (stranger, server):
            p.kill()
            p.communicate()


def test_the_servers_own_listener_below_it_is_its_readiness() -> None:
    """The listener is the server's when it is the server or a process below
    it (TGI's router, a shell that runs the server)."""
    from infer_units.helpers.act.ready import wait_ready
    from tests.support import PYTHON
    server = subprocess.Popen(["sh", "-c", '"$0" -I -c "$1"; exit 0', PYTHON, ANSWERS_200],
                              text=True, stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        result = wait_ready(f"http://127.0.0.1:{port}/health", server.pid, 10.0, 0.1)
        assert result.ready, result
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(server.pid)])    # the listener below it
        server.kill()
        server.communicate()


# ------------------------------------------------------------------ 8: bounded reads

FLOOD = """#!/bin/sh
# The model's "python", as its user wrote it: floods root with output.
yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | head -c {size}
{tail}
"""

MEASURE = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[1])
from infer_units.helpers.act.p2p import _run_selftest
from infer_units.helpers.facts.gpus import Gpu
gpu = Gpu(index=0, uuid="GPU-0", pci="0000:41:00.0", device="/dev/null", memory_total_mib=None)
verdict = _run_selftest(sys.argv[2], [gpu], float(sys.argv[4]), user=sys.argv[3])
print(json.dumps({"verdict": verdict,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
"""


def _flooding_python(public: Path, attacker: pwd.struct_passwd, size: int, tail: str) -> Path:
    script = public / "python"
    script.write_text(FLOOD.format(size=size, tail=tail))
    script.chmod(0o755)
    os.chown(script, attacker.pw_uid, attacker.pw_gid)
    return script


def _selftest_as_root(script: Path, attacker: pwd.struct_passwd, timeout: float) -> dict:
    from tests.support import PYTHON, code_copy
    done = subprocess.run([PYTHON, "-I", "-c", MEASURE, str(code_copy()), str(script),
                           attacker.pw_name, str(timeout)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    import json
    return json.loads(done.stdout.splitlines()[-1])


def test_root_keeps_a_bounded_piece_of_what_a_users_python_prints(attacker, public: Path) -> None:
    """A user-owned python that printed 768 MiB raised root's RSS from 16 to
    2,321 MiB: root kept all of it (the P2P self-test; doctor the same)."""
    script = _flooding_python(public, attacker, 300 << 20, 'echo \'{"ok": true, "why": "flood"}\'')
    got = _selftest_as_root(script, attacker, 60.0)
    assert got["verdict"].get("why") == "flood", got["verdict"]       # the verdict still read
    assert got["peak_mib"] < 150, got


def test_an_untrusted_run_ends_at_its_deadline_whatever_holds_its_output(
        attacker, public: Path) -> None:
    """A child that leaves the session and keeps the pipes open does not hold
    root past the deadline."""
    marker = f"0.{secrets.randbelow(10**6):06d}"      # sleep adds it: the leftover's mark
    script = _flooding_python(public, attacker, 1, f"setsid sleep 600 {marker} &\nexec sleep 600")
    started = time.monotonic()
    try:
        got = _selftest_as_root(script, attacker, 1.0)
        assert got["verdict"].get("hung") is True, got
        # The leftover lives 600 s: far above a run bounded by its deadline.
        assert time.monotonic() - started < 60, "root waited on the user's leftover"
    finally:
        # The escaped process is this test's: its own name, the attacker's account.
        import psutil
        left = [proc for proc in psutil.process_iter(["uids", "cmdline"])
                if proc.info["uids"] and proc.info["uids"].real == attacker.pw_uid
                and proc.info["cmdline"] == ["sleep", "60", marker]]
        for proc in left:
            proc.kill()
        psutil.wait_procs(left, timeout=10)


# ------------------------------------------------------------------ 4: group watch

HEAD_IP, RANK_IP, OUTSIDER_IP, RDV_PORT = "10.213.7.1", "10.213.7.2", "10.213.7.9", 29500

GROUP_MODEL = f"""engine = "sglang"
model = "/models/big"
gpus = [0]
port = 18500
host = "0.0.0.0"

[nodes]
hosts = ["{HEAD_IP}", "{RANK_IP}"]
addr = "{HEAD_IP}:{RDV_PORT}"
rank = 0

[liveness]
interval = "5s"
max-restarts = 1
restart-window = "1h"

[env]
INFER_UNITS_LIVENESS_DIR = "{{state}}"
"""

WATCH = r"""
import json, os, signal, sys
from infer_units.generator.build import load_all
from infer_units.generator.log import StdioHandler, setup
from infer_units.generator.render import group_watch_argv
from infer_units.helpers.act import groupwatch
from infer_units.helpers.facts.systemd import ModelState
from infer_units.helpers.hooks.unit import watched_of

# "die": the watch is killed the moment it asks, as systemd's PartOf= stop of
# the model's restart may do it
DIE = sys.argv[2:] == ["die"]

class Systemd:
    def model_state(self, unit):
        return ModelState("active", "running", "ab" * 16, "")
    def try_restart(self, unit):
        print("try_restart", unit, flush=True)
        if DIE:
            os.kill(os.getpid(), signal.SIGKILL)
    def stop(self, unit):
        print("stop", unit, flush=True)
        if DIE:
            os.kill(os.getpid(), signal.SIGKILL)

# What the unit runs: the watch's argv and hook settings from the generator
# (the drop-in's ExecStart= and Environment=), logging as a hook does
# (helpers/entry.py).
setup(StdioHandler(run_by_systemd=True))
[model] = load_all().models
os.environ["INFER_UNITS_LIVENESS_DIR"] = model.env["INFER_UNITS_LIVENESS_DIR"]
watched = watched_of(group_watch_argv(model)[2:])
print("watching", flush=True)
sys.exit(groupwatch.run(watched, poll_s=0.05, systemd=Systemd(), looks=int(sys.argv[1])))
"""

HOLD_RANK = r"""
import socket, sys, time
s = socket.socket()
s.bind((sys.argv[1], 0))
s.connect(("10.213.7.1", 29500))
print("joined", flush=True)
time.sleep(600)
"""

CONNECT = r"""
import socket, sys, time
for _ in range(int(sys.argv[2])):
    s = socket.socket()
    s.bind((sys.argv[1], 0))
    s.connect(("10.213.7.1", 29500))
    time.sleep(0.3)            # seen by a look or more, then gone
    s.close()
    time.sleep(0.3)
"""


@pytest.fixture
def netns():
    """A network namespace of the test's own, with the group's addresses on lo."""
    keeper = subprocess.Popen(["unshare", "--net", "sleep", "600"])
    enter = ["nsenter", "-t", str(keeper.pid), "--net"]
    try:
        for _ in range(100):
            if os.readlink(f"/proc/{keeper.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            time.sleep(0.01)
        subprocess.run([*enter, "ip", "link", "set", "lo", "up"], check=True)
        for ip in (HEAD_IP, RANK_IP, OUTSIDER_IP):
            subprocess.run([*enter, "ip", "addr", "add", f"{ip}/32", "dev", "lo"], check=True)
        yield enter
    finally:
        keeper.kill()
        keeper.wait()


def _asked(out: str) -> list[str]:
    """What the watch asked of systemd."""
    return [line for line in out.splitlines() if line.startswith(("try_restart ", "stop "))]


def _watch(enter: list[str], config: Path, looks: int, *how: str) -> subprocess.Popen[str]:
    from tests.support import PYTHON, base_env
    env = base_env(INFER_UNITS_CONFIG_PATH=str(config))
    watch = subprocess.Popen([*enter, PYTHON, "-c", WATCH, str(looks), *how], env=env,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert watch.stdout is not None
    # Byte by byte from the pipe itself: readline() on the text wrapper could
    # buffer the lines after this one, which communicate() (reading the
    # file descriptors) would then never see.
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(watch.stdout.fileno(), 1)
        if not chunk:
            break
        line += chunk
    assert line.decode().strip() == "watching", line
    return watch


@pytest.mark.parametrize("source", [OUTSIDER_IP, "127.0.0.2", RANK_IP])
def test_a_connection_that_is_not_a_rank_restarts_nothing_and_restarts_count(
        attacker, netns: list[str], tmp_path: Path, source: str) -> None:
    """Anyone who opened and closed a connection to a multi-node model's
    rendezvous port from a non-loopback address made the head restart the
    model, as often as they liked, and those restarts never met the cap.
    Also from a loopback alias, and from the rank's own host address (a
    user on the rank's host) while the rank stays connected."""
    from tests.support import PYTHON
    config, state = tmp_path / "etc", tmp_path / "state"
    config.mkdir()
    (config / "mn.toml").write_text(GROUP_MODEL.format(state=state))
    rendezvous = subprocess.Popen([*netns, PYTHON, "-c", (
        "import socket, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('0.0.0.0', {RDV_PORT})); s.listen(64); print('up', flush=True)\n"
        "kept = []\n"
        "while True:\n    kept.append(s.accept()[0])\n")], text=True, stdout=subprocess.PIPE)
    rank = None
    try:
        assert rendezvous.stdout is not None and rendezvous.stdout.readline().strip() == "up"
        rank = subprocess.Popen([*netns, PYTHON, "-c", HOLD_RANK, RANK_IP], text=True,
                                stdout=subprocess.PIPE)
        assert rank.stdout is not None and rank.stdout.readline().strip() == "joined"
        watch = _watch(netns, config, 60)
        outsider = subprocess.Popen([*netns, "setpriv", f"--reuid={attacker.pw_uid}",
                                     f"--regid={attacker.pw_gid}", "--clear-groups", PYTHON,
                                     "-I", "-c", CONNECT, source, "3"])
        outsider.wait(timeout=30)
        out, err = watch.communicate(timeout=60)
        assert not _asked(out), out + err
        # The rank's process dies: that is a restart, and it counts.
        rank.kill()
        rank.wait()
        out, err = _watch(netns, config, 20).communicate(timeout=60)
        assert _asked(out) == ["try_restart mn.service"], out + err
        saved = json.loads((state / "mn.liveness.json").read_text())
        assert saved["restarts_total"] == 1 and len(saved["restarts"]) == 1, saved
        # max-restarts = 1: the next one is the cap, the model stopped and left failed.
        out, err = _watch(netns, config, 20).communicate(timeout=60)
        assert _asked(out) == ["stop mn.service"], out + err
        assert (state / "mn.liveness-cap").read_text() == "ab" * 16
    finally:
        for p in (rendezvous, rank):
            if p is not None:
                p.kill()
                p.wait()



def test_another_accounts_connection_to_the_head_does_not_hide_its_leaving(
        attacker, netns: list[str], tmp_path: Path) -> None:
    """On a worker's host, any account can keep a connection of its own to
    the head's rendezvous: the worker's watch took it for its rank's, and a
    head that restarted left the worker hanging in a dead group."""
    from tests.support import PYTHON
    config, state = tmp_path / "etc", tmp_path / "state"
    config.mkdir()
    (config / "mn.toml").write_text(GROUP_MODEL.format(state=state).replace("rank = 0",
                                                                            "rank = 1"))
    rendezvous = subprocess.Popen([*netns, PYTHON, "-c", (
        "import socket, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('{HEAD_IP}', {RDV_PORT})); s.listen(64); print('up', flush=True)\n"
        "kept = []\n"
        "while True:\n    kept.append(s.accept()[0])\n")], text=True, stdout=subprocess.PIPE)
    rank = outsider = None
    try:
        assert rendezvous.stdout is not None and rendezvous.stdout.readline().strip() == "up"
        rank = subprocess.Popen([*netns, PYTHON, "-c", HOLD_RANK, RANK_IP], text=True,
                                stdout=subprocess.PIPE)      # the model's user: root here
        outsider = subprocess.Popen([*netns, "setpriv", f"--reuid={attacker.pw_uid}",
                                     f"--regid={attacker.pw_gid}", "--clear-groups", PYTHON,
                                     "-I", "-c", HOLD_RANK, RANK_IP], text=True,
                                    stdout=subprocess.PIPE)
        for p in (rank, outsider):
            assert p.stdout is not None and p.stdout.readline().strip() == "joined"
        watch = _watch(netns, config, 40)
        # The rank's own connection goes (the head restarted, say); the outsider's stays.
        rank.kill()
        rank.wait()
        out, err = watch.communicate(timeout=60)
        assert _asked(out) == ["try_restart mn.service"], out + err
    finally:
        for p in (rendezvous, rank, outsider):
            if p is not None:
                p.kill()
                p.wait()


STAND_IN = r"""
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.213.7.1", 29500))        # the rendezvous port, before the server listens
s.connect((sys.argv[1], int(sys.argv[2])))
print("joined", flush=True)
time.sleep(600)
"""


def test_another_account_on_the_head_cannot_stand_in_for_a_rank(
        attacker, netns: list[str], tmp_path: Path) -> None:
    """On the head, any account could bind the rendezvous port with
    SO_REUSEADDR before the server listened (the server's own bind, with
    SO_REUSEADDR, still succeeds) and connect from it to any open port of a
    rank's host: an established connection from the rendezvous port to the
    rank's address, which the head's watch took for the rank, so the rank's
    leaving was never seen."""
    from tests.support import PYTHON
    config, state = tmp_path / "etc", tmp_path / "state"
    config.mkdir()
    (config / "mn.toml").write_text(GROUP_MODEL.format(state=state))
    procs: list[subprocess.Popen[str]] = []
    try:
        # any service of the rank's host (its sshd, its dummy health port)
        procs.append(subprocess.Popen([*netns, PYTHON, "-c", (
            "import socket, time\n"
            f"s = socket.socket(); s.bind(('{RANK_IP}', 2222)); s.listen(8)\n"
            "print('up', flush=True); time.sleep(600)\n")], text=True, stdout=subprocess.PIPE))
        assert procs[0].stdout is not None and procs[0].stdout.readline().strip() == "up"
        stand_in = subprocess.Popen([*netns, "setpriv", f"--reuid={attacker.pw_uid}",
                                     f"--regid={attacker.pw_gid}", "--clear-groups", PYTHON,
                                     "-I", "-c", STAND_IN, RANK_IP, "2222"], text=True,
                                    stdout=subprocess.PIPE)
        procs.append(stand_in)
        assert stand_in.stdout is not None and stand_in.stdout.readline().strip() == "joined"
        procs.append(_rendezvous(netns))
        rank = subprocess.Popen([*netns, PYTHON, "-c", HOLD_RANK, RANK_IP], text=True,
                                stdout=subprocess.PIPE)
        procs.append(rank)
        assert rank.stdout is not None and rank.stdout.readline().strip() == "joined"
        watch = _watch(netns, config, 40)
        rank.kill()
        rank.wait()
        out, err = watch.communicate(timeout=60)
        assert _asked(out) == ["try_restart mn.service"], out + err
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _rendezvous(enter: list[str]) -> subprocess.Popen[str]:
    from tests.support import PYTHON
    served = subprocess.Popen([*enter, PYTHON, "-c", (
        "import socket, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('{HEAD_IP}', {RDV_PORT})); s.listen(64); print('up', flush=True)\n"
        "kept = []\n"
        "while True:\n    kept.append(s.accept()[0])\n")], text=True, stdout=subprocess.PIPE)
    assert served.stdout is not None and served.stdout.readline().strip() == "up"
    return served


def test_a_restart_is_counted_before_it_is_asked_and_the_cap_comes(
        netns: list[str], tmp_path: Path) -> None:
    """The group watch is PartOf= its model: systemd stops it the moment the
    restart it asked for begins.  It said "restart 1 of N", asked, and only
    then saved the count, so a watch stopped in between restarted the model
    again and again, each "1 of N", and the cap never came.  Here the watch
    is killed the moment it asks: every restart is in the state already, and
    after max-restarts of them the next is the cap."""
    config, state = tmp_path / "etc", tmp_path / "state"
    config.mkdir()
    (config / "mn.toml").write_text(GROUP_MODEL.format(state=state).replace(
        "max-restarts = 1", "max-restarts = 2"))
    rendezvous = _rendezvous(netns)
    try:
        # No rank connected: the formed group is short, a rank left.
        for n in (1, 2):
            watch = _watch(netns, config, 20, "die")
            out, err = watch.communicate(timeout=60)
            assert watch.returncode == -signal.SIGKILL, out + err
            assert _asked(out) == ["try_restart mn.service"], out + err
            saved = json.loads((state / "mn.liveness.json").read_text())
            assert saved["restarts_total"] == n and len(saved["restarts"]) == n, saved
        watch = _watch(netns, config, 20, "die")
        out, err = watch.communicate(timeout=60)
        assert _asked(out) == ["stop mn.service"], out + err
        saved = json.loads((state / "mn.liveness.json").read_text())
        assert saved["capped"] and saved["restarts_total"] == 2, saved
        assert (state / "mn.liveness-cap").read_text() == "ab" * 16
    finally:
        rendezvous.kill()
        rendezvous.wait()


def test_a_rank_the_head_cannot_see_is_not_counted_missing(
        netns: list[str], tmp_path: Path) -> None:
    """A [nodes] host whose name has no address on the head: the head's
    watch counted that rank missing once the group formed and restarted
    the model, up to the cap.  It is not watched (said once), `status`
    names it, and the ranks it can see are still watched."""
    from tests.support import PYTHON, base_env
    config, state = tmp_path / "etc", tmp_path / "state"
    config.mkdir()
    (config / "mn.toml").write_text(GROUP_MODEL.format(state=state).replace(
        f'"{RANK_IP}"]', f'"{RANK_IP}", "gpu-c.invalid"]'))
    rendezvous = _rendezvous(netns)
    rank = None
    try:
        rank = subprocess.Popen([*netns, PYTHON, "-c", HOLD_RANK, RANK_IP], text=True,
                                stdout=subprocess.PIPE)
        assert rank.stdout is not None and rank.stdout.readline().strip() == "joined"
        out, err = _watch(netns, config, 40).communicate(timeout=60)
        assert not _asked(out), out + err
        unseen = [line for line in out.splitlines() if "gpu-c.invalid" in line]
        assert unseen == ["<4>mn.service: rank 2: not watched: gpu-c.invalid has no address "
                          "here (its leaving cannot be seen and is not counted missing; "
                          "liveness still probes the group)"], out
        done = subprocess.run([*netns, PYTHON, "-m", "infer_units", "status", "--json", "mn"],
                              capture_output=True, text=True, timeout=120,
                              env=base_env(INFER_UNITS_CONFIG_PATH=str(config)))
        [model] = json.loads(done.stdout)["models"]
        assert model["nodes"]["ranks"] == {
            "2": "not watched: gpu-c.invalid has no address here"}, done.stdout
        table = subprocess.run([*netns, PYTHON, "-m", "infer_units", "status", "mn"],
                               capture_output=True, text=True, timeout=120,
                               env=base_env(INFER_UNITS_CONFIG_PATH=str(config)))
        assert "mn: rank 2 not watched: gpu-c.invalid has no address here" in table.stdout, \
            table.stdout + table.stderr
        # The rank it can see still counts.
        rank.kill()
        rank.wait()
        out, err = _watch(netns, config, 20).communicate(timeout=60)
        assert _asked(out) == ["try_restart mn.service"], out + err
    finally:
        for p in (rendezvous, rank):
            if p is not None:
                p.kill()
                p.wait()


RSS_OF_CHILD = r"""
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
"""


def test_doctor_keeps_a_bounded_piece_of_what_a_users_python_prints(attacker, public: Path,
                                                                   tmp_path: Path) -> None:
    """doctor ran the model's user-owned python and kept all it printed:
    768 MiB of it raised root's RSS from 16 to 2,321 MiB."""
    from tests.support import PYTHON, FakeGpus
    script = _flooding_python(public, attacker, 300 << 20, "echo '{}'")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "eng.toml").write_text(f'engine = "vllm"\nmodel = "/models/x"\ngpus = [0]\n'
                                   f'port = 18991\npython = "{script}"\nuser = "{attacker.pw_name}"\n')
    gpus = FakeGpus(tmp_path / "gpus", count=1)
    env = gpus.env(INFER_UNITS_CONFIG_PATH=str(conf))
    done = subprocess.run([PYTHON, "-c", RSS_OF_CHILD, PYTHON, "-m", "infer_units", "doctor",
                           "eng", "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) < 150, f"doctor's peak RSS {done.stdout.split()[-1]} MiB"


OPEN_EARLY = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)    # while an older version's modes let it
print("opened", flush=True)
sys.stdin.readline()                      # root narrowed the modes meanwhile
fcntl.flock(fd, fcntl.LOCK_SH)
print("locked", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("reach", ["path", "hardlink"])
def test_a_lock_opened_before_its_modes_were_narrowed_blocks_no_start(
        attacker, public: Path, monkeypatch, reach: str) -> None:
    """Narrowing a lock file's mode does not close an fd opened while an
    older version left it 0644: that fd still takes flock, and every start
    on the GPU waited for it.  Also reached through a hard link the user
    made while the file was open to it (fs.protected_hardlinks off)."""
    from tests.support import PYTHON
    monkeypatch.setenv("INFER_UNITS_RUN_DIR", str(public / "run"))
    lock = public / "run" / "gpu" / f"{GPU.uuid}.lock"
    lock.parent.mkdir(parents=True, mode=0o755)
    lock.parent.chmod(0o755)
    lock.touch(mode=0o644)
    lock.chmod(0o644)
    target = lock
    if reach == "hardlink":
        mine = public / "mine"
        mine.mkdir()
        os.chown(mine, attacker.pw_uid, attacker.pw_gid)
        target = mine / "lock"
        os.link(lock, target)       # as root: the link an older kernel setting allowed
    holder = as_attacker(attacker, PYTHON, "-I", "-c", OPEN_EARLY, str(target),
                         stdin=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "opened"
        first = GpuClaims([GPU], "model-a.service")      # the upgraded hook: narrows
        assert first.acquire(timeout=1.0) == []
        first.release()
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "locked"
        assert GpuClaims([GPU], "model-b.service").acquire(timeout=1.0) == [], \
            "the user's early fd blocks the GPU's claims"
        assert (lock.stat().st_mode & 0o7777) == 0o600
    finally:
        holder.kill()
        holder.communicate()


# ------------------------------------------------------------------ 6: search directories

SERVE = 'engine = "command"\ncommand = ["/opt/srv/serve"]\ngpus = [{gpu}]\n'


def _generate(public: Path, search: list[Path]) -> tuple[subprocess.CompletedProcess[str], Path]:
    from tests.support import PYTHON, base_env
    out = public / "out"
    out.mkdir()
    done = subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=60,
                          env=base_env(INFER_UNITS_CONFIG_PATH=":".join(map(str, search))))
    return done, out


@pytest.mark.parametrize("parent_mode", [0o777, 0o775])
def test_a_search_directory_under_a_parent_others_can_write_is_refused(
        attacker, public: Path, parent_mode: int) -> None:
    """The search directory itself root's 0755, the directory above it
    writable by others (or by the attacker's group): the attacker moves it
    aside and puts a link to a root-owned directory of their choice in its
    place (the shipped examples, run as root), or a directory of root-owned
    empty files to mask the operator's models.  Refused, as the writer
    refuses such a parent."""
    top, shipped, etc = public / "top", public / "shipped", public / "etc"
    for d in (top, shipped, etc):
        d.mkdir(mode=0o755)
    os.chown(top, 0, attacker.pw_gid)
    top.chmod(parent_mode)
    (top / "run").mkdir(mode=0o755)
    (shipped / "example.toml").write_text(SERVE.format(gpu=1))
    (etc / "real.toml").write_text(SERVE.format(gpu=0))
    move = as_attacker(attacker, "sh", "-c", f"mv {top}/run {top}/old && ln -s {shipped} {top}/run")
    assert move.communicate(timeout=30) and move.returncode == 0
    done, out = _generate(public, [top / "run", etc])
    assert not (out / "example.service").exists(), "a model the attacker linked in runs as root"
    assert (out / "real.service").exists(), done.stderr
    assert f"{top}" in done.stderr and "refus" in done.stderr, done.stderr


def test_a_link_a_user_made_in_place_of_a_missing_search_directory_is_not_followed(
        attacker, public: Path) -> None:
    """A sticky directory others can write (/tmp-like) above a search
    directory that does not exist yet: the attacker's link in its place."""
    top, shipped, etc = public / "sticky", public / "shipped", public / "etc"
    for d in (top, shipped, etc):
        d.mkdir(mode=0o755)
    top.chmod(0o1777)
    (shipped / "example.toml").write_text(SERVE.format(gpu=1))
    (etc / "real.toml").write_text(SERVE.format(gpu=0))
    link = as_attacker(attacker, "ln", "-s", str(shipped), str(top / "run"))
    assert link.communicate(timeout=30) and link.returncode == 0
    done, out = _generate(public, [top / "run", etc])
    assert not (out / "example.service").exists(), "a model the attacker linked in runs as root"
    assert (out / "real.service").exists(), done.stderr


def test_a_search_directory_root_linked_elsewhere_is_still_read(public: Path) -> None:
    """The operator's own link (/etc/infer-units -> /srv/models) stays theirs."""
    real, etc = public / "srv", public / "etc"
    real.mkdir(mode=0o755)
    (real / "real.toml").write_text(SERVE.format(gpu=0))
    etc.symlink_to(real)
    done, out = _generate(public, [etc])
    assert (out / "real.service").exists(), done.stderr


RUNS_AWAY = {
    # On SIGTERM: a grandchild in a session of its own, under another name.
    "double-fork, setsid, renamed": r"""
import ctypes, os, signal, sys, time
held = open(sys.argv[1], "rb")
def away(*_):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            ctypes.CDLL(None).prctl(15, b"kworker/0:1", 0, 0, 0)    # PR_SET_NAME
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(0.05)
        os._exit(0)
    os._exit(0)
signal.signal(signal.SIGTERM, away)
print("ready", flush=True)
while True:
    time.sleep(0.05)
""",
    # Without end: each process forks the next and leaves, so no pid lasts.
    "a new pid without end": r"""
import os, signal, sys, time
held = open(sys.argv[1], "rb")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
devnull = os.open("/dev/null", os.O_WRONLY)
os.dup2(devnull, 1)
os.dup2(devnull, 2)
while True:
    if os.fork() != 0:
        os._exit(0)
    os.setpgid(0, 0)
""",
}


@pytest.mark.parametrize("how", sorted(RUNS_AWAY))
def test_a_holder_that_runs_away_is_ended_with_its_copies(attacker, public: Path,
                                                         how: str) -> None:
    """A holder leaves its process group and session, changes its name, or
    forks a new pid without end: the set is its user's processes on the GPU,
    whatever they call themselves, and it ends before the timeout."""
    from infer_units.helpers.act.reaper import Reaper, ReapPolicy
    from infer_units.helpers.facts.gpus import FakeBackend, fd_holders
    from tests.support import PYTHON, FakeGpus, wait_until
    gpus = FakeGpus(public / "gpus", count=1)
    device = str(gpus.devices[0])
    holder = as_attacker(attacker, PYTHON, "-I", "-c", RUNS_AWAY[how], device)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        backend = FakeBackend(str(gpus.table))
        result = Reaper(backend, backend.gpus(), None, ReapPolicy("kill", 0.5, 20.0)).run()
        assert result.exit_code == 0, (result.message, result.left)
        assert fd_holders({device}) == {}, "the attacker's copy kept the GPU"
    finally:
        # Whatever is left is the attacker's: its own kill(-1) ends all of
        # it at once (no fork slips through one kill(-1)).
        subprocess.run(["setpriv", f"--reuid={attacker.pw_uid}", f"--regid={attacker.pw_gid}",
                        "--clear-groups", "--", "kill", "-KILL", "-1"], timeout=30)
        holder.communicate(timeout=30)
        assert wait_until(lambda: not _processes_of(attacker.pw_uid), 30)


def _processes_of(uid: int) -> list[int]:
    """The account's processes, zombies included (init reaps them when it will)."""
    import psutil
    return [proc.pid for proc in psutil.process_iter(["uids"])
            if proc.info["uids"] is not None and proc.info["uids"].real == uid]
