"""What the operator is told, under real systemd (issue 37 items 2, 4, 5):
`status` fails for a model file that does not load and suggests a name for a
typo; a crash loop is named with its restarts and last exit; a start refused
for a foreign port holder names it and says what exit 2 means; a listener
at the model's port on another address is neither."""

from __future__ import annotations

import json

import pytest

from .e2e_support import FAKE_TABLE, add_model, show, wait_until

pytestmark = pytest.mark.e2e


def _drop(box, *names: str) -> None:
    box.sh("rm -f " + " ".join(f"/etc/infer-units/{n}.toml" for n in names)
           + " && systemctl daemon-reload", check=False)


def test_a_file_that_does_not_load_fails_status_and_a_typo_gets_a_suggestion(box) -> None:
    add_model(box, "st-typo", 'engine = "command"\ncommand = ["/bin/true"]\nprot = 18401\n')
    box.sh("systemctl daemon-reload")
    try:
        done = box.sh("infer-units status st-typo", check=False)
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert "st-typo.toml: prot" in done.stdout and "does not load" in done.stderr, done
        typo = box.sh("infer-units status st-typx", check=False)
        assert typo.returncode == 1 and "(did you mean st-typo?)" in typo.stderr, typo.stderr
    finally:
        _drop(box, "st-typo")


def test_a_crash_loop_is_named_with_its_restarts_and_last_exit(box) -> None:
    add_model(box, "st-loop", "\n".join([
        'engine = "command"', 'command = ["/bin/sh", "-c", "exit 7"]', "port = 18402",
        "[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"',
        "[service]", 'RestartSec = "2s"']) + "\n")
    box.sh("systemctl daemon-reload && systemctl start --no-block st-loop")
    try:
        assert wait_until(lambda: int(show(box, "st-loop.service", "NRestarts")["NRestarts"]) >= 1,
                          60), show(box, "st-loop.service", "NRestarts", "ActiveState")

        def looping() -> dict | None:
            done = box.sh("infer-units status --json st-loop", check=False)
            [model] = json.loads(done.stdout)["models"]
            return model if any("crash loop" in w for w in model["why"]) else None
        assert wait_until(looping, 30), box.sh("infer-units status st-loop", check=False).stdout
        model = looping()
        assert model is not None
        [why] = [w for w in model["why"] if "crash loop" in w]
        assert "automatic restart(s)" in why and "main process exit status 7" in why, why
        table = box.sh("infer-units status st-loop", check=False).stdout
        assert "st-loop: crash loop:" in table, table
    finally:
        box.sh("systemctl stop st-loop; systemctl reset-failed st-loop", check=False)
        _drop(box, "st-loop")


def test_a_foreign_port_holder_refuses_at_once_and_the_exit_is_explained(box) -> None:
    port = 18403
    add_model(box, "st-port", "\n".join([
        'engine = "command"', 'command = ["/usr/local/bin/fake-engine", "--port", "18403"]',
        "gpus = [4]", f"port = {port}",
        "[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"',
        "[reap]", 'foreign = "fail"', 'timeout = "60s"']) + "\n")
    box.sh("systemd-run --unit=st-squat /usr/bin/python3 -c 'import socket, time; "
           f"s = socket.socket(); s.bind((\"127.0.0.1\", {port})); s.listen(); "
           "time.sleep(3600)'")
    try:
        squatter = show(box, "st-squat.service", "MainPID")["MainPID"]
        listening = ("python3 -c 'import socket; socket.create_connection("
                     f"(\"127.0.0.1\", {port}), 1).close()'")
        assert wait_until(lambda: box.sh(listening, check=False).returncode == 0, 20)
        box.sh("systemctl daemon-reload")
        started = box.sh("systemctl start st-port", check=False, timeout=120)
        assert started.returncode != 0
        errors = box.sh("journalctl -u st-port -p err -o cat --no-pager").stdout
        assert f"port {port} held by pid {squatter}" in errors, errors
        last = [ln for ln in errors.splitlines() if "exit 2 = " in ln]
        assert last and last[-1].startswith("infer-units: exit 2 = blocked: port "), errors
        status = box.sh("infer-units status --json st-port", check=False).stdout
        [model] = json.loads(status)["models"]
        assert model["health"] is None or model["health"].get("foreign") \
            or not model["health"]["ok"], model["health"]
        assert any(f"pid {squatter}" in w for w in model["why"]), model["why"]
    finally:
        box.sh("systemctl stop st-squat st-port; systemctl reset-failed st-port st-squat",
               check=False)
        _drop(box, "st-port")



