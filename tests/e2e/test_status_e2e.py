"""What the operator is told, under real systemd: `status` fails for a model
file that does not load and suggests a name for a typo; a crash loop is
named with its restarts and its last try's real exit, and exits 3; a refused
start (llama.cpp's too) ends failed with its reason in the journal and in
`status`; a foreign port holder is named, a listener at the model's port on another
address is not; a drained host, a unit generated
from files since changed, models alternating on one GPU, a missing account,
and resume's progress are each said where the operator looks."""

from __future__ import annotations

import json
import re

import pytest

from .e2e_support import (FAKE_TABLE, add_model, engine_toml, make_model_path, model_toml,
                          show, wait_until)

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
        # Every try ended exit-code: the note never calls the last one a success,
        # and points at the server's own output (logged at info, not err).
        assert "success" not in why and "journalctl -u st-loop.service -n 50" in why, why
        assert "-p err" not in why, why
        done = box.sh("infer-units status st-loop", check=False)
        assert "st-loop: crash loop:" in done.stdout, done.stdout
        # A crash loop is never `failed` (Restart=always), yet not serving: exit 3.
        assert done.returncode == 3, (done.returncode, done.stdout)
    finally:
        box.sh("systemctl stop st-loop; systemctl reset-failed st-loop", check=False)
        _drop(box, "st-loop")


def test_a_server_the_ready_timeout_stopped_is_said_so(box) -> None:
    """wait-ready gives up (exit 3) and systemd's stop ends the server: status
    says the ready timeout stopped it, not the stop's exit of the server."""
    add_model(box, "st-slow", model_toml("st-slow", [5], 18436, load=600, ready_timeout="2s")
              + 'Restart = "no"\n')
    box.sh("systemctl daemon-reload")
    try:
        assert box.sh("systemctl start st-slow", check=False, timeout=120).returncode != 0

        def said() -> list[str] | None:
            done = box.sh("infer-units status --json st-slow", check=False)
            [model] = json.loads(done.stdout)["models"]
            return [w for w in model["why"] if "ready timeout" in w] or None
        assert wait_until(said, 30), box.sh("infer-units status st-slow", check=False).stdout
        [why] = said() or []
        assert why.startswith("failed (last result exit-code, the ready timeout stopped it"), why
        assert "no healthy answer within 2s" in why and "exit status 15" not in why, why
    finally:
        box.sh("systemctl stop st-slow; systemctl reset-failed st-slow", check=False)
        _drop(box, "st-slow")


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


def _refused(box, name: str, reason: str) -> None:
    """A start refused by pre-start: systemctl says only that its job was
    canceled; the unit ends failed with pre-start's own exit status (no
    automatic restart), the journal's refusal line points at `status`, and
    `status` exits 3 naming the reason."""
    started = box.sh(f"systemctl start {name}", check=False, timeout=120)
    assert started.returncode != 0 and "canceled" in started.stderr, started
    assert wait_until(lambda: show(box, f"{name}.service", "ActiveState")["ActiveState"]
                      == "failed", 30), show(box, f"{name}.service", "ActiveState", "Result")
    props = show(box, f"{name}.service", "Result", "NRestarts")
    assert props == {"Result": "exit-code", "NRestarts": "0"}, props
    log = box.sh(f"journalctl -u {name} -p err -o cat --no-pager").stdout
    assert f"start of {name}.service refused; no automatic restart: " in log and \
        f"`infer-units status {name}` says why" in log, log
    done = box.sh(f"infer-units status {name}", check=False)
    assert done.returncode == 3, (done.returncode, done.stdout)
    [note] = [ln for ln in done.stdout.splitlines() if ln.startswith(f"note: {name}: failed")]
    assert reason in note and "exit-code" in note, done.stdout
    status = box.sh(f"infer-units status --json {name}", check=False)
    [model] = json.loads(status.stdout)["models"]
    assert any(reason in w for w in model["why"]), model["why"]


def test_a_refused_llamacpp_start_ends_failed_and_status_says_why(box) -> None:
    """llama.cpp's server is stopped with SIGKILL: that must not reach a
    pre-start refusing the start (a SIGKILLed hook is a success status)."""
    name, path = "st-llama", "/models/st-llama-absent.gguf"
    text = engine_toml(name, "llamacpp", [2], 18405).replace(
        f'model = "/models/{name}"', f'model = "{path}"')
    add_model(box, name, text, model_present=False)
    box.sh(f"systemctl daemon-reload; systemctl reset-failed {name} 2>/dev/null; true")
    try:
        _refused(box, name, f"model: {path} does not exist on this host")
        # The model in place, but the host drained: refused again, as failed.
        make_model_path(box, path)
        box.sh(f"systemctl reset-failed {name}")
        drain = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units drain --term-grace 1s "
                       "--timeout 30s", check=False, timeout=120)
        assert drain.returncode == 0, drain.stderr
        _refused(box, name, "GPUs drained by `infer-units drain`")
    finally:
        box.sh("infer-units resume --timeout 60s", check=False, timeout=120)
        box.sh(f"systemctl stop {name}; systemctl reset-failed {name}", check=False)
        _drop(box, name)


