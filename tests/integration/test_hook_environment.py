"""The root hooks never run with the server's environment: a
model's [env] reaches every command of its unit, the `+` hooks included, so
the installed CLI (what units run) keeps only what systemd tells a command,
a fixed PATH and the operator's hook settings; the test variables
(INFER_UNITS_FAKE_GPUS, ...) only on a host marked for tests by a root-only
file (helpers/hookenv.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from infer_units.helpers import hookenv

from ..support import PYTHON, ROOT, FakeGpus, alive, base_env, run_cli, wait_until

LAUNCHER = ROOT / "packaging/infer-units"
# The .deb's /usr/bin/infer-units, run from this checkout: its own text, under
# its own `python3 -I`, with the checkout put on sys.path by hand (-I ignores
# PYTHONPATH, which is the point).
RUN_LAUNCHER = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); sys.argv[0] = 'infer-units'; "
                f"exec(compile(open({str(LAUNCHER)!r}).read(), {str(LAUNCHER)!r}, 'exec'))")

HOLD = "import sys, time; f = open(sys.argv[1], 'rb'); print('up', flush=True); time.sleep(600)"


def test_a_fake_gpu_table_in_env_cannot_make_an_installed_hook_kill(tmp_path: Path) -> None:
    """The attack: [env] INFER_UNITS_FAKE_GPUS pointing at a table whose
    "device" is a file some other process holds open makes the root pre-start
    hook see that process as a GPU user and kill it.  Installed, the hook
    ignores the variable (this host is not marked for tests) and so refuses
    the selector: the fake GPU's UUID is no GPU of this host."""
    fake = FakeGpus(tmp_path / "g", count=1)
    victim = subprocess.Popen([PYTHON, "-c", HOLD, str(fake.devices[0])], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert victim.stdout is not None and victim.stdout.readline().strip() == "up"
        # what systemd hands the hook: the unit's Environment= (the model's [env])
        env = base_env(INFER_UNITS_FAKE_GPUS=str(fake.table),
                       INFER_UNITS_RUN_DIR=str(tmp_path / "run"),
                       PYTHONPATH=str(tmp_path),
                       INVOCATION_ID="0123456789abcdef0123456789abcdef")
        done = subprocess.run([PYTHON, "-I", "-c", RUN_LAUNCHER, "pre-start", "--unit", "m",
                               "--gpus", fake.uuids[0], "--foreign", "kill", "--term-grace", "1s",
                               "--timeout", "5s"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 1, (done.returncode, done.stderr)
        assert alive(victim.pid), "the hook killed a process through a fake GPU table"
        assert "SIGTERM" not in done.stderr and "SIGKILL" not in done.stderr, done.stderr
    finally:
        victim.kill()
        victim.wait()


def test_the_tests_invocation_keeps_the_fake_backend(tmp_path: Path) -> None:
    """`python3 -m infer_units` (no unit runs it) keeps the caller's
    environment: the same hook, same table, reaps the holder."""
    fake = FakeGpus(tmp_path / "g", count=1)
    holder = subprocess.Popen([PYTHON, "-c", HOLD, str(fake.devices[0])], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        done = run_cli("pre-start", "--unit", "m", "--gpus", fake.uuids[0], "--foreign", "kill",
                       "--term-grace", "1s", "--timeout", "20s", env=fake.env())
        assert done.returncode == 0, done.stderr
        assert wait_until(lambda: holder.poll() is not None, 20), "the holder was not reaped"
    finally:
        holder.kill()
        holder.wait()


def test_what_a_hook_keeps_of_its_environment() -> None:
    unit_env = {
        # systemd's own
        "INVOCATION_ID": "abc", "SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited",
        "EXIT_STATUS": "1", "MAINPID": "42", "JOURNAL_STREAM": "8:1", "SYSTEMD_EXEC_PID": "7",
        # the operator's hook settings
        "INFER_UNITS_METRICS_DIR": "/var/lib/prometheus/node-exporter",
        "INFER_UNITS_GPU_BASELINE_MIB": "0",
        # the server's
        "PATH": "/home/inference/.venv/bin:/usr/bin", "PYTHONPATH": "/home/inference",
        "PYTHONHOME": "/home/inference", "LD_PRELOAD": "/home/inference/x.so",
        "LD_LIBRARY_PATH": "/home/inference/lib", "OPENSSL_CONF": "/home/inference/ssl.cnf",
        "SSL_CERT_FILE": "/home/inference/ca.pem", "TMPDIR": "/home/inference/tmp",
        "HOME": "/home/inference", "LOCPATH": "/home/inference/locale", "GCONV_PATH": "/x",
        "NCCL_P2P_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "0", "HF_HOME": "/models",
        # the tests'
        "INFER_UNITS_FAKE_GPUS": "/home/inference/gpus.json", "INFER_UNITS_RUN_DIR": "/tmp/x",
        "INFER_UNITS_LIVENESS_DIR": "/tmp/y",
    }
    kept = hookenv.hook_environment(unit_env, testing=False)
    assert kept == {
        "INVOCATION_ID": "abc", "SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited",
        "EXIT_STATUS": "1", "MAINPID": "42", "JOURNAL_STREAM": "8:1", "SYSTEMD_EXEC_PID": "7",
        "INFER_UNITS_METRICS_DIR": "/var/lib/prometheus/node-exporter",
        "INFER_UNITS_GPU_BASELINE_MIB": "0", "PATH": hookenv.DEFAULT_PATH}
    testing = hookenv.hook_environment(unit_env, testing=True)
    assert testing["INFER_UNITS_FAKE_GPUS"] == "/home/inference/gpus.json"
    assert "LD_PRELOAD" not in testing and testing["PATH"] == hookenv.DEFAULT_PATH
    # `infer-units canary NAME` reads the model's [env] by the same rule
    assert hookenv.hook_settings(unit_env, testing=False) == {
        "INFER_UNITS_METRICS_DIR": "/var/lib/prometheus/node-exporter",
        "INFER_UNITS_GPU_BASELINE_MIB": "0"}


@pytest.mark.skipif(os.geteuid() != 0, reason="root-owned files need root")
def test_only_a_root_only_marker_marks_a_test_host(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir(mode=0o755)
    etc.chmod(0o755)
    marker = etc / "hooks-test-mode"
    assert not hookenv._root_only(str(marker))          # absent
    marker.write_text("test host\n")
    marker.chmod(0o644)
    assert hookenv._root_only(str(marker))
    marker.chmod(0o666)                                  # anyone could have written it
    assert not hookenv._root_only(str(marker))
    marker.chmod(0o644)
    os.chown(marker, 65534, 65534)                       # not root's
    assert not hookenv._root_only(str(marker))
    os.chown(marker, 0, 0)
    etc.chmod(0o777)                                     # its directory: anyone's
    assert not hookenv._root_only(str(marker))
    etc.chmod(0o755)
    link = etc / "link"
    link.symlink_to(marker)                              # a link is never followed
    assert not hookenv._root_only(str(link))
    (etc / "dir").mkdir()
    assert not hookenv._root_only(str(etc / "dir"))
