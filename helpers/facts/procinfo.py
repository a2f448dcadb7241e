"""What /proc says about one pid: name, command line, owner, state, cgroup and
the systemd unit or container that cgroup belongs to; and which boot this is.

Most of that text was chosen by the process or its owner, not written by
the kernel: the comm (prctl), the command line, a cgroup's name (any
account with a user manager creates cgroups in its delegated subtree; the
kernel refuses only "\n" in a name).  So (docs/trust.md):

  - /proc files are split on "\n" alone, the one separator the kernel
    guarantees, never str.splitlines() (which also splits on "\r", "\v",
    "\x1c", "\u2028", ...), and a field is read from its own line only;
  - a cgroup path holding any character that is not printable is nobody's
    unit or container: systemd never names a unit so;
  - every such field is escaped once, here, where it is read (one_line): no
    control character reaches a journal record, a terminal, a metric or JSON.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

# Command lines go into one journal line each: control characters escaped, as
# the generator escapes paths and values in its messages.
from ...generator.errors import one_line

# Each pattern with a word it cannot match without: re (with enum behind it)
# is imported only for a cgroup that has one of them, not by every hook.
_CONTAINER_PATTERNS = (
    ("docker-", r"docker-([0-9a-f]{12,})\.scope", "docker"),
    ("/docker/", r"/docker/([0-9a-f]{12,})", "docker"),
    ("libpod-", r"libpod-([0-9a-f]{12,})\.scope", "podman"),
    ("cri-containerd-", r"cri-containerd-([0-9a-f]{12,})\.scope", "containerd"),
    ("crio-", r"crio-([0-9a-f]{12,})\.scope", "cri-o"),
    ("lxc.payload.", r"lxc\.payload\.([^/]+)", "lxc"),
    ("machine-", r"machine-([^/]+)\.scope", "machine"),
)


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    comm: str            # kernel name, at most 15 characters, escaped
    exe_name: str        # basename of argv[0] (untruncated), escaped
    cmdline: str         # escaped
    user: str
    state: str           # R, S, D, Z, T ...
    start_time: int      # clock ticks since boot: identifies the process across pid reuse
    cgroup: str          # escaped: compared only with paths systemd gives, which never need it
    unit: str | None     # "sglang-qwen.service", "session-3.scope", ...
    container: str | None
    # State Z with no live thread: exited, not yet reaped by its parent.  It
    # holds nothing and its cgroup reads "/" (it left it): never "foreign".
    exited: bool = False
    # Basename of /proc/PID/exe when that file is root's and not writable by
    # group or others; None otherwise.  The only name the ignore list trusts:
    # argv[0] and comm are whatever the process chose (exec -a, prctl).
    root_exe: str | None = None

    def describe(self) -> str:
        where = self.unit or (f"container {self.container}" if self.container else self.cgroup)
        return f"pid {self.pid} ({self.comm}, user {self.user}, {where}): {self.cmdline}"


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def read_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start_time) from /proc/PID/stat; None once the pid is gone."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[19])


def wchan(pid: int) -> str:
    return (_read(f"/proc/{pid}/wchan") or "?").strip() or "-"


def plain_name(cgroup: str) -> bool:
    """A cgroup path that can be a unit's: every character printable (no
    line or record separator, no escape sequence, no format character)."""
    return cgroup.isprintable()


def unit_of_cgroup(cgroup: str) -> str | None:
    """The innermost systemd unit in a cgroup path (services win over slices);
    None for a path no unit of systemd's can have (plain_name)."""
    if not plain_name(cgroup):
        return None
    for part in reversed(cgroup.split("/")):
        if part.endswith((".service", ".scope")):
            return part
    return None


def container_of_cgroup(cgroup: str) -> str | None:
    if not plain_name(cgroup):
        return None
    for word, pattern, kind in _CONTAINER_PATTERNS:
        if word not in cgroup:
            continue
        import re       # cached: compiled once a process
        m = re.search(pattern, cgroup)
        if m:
            return f"{kind}:{m.group(1)[:12]}"
    return None


def read_cgroup(pid: int, tid: int | None = None) -> str:
    """The unified (v2) path, or the name=systemd one on hybrid hosts; "" when
    it cannot be read (the process is gone).  `tid`: one thread's view."""
    raw = _read(f"/proc/{pid}/cgroup" if tid is None else f"/proc/{pid}/task/{tid}/cgroup")
    if raw is None:
        return ""
    v2 = systemd = ""
    # One line per hierarchy, ended by "\n" alone: a name may hold "\r" and
    # any other character str.splitlines() would split on.
    for line in raw.split("\n"):
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2 = path
        elif controllers == "name=systemd":
            systemd = path
    # On hybrid hierarchies systemd tracks units in name=systemd.
    return systemd if systemd and systemd != "/" else (v2 or systemd or "/")


def root_exe_name(pid: int) -> str | None:
    """Basename of the executable a process runs, only when a local user
    cannot have put it there: owned by root, no group/other write bit."""
    try:
        path = os.readlink(f"/proc/{pid}/exe")
        st = os.stat(f"/proc/{pid}/exe")   # the mapped file itself, even if renamed
    except OSError:
        return None
    if st.st_uid != 0 or st.st_mode & 0o022:
        return None
    if path.endswith(" (deleted)"):
        return None
    return os.path.basename(path)