def test_a_changed_dropin_or_host_default_marks_the_unit_stale_until_daemon_reload(box) -> None:
    """systemd notices only the main file (SourcePath=): a drop-in or a host
    default changed, or a drop-in added, after daemon-reload is named by
    `status` until the next daemon-reload."""
    name = "st-stale"
    add_model(box, name, 'engine = "command"\ncommand = ["/bin/sleep", "600"]\n')
    box.write(f"/etc/infer-units/{name}.toml.d/10-desc.toml", 'description = "one"\n')

    def why() -> list[str]:
        done = box.sh(f"infer-units status --json {name}", check=False)
        [model] = json.loads(done.stdout)["models"]
        return [w for w in model["why"] if w.startswith(("stale: ", "no unit yet: "))]
    try:
        # A new model file before daemon-reload has no unit yet.
        assert why() == [f"no unit yet: /etc/infer-units/{name}.toml was added since the units "
                         "were generated; run systemctl daemon-reload"], why()
        box.sh("systemctl daemon-reload")
        assert why() == [], why()
        box.sh(f"sleep 0.01; echo 'description = \"two\"' > /etc/infer-units/{name}.toml.d/10-desc.toml")
        assert why() == [f"stale: /etc/infer-units/{name}.toml.d/10-desc.toml changed since the "
                         "unit was generated; run systemctl daemon-reload"], why()
        table = box.sh(f"infer-units status {name}", check=False).stdout
        assert f"note: {name}: stale: " in table, table
        box.sh("systemctl daemon-reload")
        assert why() == [], why()
        box.write(f"/etc/infer-units/{name}.toml.d/20-more.toml", 'description = "three"\n')
        assert why() == [f"stale: /etc/infer-units/{name}.toml.d/20-more.toml was added since the "
                         "unit was generated; run systemctl daemon-reload"], why()
        box.sh("systemctl daemon-reload")
        box.sh("mkdir -p /etc/infer-units/defaults.toml.d && echo '[reap]' "
               "> /etc/infer-units/defaults.toml.d/50-st-stale.toml")
        assert why() and "50-st-stale.toml was added" in why()[0], why()
    finally:
        box.sh(f"rm -rf /etc/infer-units/{name}.toml.d /etc/infer-units/defaults.toml.d/50-st-stale.toml",
               check=False)
        _drop(box, name)


