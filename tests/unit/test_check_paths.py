"""`infer-units check PATH` validates a model file anywhere, before it is
installed, as the generator would load it once installed; and it runs
systemd-analyze verify on the units it would get (warnings)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ..support import base_env, run_cli

MODEL = 'engine = "command"\ncommand = ["{program}", "--x"]\ngpus = [{gpu}]\nport = {port}\n'


def env(search: Path) -> dict[str, str]:
    return base_env(INFER_UNITS_CONFIG_PATH=str(search))


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """An installed model on the search path, and a place outside it."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "installed.toml").write_text(MODEL.format(program="/bin/true", gpu=0, port=18600))
    (etc / "defaults.toml.d").mkdir()
    (etc / "defaults.toml.d" / "10-host.toml").write_text('[reap]\nterm-grace = "3s"\n')
    (tmp_path / "new").mkdir()
    return tmp_path


def test_a_file_anywhere_is_checked_as_it_would_be_installed(host: Path) -> None:
    new = host / "new" / "fresh.toml"
    new.write_text(MODEL.format(program="/bin/true", gpu=1, port=18601))
    done = run_cli("check", "--no-verify", "--json", str(new), env=env(host / "etc"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] == [{"path": str(new), "unit": "fresh.service"}]
    # host defaults apply, as after installing it
    unit = run_cli("render", str(new), env=env(host / "etc")).stdout
    assert "--term-grace 3s" in unit


def test_its_own_drop_ins_count_and_errors_name_them(host: Path) -> None:
    new = host / "new" / "fresh.toml"
    new.write_text(MODEL.format(program="/bin/true", gpu=1, port=18601))
    (host / "new" / "fresh.toml.d").mkdir()
    bad = host / "new" / "fresh.toml.d" / "50-bad.toml"
    bad.write_text("port = 99999\n")
    done = run_cli("check", "--no-verify", str(new), env=env(host / "etc"))
    assert done.returncode == 1
    assert f"error: {bad}: port: port 99999 is outside 1..65535" in done.stderr


def test_overlaps_with_installed_models_are_reported(host: Path) -> None:
    new = host / "new" / "clash.toml"
    new.write_text(MODEL.format(program="/bin/true", gpu=0, port=18600))
    done = run_cli("check", "--no-verify", str(new), env=env(host / "etc"))
    assert done.returncode == 1
    # said against the file checked, naming the installed one (not blaming it)
    assert f"error: {new}: gpus: GPU 0 also used by installed ({host}/etc/installed.toml)" \
        in done.stderr, done.stderr
    assert "error: " + str(host / "etc" / "installed.toml") not in done.stderr, done.stderr


def test_a_new_version_of_an_installed_model_replaces_it(host: Path) -> None:
    new = host / "new" / "installed.toml"     # same name, other GPU: no clash with itself
    new.write_text(MODEL.format(program="/bin/true", gpu=3, port=18600))
    done = run_cli("check", "--no-verify", str(new), env=env(host / "etc"))
    assert done.returncode == 0, done.stderr
    assert f"ok: {new} -> installed.service" in done.stdout


def test_a_missing_file_is_an_error(host: Path) -> None:
    done = run_cli("check", str(host / "new" / "nothere.toml"), env=env(host / "etc"))
    assert done.returncode == 1
    assert f"error: {host / 'new' / 'nothere.toml'}: no such file" in done.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_verify_findings_are_warnings(host: Path) -> None:
    new = host / "new" / "fresh.toml"
    new.write_text(MODEL.format(program="/nonexistent/serve", gpu=1, port=18601))
    done = run_cli("check", "--json", str(new), env=env(host / "etc"))
    assert done.returncode == 0, done.stderr
    assert ("warning: systemd-analyze verify: fresh.service: Command /nonexistent/serve "
            "is not executable") in done.stderr
    report = json.loads(done.stdout)
    assert any("/nonexistent/serve" in line for line in report["verify"]["fresh.service"])
    quiet = run_cli("check", "--no-verify", str(new), env=env(host / "etc"))
    assert "systemd-analyze" not in quiet.stderr


def test_every_error_of_a_file_is_reported_each_naming_file_and_key(host: Path) -> None:
    new = host / "new" / "many.toml"
    new.write_text(MODEL.format(program="/bin/true", gpu=1, port=99999)
                   + 'colour = "red"\n[reap]\nterm-grace = "soon"\n')
    done = run_cli("check", "--no-verify", "--json", str(new), env=env(host / "etc"))
    assert done.returncode == 1
    errors = json.loads(done.stdout)["errors"]
    assert len(errors) == 3, errors
    for key in ("port", "colour", "reap.term-grace"):
        assert any(e.startswith(f"{new}: {key}: ") for e in errors), (key, errors)
        assert f"error: {new}: {key}: " in done.stderr
