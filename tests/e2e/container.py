"""A Debian system (bookworm, trixie, ...) booted with real systemd in systemd-nspawn.

The base root of each suite (debootstrap minbase + systemd, dbus, python3) is
built once and kept as a tarball in $INFER_UNITS_E2E_CACHE (default
/var/cache/infer-units-e2e); each session unpacks a fresh copy, boots it, and
installs the .deb with apt (its dependencies come from Debian; the .debs apt
downloaded are copied back into the cache, per suite, and into the next
container, so later runs do not fetch them again; copied, not shared, so that
runs at the same time do not fight over apt's lock).  debootstrap's own default
mirror is used: the repository names no package host.

The container has a network namespace of its own (loopback only): servers in
two containers booted at the same time cannot take each other's ports.  What
needs the network (apt, build-deb) runs with sh(..., net=True): the
container's files and processes, the host's network.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE = Path(os.environ.get("INFER_UNITS_E2E_CACHE", "/var/cache/infer-units-e2e"))
BASE_PACKAGES = "systemd,systemd-sysv,dbus,python3,ca-certificates"
# An optional local mirror (e.g. an apt cache proxy); unset: debootstrap's default.
MIRROR = os.environ.get("INFER_UNITS_E2E_MIRROR", "")
DEFAULT_SUITES = ("bookworm", "trixie")
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    env = dict(os.environ, PATH=SYSTEM_PATH)
    return subprocess.run(argv, env=env, **kw)


def available() -> str | None:
    """None when e2e can run here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("debootstrap", "systemd-nspawn", "nsenter"):
        if not shutil.which(tool, path=SYSTEM_PATH):
            return f"{tool} not installed (apt-get install debootstrap systemd-container)"
    return None


