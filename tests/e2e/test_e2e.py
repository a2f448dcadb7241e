"""End to end under real systemd: a bookworm container, the .deb installed with
apt, fake GPUs held by a fake engine with a TERM-ignoring worker.  The tests
run in file order on one container (test_engines.py, then test_package.py follow)."""

from __future__ import annotations

import json
import time

import pytest

from .e2e_support import add_model, alive, health_status, holders, model_toml, show, wait_until

pytestmark = pytest.mark.e2e


# ---------------------------------------------------------------- package

def test_install_generated_units_without_manual_reload(box) -> None:
    props = show(box, "preinstalled.service", "LoadState", "FragmentPath", "SourcePath")
    assert props["LoadState"] == "loaded", box.install_output
    assert props["FragmentPath"] == "/run/systemd/generator/preinstalled.service"
    assert props["SourcePath"] == "/etc/infer-units/preinstalled.toml"
    assert box.sh("test -x /usr/lib/systemd/system-generators/infer-units-generator "
                  "&& command -v infer-units").returncode == 0
    assert box.sh("test -f /usr/share/doc/infer-units/examples/sglang-qwen.toml").returncode == 0


def test_models_added_after_install_and_systemd_analyze_verify(box) -> None:
    add_model(box, "alpha", model_toml("alpha", [0, 1], 18001, load=1.5))
    add_model(box, "beta", model_toml("beta", [2, 3], 18002))
    add_model(box, "crashy", model_toml("crashy", [4], 18004, ["--crash-after", "0.5"],
                                        ready_timeout="120s", load=30))
    add_model(box, "gamma", model_toml("gamma", [1], 18003))
    box.sh("systemctl daemon-reload")
    for name in ("alpha", "beta", "crashy", "gamma"):
        assert show(box, f"{name}.service", "LoadState")["LoadState"] == "loaded"
    done = box.sh("systemd-analyze verify --man=no /run/systemd/generator/*.service", check=False)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    # the overlap between alpha and gamma is reported, both are generated
    check = box.sh("infer-units check", check=False)
    assert check.returncode == 1 and "gamma.toml: gpus: GPU 1 also used by alpha" in check.stderr


