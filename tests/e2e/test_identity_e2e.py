"""Identity and unit states under real systemd, as an attacker with a local
account would try them: a user's own `systemd-run --user --unit=<model>` is not that model,
drain while a unit restarts, a model with neither gpus nor port is fenced,
a foreign `Restart=always` unit on a model's GPU."""

from __future__ import annotations

import json

import pytest

from .e2e_support import FAKE_TABLE, add_model, alive, model_toml, show, wait_until

pytestmark = pytest.mark.e2e
FENCE = "/run/infer-units/drain.fence"
HOLD = "import time; f = open('/var/lib/fakegpu/nvidia{gpu}', 'rb'); time.sleep(3600)"


def _state(box, unit: str) -> str:
    return show(box, unit, "ActiveState")["ActiveState"]


def _cleanup(box, *names: str) -> None:
    box.sh("touch /run/id-gate; systemctl stop " + " ".join(names) + " || true; rm -f "
           + " ".join(f"/etc/infer-units/{n}.toml" for n in names) + f"; rm -f {FENCE}; "
           "systemctl daemon-reload; systemctl reset-failed " + " ".join(names) + " || true",
           check=False)


# ------------------------------------------------------------------ #4

def _user_manager(box) -> int:
    """A local user, `hog`, with a running user manager (as after a login)."""
    box.sh("id hog >/dev/null 2>&1 || useradd -m hog")
    uid = int(box.sh("id -u hog").stdout)
    # The slim image has no pam_systemd (which would set XDG_RUNTIME_DIR at a
    # login): say it to the user manager directly.
    box.write("/etc/systemd/system/user@.service.d/10-runtime-dir.conf",
              "[Service]\nEnvironment=XDG_RUNTIME_DIR=/run/user/%i\n")
    box.sh(f"systemctl daemon-reload && systemctl start user@{uid}.service")
    assert wait_until(lambda: box.sh(f"test -S /run/user/{uid}/systemd/private",
                                     check=False).returncode == 0, timeout=60)
    return uid


def _as_hog(box, uid: int, command: str, check: bool = True):
    return box.sh(f"runuser -u hog -- env XDG_RUNTIME_DIR=/run/user/{uid} {command}",
                  check=check)


def _impostor(box, uid: int, unit: str, gpu: int) -> int:
    """The user's GPU hog in their own unit named like an infer-units model."""
    _as_hog(box, uid, f"systemd-run --user --collect --unit={unit} /usr/bin/python3 -c "
                      f"\"{HOLD.format(gpu=gpu)}\"")
    pid = 0

    def started() -> bool:
        nonlocal pid
        out = _as_hog(box, uid, f"systemctl --user show --value -p MainPID {unit}",
                      check=False).stdout.strip()
        pid = int(out) if out.isdigit() else 0
        return pid > 0 and box.sh(f"ls -l /proc/{pid}/fd | grep -q nvidia{gpu}",
                                  check=False).returncode == 0
    assert wait_until(started, timeout=30)
    cgroup = box.sh(f"cat /proc/{pid}/cgroup").stdout
    assert f"/user@{uid}.service/app.slice/{unit}" in cgroup, cgroup
    return pid


def test_a_users_unit_named_like_a_model_is_reaped_by_start_and_drain(box) -> None:
    add_model(box, "id-a", model_toml("id-a", [3], 18301))
    add_model(box, "id-b", model_toml("id-b", [4], 18302))
    box.sh("systemctl daemon-reload")
    uid = _user_manager(box)
    try:
        hog = _impostor(box, uid, "id-b.service", 3)        # on id-a's GPU
        start = box.sh("systemctl start id-a", check=False)
        assert start.returncode == 0, box.journal("id-a.service")[-3000:]
        assert wait_until(lambda: not alive(box, hog), timeout=30)
        journal = box.journal("id-a.service")
        assert f"sending SIGTERM to pid {hog} (user hog" in journal, journal[-3000:]
        assert "not the service id-b.service" in journal

        hog = _impostor(box, uid, "id-b.service", 4)
        drain = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units drain --json "
                       "--term-grace 1s --timeout 30s", check=False)
        assert drain.returncode == 0, drain.stderr
        report = json.loads(drain.stdout)
        assert "id-a.service" in report["stop"], report["stop"]
        assert hog in report["signal"] and hog not in report["spare"], report
        assert not alive(box, hog)
        resumed = box.sh("infer-units resume --json --timeout 60s", check=False)
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["states"]["id-a.service"] == "active"
    finally:
        _as_hog(box, uid, "systemctl --user stop id-b.service", check=False)
        _cleanup(box, "id-a", "id-b")


