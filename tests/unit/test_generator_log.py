"""The one logging path (generator/log.py).  Where the generator's messages
go: kmsg only if it is the kernel's character device and never created, else
the journal's socket, else a oneshot unit that logs them once journald runs;
--help and usage to the terminal.  A hook's and a command's lines: `<N>`
where journald reads it, one record a message."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from infer_units.generator.log import (NOTICE, PROJECT, REPORT_UNIT, GeneratorHandler, open_kmsg,
                                       priority, systemd_log_level)
from infer_units.generator.log import setup as setup_logging   # not pytest's module `setup`
from ..support import PYTHON, base_env
from ..unitfile import split_words, values

MESSAGE = '/etc/infer-units/bad.toml: command: expected an array of strings, got str (no unit generated)'
TRICKY = 'x.toml: "quoted" $HOME 100% back\\slash'


@pytest.fixture
def auto_target(monkeypatch: pytest.MonkeyPatch) -> None:
    # as systemd runs it: no console target asked for, stderr not the journal
    monkeypatch.delenv("SYSTEMD_LOG_TARGET", raising=False)
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    monkeypatch.delenv("SYSTEMD_LOG_LEVEL", raising=False)


class Generator:
    """The generator's set-up (generator/main.py): its handler on the project's
    logger, at SYSTEMD_LOG_LEVEL; a module's logger logs through it."""

    def __init__(self, **sinks: str) -> None:
        self.sink = GeneratorHandler(**sinks)
        setup_logging(self.sink, systemd_log_level())
        self.log = logging.getLogger("infer_units.generator.main")

    def finish(self, out_dir: str) -> None:
        self.sink.finish(out_dir)
        logging.getLogger(PROJECT).removeHandler(self.sink)


def test_one_table_of_priorities(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [priority(level) for level in (logging.CRITICAL, logging.ERROR, logging.WARNING,
                                          NOTICE, logging.INFO, logging.DEBUG)] == [2, 3, 4, 5, 6, 7]
    for value, level in (("err", logging.ERROR), ("3", logging.ERROR), ("notice", NOTICE),
                         ("debug", logging.DEBUG), ("0", logging.CRITICAL), ("bogus", logging.INFO)):
        monkeypatch.setenv("SYSTEMD_LOG_LEVEL", value)
        assert systemd_log_level() == level, value


def test_kmsg_missing_is_not_created(tmp_path: Path) -> None:
    assert open_kmsg(str(tmp_path / "kmsg")) is None
    assert not (tmp_path / "kmsg").exists()


def test_kmsg_that_is_a_regular_file_is_not_used(tmp_path: Path) -> None:
    # what an old generator left in a container's tmpfs /dev
    (tmp_path / "kmsg").write_text("")
    assert open_kmsg(str(tmp_path / "kmsg")) is None


def test_kmsg_that_is_a_fifo_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "kmsg")
    started = time.monotonic()
    assert open_kmsg(str(tmp_path / "kmsg")) is None
    # A blocking open of a FIFO with no reader never returns: any bound tells.
    assert time.monotonic() - started < 60


def test_a_character_device_is_used() -> None:
    fd = open_kmsg("/dev/null")
    assert fd is not None
    os.close(fd)


def test_without_kmsg_messages_go_to_the_journal_socket(tmp_path: Path, auto_target: None,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "journal.socket")
    journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    journal.bind(path)
    journal.settimeout(5)
    gen = Generator(kmsg=str(tmp_path / "no-kmsg"), journal_socket=path)
    gen.log.error(MESSAGE)
    gen.log.debug("not shown at the default level")
    gen.finish(str(tmp_path))
    fields = dict(line.split("=", 1) for line in journal.recv(65536).decode().splitlines())
    assert fields["MESSAGE"] == MESSAGE and fields["PRIORITY"] == "3"
    assert fields["SYSLOG_IDENTIFIER"] == "infer-units-generator"
    assert fields["SYSLOG_PID"] == str(os.getpid())
    journal.setblocking(False)
    with pytest.raises(BlockingIOError):
        journal.recv(65536)                       # debug was filtered
    assert capsys.readouterr().err == ""
    assert not (tmp_path / REPORT_UNIT).exists()


def test_nothing_reachable_leaves_a_unit_that_logs_at_boot(tmp_path: Path, auto_target: None,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    gen = Generator(kmsg=str(tmp_path / "no-kmsg"), journal_socket=str(tmp_path / "no-journal"))
    gen.log.error(MESSAGE)
    gen.log.error(TRICKY)
    gen.finish(str(tmp_path))
    assert MESSAGE in capsys.readouterr().err          # and stderr, for a console
    unit = (tmp_path / REPORT_UNIT).read_text()
    argvs = [split_words(v, exec_line=True) for v in values(unit, "Service", "ExecStart")]
    assert argvs == [["/bin/echo", f"<3>{MESSAGE}"], ["/bin/echo", f"<3>{TRICKY}"]]
    assert values(unit, "Service", "SyslogIdentifier") == ["infer-units-generator"]
    link = tmp_path / "sysinit.target.wants" / REPORT_UNIT
    assert os.readlink(link) == f"../{REPORT_UNIT}" and link.resolve() == tmp_path / REPORT_UNIT
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / REPORT_UNIT)],
                            capture_output=True, text=True)
    if verify.returncode != 127:
        assert verify.returncode == 0, verify.stderr


