"""Shared test helpers: run the real CLI and generator as subprocesses, build
fake GPU tables, and start real processes that hold fake GPU files.
(A module of its own: tests/ and tests/e2e/ each have a conftest.py.)"""

from __future__ import annotations

import atexit
import functools
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from infer_units.helpers.facts.gpus import ProcBackend

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
# The interpreter running the tests runs the CLI too (Debian's on hosts, the
# image's torch Python on the GPU machine).
PYTHON = sys.executable
# The trust tests' local attacker: a real account without root, one for each
# session (conftest.py).
ATTACKER = f"iu-attacker-{os.getpid()}"


# wait-free, drain and reap call a GPU free only when they can see every
# process that might hold it, which only root can.
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root: only root sees every process's open files")


@functools.cache
def code_copy() -> Path:
    """A root-owned 0755 copy of the package (and of tests/fake_torch) that the
    tests' subprocesses import.  What they run as another account (setpriv in
    the trust tests, the hooks' drop to nobody or to a model's user, the P2P
    self-test's script) must be readable by that account, as an installed
    package is; a checkout need not be (a clone under /root, 0700).  Made once
    a session in the session's temporary directory, which tests/conftest.py
    removes at the end; the tests' own process imports the checkout."""
    top = Path(tempfile.mkdtemp(prefix="infer-units-code-"))
    # Gone with the process too where no session removes it (a bench script).
    atexit.register(shutil.rmtree, top, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__")
    # Symlinks followed: infer_units/ links to the card's folders, as installed.
    shutil.copytree(ROOT / "infer_units", top / "infer_units", ignore=skip)
    shutil.copytree(TESTS / "fake_torch", top / "fake_torch", ignore=skip)
    for path in [top, *top.rglob("*")]:
        executable = path.is_dir() or os.access(path, os.X_OK)
        path.chmod(0o755 if executable else 0o644)
    return top


def fake_torch() -> Path:
    """The CPU stand-in for torch (tests/fake_torch), where anyone can read it."""
    return code_copy() / "fake_torch"


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code_copy())
    # `python -m` would put the working directory (the checkout, when pytest
    # runs there) before PYTHONPATH: the copy is what every subprocess imports.
    env["PYTHONSAFEPATH"] = "1"
    env.setdefault("SYSTEMD_LOG_TARGET", "console")
    # [nodes] ranks by host name: the tests' host is gpu-a.example, whatever this machine is
    env.setdefault("INFER_UNITS_HOSTNAME", "gpu-a.example")
    env.update(extra)
    return env


def script_env(**extra: str) -> dict[str, str]:
    """base_env for a script of tools/, which imports its neighbours: its own
    directory first on sys.path, as when it is run by hand."""
    env = base_env(**extra)
    del env["PYTHONSAFEPATH"]
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
            check: int | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([PYTHON, "-m", "infer_units", *args], capture_output=True, text=True,
                          env=env or base_env(), timeout=timeout)
    if check is not None:
        assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
    return done


def run_generator(out: Path, config_path: str, **env: str) -> subprocess.CompletedProcess[str]:
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=60,
                          env=base_env(INFER_UNITS_CONFIG_PATH=config_path, **env))


class FakeGpus:
    """A gpus.json for INFER_UNITS_FAKE_GPUS and its device files."""

    def __init__(self, directory: Path, count: int = 4) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.devices = [self.dir / f"nvidia{i}" for i in range(count)]
        for d in self.devices:
            d.touch()
        self.uuids = [f"GPU-{i:08x}-1111-2222-3333-{i:012x}" for i in range(count)]
        self.table = self.dir / "gpus.json"
        self.table.write_text(json.dumps({"gpus": [
            {"index": i, "uuid": self.uuids[i], "pci": f"0000:{0x41 + i:02x}:00.0",
             "device": str(self.devices[i]), "memory_mib": 143771} for i in range(count)]}))

    def env(self, **extra: str) -> dict[str, str]:
        # Start claims (helpers/decide/claims.py) go under the test's directory, not /run.
        extra.setdefault("INFER_UNITS_RUN_DIR", str(self.dir / "run"))
        return base_env(INFER_UNITS_FAKE_GPUS=str(self.table), **extra)


