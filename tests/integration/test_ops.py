"""Operator experience without systemd: the drain fence and resume, drain
--dry-run against the real run, module users from /proc/modules, one CLI
style (hidden hooks, help and defaults everywhere, --json), bash completion
of model names, status's exit codes.  (Under real systemd: e2e/test_ops.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from ..support import PYTHON, ROOT, FakeGpus, base_env, run_cli, wait_until

MODEL = 'engine = "command"\ncommand = ["/bin/true"]\ngpus = [{gpu}]\nport = {port}\n'


# ---------------------------------------------------------------- fence

def test_pre_start_refuses_while_fenced_and_resume_lifts_it(fake_gpus: FakeGpus, holders) -> None:
    env = fake_gpus.env(DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent")
    fence = Path(env["INFER_UNITS_RUN_DIR"]) / "drain.fence"
    stale = holders([fake_gpus.devices[0]])
    drained = run_cli("drain", "--term-grace", "0.3s", "--timeout", "5s", env=env)
    assert drained.returncode == 0, drained.stderr
    assert json.loads(fence.read_text())["stopped"] == []     # no systemd: nothing stopped
    assert f"fenced starts: {fence}" in drained.stderr
    assert wait_until(lambda: not stale.alive())
    refused = run_cli("pre-start", "--unit", "m", "--gpus", "1", env=env)
    assert refused.returncode == 2, refused.stderr
    assert "start of m.service refused: GPUs drained by `infer-units drain`" in refused.stderr
    assert "run `infer-units resume`" in refused.stderr
    assert "start checks passed" not in refused.stderr
    resumed = run_cli("resume", "--json", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["was_fenced"] is True and not fence.exists()
    run_cli("pre-start", "--unit", "m", "--gpus", "1", env=env, check=0)
    again = run_cli("resume", env=env, check=0)
    assert "no fence" in again.stderr


def test_a_second_drain_keeps_what_the_first_stopped(fake_gpus: FakeGpus) -> None:
    env = fake_gpus.env(DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent")
    fence = Path(env["INFER_UNITS_RUN_DIR"]) / "drain.fence"
    fence.parent.mkdir(parents=True)
    fence.write_text(json.dumps({"stopped": ["a.service"], "since": 1.0}))
    report = json.loads(run_cli("drain", "--dry-run", "--json", env=env, check=0).stdout)
    assert report["fence"] == {"path": str(fence), "stopped": ["a.service"]}
    run_cli("drain", "--json", env=env, check=0)
    assert json.loads(fence.read_text())["stopped"] == ["a.service"]
    kept = run_cli("resume", env=env)      # no systemd to start a.service: the fence stays
    assert kept.returncode == 1 and "the fence stays" in kept.stderr and fence.exists()
    fence.write_text("{half")
    broken = run_cli("resume", env=env)
    assert broken.returncode == 1 and "unreadable fence" in broken.stderr
    assert not fence.exists()


def test_dry_run_predicts_exactly_what_drain_does(fake_gpus: FakeGpus, holders) -> None:
    env = fake_gpus.env(DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent")
    fence = Path(env["INFER_UNITS_RUN_DIR"]) / "drain.fence"
    a = holders([fake_gpus.devices[0]])
    b = holders([fake_gpus.devices[3]], mode="ignore-term")
    keep = holders([fake_gpus.devices[1]], exe="nv-hostengine")
    dry = run_cli("drain", "--dry-run", "--json", "--term-grace", "0.3s", "--timeout", "5s",
                  env=env)
    assert dry.returncode == 0, dry.stderr
    predicted = json.loads(dry.stdout)
    assert a.alive() and b.alive() and not fence.exists(), "a dry run changed something"
    assert f"would send SIGTERM to pid {a.pid}" in dry.stderr
    real = run_cli("drain", "--json", "--term-grace", "0.3s", "--timeout", "5s", env=env)
    assert real.returncode == 0, real.stderr
    done = json.loads(real.stdout)
    assert predicted["dry_run"] is True and done["dry_run"] is False
    for key in ("stop", "signal", "spare", "fence"):
        assert predicted[key] == done[key], key
    assert done["signal"] == sorted([a.pid, b.pid]) and done["spare"] == [keep.pid]
    assert {x["signal"] for x in done["reap"]["actions"] if x["pid"] == b.pid} == {"SIGTERM", "SIGKILL"}
    assert not a.alive() and not b.alive() and keep.alive() and fence.exists()


def test_module_users_from_proc_modules_when_refcnt_is_absent(tmp_path: Path) -> None:
    from infer_units.helpers.act.drain import describe_module, module_users
    refcnt, modules = tmp_path / "refcnt", tmp_path / "modules"
    modules.write_text("nvidia_uvm 1527808 4 - Live 0x0 (POE)\n"
                       "nvidia 56209408 37 nvidia_uvm,nvidia_modeset, Live 0x0 (POE)\n")
    users, source = module_users(str(refcnt), str(modules))
    assert users == 37 and source.startswith(str(modules)) and "absent" in source
    refcnt.write_text("35\n")
    assert module_users(str(refcnt), str(modules)) == (35, str(refcnt))
    refcnt.unlink()
    modules.write_text("nvidia 56209408 - - Live 0x0 (POE)\n")   # unload compiled out
    assert module_users(str(refcnt), str(modules))[0] is None
    modules.write_text("ext4 1 2 - Live 0x0\n")
    users, source = module_users(str(refcnt), str(modules))
    assert users is None and "not loaded" in describe_module(users, source)


# ---------------------------------------------------------------- CLI style

def _commands() -> dict[str, click.Command]:
    from infer_units.helpers.cli.root import all_commands
    return all_commands()


def test_hooks_are_hidden_and_every_option_has_help_and_its_default() -> None:
    from infer_units.helpers.commands import HOOKS
    commands = _commands()
    listed = run_cli("--help", check=0).stdout
    for hook in HOOKS:      # argparse mains, not click commands: not listed
        assert hook not in commands and f"  {hook}" not in listed
    visible = [c for c in commands.values() if not c.hidden]
    assert {"drain", "resume", "status", "check", "render", "reap"} <= {c.name for c in visible}
    for command in visible:
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                assert param.help, f"{command.name} {param.opts[0]} has no help"
    # The defaults as the man page and the README's table state them
    # (tools/clidoc.py reads click's Sentinel of 8.3 and None of 8.1 alike),
    # each shown by --help.
    docs = {doc.name: doc for doc in _clidoc().commands()}
    for command in visible:
        text = " ".join(run_cli(command.name, "--help", check=0).stdout.split())
        shown = [o for o in docs[command.name].options if o.default]
        for option in shown:
            # click 8.1 puts a text default in ()
            assert f"[default: {option.default}]" in text or \
                f"[default: ({option.default})]" in text, (command.name, option.flags, text)
        assert ".0]" not in text, f"{command.name}: a duration shown as seconds: {text}"
    # and what they are: the model file's defaults (generator/settings.py), declared once
    from infer_units.generator.durations import format_seconds
    from infer_units.generator.settings import default
    reap = {o.flags.split()[0]: o.default for o in docs["reap"].options}
    assert reap["--foreign"] == default("reap.foreign") == "kill"
    assert reap["--term-grace"] == format_seconds(default("reap.term-grace")) == "10s"
    assert reap["--timeout"] == format_seconds(default("reap.timeout")) == "60s"


def _clidoc():  # type: ignore[no-untyped-def]
    import importlib.util
    spec = importlib.util.spec_from_file_location("clidoc", ROOT / "tools/clidoc.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["clidoc"] = module      # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_durations_in_help_are_durations() -> None:
    text = " ".join(run_cli("drain", "--help", check=0).stdout.split())
    assert "[default: 60s]" in text and "[default: 10s]" in text
    bad = run_cli("drain", "--term-grace", "10.0.0")
    assert bad.returncode == 1 and "bad time span" in bad.stderr


@pytest.mark.parametrize("command", ["check", "render"])
def test_json_is_valid_whatever_goes_to_stderr(tmp_path: Path, command: str) -> None:
    (tmp_path / "good.toml").write_text(MODEL.format(gpu=0, port=18501))
    (tmp_path / "bad.toml").write_text('engine = "nope"\n')
    env = base_env(INFER_UNITS_CONFIG_PATH=str(tmp_path))
    done = run_cli(command, "--json", env=env)
    assert done.returncode == 1 and "bad.toml" in done.stderr
    report = json.loads(done.stdout)
    assert report["exit"] == 1 and any("bad.toml" in e for e in report["errors"])
    if command == "check":
        assert report["ok"] == [{"path": str(tmp_path / "good.toml"), "unit": "good.service"}]
    else:
        # the model's unit, then its [liveness] probe's command: a drop-in of
        # the package's template unit
        names = [u["name"] for u in report["units"]]
        assert names == ["good.service", "infer-units-liveness@good.service.d/50-liveness.conf"], \
            names
        assert "ExecStart=" in report["units"][0]["text"]


def test_bash_completes_model_names(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    for name in ("qwen-big", "qwen-small", "llama"):
        (tmp_path / "etc" / f"{name}.toml").write_text(MODEL.format(gpu=0, port=18000))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "infer-units"
    wrapper.write_text(f'#!/bin/sh\nexec {PYTHON} -m infer_units "$@"\n')
    wrapper.chmod(0o755)
    script = (f'source {ROOT}/packaging/completion/infer-units\n'
              'for words in "infer-units status qw" "infer-units cat l" "infer-units dr"; do\n'
              '  COMP_WORDS=($words); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=()\n'
              '  _infer_units_completion; echo "${COMPREPLY[*]}"\n'
              'done\n')
    env = base_env(INFER_UNITS_CONFIG_PATH=str(tmp_path / "etc"),
                   PATH=f"{bin_dir}:{os.environ['PATH']}")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                         timeout=60).stdout.splitlines()
    assert out == ["qwen-big qwen-small", "llama", "drain"], out


# ---------------------------------------------------------------- status

def _model(state: str | None) -> dict:
    if state is None:
        return {"systemd": {"available": False, "error": "no bus"}}
    return {"systemd": {"available": True, "active_state": state}}


@pytest.mark.parametrize("states,unknown,code", [
    (["active", "inactive"], [], 0),
    (["active", "failed"], [], 3),
    (["failed", None], [], 1),          # cannot ask systemd: 1 wins
    (["active"], ["ghost"], 1),
])
def test_status_exit_codes(states: list, unknown: list, code: int) -> None:
    from infer_units.helpers.cli.status import exit_code
    report = {"models": [_model(s) for s in states], "unknown": unknown, "errors": []}
    assert exit_code(report) == code
    # a model file that does not load (its unit does not exist): 1, failed models or not
    assert exit_code({**report, "errors": ["/etc/infer-units/x.toml: prot: unknown key"]}) == 1