def _uids(pid: int) -> tuple[int, int] | None:
    """(real, effective) uid, from the kernel's account of the process: the
    "Uid:" line of /proc/PID/status.  Not the owner of /proc/PID: that is
    root for a process that made itself non-dumpable (prctl), whoever runs
    it.  The file's first line holds the comm, which the process chose: the
    kernel escapes a "\n" in it but not a tab, so "x\nUid:\t0" there must
    never be taken for the real line (psutil's uids() searches the whole
    file and is fooled).  Only a line that starts with the key counts, and
    the last such line: the kernel writes Uid: after Name:."""
    raw = _read(f"/proc/{pid}/status")
    if raw is None:
        return None
    found: tuple[int, int] | None = None
    for line in raw.split("\n"):
        key, sep, value = line.partition(":\t")
        if key == "Uid" and sep:
            fields = value.split("\t")
            try:
                found = int(fields[0]), int(fields[1])
            except (ValueError, IndexError):
                return None
    return found


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def read_proc(pid: int) -> ProcInfo | None:
    """One consistent look at a process, or None when it is gone.  stat is read
    before and after the other files: a process that exits (or whose pid is
    reused) meanwhile would otherwise come back with an empty cgroup, i.e. as
    "foreign", and a dying process of another service is not foreign."""
    for _attempt in range(3):
        stat = read_stat(pid)
        if stat is None:
            return None
        comm = one_line((_read(f"/proc/{pid}/comm") or "?").removesuffix("\n"))
        raw_cmd = _read(f"/proc/{pid}/cmdline") or ""
        cgroup = read_cgroup(pid)
        uids = _uids(pid)       # in the window too: read after it, a dying process had "?"
        again = read_stat(pid)
        if again is None:
            return None
        if again[2] == stat[2] and cgroup and uids is not None:
            break
        # A new process under the pid, or its cgroup or uid unreadable: look again.
    else:
        return None
    state, ppid, start_time = again
    exited = False
    if state == "Z":
        # A zombie leader's own cgroup file says "/" although its live threads
        # (which may hold the GPU) are still in their service's cgroup: ask them.
        live = _live_thread_cgroup(pid)
        if live is None:
            exited = True
        else:
            cgroup = live
    argv = [a for a in raw_cmd.split("\0") if a] if raw_cmd else []
    return ProcInfo(pid=pid, ppid=ppid, comm=comm,
                    exe_name=one_line(os.path.basename(argv[0])) if argv else comm,
                    cmdline=one_line(" ".join(argv)) if argv else f"[{comm}]",
                    user=_user(uids[0]), state=state, start_time=start_time,
                    cgroup=one_line(cgroup), unit=unit_of_cgroup(cgroup),
                    container=container_of_cgroup(cgroup), exited=exited,
                    root_exe=root_exe_name(pid))


def _live_thread_cgroup(pid: int) -> str | None:
    """The cgroup of a live thread of a process whose leader is a zombie; None
    when no thread is left."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]
    except OSError:
        return None
    for tid in tids:
        cgroup = read_cgroup(pid, tid)
        if cgroup:
            return cgroup
    return None


# Debian's SYS_UID_MAX (login.defs): accounts above it are people's; nobody
# (65534) is everyone's.
SYS_UID_MAX = 999


def _uid(pid: int) -> int | None:
    """The one uid a process runs as, None when its real and effective uids
    differ (a set-uid program: not a daemon's own account) or it is gone."""
    uids = _uids(pid)
    return uids[0] if uids is not None and uids[0] == uids[1] else None


def matches_name(info: ProcInfo, names: tuple[str, ...] | list[str]) -> bool:
    """A GPU daemon of the ignore list: by the root-owned executable's
    basename only (see root_exe_name; argv[0] and comm are set by the process
    itself, so an unprivileged hog calling itself nvidia-persistenced must not
    be spared), and run by root, or by a system account as the program its
    system service was defined to run (nvidia-persistenced.service drops to
    its own account).  Anyone can run /usr/bin/nvidia-persistenced with
    LD_PRELOAD of their own code: run by a person's account, outside
    /system.slice, or from a service whose own program is something else (a
    system service's account exec'ing the daemon's binary), it is that
    account's GPU user and is reaped like any other."""
    if info.root_exe is None or info.root_exe not in names:
        return False
    uid = _uid(info.pid)
    if uid == 0:
        return True
    if (uid is None or uid > SYS_UID_MAX or not info.cgroup.startswith("/system.slice/")
            or "user@" in info.cgroup or not info.unit or not info.unit.endswith(".service")):
        return False
    return info.root_exe in _service_programs(info.unit, info.cgroup)


def _service_programs(unit: str, cgroup: str) -> set[str]:
    """Basenames of the programs a system service runs (ExecStart=, as root
    defined it), when `cgroup` is that service's own; empty when not, or
    when systemd cannot say."""
    from .systemd import SystemdUnavailable, control_group, exec_argvs
    try:
        if control_group(unit) != cgroup:
            return set()
        return {os.path.basename(argv[0]) for argv in exec_argvs(unit, "ExecStart") if argv}
    except SystemdUnavailable:
        return set()


def ancestors(pid: int) -> set[int]:
    """pid and every parent up to init: a reaper must never signal its own chain."""
    chain = set()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        stat = read_stat(pid)
        if stat is None:
            break
        pid = stat[1]
    return chain


def boot_id() -> str:
    """The kernel's id of this boot ("" where it cannot be read): state kept
    under /run or on disk is this boot's only when it carries this id."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""