HOLDER = r"""
import os, signal, sys, time
files = [open(p, "rb") for p in sys.argv[2].split(",") if p]
mode = sys.argv[1]
if "ignore-term" in mode:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "slow-term" in mode:
    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.3), sys.exit(0)))
if "orphans" in mode:
    # A parent with TP-style workers that keep the GPU files after it dies.
    for _ in range(2):
        if os.fork() == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(60)
print("ready", flush=True)
while True:
    time.sleep(60)
"""


class Holder:
    """A real process that holds fake GPU device files open."""

    def __init__(self, devices: list[Path], mode: str = "plain", argv0: str | None = None,
                 exe: str | None = None, exe_uid: int = 0) -> None:
        self.devices = list(devices)
        argv = [PYTHON, "-c", HOLDER, mode, ",".join(str(d) for d in devices)]
        if exe:
            # Run a copy of the interpreter named `exe`, owned by exe_uid
            # (ignore-list tests: the list trusts root-owned executables only).
            copy = Path(devices[0]).parent / "bin" / exe
            copy.parent.mkdir(exist_ok=True)
            if not copy.exists():
                shutil.copy2(os.path.realpath(PYTHON), copy)
                os.chmod(copy, 0o755)
                os.chown(copy, exe_uid, -1)
            argv[0] = str(copy)
        if argv0:
            # Run under another name (ignore-list tests): exec through a symlink.
            link = Path(devices[0]).parent / argv0
            if not link.exists():
                link.symlink_to(PYTHON)
            argv[0] = str(link)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", line
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        # Its "orphans" workers left its session: whatever still holds one of
        # its device files (the test's own, under its tmp_path) is one of them.
        held = {str(d) for d in self.devices}
        for pid in holders_of(held):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def holders_of(paths: set[str]) -> list[int]:
    """The pids with one of `paths` open."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in paths
                   for fd in os.listdir(f"/proc/{entry}/fd")):
                found.append(int(entry))
        except OSError:
            continue          # gone meanwhile, or not ours to read
    return found


def alive(pid: int) -> bool:
    """The pid is a process that has not exited: there, and not a zombie
    (the GPU harness and bench/llama_restart_bench.py use it too)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, step: float = 0.02,
               max_step: float = 0.2) -> bool:
    """The tests' one wait: poll `predicate` until it holds or `timeout`
    passes; its last answer.  Polls every `step` at first, backing off to
    `max_step` (a check that runs a command in a container is not free),
    so a quick state is seen at once and a slow one costs little."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
        step = min(step * 1.5, max(max_step, step))
    return bool(predicate())


DRIVER_INFO = """Model: \t\t NVIDIA H200
IRQ:   \t\t 94
GPU UUID: \t {uuid}
Video BIOS: \t 96.00.a5.00.01
Bus Type: \t PCIe
Device Minor: \t {minor}
"""


def fake_driver(tmp: Path) -> ProcBackend:
    """The files of a loaded driver with three GPUs and no NVML (the /proc
    backend's input), under `tmp`."""
    proc, dev = tmp / "proc", tmp / "dev"
    dev.mkdir(parents=True)
    # Minor numbers need not follow PCI order.
    for pci, minor in (("0000:41:00.0", 2), ("0000:42:00.0", 0), ("0000:c1:00.0", 1)):
        (proc / pci).mkdir(parents=True)
        (proc / pci / "information").write_text(DRIVER_INFO.format(uuid=f"GPU-{pci[5:7]}aa0000-1111",
                                                            minor=minor))
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    return ProcBackend(str(proc), str(dev))


@contextmanager
def http_server(handler: type[http.server.BaseHTTPRequestHandler], host: str = "127.0.0.1",
                server_class: type[http.server.ThreadingHTTPServer] = http.server.ThreadingHTTPServer,
                ) -> Iterator[http.server.ThreadingHTTPServer]:
    """A real HTTP server on a free port of `host`, answering with `handler` from
    a thread per request until the block ends; then shut down and closed."""
    httpd = server_class((host, 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