def test_argv_and_environment_reach_the_process_exactly(box) -> None:
    tricky_args = ["two words", "it's", 'say "hi"', "back\\slash", "100%", "$HOME ${PATH}",
                   "", "ünï 模型 🚀", "tab\there", "new\nline", ";", "%n", "-x"]
    tricky_env = {"SPACES": "a b  c", "QUOTES": "it's \"q\"", "DOLLAR": "$HOME ${X}",
                  "PERCENT": "50% %n", "BACKSLASH": "C:\\p\\", "EMPTY": "", "NL": "a\nb",
                  "UNI": "ünï"}
    add_model(box, "exact", model_toml("exact", [5], 18005,
                                       ["--record", "/run/exact.json", *tricky_args],
                                       env=tricky_env))
    box.sh("systemctl daemon-reload && systemctl start exact")
    record = json.loads(box.sh("cat /run/exact.json").stdout)
    assert record["argv"][1:] == ["--port", "18005", "--load", "1.0", "--record",
                                  "/run/exact.json", *tricky_args]
    for key, value in tricky_env.items():
        assert record["env"][key] == value, key
    assert record["env"]["CUDA_VISIBLE_DEVICES"] == "5"
    assert record["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    box.sh("systemctl stop exact")


# ---------------------------------------------------------------- hooks

def test_start_reaps_a_stale_foreign_holder_but_not_the_neighbour(box) -> None:
    box.sh("systemctl start beta")
    neighbour = {h["pid"] for h in holders(box, "2,3")}
    assert len(neighbour) == 3   # main + 2 workers
    # A stale process from a manual run holds GPU 0 and ignores SIGTERM.
    box.sh("systemd-run --unit=stale-foreign --property=KillMode=process /usr/bin/python3 -c "
           "'import signal,time; f=open(\"/var/lib/fakegpu/nvidia0\"); "
           "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)'")
    assert wait_until(lambda: any(h["unit"] == "stale-foreign.service" for h in holders(box, "0")))
    stale = [h["pid"] for h in holders(box, "0") if h["unit"] == "stale-foreign.service"][0]
    box.sh("systemctl start alpha")
    assert show(box, "alpha.service", "ActiveState")["ActiveState"] == "active"
    assert not alive(box, stale)
    gone = [pid for pid in neighbour if not alive(box, pid)]
    assert not gone, (f"the neighbour model was touched: {gone} of {neighbour} gone\n"
                      + box.journal("beta.service") + box.journal("alpha.service")
                      + box.sh("ps -eo pid,ppid,stat,cmd", check=False).stdout)
    log = box.journal("alpha.service")
    assert f"sending SIGTERM to pid {stale}" in log and f"sending SIGKILL to pid {stale}" in log
    assert "foreign user of GPU 0 (stale-foreign.service)" in log


def test_start_returns_only_when_health_answers(box) -> None:
    started = time.monotonic()
    box.sh("systemctl restart alpha")
    took = time.monotonic() - started
    assert took >= 1.5, "restart returned before the 1.5 s load finished"
    assert health_status(box, 18001) == "200"
    assert "answered HTTP 200" in box.journal("alpha.service")


RESTARTING = "alpha.service is restarting: its start reaps and waits for GPU 0,1"


def _count(box, line: str) -> int:
    return box.journal("alpha.service").count(line)


def test_restart_leaves_none_of_the_old_processes(box) -> None:
    old = {h["pid"] for h in holders(box, "0,1")}
    assert len(old) == 3
    restarting, reaped = _count(box, RESTARTING), _count(box, "reap GPU 0,1: ")
    freed = _count(box, "GPU 0,1 free after")
    box.sh("systemctl restart alpha")
    new = {h["pid"] for h in holders(box, "0,1")}
    assert len(new) == 3 and not old & new
    assert not any(alive(box, pid) for pid in old)
    # One wait per restart: the stop's hook saw the restart job and left the
    # reaping and the wait to the start's, which did both.
    assert wait_until(lambda: _count(box, RESTARTING) == restarting + 1
                      and _count(box, "reap GPU 0,1: ") == reaped + 1, 10), \
        box.journal("alpha.service")[-2000:]
    assert _count(box, "GPU 0,1 free after") == freed


def test_an_automatic_restart_waits_in_the_stop(box) -> None:
    """A crash has no restart job while its stop runs (systemd schedules the
    restart after it): wait-free waits for the GPUs as on every stop."""
    old = show(box, "alpha.service", "MainPID")["MainPID"]
    restarting, freed = _count(box, RESTARTING), _count(box, "GPU 0,1 free after")
    box.sh(f"kill -KILL {old}")

    def restarted() -> bool:
        props = show(box, "alpha.service", "ActiveState", "MainPID")
        return props["ActiveState"] == "active" and props["MainPID"] not in (old, "0")
    assert wait_until(restarted, 60), show(box, "alpha.service", "ActiveState", "NRestarts")
    assert wait_until(lambda: _count(box, "GPU 0,1 free after") == freed + 1, 10), \
        box.journal("alpha.service")[-2000:]
    assert _count(box, RESTARTING) == restarting


def test_another_service_on_the_gpus_blocks_the_start(box) -> None:
    before = {h["pid"] for h in holders(box, "0,1")}
    done = box.sh("systemctl start gamma", check=False)
    assert done.returncode != 0
    log = box.journal("gamma.service")
    assert "belongs to infer-units service alpha.service" in log
    assert "start of gamma.service refused; no automatic restart" in log
    # at priority err (the hooks' <3> prefix): `journalctl -p err` shows why
    errors = box.sh("journalctl -b -q -o cat -p err -u gamma.service").stdout
    assert "start of gamma.service refused" in errors and "blocked:" in errors, errors
    # The hook leaves with "blocked" itself, not killed by its cancelled job's
    # SIGTERM.  `systemctl start` returns when the job is cancelled, which can
    # be before the hook has exited and systemd has recorded its status: wait
    # for that state (code=(null) until then), with no job left on the unit.
    def settled() -> dict[str, str]:
        return show(box, "gamma.service", "ExecStartPre", "Job", "ActiveState", "SubState",
                    "NRestarts")
    def recorded() -> bool:
        props = settled()
        return "code=(null)" not in props["ExecStartPre"] and not props.get("Job")
    assert wait_until(recorded, timeout=60), settled()
    props = settled()
    assert "code=exited ; status=2" in props["ExecStartPre"], props
    # Restart=on-failure must not retry a refused start (and take the GPUs
    # unasked once alpha stops): a retry would show now as SubState
    # auto-restart (systemd enters it when the hook fails, RestartSec before
    # the new start), no sleep needed to see it.
    assert props["NRestarts"] == "0" and props["ActiveState"] in ("failed", "inactive"), props
    assert props["SubState"] in ("dead", "failed"), props
    assert {h["pid"] for h in holders(box, "0,1")} == before
    assert show(box, "alpha.service", "ActiveState")["ActiveState"] == "active"
    box.sh("systemctl reset-failed gamma", check=False)


def test_stop_leaves_the_gpus_free(box) -> None:
    restarting, freed = _count(box, RESTARTING), _count(box, "GPU 0,1 free after")
    started = time.monotonic()
    box.sh("systemctl stop alpha")
    assert time.monotonic() - started < 10, "a TERM-ignoring worker held up the stop"
    assert holders(box, "0,1") == []
    # A plain stop has a "stop" job: its hook waits for the GPUs and says so.
    assert wait_until(lambda: _count(box, "GPU 0,1 free after") == freed + 1, 10), \
        box.journal("alpha.service")[-2000:]
    assert _count(box, RESTARTING) == restarting


def test_server_crashing_while_loading_fails_the_start_fast(box) -> None:
    started = time.monotonic()
    done = box.sh("systemctl start crashy", check=False)
    took = time.monotonic() - started
    assert done.returncode != 0
    assert took < 15, f"start failed only after {took:.1f}s (ready timeout is 120s)"
    props = show(box, "crashy.service", "ExecMainStatus", "Result")
    assert props["ExecMainStatus"] == "7", props
    box.sh("systemctl stop crashy; systemctl reset-failed crashy", check=False)
    assert holders(box, "4") == []


def test_dropin_changes_the_unit(box) -> None:
    box.write("/etc/infer-units/beta.toml.d/50-env.toml", '[env]\nFROM_DROPIN = "yes"\n')
    box.sh("systemctl daemon-reload")
    env = show(box, "beta.service", "Environment")["Environment"]
    assert "FROM_DROPIN=yes" in env
    unit = box.sh("cat /run/systemd/generator/beta.service").stdout
    assert "/etc/infer-units/beta.toml.d/50-env.toml" in unit.splitlines()[1]
    box.sh("systemctl stop beta")


def test_status_reads_systemd_over_dbus(box) -> None:
    box.sh("systemctl start beta")
    main_pid = int(show(box, "beta.service", "MainPID")["MainPID"])
    out = box.sh("INFER_UNITS_FAKE_GPUS=/etc/infer-units/fakegpus.json "
                 "infer-units status --json beta").stdout
    [m] = json.loads(out)["models"]
    assert m["systemd"]["available"] is True
    assert (m["systemd"]["active_state"], m["systemd"]["sub_state"]) == ("active", "running")
    assert m["systemd"]["main_pid"] == main_pid and m["systemd"]["restarts"] == 0
    assert m["since_s"] is not None and m["since_s"] >= 0
    assert m["health"] == {"ok": True, "answer": "HTTP 200"}
    own = [p for p in m["gpu"]["processes"] if p["kind"] == "own"]
    assert len(own) == 3 and main_pid in {p["pid"] for p in own}
    assert m["metrics"]["reaps_total"] >= 1
    # every model: exit 0, or 3 should an earlier test have left one failed, or 1
    # for the broken model files earlier tests left (a file that does not
    # load fails status); never systemd out of reach
    done = box.sh("INFER_UNITS_FAKE_GPUS=/etc/infer-units/fakegpus.json infer-units status",
                  check=False)
    assert done.returncode in (0, 3) or (done.returncode == 1 and "model file error" in
                                         done.stderr), done.stderr
    assert "systemd's view unavailable" not in done.stderr, done.stderr
    table = done.stdout
    row = next(l for l in table.splitlines() if l.startswith("beta "))
    assert "active/running" in row and str(main_pid) in row and "2,3" in row and "ok" in row
    box.sh("systemctl stop beta")


def test_drain_stops_the_services_and_reaps_every_holder(box) -> None:
    box.sh("systemctl start alpha beta")
    box.sh("systemd-run --unit=stray-holder /usr/bin/python3 -c "
           "'import time; f=open(\"/var/lib/fakegpu/nvidia4\"); time.sleep(3600)'")
    assert wait_until(lambda: holders(box, "4") != [])
    done = box.sh("INFER_UNITS_FAKE_GPUS=/etc/infer-units/fakegpus.json "
                  "infer-units drain --term-grace 2s --timeout 30s", check=False)
    assert done.returncode == 0, done.stderr
    assert "stopping alpha.service, beta.service" in done.stderr
    for unit in ("alpha", "beta"):
        assert show(box, f"{unit}.service", "ActiveState")["ActiveState"] == "inactive"
    assert holders(box, "all") == []
    assert "0 process(es) hold /dev/nvidia*" in done.stderr
    assert "refcount" in done.stderr
    # drain fences every start until resume (tests/e2e/test_ops_e2e.py): lift it for the next tests
    box.sh("infer-units resume --timeout 60s && systemctl stop alpha beta")
