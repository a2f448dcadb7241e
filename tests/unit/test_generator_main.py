"""The generator as systemd runs it: arguments, log target and level, and
writing nothing but its output directory."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from ..support import PYTHON, base_env

GOOD = 'engine = "command"\ncommand = ["/bin/serve"]\ngpus = [0]\n'
BAD = 'engine = "command"\ncommand = "not a list"\n'


def generator(args: list[str], config: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "infer_units.generator.main", *args],
                          capture_output=True, text=True, timeout=60,
                          env=base_env(INFER_UNITS_CONFIG_PATH=str(config), **env))


def setup_config(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "good.toml").write_text(GOOD)
    (etc / "bad.toml").write_text(BAD)
    return etc


def test_three_directories_and_only_the_first_is_written(tmp_path: Path) -> None:
    etc = setup_config(tmp_path)
    dirs = [tmp_path / d for d in ("normal", "early", "late")]
    for d in dirs:
        d.mkdir()
    done = generator([str(d) for d in dirs], etc)
    assert done.returncode == 0
    assert sorted(p.name for p in dirs[0].iterdir()) == ["good.service"]
    assert not any(dirs[1].iterdir()) and not any(dirs[2].iterdir())
    assert sorted(p.name for p in etc.iterdir()) == ["bad.toml", "good.toml"]
    assert f"{etc}/bad.toml: command: expected an array of strings, got str (no unit generated)" \
        in done.stderr


def test_wrong_argument_count_is_an_error(tmp_path: Path) -> None:
    done = generator([str(tmp_path), str(tmp_path)], setup_config(tmp_path))
    assert done.returncode == 1 and "usage: infer-units-generator" in done.stderr


def test_log_level_filters_messages(tmp_path: Path) -> None:
    etc = setup_config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    quiet = generator([str(out)], etc, SYSTEMD_LOG_LEVEL="crit")
    assert quiet.returncode == 0 and quiet.stderr == ""
    debug = generator([str(out)], etc, SYSTEMD_LOG_LEVEL="debug")
    assert "wrote good.service" in debug.stderr and "bad.toml" in debug.stderr
    numeric = generator([str(out)], etc, SYSTEMD_LOG_LEVEL="3")
    assert "bad.toml" in numeric.stderr and "wrote" not in numeric.stderr


def test_logs_go_to_kmsg_unless_console_is_asked_for(tmp_path: Path) -> None:
    etc = setup_config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    env = base_env(INFER_UNITS_CONFIG_PATH=str(etc))
    env.pop("SYSTEMD_LOG_TARGET", None)
    done = subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, env=env, timeout=60)
    # The kernel's log only: opening /dev/kmsg for writing where it does not
    # exist (a container's tmpfs /dev) would create a regular file, which
    # log.py rightly refuses, and this test would then expect the kmsg path.
    try:
        kmsg_writable = (stat.S_ISCHR(os.stat("/dev/kmsg").st_mode)
                         and os.access("/dev/kmsg", os.W_OK))
    except OSError:
        kmsg_writable = False
    assert not os.path.isfile("/dev/kmsg"), "a regular /dev/kmsg: something created it"
    if kmsg_writable:
        assert done.stderr == ""     # it went to the kernel log with a <3> priority
        log = subprocess.run(["dmesg", "--raw"], capture_output=True, text=True)
        if log.returncode == 0:
            assert any(line.startswith("<3>") and f"{etc}/bad.toml: command:" in line
                       for line in log.stdout.splitlines())
    else:
        assert "bad.toml" in done.stderr