def test_console_target_writes_stderr_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SYSTEMD_LOG_TARGET", "console")
    gen = Generator(kmsg="/dev/null", journal_socket=str(tmp_path / "no-journal"))
    gen.log.error(MESSAGE)
    gen.finish(str(tmp_path))
    assert capsys.readouterr().err == f"infer-units-generator: {MESSAGE}\n"
    assert not (tmp_path / REPORT_UNIT).exists()


def generator(*args: str) -> subprocess.CompletedProcess[str]:
    env = base_env()
    env.pop("SYSTEMD_LOG_TARGET")
    return subprocess.run([PYTHON, "-m", "infer_units.generator.main", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_help_goes_to_stdout() -> None:
    done = generator("--help")
    assert done.returncode == 0 and done.stdout.startswith("infer-units-generator normal-dir")
    assert done.stderr == ""


def test_usage_goes_to_stderr_not_kmsg(tmp_path: Path) -> None:
    done = generator()
    assert done.returncode == 1
    assert done.stderr == "usage: infer-units-generator normal-dir [early-dir late-dir]\n"


def test_a_journal_line_is_one_write_and_a_closed_stderr_is_no_error() -> None:
    """A hook's line is written whole at once (pre-start also logs from a
    thread), with its `<N>` off a terminal, a newline in the message escaped
    (one message, one record), and with stderr closed it goes to stdout, as
    print(file=None) did, or nowhere, without raising."""
    done = subprocess.run([PYTHON, "-IS", "-c", (
        "import sys, logging; sys.path.insert(0, sys.argv[1])\n"
        "from infer_units.generator.log import NOTICE, StdioHandler, setup\n"
        "class Stream:\n"
        "    writes = []\n"
        "    def fileno(self): raise OSError\n"
        "    def write(self, text): self.writes.append(text)\n"
        "    def flush(self): pass\n"
        "setup(StdioHandler(run_by_systemd=True))\n"
        "log = logging.getLogger('infer_units.helpers.hooks.unit')\n"
        "real, sys.stderr = sys.stderr, Stream(); log.log(NOTICE, 'two\\nlines')\n"
        "writes, sys.stderr = sys.stderr.writes, real\n"
        "assert writes == ['<5>infer-units: two\\\\nlines\\n'], writes\n"
        "sys.stderr = None; log.log(NOTICE, 'to stdout')\n"
        "sys.stdout.flush(); sys.stdout = None; log.log(NOTICE, 'nowhere')\n"),
        str(Path(__file__).resolve().parents[2])], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("<5>infer-units: to stdout"), done.stdout


def hook_lines(code: str, **env: str) -> str:
    """What a hook's logging writes to a real stderr (a pipe) after `code`."""
    done = subprocess.run([PYTHON, "-IS", "-c", (
        "import sys, logging; sys.path.insert(0, sys.argv[1])\n"
        "from infer_units.generator.log import StdioHandler, setup\n"
        "run_by_systemd = sys.argv[2] == 'hook'\n"
        "setup(StdioHandler(run_by_systemd=run_by_systemd))\n"
        "log = logging.getLogger('infer_units.helpers.act.reaper')\n" + code),
        str(Path(__file__).resolve().parents[2]), env.pop("kind", "hook")],
        capture_output=True, text=True, timeout=60, env=base_env(**env))
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_control_character_never_makes_a_second_record() -> None:
    """A process name is untrusted text: escaped once, on the line it came in."""
    said = hook_lines("log.warning('pid 7 (' + '\\n<0>forged\\x1b[2J' + '): 100% busy')")
    assert said == "<4>infer-units: pid 7 (\\n<0>forged\\x1b[2J): 100% busy\n", said


def test_an_operator_command_prefixes_only_into_the_journal() -> None:
    """A person or a script reads a command's stderr: plain lines; the
    journal itself (JOURNAL_STREAM names the stream) gets the priority."""
    assert hook_lines("log.error('no model')", kind="cli") == "infer-units: no model\n"
    journal = hook_lines("import os; st = os.fstat(2)\n"
                         "os.environ['JOURNAL_STREAM'] = f'{st.st_dev}:{st.st_ino}'\n"
                         "log.error('no model')", kind="cli")
    assert journal == "<3>infer-units: no model\n"
