"""Per-GPU start claims: of two services starting at once on a shared GPU,
exactly one gets it.

Attribution alone cannot decide a race: when two pre-start hooks run at the
same moment neither server holds the GPU yet, so both would pass.  So each
pre-start, before reaping, takes a claim on its GPUs:

  - every GPU has a lock file, RUN_DIR/gpu/<uuid>.lock (RUN_DIR:
    generator/paths.py's run_dir(), a tmpfs: claims do not
    outlive a boot), 0600 in a 0700 directory: only root can open it,
    so only root can lock it;
  - the hook flocks the files of its GPUs in index order (two hooks never
    wait on each other crosswise), reads the claim each holds, and if another
    unit's claim is live it gives up (exit 2, "another infer-units service");
    otherwise it writes its own claim into each file and unlocks.  The locks
    are held for the read-and-write only (milliseconds), not for the reap;
  - a claim is live while its unit is active, activating (ExecStartPre,
    loading, auto-restart), reloading or deactivating (its processes may still
    hold the GPU), as systemd says.  Without systemd (tests, chroots) it is
    live while the cgroup it was written from has processes, or while the
    hook that wrote it runs;
  - wait-free (ExecStopPost) clears its own claim once the unit's processes
    are gone, so a waiting neighbour need not wait for the unit to turn
    inactive; a failed pre-start clears its claim too.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from dataclasses import dataclass

from ...generator.atomicfile import Dir, UnsafePath, ensure_dir, read_text
from ...generator.paths import run_dir
from ..facts.gpus import Gpu
from ..facts.procinfo import read_cgroup, read_stat, unit_of_cgroup


LIVE_STATES = ("active", "activating", "deactivating", "reloading")
LOCK_DIR_MODE = 0o700
LOCK_MODE = 0o600
LOCK_POLL_S = 0.005
CGROUP_ROOTS = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


def lock_name(gpu: Gpu) -> str:
    key = gpu.uuid or gpu.pci or str(gpu.index)
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in key) + ".lock"


@dataclass(frozen=True)
class Claim:
    unit: str
    pid: int              # the hook that wrote it
    start_time: int       # of that hook (pid reuse)
    cgroup: str           # where it ran: the unit's cgroup when run as ExecStartPre

    def as_text(self) -> str:
        return json.dumps({"unit": self.unit, "pid": self.pid, "start_time": self.start_time,
                           "cgroup": self.cgroup}) + "\n"

    @staticmethod
    def parse(text: str) -> "Claim | None":
        if not text.strip():
            return None          # cleared (the usual case): no error to build
        try:
            d = json.loads(text)
            return Claim(str(d["unit"]), int(d["pid"]), int(d["start_time"]), str(d["cgroup"]))
        except (ValueError, KeyError, TypeError):
            return None          # empty (cleared) or damaged: no claim


def claimed_gpus(unit: str, gpus: list[Gpu]) -> set[int]:
    """Which of `gpus` the claims name `unit` on: root's record of where an
    infer-units service runs (its start wrote it; its stop clears it).  A
    claim file is read without its lock: a claim being written at this
    moment belongs to a start that takes the GPU's lock before it reaps."""
    out = set()
    for g in gpus:
        claim = Claim.parse((read_text(os.path.join(run_dir(), "gpu", lock_name(g)))
                             or "") if os.geteuid() == 0 else "")
        if claim is not None and claim.unit == unit:
            out.add(g.index)
    return out