def test_two_models_alternating_on_one_gpu_are_a_note_not_an_error(box) -> None:
    """Both units are generated (the second start is refused while the first
    holds the GPU): `status` and `doctor` say so without failing; `check`,
    which validates files, still calls the overlap an error.  Named to sort
    first: each file's note names the GPU's first owner by name, and other
    modules of the session leave models on GPU 1 in the shared box."""
    for name, port in (("aa-alt-a", 18406), ("aa-alt-b", 18407)):
        add_model(box, name, "\n".join([
            'engine = "command"', f'command = ["/usr/local/bin/fake-engine", "--port", "{port}"]',
            "gpus = [1]", f"port = {port}",
            "[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"']) + "\n")
    box.sh("systemctl daemon-reload")
    try:
        done = box.sh("infer-units status aa-alt-a aa-alt-b", check=False)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert not [ln for ln in done.stdout.splitlines() if ln.startswith("error:")], done.stdout
        assert "does not load" not in done.stderr, done.stderr
        assert "GPU 1 also used by aa-alt-a" in done.stdout and "alternate" in done.stdout, \
            done.stdout
        report = json.loads(box.sh("infer-units status --json aa-alt-b", check=False).stdout)
        pair = [line for line in report["shared"] if "aa-alt-a" in line and "aa-alt-b" in line]
        assert report["errors"] == [] and len(pair) == 1, report
        doctor = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units doctor aa-alt-b",
                        check=False)
        assert not [ln for ln in doctor.stdout.splitlines()
                    if ln.startswith("error:") and "also used" in ln], doctor.stdout
        assert "shared" in doctor.stdout and "also used by aa-alt-a" in doctor.stdout, \
            doctor.stdout
        check = box.sh("infer-units check aa-alt-b", check=False)
        assert check.returncode == 1 and "GPU 1 also used by aa-alt-a" in check.stderr, check
    finally:
        _drop(box, "aa-alt-a", "aa-alt-b")


def test_resume_says_each_unit_as_it_becomes_active_or_loops(box) -> None:
    flag = "/run/st-res-crash"
    for name, port in (("st-res-ok", 18408), ("st-res-loop", 18409)):
        serve = f"exec /usr/local/bin/fake-engine --port {port}"
        script = f"test -e {flag} && exit 7; {serve}" if name == "st-res-loop" else serve
        add_model(box, name, "\n".join([
            'engine = "command"', f"command = {json.dumps(['/bin/sh', '-c', script])}",
            f"port = {port}",
            "[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"',
            "[service]", 'RestartSec = "1s"']) + "\n")
    box.sh(f"rm -f {flag}; systemctl daemon-reload && systemctl start st-res-ok st-res-loop",
           timeout=120)
    try:
        drain = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} infer-units drain --term-grace 1s "
                       "--timeout 30s", check=False, timeout=120)
        assert drain.returncode == 0, drain.stderr
        box.sh(f"touch {flag}")
        done = box.sh("infer-units resume --timeout 20s", check=False, timeout=120)
        assert done.returncode == 3, (done.returncode, done.stderr)
        lines = done.stderr.splitlines()
        assert any(re.fullmatch(r"infer-units: st-res-ok\.service active \(\d+ of \d+ active\)",
                                ln) for ln in lines), done.stderr
        assert any(ln.startswith("infer-units: st-res-loop.service is crash-looping (")
                   and "`infer-units status st-res-loop`" in ln for ln in lines), done.stderr
    finally:
        box.sh(f"rm -f {flag}; infer-units resume --timeout 5s; "
               "systemctl stop st-res-ok st-res-loop; systemctl reset-failed st-res-loop",
               check=False, timeout=120)
        _drop(box, "st-res-ok", "st-res-loop")


def test_a_user_without_an_account_is_named_by_check_and_by_the_crash_loop(box) -> None:
    name = "st-nouser"
    add_model(box, name, "\n".join([
        'engine = "command"', 'command = ["/bin/sleep", "600"]', 'user = "st-no-such-user"',
        "[service]", 'RestartSec = "1s"']) + "\n")
    box.sh("systemctl daemon-reload")
    try:
        check = box.sh(f"infer-units check {name}", check=False)
        assert check.returncode == 0 and "user: st-no-such-user does not exist on this host" \
            in check.stderr and "useradd --system" in check.stderr, check
        box.sh(f"systemctl start --no-block {name}")
        assert wait_until(lambda: int(show(box, f"{name}.service", "NRestarts")["NRestarts"])
                          >= 1, 60), show(box, f"{name}.service", "NRestarts", "ActiveState")
        done = box.sh(f"infer-units status {name}", check=False)
        assert done.returncode == 3, (done.returncode, done.stdout)
        assert f"note: {name}: crash loop: " in done.stdout and "217/USER" in done.stdout, \
            done.stdout
    finally:
        box.sh(f"systemctl stop {name}; systemctl reset-failed {name}", check=False)
        _drop(box, name)


def _series(box, directory: str, unit: str, *also: str) -> dict[str, str]:
    """The model's up and `also` series, or with none asked its up, ready and refused."""
    names = "|".join(("up", *also) if also else ("up", "ready", "refused"))
    text = box.sh(f"cat {directory}/infer-units.prom", check=False).stdout
    return {m.group(1): m.group(2) for m in
            re.finditer(rf'^infer_units_({names}){{unit="{re.escape(unit)}"}} (\S+)$',
                        text, re.M)}