# A user's GPU hog that moves itself into a cgroup of its own naming, beside
# its own in its user manager's delegated subtree, in the hierarchy systemd
# tracks units by (name=systemd on a hybrid host), and says its pid.  The
# name holds a "\r" and then what a line of /proc/PID/cgroup for modelb says.
SELF_NAMED = r"""
import os, time
f = open("/var/lib/fakegpu/nvidia3", "rb")
lines = open("/proc/self/cgroup").read().split("\n")
v1 = [line.split(":", 2)[2] for line in lines if line.split(":")[1:2] == ["name=systemd"]]
if v1:
    mount, own, line = "/sys/fs/cgroup/systemd", v1[0], "x\r1:name=systemd:"
else:
    mount, own, line = "/sys/fs/cgroup", lines[0].split(":", 2)[2], "x\r0::"
cgroup = os.path.join(mount + os.path.dirname(own), line, "system.slice", "id-d.service")
os.makedirs(cgroup)
with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
with open("/tmp/self-named.pid.new", "w") as out:
    out.write(str(os.getpid()))
os.rename("/tmp/self-named.pid.new", "/tmp/self-named.pid")
time.sleep(3600)
"""


def test_a_cgroup_named_with_a_line_separator_is_not_a_models(box) -> None:
    """The kernel refuses only "\\n" in a cgroup's name.  A user's cgroup
    .../app.slice/x\\r0::/system.slice/id-d.service, read line by line with
    splitlines(), was id-d's: the hog there on id-c's GPU refused id-c's
    start (exit 2, no automatic restart) and was never reaped."""
    add_model(box, "id-c", model_toml("id-c", [3], 18331))
    add_model(box, "id-d", model_toml("id-d", [4], 18332))
    box.sh("systemctl daemon-reload; rm -f /tmp/self-named.pid")
    uid = _user_manager(box)
    box.write("/var/lib/self-named.py", SELF_NAMED)
    try:
        _as_hog(box, uid, "systemd-run --user --collect --unit=self-named /usr/bin/python3 "
                          "/var/lib/self-named.py")
        assert wait_until(lambda: box.sh("test -s /tmp/self-named.pid",
                                         check=False).returncode == 0, timeout=30), \
            _as_hog(box, uid, "journalctl --user -u self-named -n 20", check=False).stdout
        pid = int(box.sh("cat /tmp/self-named.pid").stdout)
        assert ":/system.slice/id-d.service" in box.sh(f"cat /proc/{pid}/cgroup").stdout
        start = box.sh("systemctl start id-c", check=False)
        assert start.returncode == 0, box.journal("id-c.service")[-3000:]
        assert wait_until(lambda: not alive(box, pid), timeout=30)
        journal = box.journal("id-c.service")
        assert f"sending SIGTERM to pid {pid} (user hog" in journal, journal[-3000:]
        assert "belongs to infer-units service id-d" not in journal
    finally:
        _as_hog(box, uid, "systemctl --user stop self-named.service", check=False)
        box.sh("rm -f /tmp/self-named.pid", check=False)
        _cleanup(box, "id-c", "id-d")


# ------------------------------------------------------------------ #10

