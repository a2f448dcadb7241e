"""facts/systemd.py against real systemd: pystemd over the manager's private
socket as root (the system bus stopped, as early at boot or in a shutdown),
over the system bus as another account, with the answers systemctl gives."""

from __future__ import annotations

import json
import shlex

import pytest

from .e2e_support import show, wait_until

pytestmark = pytest.mark.e2e

# The installed package, run as the hooks run (isolated interpreter).
ASK = r"""
import json, sys
sys.path.append('/usr/lib/python3/dist-packages')
from infer_units.helpers.facts import systemd
name = sys.argv[1]
out = {}
for key, ask in (("cgroup", lambda: systemd.control_group(name)),
                 ("restarts", lambda: systemd.restarts_since_asked(name)),
                 ("sigkills", lambda: systemd.sigkills_leftovers(name)),
                 ("job", lambda: systemd.pending_job_type(name)),
                 ("state", lambda: systemd.unit_state(name).active_state),
                 ("facts", lambda: list(systemd.service_facts(name)))):
    try:
        out[key] = ask()
    except systemd.SystemdUnavailable as e:
        out[key] = "unavailable: " + str(e)
print(json.dumps(out))
"""


def _ask(box, unit: str, user: str | None = None) -> dict:
    command = f"python3 -I -c {shlex.quote(ASK)} {unit}"
    if user:
        command = f"runuser -u {user} -- {command}"
    done = box.sh(command, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _unit(box, name: str, kill_mode: str) -> None:
    box.write(f"/etc/systemd/system/{name}.service",
              f"[Service]\nExecStart=/bin/sleep 3600\nKillMode={kill_mode}\n"
              "Restart=on-failure\nRestartSec=100ms\n")
    box.sh(f"systemctl daemon-reload && systemctl start {name}")


def test_root_asks_over_the_private_socket_with_the_system_bus_down(box) -> None:
    _unit(box, "bus-mixed", "mixed")
    _unit(box, "bus-process", "process")
    try:
        box.sh("systemctl stop dbus.socket dbus.service")
        mixed = _ask(box, "bus-mixed.service")
        props = show(box, "bus-mixed.service", "ControlGroup", "MainPID", "Restart")
        assert mixed == {"cgroup": props["ControlGroup"], "restarts": 0, "sigkills": True,
                         "job": "", "state": "active",
                         "facts": [props["ControlGroup"], int(props["MainPID"]),
                                   props["Restart"]]}, mixed
        assert _ask(box, "bus-process.service")["sigkills"] is False
        # An automatic restart counts; reset_failed is a call that changes state.
        box.sh(f"kill -KILL {props['MainPID']}")
        assert wait_until(lambda: _ask(box, "bus-mixed.service")["restarts"] == 1, 20)
        box.sh("python3 -I -c \"import sys; sys.path.append('/usr/lib/python3/dist-packages'); "
               "from infer_units.helpers.facts import systemd; "
               "systemd.reset_failed('bus-mixed.service')\"")
        assert show(box, "bus-mixed.service", "NRestarts")["NRestarts"] == "0"
    finally:
        box.sh("systemctl start dbus.socket; systemctl stop bus-mixed bus-process; "
               "rm -f /etc/systemd/system/bus-mixed.service /etc/systemd/system/bus-process.service; "
               "systemctl daemon-reload", check=False)


def test_another_account_reads_over_the_system_bus_and_a_missing_unit_is_said(box) -> None:
    _unit(box, "bus-read", "mixed")
    try:
        box.sh("systemctl start dbus.socket")
        read = _ask(box, "bus-read.service", user="nobody")
        assert read["cgroup"] == "/system.slice/bus-read.service", read
        assert read["state"] == "active" and read["sigkills"] is True, read
        missing = _ask(box, "no-such-model.service")
        assert missing["state"] == "inactive" and missing["cgroup"] == "", missing
    finally:
        box.sh("systemctl stop bus-read; rm -f /etc/systemd/system/bus-read.service; "
               "systemctl daemon-reload", check=False)
