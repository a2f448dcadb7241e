"""The last run's units, written again when nothing it read has changed.

systemd runs the generator at every daemon-reload (each package install, each
`systemctl daemon-reload`), almost always on the same files.  A full run
reads every model file, validates and renders it; a run whose inputs are the
last run's writes the last run's units instead, without importing the loader
or rendering (bench/generator_bench.py).

What makes it correct: a run's output is a function of what it read.  The
loader records every read it makes of the host (generator/loader.py RECORD:
the directory listings, file contents, masks and unit-path look-ups, with
their answers); everything else the run depends on is in the key: the whole
environment (but SYSTEMD_EXEC_PID: our own pid), argv[0] and the number of
arguments (not the output directories: where the units go does not change
them), the host name, the interpreter, the CLI path units call,
and the identity (inode, size, mtime, ctime) of every file of the package's
code.  A hit asks the same questions again and requires the same answers,
byte for byte (no hash: nothing can collide).  Only runs that logged nothing
are stored, so a hit is silent as the run it replays was.  Code replaced
while a run was starting is never stored (its files must be older than the
process), so the key's code is the code that ran.

Trust: the cache is root's: read and written only when the generator runs as
root, only a regular root-owned file that neither group nor others can write,
in a root-owned directory the same (opened without following links).  It
lives in /run (a tmpfs): every boot starts with a full run.  marshal, not
json: no import (json brings re); it is read only from such a file.
INFER_UNITS_GENERATOR_CACHE moves it (tests), "" turns it off.
"""

from __future__ import annotations

import marshal
import stat
import sys

from .paths import RUN_DIR, basename, dirname, environ, getenv, is_normal, join

TYPE_CHECKING = False
if TYPE_CHECKING:
    import os as posix      # the same functions; typeshed's posix lacks some O_ flags
else:
    import posix            # os's C module, not os: paths.py says why
if TYPE_CHECKING:
    from typing import Any

CACHE_PATH = join(RUN_DIR, "generator.cache")
FORMAT = 2


class CachedUnit:
    """What main.write_unit() takes: a RenderedUnit, without importing render."""
    __slots__ = ("name", "text", "links")

    def __init__(self, name: str, text: str, links: tuple[str, ...]) -> None:
        self.name, self.text, self.links = name, text, links


def cache_path() -> str | None:
    if posix.geteuid() != 0:
        return None
    found = getenv("INFER_UNITS_GENERATOR_CACHE")
    return (CACHE_PATH if found is None else found) or None


def _package_root() -> str:
    # .../infer_units/generator/cache.py -> .../infer_units
    here = __file__
    if not is_normal(here):
        import os
        here = os.path.abspath(here)
    return dirname(dirname(here))


def code_identity() -> tuple[tuple[str, int, int, int, int], ...]:
    """Every file of the code the generator runs or reads (the shipped
    units): a new package changes their inode or ctime."""
    root = _package_root()
    out = []
    for sub, suffix in (("generator", ".py"), ("units", ".py"), ("units/systemd", ""), ("", ".py")):
        directory = join(root, sub)
        for name in sorted(posix.listdir(directory)):
            if name.endswith(suffix) and name != "__pycache__":
                path = join(directory, name)
                st = posix.stat(path)
                if stat.S_ISREG(st.st_mode):
                    out.append((path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


# Set anew for every process systemd starts (the generator's own pid on
# systemd 257), read by nothing here: keyed, no run would ever be replayed.
_PER_PROCESS_ENV = frozenset({"SYSTEMD_EXEC_PID"})


def run_key(hook_cli: str) -> tuple[Any, ...]:
    env = tuple(sorted(item for item in environ().items() if item[0] not in _PER_PROCESS_ENV))
    # The directories in argv are where units go, not what they say: a run
    # into another directory replays (systemd's is the same at every run;
    # tests and `render --output` use others).
    return (FORMAT, sys.version, (sys.argv[0], len(sys.argv)), env, posix.uname().nodename,
            hook_cli, code_identity())


def _trusted_fd(path: str) -> int | None:
    """An fd on `path` if root alone can have written it, else None."""
    try:
        parent = posix.lstat(dirname(path))
        if not stat.S_ISDIR(parent.st_mode) or parent.st_uid != 0 or parent.st_mode & 0o022:
            return None
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK | posix.O_CLOEXEC)
    except OSError:
        return None
    st = posix.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        posix.close(fd)
        return None
    return fd


def lookup(path: str, key: tuple[Any, ...]) -> list[CachedUnit] | None:
    """The stored units if the stored run read what this one would, else None."""
    fd = _trusted_fd(path)
    if fd is None:
        return None
    try:
        chunks = []
        while chunk := posix.read(fd, 1 << 20):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        posix.close(fd)
    try:
        stored = marshal.loads(b"".join(chunks))
        stored_key, record, units = stored
    except (EOFError, ValueError, TypeError):
        return None
    if stored_key != key:
        return None
    from . import loader
    loader.forget_cache()
    try:
        for kind, arg, answer in record:
            if loader.answer(kind, arg) != answer:
                return None
        return [CachedUnit(name, text, tuple(links)) for name, text, links in units]
    except (ValueError, TypeError):
        return None         # not a record this code wrote: a full run, never a crash
    finally:
        loader.forget_cache()


def _older_than_process(key: tuple[Any, ...]) -> bool:
    """Every code file last changed before this process started: the code it
    imported is the code the key names (a file replaced between our import
    and code_identity() would otherwise be keyed as the code that ran)."""
    import time
    try:
        with open("/proc/self/stat", "rb") as f:
            start_ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return False
    # The boot's moment on the clock file times use, to the microsecond.
    boot = time.clock_gettime(time.CLOCK_REALTIME) - time.clock_gettime(time.CLOCK_BOOTTIME)
    started_ns = (boot + start_ticks / posix.sysconf("SC_CLK_TCK")) * 1e9
    # Start ticks are 10 ms, file times the kernel's coarse clock: 100 ms of margin.
    return all(ctime < started_ns - 1e8 for *_, ctime in key[-1])


def store(path: str, key: tuple[Any, ...], record: list[tuple[str, str, Any]],
          units: list[Any]) -> None:
    """Keep this run for the next one (best effort: a failure only costs the
    next run its shortcut)."""
    if not _older_than_process(key) or key != run_key(key[5]):
        return
    data = marshal.dumps((key, tuple(record),
                          tuple((u.name, u.text, tuple(u.links)) for u in units)))
    from .atomicfile import ensure_dir
    try:
        # Our directory, root's and 0755 (checked from / if it exists);
        # the file root's alone (0600), written the one way files are.
        with ensure_dir(dirname(path), 0o755) as d:
            d.write(basename(path), data, 0o600)
    except OSError:
        pass
