"""`infer-units cat` and `infer-units edit` on real files, with the real CLI
and an editor that is a script (as $EDITOR is for systemctl edit)."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from ..support import PYTHON, base_env, run_cli

MAIN = '''engine = "sglang"
model = "/models/q"
gpus = [0, 1]
port = 8000
args = ["--mem-fraction-static", "0.88"]

[reap]
term-grace = "10s"
timeout = "60s"

[env]
QUOTED = "it's \\"q\\" $HOME 100%"
'''
DROPIN = 'args = ["--context-length", "65536"]\n\n[reap]\ntimeout = "2min"\n'
DEFAULTS = '[nccl]\nsocket-ifname = "eth0"\n\n[env]\nHF_HUB_OFFLINE = "1"\n'

# The editor: EDIT_MODE=prepend puts $EDIT_TEXT above what it was given (the
# drop-in part), append puts it at the end (below the marker), replace writes only
# $EDIT_TEXT, keep changes nothing, fail exits 3.
EDITOR = '''import os, sys
path = sys.argv[1]
text = open(path).read()
with open(os.environ["EDIT_SEEN"], "w") as f:
    f.write(text)
mode = os.environ["EDIT_MODE"]
if mode == "fail":
    sys.exit(3)
if mode == "prepend":
    text = os.environ["EDIT_TEXT"] + text
elif mode == "append":
    text = text + os.environ["EDIT_TEXT"]
elif mode == "replace":
    text = os.environ["EDIT_TEXT"]
open(path, "w").write(text)
'''


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    (etc / "q.toml.d").mkdir(parents=True)
    (etc / "defaults.toml.d").mkdir()
    (etc / "q.toml").write_text(MAIN)
    (etc / "q.toml.d/50-ctx.toml").write_text(DROPIN)
    (etc / "defaults.toml.d/10-host.toml").write_text(DEFAULTS)
    (tmp_path / "lib").mkdir()
    (tmp_path / "editor.py").write_text(EDITOR)
    return tmp_path


def env(conf: Path, mode: str = "keep", text: str = "") -> dict[str, str]:
    return base_env(INFER_UNITS_CONFIG_PATH=f"{conf}/etc:{conf}/lib",
                    INFER_UNITS_RUN_DIR=str(conf / "run"),
                    EDITOR=f"{PYTHON} {conf}/editor.py", EDIT_MODE=mode, EDIT_TEXT=text,
                    EDIT_SEEN=str(conf / "seen.txt"))


def test_cat_is_the_merged_model_with_each_value_s_file(conf: Path) -> None:
    done = run_cli("cat", "q", env=env(conf), check=0)
    etc = conf / "etc"
    assert tomllib.loads(done.stdout) == {
        "engine": "sglang", "model": "/models/q", "gpus": [0, 1], "port": 8000,
        "args": ["--context-length", "65536"],
        "reap": {"term-grace": "10s", "timeout": "2min"},
        "env": {"HF_HUB_OFFLINE": "1", "QUOTED": "it's \"q\" $HOME 100%"},
        "nccl": {"socket-ifname": "eth0"}}
    lines = {line.split("=")[0].strip(): line.rsplit("# ", 1)[1]
             for line in done.stdout.splitlines() if "=" in line and not line.startswith("#")}
    assert lines["engine"] == f"{etc}/q.toml"
    assert lines["args"] == f"{etc}/q.toml.d/50-ctx.toml"
    assert lines["term-grace"] == f"{etc}/q.toml"
    assert lines["timeout"] == f"{etc}/q.toml.d/50-ctx.toml"
    assert lines["socket-ifname"] == lines["HF_HUB_OFFLINE"] == f"{etc}/defaults.toml.d/10-host.toml"
    assert done.stdout.splitlines()[0] == (f"# q: {etc}/defaults.toml.d/10-host.toml, {etc}/q.toml, "
                                           f"{etc}/q.toml.d/50-ctx.toml")


def test_cat_json_and_errors(conf: Path) -> None:
    keys = json.loads(run_cli("cat", "q.service", "--json", env=env(conf), check=0).stdout)["keys"]
    assert keys["reap.timeout"] == {"value": "2min", "file": f"{conf}/etc/q.toml.d/50-ctx.toml"}
    missing = run_cli("cat", "nope", env=env(conf), check=1)
    assert missing.stderr.startswith("infer-units: no model file named nope.toml") and missing.stdout == ""
    (conf / "etc/q.toml.d/60-bad.toml").write_text("port = 99999\n")
    bad = run_cli("cat", "q", env=env(conf), check=1)
    assert "port = 99999" in bad.stdout     # shown, then refused
    assert bad.stderr.strip().splitlines()[-1].startswith(f"infer-units: error: {conf}/etc/q.toml.d/60-bad.toml: port:")
    assert "Traceback" not in bad.stderr


def test_edit_keeps_a_valid_override_and_cat_shows_it(conf: Path) -> None:
    done = run_cli("edit", "q", "--no-reload", env=env(conf, "prepend", '[reap]\ntimeout = "5min"\n'), check=0)
    target = conf / "etc/q.toml.d/override.toml"
    assert target.read_text().startswith('[reap]\ntimeout = "5min"\n')
    assert "### Lines from here on are ignored" not in target.read_text()
    assert f"wrote {target}" in done.stderr
    seen = (conf / "seen.txt").read_text()
    # below the marker, the model as it was, commented out, each value with its file
    reference = seen.split("### Lines from here on are ignored", 1)[1].splitlines()[1:]
    assert reference[0] == (f"# q: {conf}/etc/defaults.toml.d/10-host.toml, {conf}/etc/q.toml, "
                            f"{conf}/etc/q.toml.d/50-ctx.toml")
    assert any(line.startswith('# timeout = "2min"') and line.endswith(f"# {conf}/etc/q.toml.d/50-ctx.toml")
               for line in reference), reference
    keys = json.loads(run_cli("cat", "q", "--json", env=env(conf), check=0).stdout)["keys"]
    assert keys["reap.timeout"] == {"value": "5min", "file": str(target)}
    # editing again starts from the file as it is
    run_cli("edit", "q", "--no-reload", env=env(conf, "keep"), check=0)
    assert (conf / "seen.txt").read_text().startswith('[reap]\ntimeout = "5min"\n')


def test_edit_refuses_an_invalid_model_and_keeps_nothing(conf: Path) -> None:
    target = conf / "etc/q.toml.d/override.toml"
    for text, error in (('gpus = "zero"\n', "gpus:"), ("[reap]\ntimeuot = \"1s\"\n", "reap.timeuot: unknown key"),
                        ("port = \n", "invalid TOML")):
        done = run_cli("edit", "q", "--no-reload", env=env(conf, "prepend", text), check=1)
        assert f"error: {target}" in done.stderr and error in done.stderr, done.stderr
        assert "not written" in done.stderr and "Traceback" not in done.stderr
        assert not target.exists()
    # an existing override is left as it was
    target.write_text('[env]\nA = "1"\n')
    run_cli("edit", "q", "--no-reload", env=env(conf, "replace", "port = 0\n"), check=1)
    assert target.read_text() == '[env]\nA = "1"\n'
    assert sorted(p.name for p in target.parent.iterdir()) == ["50-ctx.toml", "override.toml"]


def test_edit_unchanged_failed_or_emptied(conf: Path) -> None:
    target = conf / "etc/q.toml.d/override.toml"
    done = run_cli("edit", "q", "--no-reload", env=env(conf, "keep"), check=0)
    assert "unchanged" in done.stderr and not target.exists()
    # the editor returned with the file as it was given (a GUI editor that forks): a hint
    assert "returned without changing the file" in done.stderr, done.stderr
    assert 'EDITOR="code --wait"' in done.stderr, done.stderr
    done = run_cli("edit", "q", "--no-reload", env=env(conf, "fail"), check=1)
    assert "editor exited with status 3" in done.stderr and not target.exists()
    target.write_text('[env]\nA = "1"\n')
    done = run_cli("edit", "q", "--no-reload", env=env(conf, "replace", "# nothing\n"), check=0)
    assert f"removed {target}" in done.stderr and not target.exists()
    run_cli("edit", "nope", "--no-reload", env=env(conf, "keep"), check=1)


def test_model_names_complete_in_bash(conf: Path) -> None:
    (conf / "etc/qq.toml").write_text(MAIN)
    for command in ("cat", "edit"):
        done = run_cli(env=env(conf) | {"COMP_WORDS": f"infer-units {command} q", "COMP_CWORD": "2",
                                        "_INFER_UNITS_COMPLETE": "bash_complete"})
        assert done.stdout.split() == ["plain,q", "plain,qq"], done.stderr


def test_a_refused_edit_keeps_what_was_typed(conf: Path) -> None:
    """What the operator typed survives a refusal, in a file the
    error names, and `edit --from` starts from it."""
    target = conf / "etc/q.toml.d/override.toml"
    typed = 'gpus = "zero"\n[env]\nMINE = "typed by hand"\n'
    done = run_cli("edit", "q", "--no-reload", env=env(conf, "prepend", typed), check=1)
    assert not target.exists()
    kept = Path(done.stderr.split("what you typed is kept in ", 1)[1].split()[0])
    try:
        assert kept.read_text().startswith(typed)
        assert "### Lines from here on are ignored" not in kept.read_text()
        assert kept.stat().st_mode & 0o777 == 0o600
        assert f"infer-units edit q --from {kept}" in done.stderr
        assert f"kept in {kept} until reboot" in done.stderr
        # fixed from where it was left: the editor is given the refused text
        fixed = 'gpus = [0]\n[env]\nMINE = "typed by hand"\n'
        done = run_cli("edit", "q", "--no-reload", "--from", str(kept),
                       env=env(conf, "replace", fixed), check=0)
        assert (conf / "seen.txt").read_text().startswith(typed)
        assert target.read_text() == fixed and f"wrote {target}" in done.stderr
        assert not kept.exists()            # in place now
    finally:
        kept.unlink(missing_ok=True)


def test_edit_opens_a_model_whose_override_is_broken(conf: Path) -> None:
    target = conf / "etc/q.toml.d/override.toml"
    target.write_text("port = \n")                     # invalid TOML: the model does not load
    run_cli("cat", "q", env=env(conf), check=1)
    done = run_cli("edit", "q", "--no-reload", env=env(conf, "replace", "port = 8001\n"), check=0)
    assert target.read_text() == "port = 8001\n" and f"wrote {target}" in done.stderr
    seen = (conf / "seen.txt").read_text()
    assert seen.startswith("port = \n") and "q does not load now" in seen
    assert "invalid TOML" in seen


SECOND_TRY = '''import os, sys
path = sys.argv[1]
text = open(path).read()
calls = os.environ["EDIT_SEEN"]
n = len([p for p in os.listdir(os.path.dirname(calls)) if p.startswith("seen-")])
with open(f"{calls}-{n}", "w") as f:
    f.write(text)
# first: a typo; then (the editor opened again with it): fix the typo only
text = 'gpus = "zero"\\n' + text if n == 0 else text.replace('gpus = "zero"', "gpus = [1]")
open(path, "w").write(text)
'''


def test_a_refused_edit_on_a_terminal_opens_the_editor_again(conf: Path) -> None:
    import pty
    import select
    import subprocess
    (conf / "second.py").write_text(SECOND_TRY)
    seen = conf / "calls" / "seen"
    seen.parent.mkdir()
    environment = env(conf) | {"EDITOR": f"{PYTHON} {conf}/second.py", "EDIT_SEEN": str(seen)}
    master, slave = pty.openpty()
    proc = subprocess.Popen([PYTHON, "-m", "infer_units", "edit", "q", "--no-reload"],
                            stdin=slave, stdout=slave, stderr=slave, env=environment)
    os.close(slave)
    out = b""
    try:
        while b"edit again?" not in out:
            # a guard against a hang only: the prompt comes as soon as the edit is refused
            assert select.select([master], [], [], 120)[0], out
            chunk = os.read(master, 4096)
            assert chunk, out
            out += chunk
        os.write(master, b"y\n")
        try:
            while chunk := os.read(master, 4096):
                out += chunk
        except OSError:         # EIO: the other side closed
            pass
        assert proc.wait(timeout=60) == 0, out
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    again = (seen.parent / "seen-1").read_text()
    # the typed text, under the reasons it was refused
    assert again.startswith("#! infer-units: ") and "gpus" in again.splitlines()[0]
    assert 'gpus = "zero"' in again
    target = conf / "etc/q.toml.d/override.toml"
    assert target.read_text().startswith("gpus = [1]\n") and "#! infer-units" not in target.read_text()


# ---------------------------------------------------------------- edit: errors, messages, umask

def test_an_editor_not_on_path_is_a_clear_error(conf: Path) -> None:
    done = run_cli("edit", "q", "--no-reload",
                   env=env(conf) | {"EDITOR": "no-such-editor-here --wait"}, check=1)
    assert "Traceback" not in done.stderr and "FileNotFoundError" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "cannot run the editor 'no-such-editor-here'" in line and "$EDITOR" in line, line
    assert not (conf / "etc/q.toml.d/override.toml").exists()


def test_text_below_the_marker_is_said_to_be_ignored(conf: Path) -> None:
    done = run_cli("edit", "q", "--no-reload", env=env(conf, "append", "port = 9999\n"),
                   check=0)
    assert "below the line" in done.stderr and "was ignored" in done.stderr, done.stderr
    assert "unchanged" in done.stderr, done.stderr
    # an edit that touches only the part above the marker says nothing of it
    done = run_cli("edit", "q", "--no-reload", env=env(conf, "prepend", "port = 8001\n"),
                   check=0)
    assert "ignored" not in done.stderr, done.stderr


def test_a_written_edit_says_restart_to_apply(conf: Path) -> None:
    done = run_cli("edit", "q", "--no-reload", env=env(conf, "prepend", "port = 8001\n"),
                   check=0)
    assert done.stderr.strip().splitlines()[-1] == (
        "infer-units: restart q to apply: systemctl daemon-reload && systemctl restart q"), \
        done.stderr


@pytest.mark.parametrize("umask", ["002", "000"])
def test_edit_works_under_any_umask_and_leaves_nothing_behind(conf: Path, umask: str) -> None:
    import subprocess
    import tempfile
    before = set(Path(tempfile.gettempdir()).glob("infer-units-edit-*"))

    def edit(*args: str, mode: str, text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", f'umask {umask} && exec "$@"', "sh", PYTHON, "-m",
                               "infer_units", "edit", "q", "--no-reload", *args],
                              capture_output=True, text=True, env=env(conf, mode, text),
                              timeout=120)
    target = conf / "etc/q.toml.d/override.toml"
    done = edit(mode="prepend", text="port = 8001\n")
    assert done.returncode == 0 and f"wrote {target}" in done.stderr, done.stderr
    assert target.stat().st_mode & 0o777 == 0o644
    work = conf / "run/edit"
    assert work.stat().st_mode & 0o777 == 0o700 and list(work.iterdir()) == []
    refused = edit(mode="prepend", text='gpus = "zero"\n')
    assert refused.returncode == 1, refused.stderr
    kept = Path(refused.stderr.split("what you typed is kept in ", 1)[1].split()[0])
    assert kept.parent == work and kept.stat().st_mode & 0o777 == 0o600
    assert list(work.iterdir()) == [kept]
    assert set(Path(tempfile.gettempdir()).glob("infer-units-edit-*")) == before


def test_cat_all_shows_the_effective_defaults(conf: Path) -> None:
    from infer_units.generator.settings import default
    done = run_cli("cat", "--all", "q", env=env(conf), check=0)
    data = tomllib.loads(done.stdout)
    assert data["reap"]["foreign"] == default("reap.foreign") and data["host"] == default("host")
    assert data["reap"]["timeout"] == "2min"          # set by a file: not the default
    marked = {line.split("=")[0].strip(): line.rsplit("# ", 1)[1]
              for line in done.stdout.splitlines() if "=" in line and not line.startswith("#")}
    assert marked["foreign"] == "default" and marked["host"] == "default"
    keys = json.loads(run_cli("cat", "--all", "--json", "q", env=env(conf), check=0).stdout)["keys"]
    assert keys["reap.foreign"] == {"value": default("reap.foreign"), "file": "default"}
    assert keys["reap.timeout"] == {"value": "2min", "file": f"{conf}/etc/q.toml.d/50-ctx.toml"}
    plain = tomllib.loads(run_cli("cat", "q", env=env(conf), check=0).stdout)
    assert "foreign" not in plain["reap"]
