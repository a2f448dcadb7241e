"""The tiers and the fixtures every tier shares (helpers live in support.py).

A test's tier is the directory it lives in (as pip's tests do): tests/unit
(no root, no other account, no containers, no network), tests/integration
(root, real accounts, real processes killed), tests/e2e (real systemd in
containers) and tests/gpu (the device machine).  Each test gets its tier's
marker, so `-m unit` and `-m "not e2e"` select by directory; a test file
anywhere else is refused rather than run in no tier (docs/testing.md)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .support import ATTACKER, FakeGpus, Holder, wait_until

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e", "gpu")
SESSION_TMP = pytest.StashKey[Path]()


# tryfirst: before pytest's tmpdir plugin reads --basetemp (Debian's pluggy
# has no type information for its decorator).
@pytest.hookimpl(tryfirst=True)  # type: ignore[untyped-decorator]
def pytest_configure(config: pytest.Config) -> None:
    """One temporary directory for everything the session writes: pytest's
    tmp_path, tempfile in the tests and in the programs they start (TMPDIR),
    hypothesis's database, the e2e containers, and the hooks' runtime
    directory.  Removed at the end, so a run leaves nothing in /tmp or /run."""
    session = Path(tempfile.mkdtemp(prefix="infer-units-tests-"))
    # Sticky and world-writable like /tmp: the other accounts the tests run as
    # use it too.  Root-owned, so its name cannot be taken from under us.
    session.chmod(0o1777)
    os.environ["TMPDIR"] = str(session)
    tempfile.tempdir = str(session)
    # The hooks' and the CLI's runtime directory (generator/paths.py run_dir:
    # claims, state, a refused edit's copy) here too, not the host's /run.
    run = session / "run"
    run.mkdir(mode=0o755)
    os.environ["INFER_UNITS_RUN_DIR"] = str(run)
    if config.option.basetemp is None:
        # pytest's own numbered directories would outlive the session
        config.option.basetemp = str(session / "pytest")
    config.stash[SESSION_TMP] = session
    # A SIGTERM (`timeout`, CI's cancel) ends the run as Ctrl-C does: the
    # fixtures' teardowns (containers, processes, the attacker account) and
    # this directory's removal still run.
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_TMP, None)
    if session is None:
        return
    if os.environ.get("INFER_UNITS_E2E_KEEP"):
        print(f"\nINFER_UNITS_E2E_KEEP: the session's files are kept in {session}")
        return
    shutil.rmtree(session, ignore_errors=True)


def tier_of(path: Path) -> str | None:
    """The tier directory `path` is in, None for a file outside every tier."""
    try:
        top = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return top if top in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            raise pytest.UsageError(
                f"{item.path}: a test outside the tier directories; put it in "
                f"{', '.join('tests/' + t for t in TIERS)}")
        item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture
def fake_gpus(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path / "fakegpu")


@pytest.fixture
def holders() -> Iterator[Callable[..., Holder]]:
    started: list[Holder] = []

    def start(devices: list[Path], mode: str = "plain", argv0: str | None = None,
              exe: str | None = None, exe_uid: int = 0) -> Holder:
        h = Holder(devices, mode, argv0, exe, exe_uid)
        started.append(h)
        return h

    yield start
    for h in started:
        h.stop()


@pytest.fixture(scope="session")
def attacker() -> Iterator[pwd.struct_passwd]:
    """The local attacker of the trust tests: a real account without root,
    whose commands run through setpriv.  The session's own (needs root):
    created here and removed at the end, so sessions at the same time do not
    share one and none is left in /etc/passwd."""
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    ATTACKER], check=True)
    account = pwd.getpwnam(ATTACKER)
    try:
        yield account
    finally:
        # A process a test left running as the attacker would keep the
        # account (userdel refuses): it is ended, and the leak reported.
        left = processes_of(account.pw_uid)
        for pid, cmdline in left.items():
            os.kill(pid, signal.SIGKILL)
            print(f"killed pid {pid} ({cmdline}): left running by a test as {ATTACKER}")
        assert wait_until(lambda: not processes_of(account.pw_uid), 10)
        subprocess.run(["userdel", ATTACKER], check=True)
        assert not left, f"tests left processes running as {ATTACKER}: {left}"


def processes_of(uid: int) -> dict[int, str]:
    """pid -> command line of every process whose real uid is `uid`."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                real = next(line.split()[1] for line in f if line.startswith("Uid:"))
            if int(real) == uid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, StopIteration):
            continue          # gone meanwhile
    return found


@pytest.fixture
def public() -> Iterator[Path]:
    """A root-owned 0755 directory other users can reach (pytest's tmp is 0700)."""
    path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="iu-public-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


CGROUP_V1 = Path("/sys/fs/cgroup/systemd")


@pytest.fixture
def user_cgroup() -> Iterator[Callable[[str], Path]]:
    """Cgroups under user 65534's user manager (name=systemd, the hierarchy
    the hooks read on a hybrid host like this one), as its delegated
    subtree lets that account make them (any name but one with "\\n" or
    "/"): make(relative path) -> the directory; removed afterwards, their
    processes moved back to the root cgroup."""
    if not (CGROUP_V1 / "cgroup.procs").exists() or not os.access(CGROUP_V1, os.W_OK):
        pytest.skip("cgroup v1 name=systemd not writable here")
    top = CGROUP_V1 / "user.slice/user-65534.slice/user@65534.service/app.slice"
    made: list[Path] = []

    def make(relative: str) -> Path:
        path = top / relative
        path.mkdir(parents=True, exist_ok=True)
        made.append(path)
        return path

    yield make
    for path in made:
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                (CGROUP_V1 / "cgroup.procs").write_text(pid)
            except OSError:
                pass
    for path in made:
        while path != top:          # the name's own directories, innermost first
            try:
                path.rmdir()
            except OSError:
                break
            path = path.parent
