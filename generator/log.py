"""The one logging path of infer-units: the standard library's `logging`.

Every module logs with `log = logging.getLogger(__name__)` (all of them under
the `infer_units` logger) and `log.error/warning/info/debug`, `log.log(NOTICE,
...)`; each entry point calls `setup()` once: the generator's main,
helpers/entry.py for the hooks and the operator commands.  What a record
becomes is decided here only:

  * `PRIORITIES`, the one table from Python's levels to syslog priorities
    (`journalctl -p`); NOTICE is a level of ours, as Python has none;
  * `JournalFormatter`: `ident: message`, the message escaped once by
    one_line() (a "\\n<0>" a process put into its name shows escaped and
    never makes a second journal record, docs/trust.md), with systemd's
    `<N>` priority prefix where journald reads it (SyslogLevelPrefix=);
  * `StdioHandler` for a process's stderr (or stdout): a hook, which systemd
    runs with stderr on the journal, prefixes every line except on a
    terminal; an operator command prefixes only where its stderr is the
    journal itself, so a person or a script reads plain lines;
  * `GeneratorHandler` for the generator, whose stderr systemd sends to
    /dev/null.  Where a message goes, first that works:

      1. stderr, when asked for (SYSTEMD_LOG_TARGET=console), when stderr is
         a terminal (run by hand) or already the journal (JOURNAL_STREAM);
      2. /dev/kmsg with a <N> priority, only if it is the kernel's character
         device (a host; journald reads it from the start of boot).  It is
         never created: in a container /dev is a tmpfs and a plain open(2)
         would make a regular file that nothing reads;
      3. the journal's native socket (a container at daemon-reload; a
         sandboxed generator on systemd 257 reaches it too);
      4. nothing reachable (a container at boot: no kmsg, journald not yet
         started): stderr, and finish() writes a oneshot unit that logs the
         messages once journald runs.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from typing import Callable, TextIO

from .errors import one_line

PROJECT = "infer_units"         # the logger every module's __name__ is under
IDENT = "infer-units"           # what a hook's or a command's line starts with
NOTICE = logging.INFO + 5       # syslog's notice: between info and warning
logging.addLevelName(NOTICE, "NOTICE")

# The one table: a record's level -> the syslog priority the journal sees.
PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4),
              (NOTICE, 5), (logging.INFO, 6), (logging.DEBUG, 7))
# SYSTEMD_LOG_LEVEL's names (systemd's log_level_from_string).
SYSLOG_NAMES = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warning": 4,
                "notice": 5, "info": 6, "debug": 7}

KMSG = "/dev/kmsg"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
REPORT_UNIT = "infer-units-generator-report.service"


def priority(levelno: int) -> int:
    """The syslog priority of a record's level (a level between two of the
    table's counts as the less severe one)."""
    for level, prio in PRIORITIES:
        if levelno >= level:
            return prio
    return 7


def systemd_log_level() -> int:
    """SYSTEMD_LOG_LEVEL (a name or 0-7; info if unset) as a logging level:
    the least severe level whose priority it still shows."""
    raw = (os.environ.get("SYSTEMD_LOG_LEVEL") or "info").strip().lower()
    most = min(int(raw), 7) if raw.isdigit() else SYSLOG_NAMES.get(raw, 6)
    return min((level for level, prio in PRIORITIES if prio <= most), default=logging.CRITICAL)


def open_kmsg(path: str = KMSG) -> int | None:
    """A write fd on the kernel log, or None.  No O_CREAT: never make the file;
    O_NONBLOCK: a FIFO put there must not hang the boot."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if stat.S_ISCHR(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _isatty(stream: TextIO) -> bool:
    try:
        return os.isatty(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False


def is_journal(stream: TextIO) -> bool:
    """The stream is journald's own (systemd sets JOURNAL_STREAM to its
    device:inode for a service's stdout/stderr)."""
    journal = os.environ.get("JOURNAL_STREAM") or ""
    if not journal:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return journal == f"{st.st_dev}:{st.st_ino}"


def stderr_is_for_people(stream: TextIO | None = None) -> bool:
    """stderr goes somewhere someone reads: a terminal, or the journal itself."""
    stream = sys.stderr if stream is None else stream
    return stream is not None and (_isatty(stream) or is_journal(stream))


NAMES_UNIT = {"names_unit": True}
"""`extra=` of a line that names its model itself (the liveness probe's, the
group watch's): on stdout, with no ident (their units' SyslogIdentifier= is
the model's); every other line is the process's, on stderr."""


def names_unit(record: logging.LogRecord) -> bool:
    return bool(getattr(record, "names_unit", False))


class JournalFormatter(logging.Formatter):
    """`<N>ident: message`: the `<N>` where `prefixed(record)` says journald
    reads it, the ident where there is one; the message escaped here, once."""

    def __init__(self, ident: str = IDENT,
                 prefixed: Callable[[logging.LogRecord], bool] = lambda record: False) -> None:
        super().__init__()
        self.ident = ident
        self.prefixed = prefixed

    def message(self, record: logging.LogRecord) -> str:
        """The record's text on one line (what every sink writes)."""
        return one_line(record.getMessage())

    def format(self, record: logging.LogRecord) -> str:
        head = f"{self.ident}: " if self.ident and not names_unit(record) else ""
        prefix = f"<{priority(record.levelno)}>" if self.prefixed(record) else ""
        return prefix + head + self.message(record)


