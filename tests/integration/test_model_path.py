"""pre-start --model-path: a model path that is not on this host refuses the
start (exit 1, one line naming the path and the fix) before anything else is
done; a path that is there lets the start go on.  The real hook, real paths.
(Under real systemd, no automatic restart: e2e/test_status_e2e.py.)"""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from ..support import FakeGpus, run_cli


def pre_start(fake_gpus: FakeGpus, path: Path, *more: str) -> tuple[int, str]:
    env = fake_gpus.env(DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent")
    done = run_cli("pre-start", "--unit", "m", "--model-path", str(path), *more, env=env)
    return done.returncode, done.stderr


def refusal(stderr: str, path: Path) -> list[str]:
    return [line for line in stderr.splitlines()
            if f"model: {path} does not exist on this host (" in line]


@pytest.mark.parametrize("kind", ["missing", "dangling link", "link loop", "under a file"])
def test_a_model_path_that_is_not_there_refuses_the_start(
        fake_gpus: FakeGpus, tmp_path: Path, kind: str) -> None:
    models = tmp_path / "models dir 100%"
    models.mkdir()
    path = models / "qwen"
    if kind == "dangling link":
        path.symlink_to(models / "gone")
    elif kind == "link loop":
        path.symlink_to(path)
    elif kind == "under a file":
        (models / "file").write_text("")
        path = models / "file" / "qwen"
    # A GPU of the fake table and a holder-free port: only the path can refuse.
    code, stderr = pre_start(fake_gpus, path, "--gpus", "0")
    assert code == 1, stderr
    lines = refusal(stderr, path)
    assert len(lines) == 1, stderr
    assert "`infer-units cat m` shows the file that sets `model`" in lines[0]
    if kind == "dangling link":
        assert "a symbolic link whose target is missing" in lines[0]
    # Refused before the GPUs are touched: nothing reaped, nothing claimed.
    assert "reap GPU" not in stderr and "start checks passed" not in stderr
    claims = Path(fake_gpus.env()["INFER_UNITS_RUN_DIR"]) / "gpu"
    assert not claims.exists() or not any(claims.iterdir())


@pytest.mark.parametrize("kind", ["directory", "file", "link to a directory"])
def test_a_model_path_that_is_there_lets_the_start_go_on(
        fake_gpus: FakeGpus, tmp_path: Path, kind: str) -> None:
    path = tmp_path / "models" / "qwen"
    path.parent.mkdir()
    if kind == "directory":
        path.mkdir()
    elif kind == "file":
        path = path.with_suffix(".gguf")
        path.write_text("")
    else:
        (tmp_path / "store").mkdir()
        path.symlink_to(tmp_path / "store")
    code, stderr = pre_start(fake_gpus, path, "--gpus", "0")
    assert code == 0, stderr
    assert "start checks passed" in stderr and not refusal(stderr, path)


def test_the_path_is_checked_after_the_drain_fence(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    """A drained host says it is drained (exit 2), not that a model is missing."""
    run = Path(fake_gpus.env()["INFER_UNITS_RUN_DIR"])
    run.mkdir(mode=0o755, exist_ok=True)
    (run / "drain.fence").write_text('{"stopped": []}\n')
    code, stderr = pre_start(fake_gpus, tmp_path / "missing")
    assert code == 2, stderr
    assert "GPUs drained by `infer-units drain`" in stderr
    assert not refusal(stderr, tmp_path / "missing")


def as_account(account: pwd.struct_passwd, *argv: str) -> None:
    subprocess.run(["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                    "--clear-groups", "--", *argv], check=True, timeout=30)


def attackers_models(public: Path, attacker: pwd.struct_passwd) -> tuple[Path, Path]:
    """A directory of root's that only root can enter, holding `secret`, and
    a models directory the attacker owns (a model's user owns its models)."""
    private = public / "root-only"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("")
    models = public / "models"
    models.mkdir()
    os.chown(models, attacker.pw_uid, attacker.pw_gid)
    return private, models


def test_a_link_to_roots_files_tells_the_models_account_nothing(
        fake_gpus: FakeGpus, public: Path, attacker: pwd.struct_passwd) -> None:
    """The model's account points its model path at root's files by a link
    of its own: whether the target exists (`secret`) or not (`absent`), the
    start goes the same way with the same words, as for any path it cannot
    reach (pre-start looks with its rights, not root's)."""
    private, models = attackers_models(public, attacker)
    link = models / "model"
    seen = []
    for target in (private / "secret", private / "absent"):
        as_account(attacker, "ln", "-sfn", str(target), str(link))
        code, stderr = pre_start(fake_gpus, link, "--user", attacker.pw_name)
        seen.append((code, [line for line in stderr.splitlines() if "model:" in line]))
    unreachable = pre_start(fake_gpus, private / "secret", "--user", attacker.pw_name)
    assert seen[0] == seen[1], seen
    # The same as a path it cannot reach, named without a link: a warning
    # that says no more than its own stat would, and the start goes on.
    assert seen[0][0] == unreachable[0] == 0, (seen, unreachable)
    assert [line.replace(str(private / "secret"), str(link)) for line in unreachable[1].splitlines()
            if "model:" in line] == seen[0][1], (seen, unreachable)
    assert len(seen[0][1]) == 1 and f"cannot tell as {attacker.pw_name} whether it exists " \
        "(Permission denied)" in seen[0][1][0], seen


def test_the_models_account_still_learns_what_it_can_see_itself(
        fake_gpus: FakeGpus, public: Path, attacker: pwd.struct_passwd) -> None:
    """A path the account can read passes; one missing where it can look is
    refused with the path named."""
    _private, models = attackers_models(public, attacker)
    as_account(attacker, "mkdir", str(models / "qwen"))
    code, stderr = pre_start(fake_gpus, models / "qwen", "--user", attacker.pw_name)
    assert code == 0 and "start checks passed" in stderr and "model:" not in stderr, stderr
    code, stderr = pre_start(fake_gpus, models / "gone", "--user", attacker.pw_name)
    assert code == 1, stderr
    assert len(refusal(stderr, models / "gone")) == 1, stderr
