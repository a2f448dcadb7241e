"""Written as the attacker: a search directory that others
can write (a /run/infer-units left 0777, or one owned by a user) is refused
whole, for reading as for writing.  A local account without root puts a link
to a root-owned model file there (it would become a unit running as root)
and an empty file (it would mask the operator's model in a lower directory);
the generator uses neither, says so in one line naming the directory, and
still generates the models of the other directories."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from ..support import PYTHON, base_env, run_cli

pytestmark = pytest.mark.integration

MODEL = 'engine = "command"\ncommand = ["/opt/srv/serve"]\ngpus = [{gpu}]\n'


def as_attacker(attacker: pwd.struct_passwd, *argv: str) -> None:
    subprocess.run(["setpriv", f"--reuid={attacker.pw_uid}", f"--regid={attacker.pw_gid}",
                    "--clear-groups", "--", *argv], check=True, timeout=30)


def tree(public: Path) -> tuple[Path, Path, Path]:
    """run/ (the attacker's way in), etc/ with the operator's model, and a
    root-owned model file outside the search path (a shipped example)."""
    run, etc, shipped = public / "run", public / "etc", public / "shipped"
    for d in (run, etc, shipped):
        d.mkdir(mode=0o755)
    (etc / "real.toml").write_text(MODEL.format(gpu=0))
    (shipped / "example.toml").write_text(MODEL.format(gpu=1))
    return run, etc, shipped


def generate(public: Path, run: Path, etc: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = public / "out"
    out.mkdir()
    done = subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=60,
                          env=base_env(INFER_UNITS_CONFIG_PATH=f"{run}:{etc}"))
    return done, out


@pytest.mark.parametrize("how", ["mode 0777", "owned by the attacker"])
def test_a_directory_others_can_write_is_refused_whole(attacker: pwd.struct_passwd,
                                                       public: Path, how: str) -> None:
    run, etc, shipped = tree(public)
    if how == "mode 0777":
        run.chmod(0o777)
    else:
        os.chown(run, attacker.pw_uid, attacker.pw_gid)
    as_attacker(attacker, "ln", "-s", str(shipped / "example.toml"), str(run / "evil.toml"))
    as_attacker(attacker, "touch", str(run / "real.toml"))     # an empty file: a mask
    assert (run / "evil.toml").is_symlink() and (run / "real.toml").stat().st_size == 0

    done, out = generate(public, run, etc)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["real.service"], done.stderr
    assert f"SourcePath={etc}/real.toml" in (out / "real.service").read_text()
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    reason = ("writable by group or others (mode 0777)" if how == "mode 0777"
              else f"owned by uid {attacker.pw_uid}, not root")
    assert lines[0].startswith(f"infer-units-generator: {run}: refused: {reason}"), lines

    checked = run_cli("check", env=base_env(INFER_UNITS_CONFIG_PATH=f"{run}:{etc}"))
    assert checked.returncode == 1 and f"{run}: refused: {reason}" in checked.stderr, \
        (checked.stdout, checked.stderr)


def test_a_drop_in_directory_others_can_write_refuses_its_model(attacker: pwd.struct_passwd,
                                                                 public: Path) -> None:
    """A model's drop-ins in a directory the attacker can write: the model is
    refused (its drop-ins are not the operator's), naming that directory; the
    attacker's drop-in is never applied."""
    run, etc, _ = tree(public)
    (etc / "other.toml").write_text(MODEL.format(gpu=2))
    dropins = etc / "real.toml.d"
    dropins.mkdir(mode=0o777)
    dropins.chmod(0o777)
    as_attacker(attacker, "ln", "-s", "/dev/null", str(dropins / "50-x.toml"))
    done, out = generate(public, run, etc)
    assert sorted(p.name for p in out.iterdir()) == ["other.service"], done.stderr
    assert f"{dropins}: refused: writable by group or others (mode 0777)" in done.stderr


def test_root_owned_directories_still_mask_and_link(public: Path) -> None:
    """The refusal is about who can write, not about links or masks: in a
    directory only root can write, both still work as documented."""
    run, etc, shipped = tree(public)
    (run / "linked.toml").symlink_to(shipped / "example.toml")
    (run / "real.toml").write_text("")
    done, out = generate(public, run, etc)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["linked.service"]