def test_drain_while_a_unit_restarts_stops_records_and_resumes_it(box) -> None:
    """`systemctl restart` is in its stop half (an ExecStop that waits for a
    gate keeps it deactivating) when drain runs."""
    text = model_toml("id-r", [4], 18303) + "ExecStop = " + json.dumps(
        "/bin/sh -c 'while [ ! -e /run/id-gate ]; do sleep 0.1; done'") + "\n"
    add_model(box, "id-r", text)
    box.sh("rm -f /run/id-gate /run/id-drain.*; systemctl daemon-reload && systemctl start id-r")
    try:
        box.sh("systemctl restart --no-block id-r")
        assert wait_until(lambda: _state(box, "id-r.service") == "deactivating", timeout=30)
        box.sh("systemd-run --collect --unit=id-drainer /bin/sh -c '"
               f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units drain --json --term-grace 1s "
               "--timeout 60s >/run/id-drain.json 2>/run/id-drain.err; "
               "echo $? >/run/id-drain.rc.tmp; mv /run/id-drain.rc.tmp /run/id-drain.rc'")

        def drain_acted() -> bool:    # drain stopped it (a stop job replaced the restart), or gave up
            jobs = box.sh("systemctl list-jobs --no-legend", check=False).stdout
            return (box.sh("test -e /run/id-drain.rc", check=False).returncode == 0
                    or any(line.split()[1:3] == ["id-r.service", "stop"]
                           for line in jobs.splitlines() if len(line.split()) > 2))
        assert wait_until(drain_acted, timeout=60)
        box.sh("touch /run/id-gate")       # the stop may now finish
        assert wait_until(lambda: box.sh("test -e /run/id-drain.rc", check=False).returncode
                          == 0, timeout=90)
        rc = int(box.sh("cat /run/id-drain.rc").stdout)
        assert rc == 0, box.sh("cat /run/id-drain.err").stdout
        report = json.loads(box.sh("cat /run/id-drain.json").stdout)
        assert "id-r.service" in report["stop"], report
        assert "id-r.service" in json.loads(box.sh(f"cat {FENCE}").stdout)["stopped"]
        assert _state(box, "id-r.service") == "inactive", box.journal("id-r.service")[-2000:]
        resumed = box.sh("infer-units resume --json --timeout 60s", check=False)
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["states"]["id-r.service"] == "active"
        assert _state(box, "id-r.service") == "active"
    finally:
        _cleanup(box, "id-r")


# ------------------------------------------------------------------ #11

def test_a_model_with_neither_gpus_nor_port_does_not_start_while_fenced(box) -> None:
    add_model(box, "id-bare", 'engine = "command"\ncommand = ["/bin/sleep", "infinity"]\n'
                              '[service]\nRestartSec = "1s"\n')
    box.sh("systemctl daemon-reload")
    # /run is the container's own tmpfs: written from inside
    box.sh(f"mkdir -p /run/infer-units && echo '{{\"stopped\": []}}' > {FENCE}")
    try:
        assert box.sh("systemctl start id-bare", check=False).returncode != 0
        assert wait_until(lambda: _state(box, "id-bare.service") in ("failed", "inactive"),
                          timeout=30)
        assert "start of id-bare.service refused: GPUs drained" in box.journal("id-bare.service")
        box.sh("infer-units resume")
        box.sh("systemctl reset-failed id-bare; systemctl start id-bare")
        assert _state(box, "id-bare.service") == "active"
    finally:
        _cleanup(box, "id-bare")


# ------------------------------------------------------------------ #12

def test_a_foreign_restart_always_unit_is_stopped_through_systemd(box) -> None:
    """Killed, its process comes back RestartSec= (100 ms) later and shares
    the GPU with the model that was told "GPUs free"."""
    box.write("/etc/systemd/system/id-hogd.service",
              "[Service]\nExecStart=/usr/bin/python3 -c \"" + HOLD.format(gpu=2) + "\"\n"
              "Restart=always\nRestartSec=100ms\n")
    add_model(box, "id-g", model_toml("id-g", [2], 18304))
    box.sh("systemctl daemon-reload && systemctl start id-hogd")
    try:
        hog = int(show(box, "id-hogd.service", "MainPID")["MainPID"])
        assert wait_until(lambda: box.sh(f"ls -l /proc/{hog}/fd | grep -q nvidia2",
                                         check=False).returncode == 0, timeout=30)
        start = box.sh("systemctl start id-g", check=False)
        assert start.returncode == 0, box.journal("id-g.service")[-3000:]
        props = show(box, "id-hogd.service", "ActiveState", "Job")   # not coming back
        assert props["ActiveState"] == "inactive" and not props.get("Job"), props
        journal = box.journal("id-g.service")
        assert f"stopping id-hogd.service through systemd for pid {hog}" in journal, \
            journal[-3000:]
        users = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units holders --json "
                       "--gpus 2").stdout
        assert {h["unit"] for h in json.loads(users)["holders"]} == {"id-g.service"}, users
    finally:
        box.sh("systemctl stop id-hogd; rm -f /etc/systemd/system/id-hogd.service", check=False)
        _cleanup(box, "id-g")


