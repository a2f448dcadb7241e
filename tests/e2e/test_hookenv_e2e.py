"""Under real systemd: a model's [env] reaches its unit's root hooks, and on a
host not marked for tests (no HOOKS_TEST_MARKER) the installed hooks ignore
INFER_UNITS_FAKE_GPUS from it (helpers/hookenv.py), so a fake GPU table cannot
make pre-start kill a process that holds one of its "device" files."""

from __future__ import annotations

from .e2e_support import HOOKS_TEST_MARKER, add_model, alive, model_toml, show, wait_until


def test_fake_gpus_in_env_reach_no_hook_on_an_unmarked_host(box) -> None:
    box.sh("systemd-run --unit=env-victim /usr/bin/python3 -c "
           "'import time; f=open(\"/var/lib/fakegpu/nvidia4\"); time.sleep(3600)'")
    assert wait_until(lambda: show(box, "env-victim.service", "MainPID")["MainPID"] != "0")
    victim = int(show(box, "env-victim.service", "MainPID")["MainPID"])
    box.sh(f"mv {HOOKS_TEST_MARKER} {HOOKS_TEST_MARKER}.off")
    try:
        add_model(box, "unmarked", model_toml("unmarked", [4], 18777))
        box.sh("systemctl daemon-reload")
        done = box.sh("systemctl start unmarked", check=False)
        assert done.returncode != 0, done.stdout + done.stderr
        log = box.journal("unmarked.service")
        assert "no NVIDIA driver" in log, log
        assert "SIGTERM" not in log and "SIGKILL" not in log, log
        assert alive(box, victim)
    finally:
        box.sh("systemctl stop unmarked; rm -f /etc/infer-units/unmarked.toml; "
               "systemctl daemon-reload; systemctl reset-failed unmarked", check=False)
        box.sh(f"mv {HOOKS_TEST_MARKER}.off {HOOKS_TEST_MARKER}")
        box.sh("systemctl stop env-victim", check=False)
    # marked again, the same model's hooks use the fake table (the other tests rely on it)
    add_model(box, "marked", model_toml("marked", [4], 18777))
    try:
        box.sh("systemctl daemon-reload && systemctl start marked")
        assert show(box, "marked.service", "ActiveState")["ActiveState"] == "active"
    finally:
        box.sh("systemctl stop marked; rm -f /etc/infer-units/marked.toml; "
               "systemctl daemon-reload", check=False)