def test_a_users_listener_at_the_models_port_on_another_address_is_no_holder_nor_health(
        box) -> None:
    """An account listening at the model's port on 127.0.0.2 and ::1 (the
    model binds 127.0.0.1) answers 200 to everyone: the start goes on with
    `[reap] foreign = "fail"`, the unit's readiness is its own server's,
    and `status` shows the model's health, not a foreign one."""
    port = 18405
    add_model(box, "st-addr", "\n".join([
        'engine = "command"', f'command = ["/usr/local/bin/fake-engine", "--port", "{port}"]',
        "gpus = [5]", f"port = {port}", 'host = "127.0.0.1"',
        "[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"',
        "[reap]", 'foreign = "fail"', 'timeout = "60s"']) + "\n")
    box.sh("id st-other >/dev/null 2>&1 || useradd --system --no-create-home st-other; "
           "mkdir -p /var/lib/st-www && : > /var/lib/st-www/health")
    addresses = ["127.0.0.2"] + (["::1"] if box.sh("test -s /proc/net/if_inet6",
                                                   check=False).returncode == 0 else [])
    units = [f"st-other{i}" for i in range(len(addresses))]
    for unit, address in zip(units, addresses):
        box.sh(f"systemd-run --unit={unit} -p User=st-other /usr/bin/python3 -m http.server "
               f"--bind {address} --directory /var/lib/st-www {port}")
    try:
        for address in addresses:
            url = f"http://[{address}]:{port}/health" if ":" in address else \
                f"http://{address}:{port}/health"
            answered = f"python3 -c 'import urllib.request as u; u.urlopen(\"{url}\", timeout=1)'"
            assert wait_until(lambda: box.sh(answered, check=False).returncode == 0, 20), address
        box.sh("systemctl daemon-reload")
        started = box.sh("systemctl start st-addr", check=False, timeout=120)
        journal = box.sh("journalctl -u st-addr -o cat --no-pager").stdout
        assert started.returncode == 0, journal
        assert "held by" not in journal and "not this server's" not in journal, journal
        [model] = json.loads(box.sh("infer-units status --json st-addr", check=False).stdout)[
            "models"]
        assert model["health"]["ok"] and not model["health"].get("foreign"), model["health"]
        assert model["port_view"]["foreign"] == [], model["port_view"]
    finally:
        box.sh(f"systemctl stop st-addr {' '.join(units)}; systemctl reset-failed st-addr "
               f"{' '.join(units)}", check=False)
        _drop(box, "st-addr")


def test_a_drained_host_is_named_and_no_stale_liveness_is_shown(box) -> None:
    add_model(box, "st-drain", "\n".join([
        'engine = "command"', 'command = ["/usr/local/bin/fake-engine", "--port", "18404"]',
        "gpus = [3]", "port = 18404",
        "[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"',
        "[liveness]", 'interval = "2s"']) + "\n")
    box.sh("systemctl daemon-reload && systemctl start st-drain", timeout=120)

    def probed() -> bool:
        done = box.sh("infer-units status --json st-drain", check=False)
        [model] = json.loads(done.stdout)["models"]
        return bool(model["liveness"] and model["liveness"]["last_probe"])
    try:
        assert wait_until(probed, 60), box.sh("infer-units status st-drain", check=False).stdout
        drain = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units drain --term-grace 1s "
                       "--timeout 30s", check=False, timeout=120)
        assert drain.returncode == 0, drain.stderr
        table = box.sh("infer-units status st-drain", check=False).stdout
        assert "this host is drained" in table and "st-drain: drained by `infer-units drain`" \
            in table, table
        row = table.splitlines()[1]
        assert row.startswith("st-drain") and "inactive" in row and " ago" not in row, table
    finally:
        box.sh("infer-units resume --timeout 60s", check=False, timeout=120)
        box.sh("systemctl stop st-drain", check=False)
        _drop(box, "st-drain")
