"""Where the generator's messages go (generator/log.py): kmsg only if it is the
kernel's character device and never created, else the journal's socket, else a
oneshot unit that logs them once journald runs; --help and usage to the terminal."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from infer_units.generator.log import REPORT_UNIT, GeneratorLog, open_kmsg
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
    log = GeneratorLog(kmsg=str(tmp_path / "no-kmsg"), journal_socket=path)
    log.error(MESSAGE)
    log.debug("not shown at the default level")
    log.finish(str(tmp_path))
    fields = dict(line.split("=", 1) for line in journal.recv(65536).decode().splitlines())
    assert fields["MESSAGE"] == MESSAGE and fields["PRIORITY"] == "3"
    assert fields["SYSLOG_IDENTIFIER"] == "infer-units-generator"
    assert fields["SYSLOG_PID"] == str(os.getpid())
    journal.setblocking(False)
    with pytest.raises(BlockingIOError):
        journal.recv(65536)                       # debug was filtered
    assert capsys.readouterr().err == ""
    assert not (tmp_path / REPORT_UNIT).exists() and log.errors == 1


def test_nothing_reachable_leaves_a_unit_that_logs_at_boot(tmp_path: Path, auto_target: None,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    log = GeneratorLog(kmsg=str(tmp_path / "no-kmsg"), journal_socket=str(tmp_path / "no-journal"))
    log.error(MESSAGE)
    log.error(TRICKY)
    log.finish(str(tmp_path))
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
    log = GeneratorLog(kmsg="/dev/null", journal_socket=str(tmp_path / "no-journal"))
    log.error(MESSAGE)
    log.finish(str(tmp_path))
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
    """say() writes a whole line at once (pre-start also says things from a
    thread), a newline in the message escaped (one message, one record), and with stderr closed it goes to stdout, as print(file=None)
    did, or nowhere, without raising."""
    done = subprocess.run([PYTHON, "-IS", "-c", (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from infer_units.generator.log import say\n"
        "class Stream:\n"
        "    writes = []\n"
        "    def fileno(self): raise OSError\n"
        "    def write(self, text): self.writes.append(text)\n"
        "    def flush(self): pass\n"
        "s = Stream(); say(5, 'two\\nlines', stream=s)\n"
        "assert s.writes == ['<5>infer-units: two\\\\nlines\\n'], s.writes\n"
        "sys.stderr = None; say(5, 'to stdout')\n"
        "sys.stdout.flush(); sys.stdout = None; say(5, 'nowhere')\n"),
        str(Path(__file__).resolve().parents[2])], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("infer-units: to stdout"), done.stdout
