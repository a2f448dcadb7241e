"""`--json` prints one JSON document on stdout on every path, usage and
config errors included, and `check NAME` fails for a name with no file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer_units.helpers.cli.root import all_commands

from ..support import FakeGpus, base_env, run_cli


def one_document(done, code: int = 1) -> dict:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    document = json.loads(done.stdout)      # exactly one document: nothing before or after
    assert isinstance(document, dict)
    return document


def json_commands() -> list[str]:
    return sorted(name for name, command in all_commands().items()
                  if any("--json" in p.opts for p in command.params))


def test_every_json_command_is_covered() -> None:
    assert {"holders", "reap", "cat", "drain", "check", "render", "status", "doctor",
            "resume"} <= set(json_commands())


@pytest.mark.parametrize("command", json_commands())
def test_a_usage_error_is_one_json_document(command: str) -> None:
    """click's own usage errors (an unknown option), before the command runs:
    safe for drain and resume too, which would otherwise act on this host."""
    doc = one_document(run_cli(command, "--json", "--no-such-option"))
    assert "--no-such-option" in doc["error"] and doc["exit"] == 1


@pytest.fixture
def config(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "good.toml").write_text('engine = "command"\ncommand = ["/opt/srv/serve"]\n'
                                   'gpus = [0]\nport = 8000\n')
    (etc / "broken.toml").write_text('engine = "command"\ncommand = ["/opt/srv/serve"]\n'
                                     'port = 99999\n')
    return etc


@pytest.mark.parametrize("argv", [
    ("holders", "--gpus", "9", "--json"),
    ("holders", "--gpus", "", "--json"),
    ("reap", "--json"),                                   # --gpus missing
    ("reap", "--gpus", "9", "--dry-run", "--json"),
    ("reap", "--gpus", "0", "--timeout", "nan", "--dry-run", "--json"),
    ("reap", "--gpus", "0", "--foreign", "maybe", "--dry-run", "--json"),
    ("drain", "--timeout", "bad", "--json"),
    ("drain", "--timeout", "400000d", "--json"),
    ("cat", "nosuch", "--json"),
    ("cat", "--json"),                                    # NAME missing
    ("check", "nosuch", "--json"),
    ("check", "broken", "--json"),
    ("render", "nosuch", "--json"),
    ("status", "nosuch", "--json"),
    ("doctor", "nosuch", "--json"),
    ("resume", "--timeout", "-1s", "--json"),
])
def test_config_and_usage_errors_print_one_document(fake_gpus: FakeGpus, config: Path,
                                                    tmp_path: Path, argv: tuple[str, ...]) -> None:
    env = fake_gpus.env(INFER_UNITS_CONFIG_PATH=str(config),
                        INFER_UNITS_STATE_DIR=str(tmp_path / "state"))
    done = run_cli(*argv, env=env)
    assert done.returncode != 0, done
    doc = one_document(done, done.returncode)
    assert doc.get("error") or doc.get("errors") or doc.get("unknown"), doc


def test_cat_of_a_broken_model_is_one_document(config: Path) -> None:
    """cat shows the merged file, then fails on its error: still one document."""
    done = run_cli("cat", "broken", "--json", env=base_env(INFER_UNITS_CONFIG_PATH=str(config)))
    doc = one_document(done)
    assert doc["keys"]["port"]["value"] == 99999
    assert "port" in done.stderr and "65535" in done.stderr


# ---------------------------------------------------------------- check NAME

def test_check_of_a_missing_name_fails(config: Path) -> None:
    env = base_env(INFER_UNITS_CONFIG_PATH=str(config))
    done = run_cli("check", "--no-verify", "missing-name", env=env)
    assert done.returncode == 1, done
    assert f"no model file named missing-name.toml on the search path ({config})" in done.stderr
    # with a good model beside it: still an error, and the good one is still checked
    done = run_cli("check", "--no-verify", "good", "missing-name", env=env)
    assert done.returncode == 1 and "ok: " in done.stdout and "missing-name" in done.stderr
    assert run_cli("check", "--no-verify", "good", env=env).returncode == 0


def test_check_of_a_missing_name_on_an_empty_search_path_fails(tmp_path: Path) -> None:
    done = run_cli("check", "--no-verify", "missing-name",
                   env=base_env(INFER_UNITS_CONFIG_PATH=str(tmp_path)))
    assert done.returncode == 1 and "missing-name" in done.stderr, done
