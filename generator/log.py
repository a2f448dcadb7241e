"""The generator's log: where its messages can reach `journalctl -b`.

systemd runs generators with stdout and stderr on /dev/null (PID 1's own), so
stderr is never enough.  Where a message goes, first that works:

  1. stderr, when asked for (SYSTEMD_LOG_TARGET=console), when stderr is a
     terminal (run by hand) or already the journal (JOURNAL_STREAM);
  2. /dev/kmsg with a <N> priority, only if it is the kernel's character
     device (a host; journald reads it from the start of boot).  It is never
     created: in a container /dev is a tmpfs and a plain open(2) would make a
     regular file that nothing reads;
  3. the journal's native socket (a container at daemon-reload; a sandboxed
     generator on systemd 257 reaches it too);
  4. nothing reachable (a container at boot: no kmsg, journald not yet
     started): stderr, and finish() writes a oneshot unit that logs the
     messages once journald runs.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import TextIO

from .errors import one_line

LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warning": 4,
          "notice": 5, "info": 6, "debug": 7}
KMSG = "/dev/kmsg"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
REPORT_UNIT = "infer-units-generator-report.service"


def _max_level() -> int:
    raw = (os.environ.get("SYSTEMD_LOG_LEVEL") or "info").strip().lower()
    if raw.isdigit():
        return min(int(raw), 7)
    return LEVELS.get(raw, 6)


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


def stderr_is_for_people(stream: TextIO | None = None) -> bool:
    """stderr goes somewhere someone reads: a terminal, or the journal itself."""
    stream = sys.stderr if stream is None else stream
    try:
        fd = stream.fileno()
        if os.isatty(fd):
            return True
        journal = os.environ.get("JOURNAL_STREAM") or ""
        if journal:
            st = os.fstat(fd)
            return journal == f"{st.st_dev}:{st.st_ino}"
    except (OSError, ValueError, AttributeError):
        pass
    return False


def say(priority: int, message: str, ident: str = "infer-units",
        stream: TextIO | None = None) -> None:
    """One line for the journal from a process systemd runs (a hook, the
    liveness probe): a `<N>` syslog priority prefix, which journald reads
    (SyslogLevelPrefix=) so `journalctl -p err` shows a refused start, and no
    prefix on a terminal, where a person reads it."""
    stream = sys.stderr if stream is None else stream
    if stream is None:
        stream = sys.stdout      # as print(file=None) did
        if stream is None:
            return               # both closed: nowhere to say it
    # One record: a control character (a "\n<0>" a process put into its
    # name, an ESC sequence) is shown escaped, never written (docs/trust.md).
    message = one_line(message)
    try:
        tty = os.isatty(stream.fileno())
    except (OSError, ValueError, AttributeError):
        tty = False
    head = f"{ident}: " if ident else ""
    # One write a line: pre-start also says things from a thread (its start-limit question).
    stream.write(("" if tty else f"<{priority}>") + head + message + "\n")
    stream.flush()


def journal_send(fields: dict[str, str], path: str = JOURNAL_SOCKET) -> bool:
    """One entry in journald's native protocol (FIELD=value, one a line);
    False when the journal cannot be reached.  The one writer of the journal
    socket: the generator and the liveness probe both use it."""
    payload = "".join(f"{k}={one_line(v)}\n" for k, v in fields.items())
    import socket       # here: most runs log to /dev/kmsg or stderr, never to the socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(payload.encode("utf-8", "replace"), path)
        return True
    except OSError:
        return False


class GeneratorLog:
    def __init__(self, ident: str = "infer-units-generator", kmsg: str = KMSG,
                 journal_socket: str = JOURNAL_SOCKET) -> None:
        self.ident = ident
        self.max_level = _max_level()
        self.errors = 0
        self.journal_socket = journal_socket
        self.undelivered: list[tuple[int, str]] = []   # for the report unit
        self._kmsg: int | None = None
        target = (os.environ.get("SYSTEMD_LOG_TARGET") or "auto").strip().lower()
        # "stderr", "kmsg", "journal" or "auto" (kmsg, else journal, else report)
        if target in ("console", "console-prefixed") or stderr_is_for_people():
            self.sink = "stderr"
        else:
            self._kmsg = open_kmsg(kmsg) if target != "journal" else None
            self.sink = "kmsg" if self._kmsg is not None else "journal"

    def log(self, level: int, message: str) -> None:
        if level <= LEVELS["err"]:
            self.errors += 1
        if level > self.max_level:
            return
        message = one_line(message)
        if self.sink == "kmsg" and self._kmsg is not None:
            try:
                os.write(self._kmsg, f"<{level}>{self.ident}[{os.getpid()}]: {message}\n"
                         .encode("utf-8", "replace"))
                return
            except OSError:
                pass
        if self.sink in ("kmsg", "journal") and self._to_journal(level, message):
            return
        if self.sink != "stderr":
            self.undelivered.append((level, message))
        print(f"{self.ident}: {message}", file=sys.stderr)

    def _to_journal(self, level: int, message: str) -> bool:
        """One datagram in journald's native protocol."""
        return journal_send({"MESSAGE": message, "PRIORITY": str(level),
                             "SYSLOG_IDENTIFIER": self.ident, "SYSLOG_PID": str(os.getpid())},
                            self.journal_socket)

    def error(self, message: str) -> None:
        self.log(LEVELS["err"], message)

    def debug(self, message: str) -> None:
        self.log(LEVELS["debug"], message)

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
            print(f"{self.ident}: cannot write {REPORT_UNIT}: {e.strerror}", file=sys.stderr)


def write_report_unit(out_dir: str, ident: str, messages: list[tuple[int, str]]) -> None:
    """units/report-service.j2, one ExecStart= per message."""
    # Imported here, not at the top: the hooks import this module (say()) and
    # write no unit.
    from .atomicfile import open_dir
    from .render import fill
    from .systemd_quote import exec_line
    text = fill("report-service", {"ident": ident, "exec_start": [
        exec_line(["/bin/echo", f"<{level}>{message}"]) for level, message in messages]})
    with open_dir(out_dir) as out:
        out.write(REPORT_UNIT, text)
        with out.sub("sysinit.target.wants") as wants:
            wants.symlink(REPORT_UNIT, "../" + REPORT_UNIT)
