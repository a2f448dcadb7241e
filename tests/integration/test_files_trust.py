"""Files and directories across the trust boundary (README "Trust model",
generator/atomicfile.py), tried as a local attacker would: a non-root account
(created here, commands run as it through setpriv) that owns or can write a
directory a root hook writes into, plants symlinks and FIFOs at every name
the hook could pick, and waits for a hook run under `umask 000` to leave it a
world-writable directory.  Needs root (it creates the user and drops to it)."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from ..support import ATTACKER, PYTHON, FakeGpus, base_env, run_cli, run_generator

VICTIM_TEXT = "root's secret, 0600\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a user")


def as_attacker(account: pwd.struct_passwd, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Python `code` run as the attacker (no root, no groups)."""
    return subprocess.run(["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                           "--clear-groups", PYTHON, "-c", code, *args],
                          capture_output=True, text=True, timeout=120, cwd="/")


def victim(tmp_path: Path) -> Path:
    """A root-owned 0600 file the attacker cannot read or write."""
    path = tmp_path / "victim"
    path.write_text(VICTIM_TEXT)
    path.chmod(0o600)
    return path


# The attacker's planting: a symlink (or FIFO) at every name the next few
# thousand processes' hooks would use (main's "<file>.<pid>.tmp"), and at fixed
# ".tmp" names.
NEXT_PIDS = r"""
def next_pids(n=4000):
    last = int(open("/proc/sys/kernel/ns_last_pid").read())
    top = int(open("/proc/sys/kernel/pid_max").read())
    return [(last + i) % top for i in range(1, n)]
"""
PLANT = NEXT_PIDS + r"""
import os, sys
directory, kind, target = sys.argv[1], sys.argv[2], sys.argv[3]
names = [f"infer-units.prom.{pid}.tmp" for pid in next_pids()]
names += ["infer-units.prom.tmp", "infer-units.prom"]
for name in names:
    path = os.path.join(directory, name)
    if kind == "symlink":
        os.symlink(target, path)
    else:
        os.mkfifo(path)
print(len(names))
"""


def _metrics_dir(layout: str, public: Path, account: pwd.struct_passwd) -> Path:
    """The textfile directory as the attacker can reach it."""
    if layout == "owned by the attacker":          # a dir the exporter's user owns
        d = public / "textfile"
        d.mkdir()
        os.chown(d, account.pw_uid, account.pw_gid)
        return d
    if layout == "root's, writable by others":
        d = public / "textfile"
        d.mkdir()
        d.chmod(0o777)
        return d
    # Debian: /var/lib/prometheus (prometheus') / node-exporter (root's 0755).
    parent = public / "prometheus"
    parent.mkdir()
    os.chown(parent, account.pw_uid, account.pw_gid)
    d = parent / "node-exporter"
    d.mkdir(mode=0o755)
    # The attacker cannot write node-exporter/, but it owns the parent: it
    # moves the root directory away and puts its own in its place.
    swapped = as_attacker(account, "import os, sys; os.rename(sys.argv[1], sys.argv[1] + '.old');"
                          " os.mkdir(sys.argv[1])", str(d))
    assert swapped.returncode == 0, swapped.stderr
    return d


LAYOUTS = ["owned by the attacker", "root's, writable by others",
           "root's, under a parent the attacker owns"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_planted_symlinks_never_make_a_root_hook_overwrite_a_file(
        layout: str, fake_gpus: FakeGpus, tmp_path: Path, public: Path,
        attacker: pwd.struct_passwd) -> None:
    target = victim(tmp_path)
    metrics = _metrics_dir(layout, public, attacker)
    planted = as_attacker(attacker, PLANT, str(metrics), "symlink", str(target))
    assert planted.returncode == 0, planted.stderr
    done = run_cli("pre-start", "--unit", "m.service", "--gpus", "0",
                   env=fake_gpus.env(INFER_UNITS_STATE_DIR=str(tmp_path / "state"),
                                     INFER_UNITS_METRICS_DIR=str(metrics)))
    assert target.read_text() == VICTIM_TEXT, "a root hook wrote through the attacker's link"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    # Metrics never fail a start; the refusal is one line naming the directory.
    assert done.returncode == 0, done.stderr
    refusal = [l for l in done.stderr.splitlines() if "metrics not written" in l]
    assert refusal and "refusing " in refusal[0], done.stderr
    assert f"owned by {ATTACKER}" in refusal[0] or "writable by" in refusal[0], refusal


def test_planted_fifos_never_hang_a_root_hook(fake_gpus: FakeGpus, tmp_path: Path,
                                              public: Path, attacker: pwd.struct_passwd) -> None:
    metrics = _metrics_dir("owned by the attacker", public, attacker)
    planted = as_attacker(attacker, PLANT, str(metrics), "fifo", "")
    assert planted.returncode == 0, planted.stderr
    try:
        done = run_cli("pre-start", "--unit", "m.service", "--gpus", "0", timeout=60,
                       env=fake_gpus.env(INFER_UNITS_STATE_DIR=str(tmp_path / "state"),
                                         INFER_UNITS_METRICS_DIR=str(metrics)))
    except subprocess.TimeoutExpired:
        pytest.fail("pre-start hung on a FIFO the attacker planted")
    assert done.returncode == 0, done.stderr
    assert "metrics not written: refusing" in done.stderr, done.stderr


def test_fifos_in_our_own_directories_never_hang_a_hook(fake_gpus: FakeGpus,
                                                         tmp_path: Path) -> None:
    """Whatever put them there (root by mistake, an older version's 0777
    directory), a FIFO where the hooks read or write their state is refused
    without waiting for a writer."""
    run = Path(fake_gpus.env()["INFER_UNITS_RUN_DIR"])
    state = run / "state"
    (run / "gpu").mkdir(parents=True)
    state.mkdir()
    for path in (state / "m.service.json", state / "gpu-health.state",
                 run / "gpu" / f"{fake_gpus.uuids[0]}.lock", run / "m.env"):
        os.mkfifo(path)
    env = fake_gpus.env(INFER_UNITS_STATE_DIR=str(state))
    try:
        start = run_cli("pre-start", "--unit", "m.service", "--gpus", "0",
                        "--env-file", str(run / "m.env"), env=env, timeout=60)
        stop = run_cli("wait-free", "--unit", "m.service", "--gpus", "0", "--timeout", "5s",
                       env=env, timeout=60)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a hook hung on a FIFO: {e.cmd}")
    # The env file and the lock cannot be used: a clear refusal, not a hang.
    assert start.returncode == 1, start.stderr
    assert f"{run / 'm.env'}" in start.stderr and "FIFO" in start.stderr, start.stderr
    assert stop.returncode in (0, 1), stop.stderr
    assert "Traceback" not in start.stderr + stop.stderr


def test_umask_000_leaves_no_directory_an_attacker_can_write(
        fake_gpus: FakeGpus, public: Path, attacker: pwd.struct_passwd) -> None:
    """#6: after `umask 000; infer-units reap ...` the runtime directory (also
    the first model directory) was world-writable and a local user dropped a
    model file into it."""
    run = public / "run"
    state = run / "state"
    env = fake_gpus.env(INFER_UNITS_RUN_DIR=str(run), INFER_UNITS_STATE_DIR=str(state),
                        INFER_UNITS_P2P_CACHE=str(run / "p2p"))
    for argv in (["reap", "--gpus", "0", "--unit", "m.service"],
                 ["pre-start", "--unit", "m.service", "--gpus", "0,1",
                  "--env-file", str(run / "m.env"), "--resolve-gpus"],
                 ["drain", "--timeout", "5s"], ["resume"]):
        done = subprocess.run(["/bin/sh", "-c", 'umask 000; exec "$@"', "sh", PYTHON, "-m",
                               "infer_units", *argv], capture_output=True, text=True,
                              env=env, timeout=120)
        assert "Traceback" not in done.stderr, (argv, done.stderr)
    made = [run, run / "gpu", state]
    assert all(d.is_dir() for d in made), sorted(str(p) for p in run.rglob("*"))
    for path in [run, *run.rglob("*")]:
        st = path.lstat()
        assert st.st_uid == 0, path
        # Claim locks are root's alone: 0700 and 0600 there.
        private = path == run / "gpu" or path.parent == run / "gpu"
        expected = (0o700 if private else 0o755) if stat.S_ISDIR(st.st_mode) else (
            0o600 if private else 0o644)
        assert stat.S_IMODE(st.st_mode) == expected, (path, oct(st.st_mode))
    # And the attacker, tried: no model file, no link, no FIFO anywhere in it.
    tried = as_attacker(attacker, r"""
import os, sys
made = []
for d in sys.argv[1:]:
    for make in (lambda p: open(p, "x").write('engine = "command"\n'),
                 lambda p: os.symlink("/etc/shadow", p), os.mkfifo):
        path = os.path.join(d, "evil.toml")
        try:
            make(path)
            made.append(path)
            os.unlink(path)
        except OSError:
            pass
print(made)
""", *map(str, made))
    assert tried.returncode == 0, tried.stderr
    assert tried.stdout.strip() == "[]", tried.stdout


@pytest.mark.parametrize("how", ["writable by others", "owned by the attacker"])
def test_an_existing_runtime_directory_others_can_change_is_refused(
        how: str, fake_gpus: FakeGpus, public: Path, attacker: pwd.struct_passwd) -> None:
    """A runtime directory left 0777 (an older version under umask 000) or
    made by someone else is not used: pre-start says which and why (exit 1)."""
    run = public / "run"
    run.mkdir()
    if how == "writable by others":
        run.chmod(0o777)
    else:
        os.chown(run, attacker.pw_uid, attacker.pw_gid)
    done = run_cli("pre-start", "--unit", "m.service", "--gpus", "0",
                   env=fake_gpus.env(INFER_UNITS_RUN_DIR=str(run),
                                     INFER_UNITS_STATE_DIR=str(public / "state")))
    assert done.returncode == 1, done.stderr
    line = next((l for l in done.stderr.splitlines() if f"refusing {run}" in l), "")
    assert how.split()[0] in line and "\n" not in line, done.stderr
    assert not (run / "gpu").exists()


def test_the_generator_never_writes_through_a_planted_link(tmp_path: Path, public: Path,
                                                            attacker: pwd.struct_passwd) -> None:
    """`infer-units render --output DIR` (root) into a directory the attacker
    can write: refused, nothing written through its links."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text('engine = "vllm"\nmodel = "/m"\ngpus = [0]\nport = 8000\n')
    target = victim(tmp_path)
    out = public / "out"
    out.mkdir()
    os.chown(out, attacker.pw_uid, attacker.pw_gid)
    planted = as_attacker(attacker, NEXT_PIDS + r"""
import os, sys
for pid in next_pids():
    os.symlink(sys.argv[2], os.path.join(sys.argv[1], f".m.service.{pid}.tmp"))
""", str(out), str(target))
    assert planted.returncode == 0, planted.stderr
    done = run_cli("render", "--output", str(out),
                   env=base_env(INFER_UNITS_CONFIG_PATH=str(etc)))
    assert target.read_text() == VICTIM_TEXT
    assert done.returncode != 0 and f"refusing {out}" in done.stderr, done.stderr


def test_only_links_root_made_are_followed_on_the_way(fake_gpus: FakeGpus, tmp_path: Path,
                                                      public: Path,
                                                      attacker: pwd.struct_passwd) -> None:
    """A root-made link on the way (Debian's /var/run -> /run) is followed; one
    the attacker made in a sticky world-writable directory (/tmp-like) is not,
    even when it points at a directory of root's."""
    real = public / "real"
    real.mkdir()
    (public / "by-root").symlink_to(real)
    sticky = public / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    made = as_attacker(attacker, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])",
                       str(real), str(sticky / "by-attacker"))
    assert made.returncode == 0, made.stderr
    for via, written in ((public / "by-root", True), (sticky / "by-attacker", False)):
        for f in real.iterdir():
            f.unlink()
        done = run_cli("pre-start", "--unit", "m.service", "--gpus", "0",
                       env=fake_gpus.env(INFER_UNITS_STATE_DIR=str(tmp_path / "state"),
                                         INFER_UNITS_METRICS_DIR=str(via)))
        assert done.returncode == 0, done.stderr
        assert (real / "infer-units.prom").exists() == written, (via, done.stderr)
        if not written:
            assert f"refusing {sticky / 'by-attacker'}: a symlink owned by {ATTACKER}" \
                in done.stderr, done.stderr


def test_a_model_file_another_account_could_write_is_not_generated(
        tmp_path: Path, public: Path, attacker: pwd.struct_passwd) -> None:
    """#6's end: a runtime directory left world-writable (the first directory
    of the search path) and a local user's model file in it.  Its command
    would run as root: the generator refuses it, as it refuses a root file
    anyone may rewrite."""
    run = public / "run"
    run.mkdir()
    run.chmod(0o777)
    dropped = as_attacker(attacker, "import sys; open(sys.argv[1], 'x').write(sys.argv[2])",
                          str(run / "evil.toml"),
                          'engine = "command"\ncommand = ["/bin/sh", "-c", "id"]\n')
    assert dropped.returncode == 0, dropped.stderr
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "loose.toml").write_text('engine = "command"\ncommand = ["/bin/true"]\n')
    (etc / "loose.toml").chmod(0o666)
    (etc / "fine.toml").write_text('engine = "command"\ncommand = ["/bin/true"]\n')
    out = tmp_path / "out"
    done = run_generator(out, f"{run}:{etc}")
    assert sorted(p.name for p in out.iterdir()) == ["fine.service"], done.stderr
    # The directory others can write is refused whole, its files unread.
    assert f"{run}: refused: writable by group or others (mode 0777)" in done.stderr
    assert f"{etc}/loose.toml: not used: writable by group or others (mode 0666)" in done.stderr
