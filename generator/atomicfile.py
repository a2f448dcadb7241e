"""The one way this project writes a file: relative to a checked directory fd,
through a unique temporary name, renamed into place.

Root hooks write where other accounts may have been first (a metrics
directory the exporter's user owns, our RUN_DIR after a bad umask), so
every write here:

  - opens the directory by walking the path from / one component at a time
    (O_DIRECTORY|O_NOFOLLOW, symlinks followed only when root or we own them),
    and refuses it when a directory on the way, or the directory itself, is
    owned by someone other than root (or the caller) or writable by group or
    others: whoever can write a directory can swap what is in it.  Passing
    through a sticky directory (/tmp) is allowed: there no one else can
    rename our entries.  The checks are fstat() of the opened fds, so a
    rename between check and use changes nothing;
  - creates the temporary file with O_CREAT|O_EXCL|O_NOFOLLOW under a random
    name (never a fixed ".tmp": a planted symlink or FIFO there is just a name
    taken, and another is drawn), fsyncs it where durability matters, and
    renameat()s it over the target.  rename never follows a link at the
    target; a target that is a FIFO, socket, device or directory is refused
    (it is not ours);
  - reads with O_NOFOLLOW|O_NONBLOCK and only regular files, so a FIFO never
    hangs a hook.

Our own directories (ensure_dir) are created with mkdirat and then fchmod()
to their fixed mode, whatever the caller's umask; an existing one is used
only when it passes the same check.
"""

from __future__ import annotations

import errno
import os
import stat
from types import TracebackType

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Walking: O_PATH needs no read permission (a non-root caller passes 0711 homes).
_WALK_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40          # the kernel's own limit for one path
_TRIES = 32              # random temporary names drawn before giving up
MAX_READ = 1 << 20       # our state files are a few KiB