class StdioHandler(logging.Handler):
    """One line a record on stderr (stdout: NAMES_UNIT), in one write (pre-start
    also logs from a thread, its start-limit question).  The stream is looked
    up at each record: with stderr closed the line goes to stdout, as
    print(file=None) did, or nowhere."""

    def __init__(self, ident: str = IDENT, run_by_systemd: bool = False) -> None:
        super().__init__()
        self.run_by_systemd = run_by_systemd
        self.line = JournalFormatter(ident, self.prefixed)
        self.setFormatter(self.line)

    @staticmethod
    def stream(record: logging.LogRecord) -> TextIO | None:
        stream = sys.stdout if names_unit(record) else sys.stderr
        return sys.stdout if stream is None else stream

    def prefixed(self, record: logging.LogRecord) -> bool:
        """A process systemd runs writes to the journal (a `<N>` prefix) unless a
        person runs it on a terminal; an operator's command only where its
        stream is the journal itself (`systemd-run`, a unit running it)."""
        stream = self.stream(record)
        if stream is None:
            return False
        return not _isatty(stream) if self.run_by_systemd else is_journal(stream)

    def emit(self, record: logging.LogRecord) -> None:
        stream = self.stream(record)
        if stream is None:
            return                  # stdout and stderr closed: nowhere to say it
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001  (logging's own rule: a sink never raises)
            self.handleError(record)


def journal_send(fields: dict[str, str], path: str = JOURNAL_SOCKET) -> bool:
    """One entry in journald's native protocol (FIELD=value, one a line);
    False when the journal cannot be reached.  The one writer of the journal
    socket: the generator and the liveness probe both use it.  one_line()
    leaves text it already escaped as it is."""
    payload = "".join(f"{k}={one_line(v)}\n" for k, v in fields.items())
    import socket       # here: most runs log to /dev/kmsg or stderr, never to the socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(payload.encode("utf-8", "replace"), path)
        return True
    except OSError:
        return False


class GeneratorHandler(logging.Handler):
    """The generator's sinks (this module's docstring), chosen once."""

    def __init__(self, ident: str = "infer-units-generator", kmsg: str = KMSG,
                 journal_socket: str = JOURNAL_SOCKET) -> None:
        super().__init__()
        self.ident = ident
        self.journal_socket = journal_socket
        self.undelivered: list[tuple[int, str]] = []   # for the report unit
        self.console = StdioHandler(ident)
        self._kmsg: int | None = None
        target = (os.environ.get("SYSTEMD_LOG_TARGET") or "auto").strip().lower()
        # "stderr", "kmsg", "journal" or "auto" (kmsg, else journal, else report)
        if target in ("console", "console-prefixed") or stderr_is_for_people():
            self.sink = "stderr"
        else:
            self._kmsg = open_kmsg(kmsg) if target != "journal" else None
            self.sink = "kmsg" if self._kmsg is not None else "journal"

    def emit(self, record: logging.LogRecord) -> None:
        level = priority(record.levelno)
        message = self.console.line.message(record)
        if self.sink == "kmsg" and self._kmsg is not None:
            try:
                os.write(self._kmsg, f"<{level}>{self.ident}[{os.getpid()}]: {message}\n"
                         .encode("utf-8", "replace"))
                return
            except OSError:
                pass
        if self.sink in ("kmsg", "journal") and journal_send(
                {"MESSAGE": message, "PRIORITY": str(level), "SYSLOG_IDENTIFIER": self.ident,
                 "SYSLOG_PID": str(os.getpid())}, self.journal_socket):
            return
        if self.sink != "stderr":
            self.undelivered.append((level, message))
        self.console.emit(record)

    def finish(self, out_dir: str) -> None:
        """What reached no log becomes a unit that logs it once journald runs."""
        if self._kmsg is not None:
            os.close(self._kmsg)
            self._kmsg = None
        if not self.undelivered:
            return
        try:
            write_report_unit(out_dir, self.ident, self.undelivered)
        except OSError as e:
            logging.getLogger(__name__).error(f"cannot write {REPORT_UNIT}: {e.strerror}")


def write_report_unit(out_dir: str, ident: str, messages: list[tuple[int, str]]) -> None:
    """units/report-service.j2, one ExecStart= per message."""
    # Imported here, not at the top: the hooks import this module and write no unit.
    from .atomicfile import open_dir
    from .render import fill
    from .systemd_quote import exec_line
    text = fill("report-service", {"ident": ident, "exec_start": [
        exec_line(["/bin/echo", f"<{level}>{message}"]) for level, message in messages]})
    with open_dir(out_dir) as out:
        out.write(REPORT_UNIT, text)
        with out.sub("sysinit.target.wants") as wants:
            wants.symlink(REPORT_UNIT, "../" + REPORT_UNIT)


def setup(handler: logging.Handler | None = None, level: int = logging.DEBUG) -> logging.Handler:
    """Once per process, at its entry point: `handler` (a StdioHandler for
    stderr if None) is the one place the project's records go, those of
    `level` and above.  A second call replaces the first's handler (the tests
    run entry points in one process).  Records still propagate: nothing of
    ours configures the root logger, so only a test's log capture sees them."""
    handler = handler if handler is not None else StdioHandler()
    handler.setLevel(level)
    logger = logging.getLogger(PROJECT)
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)      # the handler filters; the hooks' _LastError sees all
    return handler
