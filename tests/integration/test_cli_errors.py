"""Every bad invocation of the CLI and the hooks: one line on stderr, a
non-zero exit (1: usage), never a traceback; GPU selectors that are empty,
blank, ambiguous or not ASCII are usage errors, never "all"."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from ..support import PYTHON, FakeGpus, base_env, run_cli


def one_line_error(done, code: int = 1) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


SELECTORS = ["", " ", ",", "0,,1", " , ", "\u0661", "\u0660,1", "all,0", "GPU-0000000",
             "0x1", "-1", "1.0", "\u00b2"]


@pytest.mark.parametrize("selector", SELECTORS)
@pytest.mark.parametrize("command", [("reap", "--dry-run", "--gpus"), ("holders", "--gpus"),
                                     ("pre-start", "--unit", "m", "--gpus"),
                                     ("wait-free", "--gpus"), ("p2p-check", "--gpus")])
def test_bad_gpu_selectors_are_usage_errors(fake_gpus: FakeGpus, command, selector) -> None:
    done = run_cli(*command, selector, env=fake_gpus.env())
    line = one_line_error(done)
    assert "GPU" in line and "selector" in line or "not found" in line or "ambiguous" in line \
        or "cannot be combined" in line, line


def test_ambiguous_uuid_prefix_names_the_candidates(tmp_path: Path) -> None:
    fake = FakeGpus(tmp_path / "g", count=2)
    table = json.loads(fake.table.read_text())
    table["gpus"][0]["uuid"] = "GPU-aaaabbbb-0000"
    table["gpus"][1]["uuid"] = "GPU-aaaabbbb-1111"
    fake.table.write_text(json.dumps(table))
    line = one_line_error(run_cli("reap", "--gpus", "GPU-aaaabbbb", env=fake.env()))
    assert "ambiguous" in line and "GPU-aaaabbbb-0000" in line and "GPU-aaaabbbb-1111" in line
    # A unique prefix still works, and so does "all", alone.
    assert run_cli("reap", "--gpus", "GPU-aaaabbbb-1", "--dry-run", env=fake.env()).returncode == 0
    assert run_cli("reap", "--gpus", " all ", "--dry-run", env=fake.env()).returncode == 0


def _bad_env_files(tmp: Path) -> list[Path]:
    directory = tmp / "a-directory.env"
    directory.mkdir()
    binary = tmp / "binary.env"
    binary.write_bytes(b"CUDA_VISIBLE_DEVICES=\xff\xfe\n")
    return [directory, binary]


def test_table_of_bad_invocations(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    env = fake_gpus.env(INFER_UNITS_STATE_DIR=str(tmp_path / "state"))
    directory, binary = _bad_env_files(tmp_path)
    cases = [
        (("wait-port", "--port", "99999"), "port '99999' is not in 1-65535"),
        (("wait-port", "--port", "0"), "not in 1-65535"),
        (("wait-port", "--port", "\u0668\u0660"), "ASCII digits"),
        (("pre-start", "--unit", "m", "--port", "99999"), "not in 1-65535"),
        (("pre-start", "--unit", "m", "--port", "-5"), "--port"),
        (("pre-start", "--unit", "", "--gpus", "0"), "bad unit name"),
        (("reap", "--gpus", "0", "--unit", "a/b"), "bad unit name"),
        (("reap", "--gpus", "0", "--timeout", "\u0661\u0660s"), "ASCII"),
        (("reap", "--gpus", "0", "--timeout", "9" * 400 + "s"), "too large"),
        (("reap", "--gpus", "0", "--term-grace", "soon"), "bad time span"),
        (("pre-start", "--unit", "m", "--gpus", "0", "--timeout", "\u0665s"), "ASCII"),
        (("wait-free", "--gpus", "0", "--timeout", "1e999"), "bad time span"),
        (("drain", "--timeout", "forever"), "bad time span"),
        (("reap", "--gpus", "0", "--env-file", str(directory)), "cannot read"),
        (("reap", "--gpus", "0", "--env-file", str(binary)), "cannot read"),
        (("p2p-check", "--gpus", "0,1", "--env-file", str(directory)), "cannot read"),
        (("pre-start", "--unit", "m", "--gpus", "0", "--env-file", str(binary)), "cannot read"),
        (("wait-ready", "--url", "notaurl", "--timeout", "1s"), "notaurl"),
        (("wait-ready", "--url", "http://127.0.0.1:1/health", "--pid", "-1",
          "--timeout", "1s"), ""),
        (("status", "no-such-model"), "no model file named no-such-model.toml"),
        (("reap",), "--gpus"),
        (("nonsense-command",), "No such command"),
    ]
    for argv, expected in cases:
        done = run_cli(*argv, env=base_env(**{**env, "INFER_UNITS_CONFIG_PATH": str(tmp_path)}))
        assert done.returncode != 0, argv
        assert "Traceback" not in done.stderr + done.stdout, (argv, done.stderr)
        lines = [l for l in done.stderr.strip().splitlines()]
        errors = [l for l in lines if expected in l]
        assert errors, (argv, done.stderr)
        if argv[0] != "status":
            assert len(lines) == 1, (argv, done.stderr)
            assert done.returncode == 1, (argv, done.returncode, done.stderr)
        else:
            assert done.returncode == 1


DEEP = "deeply nested"


@pytest.mark.parametrize("content", [
    "{", '{"gpus": 5}', '{"gpus": [{"index": "x"}]}', DEEP,
    '{"gpus": [{"index": 1e400, "uuid": "GPU-1", "pci": "41:00.0", "device": "/x"}]}',
    '{"gpus": [{"index": true, "uuid": "GPU-1", "pci": "41:00.0", "device": "/x"}]}',
    '{"gpus": [{"index": 0, "uuid": "GPU-1", "pci": "41:00.0", "device": "/x"},'
    ' {"index": 0, "uuid": "GPU-2", "pci": "42:00.0", "device": "/y"}]}',
    "\xff\xfe",
], ids=lambda c: c[:24])
def test_corrupt_fake_table_is_one_line(tmp_path: Path, content: str) -> None:
    table = tmp_path / "gpus.json"
    if content == DEEP:
        content = "[" * 100000 + "]" * 100000
    table.write_bytes(content.encode() if content != "\xff\xfe" else b"\xff\xfe")
    env = base_env(INFER_UNITS_FAKE_GPUS=str(table), INFER_UNITS_RUN_DIR=str(tmp_path / "run"))
    for argv in (("holders",), ("reap", "--gpus", "0"), ("pre-start", "--unit", "m", "--gpus", "0"),
                 ("wait-free", "--gpus", "0")):
        line = one_line_error(run_cli(*argv, env=env))
        assert f"INFER_UNITS_FAKE_GPUS={table}" in line, line


def test_bad_baseline_variable_is_a_usage_error(fake_gpus: FakeGpus) -> None:
    line = one_line_error(run_cli("reap", "--gpus", "0", env=fake_gpus.env(
        INFER_UNITS_GPU_BASELINE_MIB="lots")))
    assert "INFER_UNITS_GPU_BASELINE_MIB" in line


def test_json_stays_valid_with_corrupt_state_and_unwritable_metrics(fake_gpus: FakeGpus,
                                                                    holders,
                                                                    tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "m.service.json").write_text('[1, 2, {"reaps_total": "x"}]')
    (state / "n.service.json").write_text('{"reaps_total": "NaN", "p2p_ok": [1]}')
    holders([fake_gpus.devices[0]])
    metrics = tmp_path / "not-a-dir"
    metrics.write_text("")
    env = fake_gpus.env(INFER_UNITS_STATE_DIR=str(state), INFER_UNITS_METRICS_DIR=str(metrics))
    for unit in ("m", "n"):
        done = run_cli("reap", "--gpus", "0", "--unit", unit, "--json", "--term-grace", "2s",
                       env=env)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)           # logs went to stderr
        assert report["exit"] == 0
        assert "metrics not written" in done.stderr
    # The state was replaced by a good one; the textfile could not be written.
    assert json.loads((state / "m.service.json").read_text())["reaps_total"] == 1
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text('engine = "sglang"\nmodel = "/m"\ngpus = [0]\nport = 18123\n')
    done = run_cli("status", "--json", env=fake_gpus.env(
        INFER_UNITS_STATE_DIR=str(state), INFER_UNITS_CONFIG_PATH=str(etc),
        DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent"))
    assert done.returncode == 1 and "systemd's view unavailable" in done.stderr, done.stderr
    assert json.loads(done.stdout)["models"][0]["name"] == "m"
    bad = run_cli("status", "m", "ghost", env=fake_gpus.env(
        INFER_UNITS_CONFIG_PATH=str(etc), DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent"))
    assert bad.returncode == 1 and "no model file named ghost.toml" in bad.stdout + bad.stderr


def test_unexpected_errors_are_one_line_unless_debugging(tmp_path: Path) -> None:
    # A fake table that is a directory: reading it fails deep down (IsADirectoryError).
    env = base_env(INFER_UNITS_FAKE_GPUS=str(tmp_path), INFER_UNITS_RUN_DIR=str(tmp_path / "r"))
    line = one_line_error(run_cli("holders", env=env))
    assert str(tmp_path) in line


def test_reap_reads_its_options_as_its_click_command_did(fake_gpus: FakeGpus) -> None:
    """reap (a click command, cli/reap.py) reads: a value that starts with
    "-", a trailing "--", a closed stdout, a COLUMNS that is not a number (found by this wave's review)."""
    env = fake_gpus.env()
    assert run_cli("reap", "--gpus", "0", "--dry-run", "--ignore", "-bash", env=env).returncode == 0
    done = run_cli("reap", "--gpus", "0", "--dry-run", "--json", "--", env=env, check=0)
    assert json.loads(done.stdout)["exit"] == 0
    assert run_cli("reap", "--gpus", "0", "--dry-run", env={**env, "COLUMNS": "wide"}).returncode == 0
    for extra in ([], ["--json"]):
        closed = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", PYTHON, "-m", "infer_units",
                                 "reap", "--gpus", "0", "--dry-run", *extra],
                                capture_output=True, text=True, env=env, timeout=60)
        assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr
    line = one_line_error(run_cli("reap", "--gpus", "0", "--", "extra", env=env))
    assert "extra" in line


def test_reap_interrupted_is_one_line_and_one_document(fake_gpus: FakeGpus, holders) -> None:
    """Ctrl-C while reap waits: "aborted", exit 1, one JSON document, as click's Abort was."""
    holder = holders([fake_gpus.devices[0]])
    p = subprocess.Popen([PYTHON, "-m", "infer_units", "reap", "--gpus", "0", "--foreign", "wait",
                          "--timeout", "60s", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=fake_gpus.env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stderr is not None
    first = p.stderr.readline()              # it is waiting for the holder now
    assert "waiting" in first, first
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "Traceback" not in err, err
    assert json.loads(out) == {"error": "aborted", "exit": 1}
    assert err.strip().splitlines() == ["infer-units: aborted"]
    assert holder.alive()                    # nothing was signalled
