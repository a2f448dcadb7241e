"""The trust boundary (README "Trust model"), tried as a local attacker would:
a non-root account that owns a model's venv.  Needs root (drops to that user)."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from ..support import ATTACKER, FakeGpus, base_env, fake_torch, run_cli

FAKE_TORCH = fake_torch()      # where nobody and the attacker can read it

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a user")


def _user_venv(tmp_path: Path, account: pwd.struct_passwd) -> tuple[Path, Path]:
    """A venv the attacker owns, with a .pth that records who imported it."""
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, account.pw_uid, account.pw_gid)
    marker = home / "ran-as"
    subprocess.run(["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                    "--clear-groups", "/usr/bin/python3", "-m", "venv", "--without-pip",
                    str(home / "venv")], check=True, cwd="/")
    site = next((home / "venv/lib").glob("python3*/site-packages"))
    payload = (f"import os; open({str(marker)!r}, 'a').write(str(os.getuid()) + chr(10))\n")
    subprocess.run(["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                    "--clear-groups", "/usr/bin/python3", "-c",
                    f"open({str(site / 'evil.pth')!r}, 'w').write({payload!r})"], check=True)
    return home / "venv/bin/python", marker


def test_p2p_selftest_never_runs_the_users_python_as_root(
        fake_gpus: FakeGpus, tmp_path: Path, attacker: pwd.struct_passwd,
        public: Path) -> None:
    python, marker = _user_venv(public, attacker)
    done = run_cli("pre-start", "--unit", "m.service", "--gpus", "0,1", "--p2p",
                   "--env-file", str(tmp_path / "m.env"), "--python", str(python),
                   "--user", ATTACKER, "--p2p-env", f"PYTHONPATH={FAKE_TORCH}",
                   env=fake_gpus.env(INFER_UNITS_P2P_CACHE=str(tmp_path / "p2p"),
                                     INFER_UNITS_P2P_MIB="1",
                                     INFER_UNITS_STATE_DIR=str(tmp_path / "state"),
                                     LD_LIBRARY_PATH="/hook-only", SECRET="root's"))
    assert done.returncode == 0, done.stderr
    # The .pth ran, but as the attacker, never as uid 0.
    ran = marker.read_text().split()
    assert ran and set(ran) == {str(attacker.pw_uid)}, ran
    # The self-test itself ran (fake torch from the server's [env]) and P2P is on.
    assert "P2P on" in done.stderr, done.stderr


def test_p2p_selftest_gets_a_scrubbed_environment(fake_gpus: FakeGpus, tmp_path: Path,
                                                  attacker: pwd.struct_passwd,
                                                  public: Path) -> None:
    dump = public / "python"
    out = public / "env.txt"
    public.chmod(0o777)
    dump.write_text(f"#!/bin/sh\nenv > {out}\nid -u >> {out}\n")
    dump.chmod(0o755)
    done = run_cli("p2p-check", "--gpus", "0,1", "--python", str(dump), "--user", ATTACKER,
                   "--env", "FROM_MODEL=1",
                   env=fake_gpus.env(INFER_UNITS_P2P_CACHE=str(tmp_path / "p2p"),
                                     LD_PRELOAD="/hook-only.so", SECRET="root's"))
    assert done.returncode == 0, done.stderr
    seen = out.read_text().splitlines()
    assert seen[-1] == str(attacker.pw_uid)
    names = {line.partition("=")[0] for line in seen[:-1]}
    assert "FROM_MODEL" in names and "CUDA_VISIBLE_DEVICES" in names
    assert not names & {"SECRET", "LD_PRELOAD", "PYTHONPATH", "INFER_UNITS_FAKE_GPUS"}


def test_one_models_forged_p2p_verdict_is_never_another_models(
        fake_gpus: FakeGpus, tmp_path: Path, attacker: pwd.struct_passwd,
        public: Path) -> None:
    # Model A's user owns A's python, so A's self-test says whatever they
    # like: "P2P works".  Model B on the same GPUs (another account, another
    # python) must not start with P2P on on their word: on a host where peer
    # copies corrupt data, that silently corrupts B's outputs.
    liar = public / "python"
    liar.write_text("#!/bin/sh\necho '{\"ok\": true, \"pairs\": []}'\n")
    liar.chmod(0o755)
    cache = str(tmp_path / "p2p")
    a = run_cli("p2p-check", "--gpus", "0,1", "--python", str(liar), "--user", ATTACKER,
                "--env-file", str(tmp_path / "a.env"),
                env=fake_gpus.env(INFER_UNITS_P2P_CACHE=cache, INFER_UNITS_P2P_MIB="1"))
    assert a.returncode == 0 and "P2P on" in a.stderr, a.stderr
    b = run_cli("p2p-check", "--gpus", "0,1", "--python", "/usr/bin/python3", "--user", "root",
                "--env", f"PYTHONPATH={FAKE_TORCH}", "--env", "FAKE_TORCH_CORRUPT=0>1",
                "--env-file", str(tmp_path / "b.env"),
                env=fake_gpus.env(INFER_UNITS_P2P_CACHE=cache, INFER_UNITS_P2P_MIB="1"))
    assert b.returncode == 0, b.stderr
    assert "[result cached this boot]" not in b.stderr, b.stderr
    assert "P2P OFF" in b.stderr and "GPU 0->1: 1 words differ" in b.stderr, b.stderr
    assert (tmp_path / "b.env").read_text().startswith("NCCL_P2P_DISABLE=1")


def test_a_self_tests_malformed_pairs_do_not_crash_the_start(
        fake_gpus: FakeGpus, tmp_path: Path, attacker: pwd.struct_passwd,
        public: Path) -> None:
    odd = public / "python"
    odd.write_text("#!/bin/sh\necho '{\"ok\": false, \"pairs\": [{\"ok\": false}, "
                   "{\"ok\": false, \"src\": 99, \"dst\": true}]}'\n")
    odd.chmod(0o755)
    done = run_cli("p2p-check", "--gpus", "0,1", "--python", str(odd), "--user", ATTACKER,
                   "--env-file", str(tmp_path / "m.env"),
                   env=fake_gpus.env(INFER_UNITS_P2P_CACHE=str(tmp_path / "p2p")))
    assert done.returncode == 0, done.stderr
    assert "P2P OFF" in done.stderr and "GPU ?->?" in done.stderr, done.stderr


def test_p2p_selftest_as_root_model_drops_to_nobody_and_root_venv_works(
        fake_gpus: FakeGpus, tmp_path: Path) -> None:
    done = run_cli("p2p-check", "--gpus", "0,1", "--python", "/usr/bin/python3",
                   "--user", "root", "--env", f"PYTHONPATH={FAKE_TORCH}",
                   env=fake_gpus.env(INFER_UNITS_P2P_CACHE=str(tmp_path / "p2p"),
                                     INFER_UNITS_P2P_MIB="1"))
    assert done.returncode == 0, done.stderr
    assert "P2P on: every GPU pair copied" in done.stderr, done.stderr


def test_cli_launcher_ignores_the_environment_a_unit_passes(public: Path) -> None:
    """/usr/bin/infer-units (packaging/infer-units) runs isolated: a [env]
    PYTHONPATH pointing at a user's directory does not run their code."""
    launcher = Path(__file__).parents[2] / "packaging" / "infer-units"
    marker = public / "ran"
    (public / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    (public / "usercustomize.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public), "PYTHONSTARTUP": str(public),
           "PYTHONHOME": "/usr"}
    subprocess.run([str(launcher), "--help"], env=env, cwd=public, capture_output=True,
                   check=False, timeout=60)
    assert not marker.exists()
    # -I (isolated), with -S (no site: its .pth files) as the generator's
    assert launcher.read_text().splitlines()[0] in ("#!/usr/bin/python3 -I",
                                                    "#!/usr/bin/python3 -IS")


@pytest.mark.parametrize("key", ["LD_PRELOAD", "LD_LIBRARY_PATH", "GCONV_PATH"])
def test_generator_refuses_loader_variables_that_would_reach_root_hooks(
        tmp_path: Path, key: str) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text(f'engine = "command"\ncommand = ["/bin/sleep", "1"]\n'
                                f'gpus = [0]\n[env]\n{key} = "/home/u/lib"\n')
    done = run_cli("check", "m", env=base_env(INFER_UNITS_CONFIG_PATH=str(etc)))
    assert done.returncode == 1
    assert "m.toml" in done.stderr and f"env: {key}" in done.stderr, done.stderr
    assert "root hooks" in done.stderr


@pytest.mark.parametrize("section,key,value,reason", [
    ("service", "ExecStart", "/bin/true", "the server's argv is ExecStart"),
    ("service", "Environment", "PYTHONPATH=/home/u", "reaches the root hooks"),
    ("service", "After", "x.service", "[Unit] directive, not [Service]"),
    ("unit", "Restart", "always", "[Service] directive, not [Unit]"),
    ("install", "After", "x.service", "[Unit] directive, not [Install]"),
])
def test_raw_directives_in_the_wrong_section_or_undoing_the_unit_are_refused(
        tmp_path: Path, section: str, key: str, value: str, reason: str) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text(f'engine = "command"\ncommand = ["/bin/sleep", "1"]\n'
                                f'[{section}]\n{key} = "{value}"\n')
    done = run_cli("check", "m", env=base_env(INFER_UNITS_CONFIG_PATH=str(etc)))
    assert done.returncode == 1
    assert "m.toml" in done.stderr and key in done.stderr and reason in done.stderr, done.stderr