# ------------------------------------------------------------------ a unit rendered into /etc

def test_a_unit_rendered_into_etc_is_an_infer_units_service(box) -> None:
    """`infer-units render --output /etc/systemd/system` writes the
    generator's unit, stamp included, where systemd loads it: its processes
    are another infer-units service's, never foreign (they were reaped)."""
    name = "id-etc"
    add_model(box, name, model_toml(name, [1], 18311))
    box.sh(f"infer-units render {name} --output /etc/systemd/system")
    box.sh(f"rm -f /etc/infer-units/{name}.toml && systemctl daemon-reload && systemctl start {name}")
    try:
        pid = int(show(box, f"{name}.service", "MainPID")["MainPID"])
        assert pid and alive(box, pid)
        done = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units reap --gpus 1 "
                      "--term-grace 1s --timeout 5s", check=False)
        assert done.returncode == 2, (done.returncode, done.stderr)
        assert f"belongs to infer-units service {name}.service" in done.stderr, done.stderr
        assert alive(box, pid)
    finally:
        box.sh(f"systemctl stop {name}; rm -f /etc/systemd/system/{name}.service; "
               "systemctl daemon-reload", check=False)


def test_a_system_services_account_running_a_gpu_daemons_binary_is_reaped(box) -> None:
    """A system service's own account that execs the daemon's root-owned
    executable (with LD_PRELOAD of its own code, say) from its own service,
    defined to run something else, was spared as that GPU daemon."""
    box.sh("id svc-hog >/dev/null 2>&1 || useradd --system --no-create-home svc-hog; "
           "install -m 0755 -o root /usr/bin/python3 /usr/local/sbin/nvidia-persistenced")
    box.write("/usr/local/lib/svc-hog.py", HOLD.format(gpu=0).replace("; ", "\n") + "\n")
    box.sh("systemd-run --unit=id-svc-hog --uid=svc-hog /bin/sh -c "
           "'exec /usr/local/sbin/nvidia-persistenced /usr/local/lib/svc-hog.py'")
    try:
        assert wait_until(lambda: show(box, "id-svc-hog.service", "MainPID")["MainPID"] != "0", 20)
        pid = int(show(box, "id-svc-hog.service", "MainPID")["MainPID"])
        assert wait_until(lambda: any(h["pid"] == pid for h in _holders(box, "0")), 20)
        done = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units reap --gpus 0 "
                      "--term-grace 1s --timeout 10s", check=False)
        assert done.returncode == 0, (done.returncode, done.stderr)
        assert wait_until(lambda: not alive(box, pid), 10), done.stderr
        # The daemon's own service, defined to run that program: spared.
        box.sh("systemd-run --unit=id-svc-daemon --uid=svc-hog "
               "/usr/local/sbin/nvidia-persistenced /usr/local/lib/svc-hog.py")
        assert wait_until(lambda: show(box, "id-svc-daemon.service", "MainPID")["MainPID"] != "0")
        daemon = int(show(box, "id-svc-daemon.service", "MainPID")["MainPID"])
        assert wait_until(lambda: any(h["pid"] == daemon for h in _holders(box, "0")), 20)
        done = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units reap --gpus 0 --json "
                      "--term-grace 1s --timeout 10s", check=False)
        assert done.returncode == 0 and alive(box, daemon), (done.stdout, done.stderr)
        assert daemon in {h["pid"] for h in json.loads(done.stdout)["ignored"]}
    finally:
        box.sh("systemctl stop id-svc-hog id-svc-daemon; "
               "systemctl reset-failed id-svc-hog id-svc-daemon; "
               "rm -f /usr/local/sbin/nvidia-persistenced /usr/local/lib/svc-hog.py", check=False)


def _holders(box, gpus: str) -> list[dict]:
    out = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units holders --json --gpus {gpus}",
                 check=False).stdout
    return json.loads(out)["holders"] if out.strip() else []