def test_up_and_ready_series_follow_the_unit_from_refusal_to_serving_to_stopped(box) -> None:
    """The shipped metrics refresh raises up and ready once the model serves;
    a stop lowers both at once (its stop hook), and a refused model has its
    series from the refusal on, down."""
    metrics, name, path = "/var/lib/st-metrics", "st-series", "/models/st-series-absent"
    box.sh(f"install -d -m 0755 {metrics}")
    text = engine_toml(name, "llamacpp", [2], 18410, env={"INFER_UNITS_METRICS_DIR": metrics})
    add_model(box, name, text.replace(f'model = "/models/{name}"', f'model = "{path}"'),
              model_present=False)
    unit = f"{name}.service"
    box.sh("systemctl daemon-reload")
    try:
        box.sh(f"systemctl start {name}", check=False, timeout=120)
        assert _series(box, metrics, unit) == {"up": "0", "ready": "0", "refused": "1"}, \
            box.sh(f"cat {metrics}/infer-units.prom; journalctl -u {name} -o cat --no-pager",
                   check=False).stdout
        make_model_path(box, path)
        box.sh(f"systemctl reset-failed {name}; systemctl start {name}", timeout=120)
        # Started, not yet seen: the start lowered them; the refresh raises them.
        assert _series(box, metrics, unit) == {"up": "0", "ready": "0", "refused": "0"}
        box.sh("systemctl start infer-units-metrics.service", timeout=300)
        assert _series(box, metrics, unit) == {"up": "1", "ready": "1", "refused": "0"}, \
            box.sh("journalctl -u infer-units-metrics -n 20 --no-pager").stdout
        box.sh(f"systemctl stop {name}", timeout=120)
        assert _series(box, metrics, unit) == {"up": "0", "ready": "0", "refused": "0"}
        assert show(box, "infer-units-metrics.timer", "UnitFileState")["UnitFileState"] \
            == "disabled"
    finally:
        box.sh(f"systemctl stop {name}; systemctl reset-failed {name}", check=False)
        _drop(box, name)
        box.sh(f"rm -rf {metrics}", check=False)


# Inside the container: a connection opened before the stop, then the stop;
# once the unit is draining, a new connection to the port and a request on
# the old one.  SGLang would take the new one (it takes new requests until
# it exits): the unit's port fence resets it, and the old one is answered.
FENCE_PROBE = """python3 - <<'PY'
import json, socket, subprocess, time
port, table = %d, "inet infer_units_drain_%d"
old = socket.create_connection(("127.0.0.1", port), timeout=10)
subprocess.run(["systemctl", "stop", "--no-block", "%s"], check=True)
deadline = time.monotonic() + 60
while subprocess.run(["nft", "list", "table", *table.split()], capture_output=True).returncode:
    assert time.monotonic() < deadline, "no port fence within 60 s of the stop"
    time.sleep(0.05)
try:
    socket.create_connection(("127.0.0.1", port), timeout=10).close()
    new = "connected"
except ConnectionRefusedError:
    new = "refused"
old.sendall(b"GET /health HTTP/1.0\\r\\n\\r\\n")
print(json.dumps({"new": new, "old": old.recv(64).decode(errors="replace")}))
PY"""


def test_a_stop_that_drains_is_shown_draining_until_the_server_is_gone(box) -> None:
    """Between the stop's SIGTERM and the server's exit, within [stop] drain,
    the model is draining: `status` says so (STATE, why, --json) and so do
    the metrics; its port resets new connections while the open ones are
    answered; once stopped, nothing says draining and the port is open."""
    metrics, name = "/var/lib/st-drain-metrics", "st-draining"
    box.sh(f"install -d -m 0755 {metrics}")
    add_model(box, name, engine_toml(name, "sglang", [3], 18411, env={
        "FAKE_DRAIN_S": "20", "INFER_UNITS_METRICS_DIR": metrics}))
    unit = f"{name}.service"
    box.sh(f"systemctl daemon-reload && systemctl start {name}", timeout=120)

    def seen() -> dict | None:
        done = box.sh(f"infer-units status --json {name}", check=False)
        [model] = json.loads(done.stdout)["models"]
        return model if model["draining"] else None
    try:
        fence = json.loads(box.sh(FENCE_PROBE % (18411, 18411, name)).stdout)
        assert fence["new"] == "refused" and fence["old"].startswith("HTTP/1.0 503"), fence
        assert wait_until(seen, 30), box.sh(f"infer-units status {name}", check=False).stdout
        model = seen()
        assert model is not None and model["draining"]["bound_s"] == 30.0, model
        assert any(w.startswith("draining: stopping for ") and "[stop] drain of 30s" in w
                   for w in model["why"]), model["why"]
        table = box.sh(f"infer-units status {name}", check=False)
        assert table.returncode == 0 and table.stdout.splitlines()[1].split()[1] == "draining", \
            table.stdout
        box.sh("infer-units status --write-metrics >/dev/null", check=False)
        assert _series(box, metrics, unit, "draining") == {"up": "0", "draining": "1"}
        assert wait_until(lambda: show(box, unit, "ActiveState")["ActiveState"] == "inactive",
                          120)
        assert seen() is None
        assert _series(box, metrics, unit, "draining") == {"up": "0", "draining": "0"}
        assert "infer_units_drain" not in box.sh("nft list tables").stdout
    finally:
        box.sh(f"systemctl stop {name}; systemctl reset-failed {name}", check=False)
        _drop(box, name)
        box.sh(f"rm -rf {metrics}", check=False)