class UnsafePath(OSError):
    """A path a root hook will not write through; str() is one line that names
    the path and why."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EPERM, f"refusing {path}: {why}", path)

    def __str__(self) -> str:
        return str(self.strerror)


def _owner(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _trusted_owner(uid: int) -> bool:
    return uid == 0 or uid == os.geteuid()


def _check_dir(path: str, st: os.stat_result, passing: bool) -> None:
    """Refuse a directory someone else could change.  `passing`: only walked
    through (a sticky directory like /tmp is fine there)."""
    if not _trusted_owner(st.st_uid):
        raise UnsafePath(path, f"owned by {_owner(st.st_uid)}, not root: that account could "
                         "replace what a root hook writes there (use a directory only root "
                         "can write, every directory above it too)")
    if st.st_mode & 0o022 and not (passing and st.st_mode & stat.S_ISVTX):
        who = "group and others" if st.st_mode & 0o022 == 0o022 else (
            "group" if st.st_mode & 0o020 else "others")
        raise UnsafePath(path, f"writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): "
                         "anyone who can write it could plant links or files where a root "
                         "hook writes (chmod go-w it once its contents are checked, or "
                         "remove it)")


def _subdir(parent: int, parent_path: str, name: str, mode: int, passing: bool) -> int:
    """An fd of directory `name` in `parent`: made with exactly `mode` when
    missing, else checked.  O_NOFOLLOW: a symlink planted there is refused."""
    path = os.path.join(parent_path, name)
    try:
        os.mkdir(name, 0o700, dir_fd=parent)     # fchmod below sets the real mode
        created = True
    except FileExistsError:
        created = False                          # ours from before, or someone else's: checked
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            raise UnsafePath(path, f"{_kind(st.st_mode)}, not a directory") from None
        raise
    try:
        st = os.fstat(fd)
        if created and st.st_uid == os.geteuid():
            os.fchmod(fd, mode)                  # the umask does not decide
        else:
            _check_dir(path, st, passing)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _down(where: str, name: str) -> str:
    """Where `name` (one component) leads from the directory `where`."""
    return os.path.normpath(os.path.join(where, name))


def _components(path: str) -> list[str]:
    return [c for c in os.path.abspath(path).split("/") if c and c != "."]


def _walk(path: str, create_mode: int | None) -> int:
    """An O_RDONLY fd of directory `path`, every step checked; missing
    directories created with create_mode (None: FileNotFoundError)."""
    todo = _components(path)
    todo.reverse()                       # a stack: symlink targets are pushed on it
    fd = os.open("/", _WALK_FLAGS)
    where = "/"
    links = 0
    try:
        _check_dir("/", os.fstat(fd), passing=True)
        while todo:
            name = todo.pop()
            last = not todo
            here = os.path.join(where, name)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if create_mode is None:
                    raise FileNotFoundError(errno.ENOENT, "no such directory", here) from None
                nxt = _subdir(fd, where, name, create_mode, passing=not last)
                os.close(fd)
                fd = nxt
                where = _down(where, name)
                continue
            if stat.S_ISLNK(st.st_mode):
                # /var/run -> /run: fine when root (or we) made the link in a
                # directory already checked; a planted one is someone else's.
                if not _trusted_owner(st.st_uid):
                    raise UnsafePath(here, f"a symlink owned by {_owner(st.st_uid)}")
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                target = os.readlink(name, dir_fd=fd)
                parts = [c for c in target.split("/") if c and c != "."]
                todo.extend(reversed(parts))
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _WALK_FLAGS)
                    where = "/"
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", here)
            nxt = os.open(name, _DIR_FLAGS if last else _WALK_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
            where = _down(where, name)
            _check_dir(where, os.fstat(fd), passing=not last)
        if where == "/":                 # the path was / itself: a real fd, not O_PATH
            nxt = os.open("/", _DIR_FLAGS)
            os.close(fd)
            fd = nxt
            _check_dir("/", os.fstat(fd), passing=False)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a symlink" if stat.S_ISLNK(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


class Dir:
    """An open, checked directory; names are relative to it (no '/')."""

    __slots__ = ("fd", "path", "_children")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self._children: dict[str, Dir] = {}

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Closes the children (child()) too."""
        children, self._children = self._children, {}
        for child in children.values():
            child.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _name(self, name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{self.path}: {name!r} is not a file name")
        return name

    def sub(self, name: str, mode: int = 0o755) -> Dir:
        """Our subdirectory `name`, created with exactly `mode` when missing."""
        name = self._name(name)
        return Dir(_subdir(self.fd, self.path, name, mode, passing=False),
                   os.path.join(self.path, name))

    def child(self, name: str, mode: int = 0o755) -> Dir:
        """sub(name, mode), opened once and kept open until this Dir closes:
        for many files in a few subdirectories (a generator's .wants/)."""
        found = self._children.get(name)
        if found is None:
            found = self._children[name] = self.sub(name, mode)
        return found

    def _regular_or_missing(self, name: str) -> None:
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(os.path.join(self.path, name),
                             f"{_kind(st.st_mode)}, not a regular file: not replaced "
                             "(remove it if it is not yours)")

    def _temp(self, name: str, mode: int) -> tuple[str, int]:
        # A dot name: systemd and node_exporter's *.prom glob skip one left behind.
        for _ in range(_TRIES):
            tmp = f".{name}.{os.urandom(6).hex()}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                             os.O_CLOEXEC, mode, dir_fd=self.fd)
            except FileExistsError:
                continue
            os.fchmod(fd, mode)          # the umask does not decide
            return tmp, fd
        raise FileExistsError(errno.EEXIST, "no free temporary name", os.path.join(self.path, name))

    def _discard(self, tmp: str) -> None:
        try:
            os.unlink(tmp, dir_fd=self.fd)
        except OSError:
            pass

    def write(self, name: str, data: bytes | str, mode: int = 0o644,
              durable: bool = False) -> None:
        """Replace `name` atomically: readers see the old file or the new one,
        never half of one.  A full disk (ENOSPC, EFBIG, EDQUOT) leaves the old
        one.  `durable`: fsync the file and the directory (a file on disk that
        must survive a crash; tmpfs needs none)."""
        name = self._name(name)
        raw = data.encode("utf-8") if isinstance(data, str) else data
        self._regular_or_missing(name)
        tmp, fd = self._temp(name, mode)
        try:
            try:
                view = memoryview(raw)
                while view:
                    view = view[os.write(fd, view):]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self._discard(tmp)
            raise
        if durable:
            os.fsync(self.fd)

    def write_new(self, name: str, data: bytes | str, mode: int = 0o644) -> None:
        """write(), for a directory that is expected not to have `name` yet (a
        generator's output, emptied before each run): the file is written
        unnamed (O_TMPFILE) and linked in whole, so a reader, a full disk or
        a kill leaves it whole or absent, never partial; 3 system calls fewer
        than write().  A name already there (a link, a FIFO, an old file) or
        a kernel or /proc without what this needs: write() decides, with its
        checks."""
        name = self._name(name)
        raw = data.encode("utf-8") if isinstance(data, str) else data
        try:
            fd = os.open(".", os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, mode, dir_fd=self.fd)
        except OSError:
            fd = -1         # no O_TMPFILE here (an old kernel, a filesystem without it)
        if fd >= 0:
            try:
                os.fchmod(fd, mode)          # the umask does not decide
                view = memoryview(raw)
                while view:
                    view = view[os.write(fd, view):]
                # linkat(2) of the fd's /proc link: the one way to name an
                # O_TMPFILE file without CAP_DAC_READ_SEARCH (AT_EMPTY_PATH).
                # It never replaces: an existing name is EEXIST, and write() below.
                os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=self.fd)
                return
            except (FileExistsError, FileNotFoundError):
                pass        # the name is taken, or no /proc: write() below
            finally:
                os.close(fd)    # unlinked, the unnamed file is gone with its fd
        self.write(name, raw, mode)

    def symlink(self, name: str, target: str) -> None:
        """`name` -> target, replacing a link (or file) of that name atomically."""
        name = self._name(name)
        try:
            os.symlink(target, name, dir_fd=self.fd)       # atomic by itself
            return
        except FileExistsError:
            pass
        st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        if not (stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise UnsafePath(os.path.join(self.path, name), f"{_kind(st.st_mode)}: not replaced")
        for _ in range(_TRIES):
            tmp = f".{name}.{os.urandom(6).hex()}.tmp"
            try:
                os.symlink(target, tmp, dir_fd=self.fd)
            except FileExistsError:
                continue
            try:
                os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except BaseException:
                self._discard(tmp)
                raise
            return
        raise FileExistsError(errno.EEXIST, "no free temporary name", os.path.join(self.path, name))

    def open_regular(self, name: str, flags: int, mode: int = 0o644) -> int:
        """An fd of regular file `name` (O_NOFOLLOW|O_NONBLOCK added: a link or
        a FIFO there is refused, never followed or waited on).  With O_CREAT
        a new file gets `mode` whatever the umask."""
        name = self._name(name)
        flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        created = False
        if flags & os.O_CREAT:
            try:
                fd = os.open(name, flags | os.O_EXCL, mode, dir_fd=self.fd)
                created = True
            except FileExistsError:
                flags &= ~os.O_CREAT
        if not created:
            fd = os.open(name, flags, dir_fd=self.fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(os.path.join(self.path, name),
                                 f"{_kind(st.st_mode)}, not a regular file")
            if created:
                os.fchmod(fd, mode)      # the umask does not decide
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, name: str, limit: int = MAX_READ) -> bytes | None:
        """The file's bytes (at most `limit`), None when there is none."""
        try:
            fd = self.open_regular(name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return _read_all(fd, limit)
        finally:
            os.close(fd)

    def unlink(self, name: str) -> bool:
        """False when there was nothing to remove."""
        try:
            os.unlink(self._name(name), dir_fd=self.fd)
            return True
        except FileNotFoundError:
            return False


def _read_all(fd: int, limit: int) -> bytes:
    chunks = []
    while limit > 0:
        chunk = os.read(fd, min(limit, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


def open_dir(path: str) -> Dir:
    """An existing directory, checked (see the module's docstring)."""
    return Dir(_walk(path, None), os.path.abspath(path))


def ensure_dir(path: str, mode: int = 0o755) -> Dir:
    """Our directory: created (with its missing parents) with exactly `mode`,
    or an existing one that passes the check."""
    return Dir(_walk(path, mode), os.path.abspath(path))


def write_file(path: str, data: bytes | str, mode: int = 0o644, durable: bool = False,
               dir_mode: int | None = None) -> None:
    """Replace the file at `path` (Dir.write); dir_mode: create its directory
    (ours) with that mode when missing."""
    directory, _, name = os.path.abspath(path).rpartition("/")     # os.path.split of it
    directory = directory or "/"
    with (open_dir(directory) if dir_mode is None else ensure_dir(directory, dir_mode)) as d:
        d.write(name, data, mode, durable)


def read_file(path: str, limit: int = MAX_READ) -> bytes | None:
    """A regular file's bytes, None when missing; never follows a link at
    `path` nor waits on a FIFO (OSError instead).  The directory is not
    checked: reading trusts what our writes made."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC |
                     os.O_NOCTTY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(path, f"{_kind(st.st_mode)}, not a regular file")
        return _read_all(fd, limit)
    finally:
        os.close(fd)


def read_text(path: str, limit: int = MAX_READ) -> str | None:
    data = read_file(path, limit)
    return None if data is None else data.decode("utf-8")
