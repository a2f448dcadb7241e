"""Long model names, the engines' own drain flags, and the
program's name -- each a clear error naming file, key and reason, never a
partial write, an internal error or a unit systemd refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_units.generator.atomicfile import write_file
from infer_units.generator.loader import NAME_MAX, TEMP_EXTRA

from ..support import base_env, run_cli, run_generator
from ..unitfile import values

COMMAND = 'engine = "command"\ncommand = ["/opt/srv/serve"]\ngpus = [0]\nport = 8000\n'
# a probe timeout beyond the template's 300s: the generator writes
# infer-units-liveness@NAME.service.d/ for it, the longest name of a model
LIVENESS = '[liveness]\ninterval = "20s"\ntimeout = "10min"\n'


def generate_one(tmp_path: Path, name: str, body: str):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / f"{name}.toml").write_text(body)
    out = tmp_path / "out"
    done = run_generator(out, str(etc))
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    return done, written


LIVENESS_MAX = 255 - TEMP_EXTRA - len(".liveness.json")


def test_the_limits_are_the_longest_files_written_for_a_model(tmp_path: Path) -> None:
    """Written for real, through the one file writer (its temporary names
    included): the hooks' metrics state of the longest name, the liveness
    state of the longest name with liveness; one more character does not fit."""
    write_file(str(tmp_path / f"{'m' * NAME_MAX}.service.json"), "{}")
    write_file(str(tmp_path / f"{'m' * LIVENESS_MAX}.liveness.json"), "{}")
    with pytest.raises(OSError):
        write_file(str(tmp_path / f"{'m' * (NAME_MAX + 1)}.service.json"), "{}")
    assert len(f"infer-units-liveness@{'m' * LIVENESS_MAX}.service.d") <= 255


@pytest.mark.parametrize("length", [NAME_MAX - 1, NAME_MAX])
def test_longest_names_without_liveness_generate_whole(tmp_path: Path, length: int) -> None:
    name = "m" * length
    done, written = generate_one(tmp_path, name, COMMAND + '[liveness]\ninterval = "0"\n'
                                 '[install]\nWantedBy = "multi-user.target"\n')
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert written == [f"{name}.service", "multi-user.target.wants",
                       f"multi-user.target.wants/{name}.service"]


@pytest.mark.parametrize("length", [NAME_MAX + 1, 228, 234, 240, 250])
def test_longer_names_are_refused_by_name_and_nothing_is_written(tmp_path: Path,
                                                                 length: int) -> None:
    name = "m" * length
    done, written = generate_one(tmp_path, name, COMMAND + '[liveness]\ninterval = "0"\n'
                                 '[install]\nWantedBy = "multi-user.target"\n')
    assert written == [], written
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and f"{name}.toml" in lines[0], lines
    assert f"{length} characters, more than {NAME_MAX}" in lines[0], lines


def test_longest_name_with_liveness_writes_every_file(tmp_path: Path) -> None:
    name = "m" * LIVENESS_MAX
    done, written = generate_one(tmp_path, name, COMMAND + LIVENESS)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert f"infer-units-liveness@{name}.service.d/50-liveness.conf" in written, written
    assert f"{name}.service" in written


@pytest.mark.parametrize("length", [LIVENESS_MAX + 1, NAME_MAX])
def test_a_name_too_long_for_its_liveness_units_is_refused_whole(tmp_path: Path,
                                                                 length: int) -> None:
    """No unit without its liveness drop-ins (a partial write), no false error."""
    name = "m" * length
    done, written = generate_one(tmp_path, name, COMMAND + LIVENESS)
    assert written == [], written
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "liveness.interval" in lines[0] and "too long" in lines[0], lines
    assert "File name too long" not in done.stderr


# ---------------------------------------------------------------- drain flags

VLLM = 'engine = "vllm"\nmodel = "/m"\ngpus = [0]\nport = 8000\n'
TGI = 'engine = "tgi"\nmodel = "/m"\ngpus = [0]\nport = 8000\n'


def check(tmp_path: Path, body: str):
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "m.toml").write_text(body)
    return run_cli("check", "--no-verify", env=base_env(INFER_UNITS_CONFIG_PATH=str(etc))), etc


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e20", "10s", "", " 5", "99999999999999"])
def test_vllm_shutdown_timeout_that_is_no_whole_seconds(tmp_path: Path, value: str) -> None:
    done, etc = check(tmp_path, VLLM + f'args = ["--shutdown-timeout", "{value}"]\n')
    assert done.returncode == 1, done
    assert f"{etc}/m.toml: args: --shutdown-timeout" in done.stderr, done.stderr
    assert "whole seconds" in done.stderr and "internal error" not in done.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e20"])
def test_tgi_graceful_termination_from_its_env(tmp_path: Path, value: str) -> None:
    done, etc = check(tmp_path, TGI + f'[env]\nGRACEFUL_TERMINATION_TIMEOUT = "{value}"\n')
    assert done.returncode == 1, done
    assert f"{etc}/m.toml: env.GRACEFUL_TERMINATION_TIMEOUT: " in done.stderr, done.stderr
    assert "whole seconds" in done.stderr


@pytest.mark.parametrize("body, expected", [
    (VLLM + 'args = ["--shutdown-timeout=120"]\n', "165s"),     # 120 + 30 teardown + 15
    (TGI + '[env]\nGRACEFUL_TERMINATION_TIMEOUT = "45"\n', "135s"),  # 2 x 45 + 30 + 15
])
def test_whole_seconds_give_a_stop_window_around_them(tmp_path: Path, body: str,
                                                      expected: str) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text(body)
    done = run_cli("render", "m", env=base_env(INFER_UNITS_CONFIG_PATH=str(etc)), check=0)
    unit = done.stdout.split("\n", 1)[1]
    assert values(unit, "Service", "TimeoutStopSec") == [expected]


# ---------------------------------------------------------------- the program

@pytest.mark.parametrize("body, key", [
    (VLLM + 'python = "/opt/venv/bin/py\\tthon"\n', "python"),
    (VLLM + 'python = "/opt/venv/bin/python\\u000b"\n', "python"),
    (TGI + 'executable = "/opt/tgi/text-generation-launcher\\t"\n', "executable"),
    (TGI + 'executable = "text\\u00a0generation-launcher"\n', "executable"),
    ('engine = "command"\ncommand = ["/opt/srv/se\\tve", "x"]\ngpus = [0]\n', "command"),
    ('engine = "command"\ncommand = ["/opt/srv/se\\u2003ve"]\ngpus = [0]\n', "command"),
])
def test_whitespace_or_control_in_the_program_is_refused(tmp_path: Path, body: str,
                                                         key: str) -> None:
    done, etc = check(tmp_path, body)
    assert done.returncode == 1, done
    assert f"{etc}/m.toml: {key}: " in done.stderr, done.stderr
    assert ("systemd refuses in the name of the program" in done.stderr
            or "control character" in done.stderr), done.stderr


def test_a_space_in_the_program_path_still_works(tmp_path: Path) -> None:
    done, _ = check(tmp_path, 'engine = "command"\ncommand = ["/opt/my srv/serve"]\n'
                              'gpus = [0]\n')
    assert done.returncode == 0, done