class ClaimError(Exception):
    """The lock files cannot be used: `timed_out` when another hook kept the
    lock too long, otherwise they cannot be created (not root?)."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def _cgroup_populated(path: str) -> bool | None:
    for root in CGROUP_ROOTS:
        try:
            with open(f"{root}{path}/cgroup.procs", encoding="ascii") as f:
                return bool(f.read().split())
        except OSError:
            continue
    return None


def claim_live(claim: Claim) -> tuple[bool, str]:
    """(live, how we know)."""
    try:
        from ..facts.systemd import SystemdUnavailable, unit_state
        try:
            state = unit_state(claim.unit)
            return state.active_state in LIVE_STATES, f"{state.active_state}/{state.sub_state}"
        except SystemdUnavailable:
            pass
    except ImportError:
        pass
    if claim.cgroup and unit_of_cgroup(claim.cgroup) == claim.unit:
        populated = _cgroup_populated(claim.cgroup)
        if populated:
            return True, f"processes in {claim.cgroup}"
    stat = read_stat(claim.pid)
    if stat is not None and stat[2] == claim.start_time:
        return True, f"its start hook pid {claim.pid} runs"
    return False, "no process left"


def _narrow(fd: int, mode: int) -> None:
    """Our directory at exactly `mode` (never one another account owns)."""
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and st.st_mode & 0o7777 != mode:
        os.fchmod(fd, mode)


def _lock(locks: Dir, name: str, deadline: float) -> int:
    """An fd of lock file `name`, flocked, that is the file `locks` names now.

    A file that is not exactly ours and 0600 with one name (an older
    version's 0644, a hard link made meanwhile) is replaced, never narrowed:
    an fd another account opened while it could still takes flock after a
    chmod, and would hold every start on the GPU (docs/trust.md).  The claim
    it carries is copied over.  A hook that locked the replaced file meanwhile
    finds its fd no longer named and opens the new one."""
    while True:
        fd = locks.open_regular(name, os.O_RDWR | os.O_CREAT, LOCK_MODE)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_mode & 0o7777 != LOCK_MODE or st.st_nlink != 1:
                locks.write(name, os.pread(fd, 4096, 0), LOCK_MODE)
                os.close(fd)
                continue
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        raise ClaimError(f"{os.path.join(locks.path, name)}: still locked by "
                                         "another start hook", timed_out=True) from None
                    time.sleep(LOCK_POLL_S)
            try:
                named = os.stat(name, dir_fd=locks.fd, follow_symlinks=False).st_ino
            except FileNotFoundError:
                named = None
        except BaseException:
            os.close(fd)
            raise
        if named == st.st_ino:
            return fd
        os.close(fd)


class GpuClaims:
    def __init__(self, gpus: list[Gpu], unit: str) -> None:
        self.gpus = sorted(gpus, key=lambda g: g.index)
        self.unit = unit

    def _open_locked(self, deadline: float) -> list[tuple[Gpu, int]]:
        held: list[tuple[Gpu, int]] = []
        try:
            # flock(2) needs no more than an fd open for reading: a lock file
            # another account can open is one it can hold, and every start on
            # that GPU would wait for it (docs/trust.md).  So the directory is
            # root's alone (0700) and each lock file 0600, created with
            # O_EXCL|O_NOFOLLOW relative to the directory's fd
            # (generator/atomicfile.py), whatever the umask; a directory left
            # wider by an older version is narrowed before any lock is taken
            # (a directory fd opened meanwhile opens nothing in it), a lock
            # file is replaced (_lock).
            with ensure_dir(os.path.join(run_dir(), "gpu"), LOCK_DIR_MODE) as locks:
                _narrow(locks.fd, LOCK_DIR_MODE)
                for g in self.gpus:            # index order: no crosswise waits
                    held.append((g, _lock(locks, lock_name(g), deadline)))
        except BaseException:
            for _g, fd in held:
                os.close(fd)
            raise
        return held

    def acquire(self, timeout: float = 10.0) -> list[str]:
        """Claim every GPU, or none: returns why not (one line per GPU held by
        another unit's live claim); [] when the claim is ours."""
        me = os.getpid()
        stat = read_stat(me)
        mine = Claim(self.unit, me, stat[2] if stat else 0, read_cgroup(me))
        try:
            held = self._open_locked(time.monotonic() + timeout)
        except OSError as e:
            raise ClaimError(str(e) if isinstance(e, UnsafePath)
                             else f"{run_dir()}/gpu: {e.strerror or e}") from None
        try:
            conflicts = []
            for g, fd in held:
                other = Claim.parse(os.pread(fd, 4096, 0).decode(errors="replace"))
                if other is None or other.unit == self.unit:
                    continue
                live, how = claim_live(other)
                if live:
                    conflicts.append(f"GPU {g.index} belongs to infer-units service "
                                     f"{other.unit} (its start claim, {how})")
            if not conflicts:
                data = mine.as_text().encode()
                for _g, fd in held:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, data, 0)
            return conflicts
        finally:
            for _g, fd in held:
                os.close(fd)        # closing drops the flock

    def release(self) -> None:
        """Clear the claims that name this unit (never another unit's)."""
        try:
            held = self._open_locked(time.monotonic() + 5.0)
        except (OSError, ClaimError):
            return
        try:
            for _g, fd in held:
                claim = Claim.parse(os.pread(fd, 4096, 0).decode(errors="replace"))
                if claim is not None and claim.unit == self.unit:
                    os.ftruncate(fd, 0)
        finally:
            for _g, fd in held:
                os.close(fd)
