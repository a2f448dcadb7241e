"""The generator as systemd runs it: arguments, log target and level, and
writing nothing but its output directory."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

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


# Every system call that can create, change or remove a file, as strace names
# them, with the indexes of the (directory fd, path) pairs it writes at (None:
# a path relative to the working directory).
_WRITES: dict[str, tuple[tuple[int | None, int], ...]] = {
    "openat": ((0, 1),), "mkdirat": ((0, 1),), "unlinkat": ((0, 1),), "fchmodat": ((0, 1),),
    "mknodat": ((0, 1),), "symlinkat": ((1, 2),), "linkat": ((2, 3),),
    "renameat": ((0, 1), (2, 3)), "renameat2": ((0, 1), (2, 3)),
    "open": ((None, 0),), "creat": ((None, 0),), "mkdir": ((None, 0),), "unlink": ((None, 0),),
    "rmdir": ((None, 0),), "chmod": ((None, 0),), "truncate": ((None, 0),),
    "mknod": ((None, 0),), "symlink": ((None, 1),), "link": ((None, 1),),
    "rename": ((None, 0), (None, 1)),
}
_CALL = re.compile(r"^\d+ +(\w+)\((.*)\) += ")
_FD = re.compile(r"^(?:\d+|AT_FDCWD)<(.*)>$")


def _written_paths(line: str, cwd: str) -> list[str]:
    """Where one traced call writes, as absolute paths."""
    found = _CALL.match(line)
    assert found, line
    args = found.group(2).split(", ")
    if found.group(1) in ("openat", "open") and not any(
            flag in line for flag in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC")):
        return []
    paths = []
    for fd_at, path_at in _WRITES[found.group(1)]:
        path = args[path_at].strip('"')
        if not path.startswith("/"):
            directory = cwd if fd_at is None else _FD.match(args[fd_at])
            assert directory is not None, line
            path = os.path.join(directory if isinstance(directory, str) else directory.group(1),
                                path)
        paths.append(os.path.normpath(path))
    return paths


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_run_writes_nothing_outside_its_output_directory(tmp_path: Path) -> None:
    """systemd.generator(7): a generator writes into its output directories
    and nowhere else (no cache in /run).  Every successful call that could
    write is traced with the paths of its directory fds (strace -y); each
    must write inside the output directory.  Run as root with the default
    environment, the generator of old kept a cache in /run/infer-units."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "good.toml").write_text(GOOD + '[install]\nWantedBy = "multi-user.target"\n'
                                   '[liveness]\ninterval = "10s"\n')
    out = tmp_path / "out"
    out.mkdir()
    env = base_env(INFER_UNITS_CONFIG_PATH=str(etc))
    trace = tmp_path / "trace"
    done = subprocess.run(["strace", "-f", "-qq", "-y", "-e", "trace=" + ",".join(_WRITES),
                           "-e", "status=successful", "-e", "signal=none", "-o", str(trace),
                           PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "good.service").is_file()
    assert (out / "multi-user.target.wants" / "good.service").is_symlink()
    written = [path for line in trace.read_text().splitlines()
               for path in _written_paths(line, str(tmp_path))]
    assert str(out / "multi-user.target.wants") in written, "the trace is not what this reads"
    for path in written:
        if "/__pycache__/" in path:
            continue        # the interpreter's own byte-code cache, not the generator's
        assert path == str(out) or path.startswith(f"{out}/"), f"a write outside {out}: {path}"