def _devnull_args() -> list[str]:
    """nspawn copies the host's /dev/null with its mode.  Some sandboxes have it
    0644, and then nothing but root can write to it in the container: trixie's
    dbus-daemon fails to start (and every test that asks systemd over D-Bus with
    it), as would a model's server run as its `user`.  A node of our own with
    the mode every Debian host has (0666) is bound over it there."""
    if stat.S_IMODE(os.stat("/dev/null").st_mode) & 0o666 == 0o666:
        return []
    node = CACHE / "dev-null-0666"
    if not node.is_char_device():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = CACHE / f".dev-null-{os.getpid()}"
        os.mknod(tmp, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.chmod(tmp, 0o666)              # whatever the umask
        os.replace(tmp, node)
    return [f"--bind={node}:/dev/null"]


def suites() -> list[str]:
    """The suites to boot: $INFER_UNITS_E2E_SUITES (space separated), default all."""
    raw = os.environ.get("INFER_UNITS_E2E_SUITES", "").split()
    return raw or list(DEFAULT_SUITES)


def first_suite() -> list[str]:
    """The first of suites() alone: for tests whose subject is the same on
    every suite (the real engines run from the host's build, the same files in
    each container), where the suites' own differences (systemd 252 and 257)
    are covered by the tests that run on all of them."""
    return suites()[:1]


def base_tar(suite: str) -> Path:
    return CACHE / f"{suite}-base.tar"


def apt_archives(suite: str) -> Path:
    # bookworm's cache predates suites and keeps its old name.
    return CACHE / ("apt-archives" if suite == "bookworm" else f"apt-archives-{suite}")


def ensure_base(suite: str = "bookworm") -> Path:
    tar = base_tar(suite)
    if tar.exists():
        return tar
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"base-{suite}-", dir=CACHE))
    try:
        root = work / "root"
        argv = ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", suite, str(root)]
        if MIRROR:
            argv.append(MIRROR)
        done = _run(argv, timeout=1200)
        if done.returncode != 0:
            raise RuntimeError(f"debootstrap failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        (root / "etc/hostname").write_text("iu-e2e\n")
        # No login prompts or getty on the container console.
        for unit in ("console-getty.service", "getty@tty1.service"):
            link = root / "etc/systemd/system" / unit
            link.unlink(missing_ok=True)
            link.symlink_to("/dev/null")
        tmp = work / "base.tar"
        done = _run(["tar", "-C", str(root), "-cf", str(tmp), "."], timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"tar failed: {done.stderr}")
        os.replace(tmp, tar)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tar


@contextmanager
def kept_or_shut_down(c: "Container") -> Iterator["Container"]:
    """The container for a fixture's block, shut down when the block ends however
    it ends; with INFER_UNITS_E2E_KEEP set it is left running, for a look
    inside, and its root is said."""
    try:
        yield c
    finally:
        if os.environ.get("INFER_UNITS_E2E_KEEP"):
            print(f"e2e container kept at {c.root}")
        else:
            c.shutdown()


class Container:
    def __init__(self, suite: str = "bookworm", nspawn_args: tuple[str, ...] = ()) -> None:
        self.suite = suite
        self.nspawn_args = list(nspawn_args)     # e.g. a network namespace, a host name
        self.dir = Path(tempfile.mkdtemp(prefix=f"iu-e2e-{suite}-"))
        self.root = self.dir / "root"
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader = 0

    # ------------------------------------------------------------- lifecycle
    def boot(self) -> None:
        self.root.mkdir()
        done = _run(["tar", "-C", str(self.root), "-xf", str(ensure_base(self.suite))], timeout=600)
        assert done.returncode == 0, done.stderr
        inside = self.path("/var/cache/apt/archives")
        inside.mkdir(parents=True, exist_ok=True)
        cache = apt_archives(self.suite)
        for deb in cache.glob("*.deb") if cache.is_dir() else ():
            if not (inside / deb.name).exists():
                shutil.copy2(deb, inside / deb.name)
        self._start()

    def boot_root(self, root: Path) -> None:
        """Boot a root prepared elsewhere (a copy of another container's)."""
        self.root = root
        self._start()

    def _keep_archives(self) -> None:
        """The .debs apt fetched in here, for the next container (atomic per file)."""
        cache = apt_archives(self.suite)
        cache.mkdir(parents=True, exist_ok=True)
        for deb in self.path("/var/cache/apt/archives").glob("*.deb"):
            if not (cache / deb.name).exists():
                tmp = cache / f".{deb.name}.{os.getpid()}"
                shutil.copy2(deb, tmp)
                os.replace(tmp, cache / deb.name)

    def reboot(self) -> None:
        """Power off and boot the same root again (a new boot: generators run
        before journald, /run starts empty)."""
        self._stop()
        self._start()

    def power_cut(self) -> None:
        """The power lost: the container's init SIGKILLed, and with it every
        process of its PID namespace at once (no stop job, no ExecStopPost),
        then the same root booted again.  What the page cache held survives:
        a lost write is not part of this cut."""
        assert self.proc is not None and self.leader
        os.kill(self.leader, signal.SIGKILL)
        self.proc.wait(60)
        self.leader = 0
        self._start()

    def _network_args(self) -> list[str]:
        """A network namespace of its own (ports never clash with another
        container's); a caller that names its network keeps it."""
        if any(a.startswith(("--network", "--private-network")) for a in self.nspawn_args):
            return []
        return ["--private-network", "--resolv-conf=copy-host"]

    def _start(self) -> None:
        log = open(self.dir / "console.log", "ab")
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "-D", str(self.root), "--register=no", "--keep-unit",
             "--quiet", *self._network_args(), *_devnull_args(), *self.nspawn_args, "-b"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, PATH=SYSTEM_PATH, SYSTEMD_NSPAWN_TMPFS_TMP="0"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            self.leader = self._find_leader()
            if self.leader:
                state = self.sh("systemctl is-system-running --wait", check=False, timeout=120)
                if state.stdout.strip() in ("running", "degraded"):
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError("container did not boot:\n" +
                           (self.dir / "console.log").read_text(errors="replace")[-3000:])

    def _find_leader(self) -> int:
        assert self.proc is not None
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid == self.proc.pid and "(systemd)" in stat:
                    return int(entry)
            except (OSError, ValueError, IndexError):
                continue
        return 0

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()     # nspawn asks the container's systemd to power off
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.leader = 0

    def shutdown(self) -> None:
        self._stop()
        if self.root.is_dir():
            try:
                self._keep_archives()
            except OSError:
                pass      # a cache is only a cache
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------- inside
    def sh(self, script: str, check: bool = True, timeout: float = 300, net: bool = False,
           ) -> subprocess.CompletedProcess[str]:
        """Run a shell script inside the container: all its namespaces, or with
        net=True all but the network one (apt and pip reach the host's network)."""
        namespaces = ["-m", "-u", "-i", "-p", "-C"] if net else ["-a"]
        done = _run(["nsenter", "-t", str(self.leader), *namespaces, "/usr/bin/env", "-i",
                     f"PATH={SYSTEM_PATH}", "LANG=C.UTF-8", "PYTHONIOENCODING=utf-8", "/bin/sh", "-c", script],
                    timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"in container: {script}\nexit {done.returncode}\n"
                                 f"{done.stdout}\n{done.stderr}")
        return done

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def write(self, inside: str, text: str, mode: int = 0o644) -> None:
        target = self.path(inside)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        target.chmod(mode)

    def install_deb(self, deb: Path) -> subprocess.CompletedProcess[str]:
        shutil.copy(deb, self.path("/root") / deb.name)
        return self.sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                       f"apt-get install -y -qq --no-install-recommends /root/{deb.name}",
                       timeout=900, net=True)

    def journal(self, unit: str, since_cursor: str | None = None) -> str:
        return self.sh(f"journalctl -u {unit} -o cat --no-pager", check=False).stdout
