"""The package's life under real systemd, per suite, on the shared container
(after test_e2e.py and test_engines.py): removal, upgrade from the first
release, a .deb built from nothing inside the container, a bad model's error
in the journal at daemon-reload and at boot, edit and cat, purge.  In file order."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .e2e_support import add_model, model_toml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# 0.1.0 as first packaged: an inactive example as a conffile in /etc, and
# infer-units.target left to dh_installsystemd (never enabled when built on bookworm).
FIRST_RELEASE = "351ee6a"
# The last commit that generated <name>-liveness.timer/.service beside each
# model (before the package shipped infer-units-liveness@.timer/.service).
COMPANIONS_RELEASE = "2afe83a"
NVML_CACHE = Path("/var/cache/infer-units-build")
APT = "DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Options::=--force-confold"
BAD = 'engine = "command"\ncommand = "not a list"\ngpus = [0]\n'
BAD_LINE = "bad.toml: command: expected an array of strings, got str (no unit generated)"


def show(box, unit: str, *props: str) -> dict[str, str]:
    out = box.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def in_target(name: str, gpus: list[int], port: int) -> str:
    return model_toml(name, gpus, port) + '\n[install]\nWantedBy = ["infer-units.target"]\n'


def dangling_links(box) -> list[str]:
    return box.sh("find /etc/systemd/system -xtype l").stdout.split()


def start(box, unit: str) -> None:
    done = box.sh(f"systemctl start {unit}", check=False)
    assert done.returncode == 0, box.sh(f"journalctl -b -u {unit} --no-pager | tail -30").stdout


def keeper_pid(box) -> str:
    pid = getattr(box, "keeper_pid", None)
    if pid is None:
        pytest.skip("needs the models of test_upgrade_from_0_1_0_starts_and_stops_nothing")
    return pid


def install(box, deb: Path) -> str:
    shutil.copy(deb, box.path("/root") / deb.name)
    done = box.sh(f"{APT} install --no-install-recommends --allow-downgrades /root/{deb.name}",
                  check=False, timeout=900, net=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def build_deb(src: Path, env: dict[str, str] | None = None) -> Path:
    done = subprocess.run([str(src / "packaging/build-deb")], cwd=src, capture_output=True,
                          text=True, timeout=1800, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return Path(done.stdout.strip().splitlines()[-1])


def release_tree(tmp_path_factory: pytest.TempPathFactory, name: str, commit: str) -> Path:
    """The source tree of an earlier commit (git archive); skips when this
    clone does not have it."""
    src = tmp_path_factory.mktemp(name) / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit],
                             capture_output=True, timeout=60)
    if archive.returncode != 0:
        pytest.skip(f"commit {commit} not in this clone")
    subprocess.run(["tar", "-C", str(src), "-xf", "-"], input=archive.stdout, check=True)
    return src


@pytest.fixture(scope="session")
def first_release_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """0.1.0 from git, built by today's build-deb (0.1.0's own needed build-essential)."""
    src = release_tree(tmp_path_factory, "first-release", FIRST_RELEASE)
    shutil.copy(ROOT / "packaging/build-deb", src / "packaging/build-deb")
    deb = build_deb(src)
    assert deb.name == "infer-units_0.1.0_all.deb"
    return deb



def test_apt_remove_leaves_no_generated_unit(box) -> None:
    """First: what test_e2e.py and test_engines.py left running goes with the package.
    beta is test_e2e.py's; it is added here when that module did not run."""
    if box.sh("test -e /etc/infer-units/beta.toml", check=False).returncode != 0:
        add_model(box, "beta", model_toml("beta", [2, 3], 18002))
    # A drain fence left by an earlier test that failed between its drain and
    # its resume refuses every start (test_ops_e2e.py): not this test's subject.
    box.sh("rm -f /run/infer-units/drain.fence && systemctl daemon-reload")
    start(box, "beta")
    box.sh(f"{APT} remove infer-units")
    box.sh("systemctl daemon-reload")
    assert box.sh("test -e /run/systemd/generator/beta.service", check=False).returncode != 0
    assert show(box, "beta.service", "LoadState")["LoadState"] == "not-found"
    assert box.sh("ls /run/systemd/generator/*.service 2>/dev/null | wc -l").stdout.strip() == "0"
    # the package is gone: look at the fake GPU files directly
    assert box.sh("for p in /proc/[0-9]*; do ls -l $p/fd 2>/dev/null; done | "
                  "grep -c /var/lib/fakegpu/ || true").stdout.strip() == "0"

def test_upgrade_from_0_1_0_starts_and_stops_nothing(box, first_release_deb: Path, deb: Path) -> None:
    box.sh(f"{APT} purge infer-units >/dev/null 2>&1 || true", net=True)
    install(box, first_release_deb)
    assert box.sh("test -f /etc/infer-units/sglang-qwen.toml.example", check=False).returncode == 0
    box.write("/etc/infer-units/keeper.toml", in_target("keeper", [0], 18201))
    box.write("/etc/infer-units/sleeper.toml", in_target("sleeper", [1], 18202))
    # The operator enabled the group: an upgrade that restarted the target
    # would start sleeper (and reap its GPUs).
    box.sh("systemctl daemon-reload && systemctl enable infer-units.target")
    start(box, "keeper")
    pid = show(box, "keeper.service", "MainPID")["MainPID"]
    assert pid != "0"

    install(box, deb)

    assert show(box, "keeper.service", "MainPID", "ActiveState") == \
        {"MainPID": pid, "ActiveState": "active"}
    assert show(box, "sleeper.service", "ActiveState")["ActiveState"] == "inactive"
    assert box.sh("systemctl is-enabled infer-units.target").stdout.strip() == "enabled"
    # the conffile example is gone, the examples and docs are in /usr/share/doc
    assert box.sh("test -e /etc/infer-units/sglang-qwen.toml.example", check=False).returncode != 0
    doc = "/usr/share/doc/infer-units"
    box.sh(f"test -f {doc}/examples/sglang-qwen.toml && test -f {doc}/examples/sglang-qwen.toml.d/50-memory.toml"
           f" && test -f {doc}/README.md.gz && grep -q '^nvidia-ml-py ' {doc}/BUNDLED")
    # the pure-Python package serves this suite's python3 (3.11 on bookworm, 3.13 on trixie)
    box.sh("test -f /usr/lib/python3/dist-packages/infer_units/generator/main.py && "
           "python3 -c 'import infer_units.helpers.cli.root'")
    box.keeper_pid = pid  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def companions_release_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = release_tree(tmp_path_factory, "companions-release", COMPANIONS_RELEASE)
    return build_deb(src, env={**os.environ, "INFER_UNITS_DEB_VERSION": "0.2.0~companions1"})


def test_deb_built_from_nothing_in_the_container_upgrades_alike(box, tmp_path: Path) -> None:
    """build-deb as root on this suite's minbase (plus the runtime packages),
    with this suite's debhelper: same maintainer scripts, same behaviour."""
    pid = keeper_pid(box)
    assert box.sh("dpkg -s build-essential", check=False).returncode != 0
    src = box.path("/root/src")
    src.mkdir()
    subprocess.run(f"tar -C {ROOT} --exclude=./build --exclude=./dist --exclude=./.git "
                   f"--exclude='__pycache__' --exclude=./.pytest_cache -cf - . | tar -C {src} -xf -",
                   shell=True, check=True)
    if NVML_CACHE.is_dir():     # the wheel build-deb downloaded on this machine: no second download
        shutil.copytree(NVML_CACHE, box.path(str(NVML_CACHE)), dirs_exist_ok=True)
    version = f"0.2.0+{box.suite}1"
    done = box.sh(f"cd /root/src && INFER_UNITS_DEB_VERSION={version} packaging/build-deb",
                  check=False, timeout=1800, net=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    built = done.stdout.strip().splitlines()[-1]
    assert built == f"/root/src/dist/infer-units_{version}_all.deb"
    assert box.sh("dpkg -s build-essential", check=False).returncode != 0
    scripts = box.sh(f"dpkg-deb --ctrl-tarfile {built} | tar -xO ./postinst ./postrm ./prerm").stdout
    assert "deb-systemd-invoke" not in scripts     # nothing started, stopped or restarted

    # The operator turned the group off: an upgrade keeps it off.
    box.sh("systemctl disable infer-units.target")
    box.sh(f"{APT} install --no-install-recommends {built}", timeout=900, net=True)
    assert box.sh("dpkg-query -W -f='${Version}' infer-units").stdout == version
    assert show(box, "keeper.service", "MainPID", "ActiveState") == {"MainPID": pid, "ActiveState": "active"}
    assert show(box, "sleeper.service", "ActiveState")["ActiveState"] == "inactive"
    assert box.sh("systemctl is-enabled infer-units.target", check=False).stdout.strip() == "disabled"


def test_a_bad_model_is_in_the_journal_at_reload_and_at_boot(box) -> None:
    keeper_pid(box)
    box.write("/etc/infer-units/bad.toml", BAD)
    box.sh("systemctl daemon-reload")
    # journalctl reads what journald has already stored: give it a moment
    box.sh("journalctl --sync")
    log = box.sh("journalctl -b -o cat -p err -t infer-units-generator --no-pager").stdout
    assert f"/etc/infer-units/{BAD_LINE}" in log, box.sh("journalctl -b --no-pager | tail -50").stdout
    # At boot the generator runs before journald and (in a container) without kmsg.
    box.sh("systemctl stop keeper")
    box.reboot()
    box.sh("journalctl --sync")
    log = box.sh("journalctl -b -o cat -p err -t infer-units-generator --no-pager").stdout
    assert f"/etc/infer-units/{BAD_LINE}" in log, box.sh("journalctl -b --no-pager | tail -80").stdout
    box.sh("test ! -e /dev/kmsg || test -c /dev/kmsg")     # never a file made by us
    # the good models are still generated
    assert show(box, "keeper.service", "LoadState")["LoadState"] == "loaded"
    box.sh("rm /etc/infer-units/bad.toml && systemctl daemon-reload")


def test_edit_validates_reloads_and_cat_names_the_files(box) -> None:
    keeper_pid(box)
    override = "/etc/infer-units/keeper.toml.d/override.toml"
    box.write("/usr/local/bin/edit-good", "#!/bin/sh\nprintf '[env]\\nFROM_EDIT = \"yes\"\\n' > \"$1\"\n", 0o755)
    box.write("/usr/local/bin/edit-bad", "#!/bin/sh\necho 'gpus = \"x\"' > \"$1\"\n", 0o755)
    box.sh("EDITOR=/usr/local/bin/edit-good infer-units edit keeper")
    # reloaded by edit itself
    assert "FROM_EDIT=yes" in show(box, "keeper.service", "Environment")["Environment"]
    line = next(l for l in box.sh("infer-units cat keeper").stdout.splitlines() if l.startswith("FROM_EDIT"))
    assert line.endswith(f"# {override}")
    done = box.sh("EDITOR=/usr/local/bin/edit-bad infer-units edit keeper", check=False)
    assert done.returncode == 1 and f"error: {override}: gpus:" in done.stderr, done.stderr
    assert box.sh(f"cat {override}").stdout == '[env]\nFROM_EDIT = "yes"\n'


def test_purge_leaves_no_dangling_link(box) -> None:
    keeper_pid(box)
    # enabled by the operator with systemctl, and pulled in by another target:
    # links deb-systemd-helper never recorded
    box.sh("systemctl enable infer-units.target && systemctl add-wants graphical.target infer-units.target")
    start(box, "keeper")
    box.sh("test -L /etc/systemd/system/multi-user.target.wants/infer-units.target && "
           "test -L /etc/systemd/system/graphical.target.wants/infer-units.target")
    box.sh(f"{APT} purge infer-units", timeout=600, net=True)
    assert dangling_links(box) == []
    box.sh("systemctl daemon-reload")
    assert show(box, "infer-units.target", "LoadState")["LoadState"] == "not-found"
    assert show(box, "keeper.service", "LoadState")["LoadState"] == "not-found"
    # the operator's model files are theirs, not the package's
    box.sh("test -f /etc/infer-units/keeper.toml && test -f /etc/infer-units/sleeper.toml")


def test_upgrade_from_generated_liveness_companions_leaves_none_behind(
        box, companions_release_deb: Path, deb: Path) -> None:
    """Last in this file: it purges the package, which stops the models the
    tests above share (keeper).  The previous package generated
    <name>-liveness.timer/.service: after the
    upgrade none of them is left loaded or running, the active model keeps
    its process and has the package's infer-units-liveness@ timer running."""
    box.sh(f"{APT} purge infer-units >/dev/null 2>&1 || true", net=True)
    install(box, companions_release_deb)
    box.write("/etc/infer-units/lvup.toml", model_toml("lvup", [0], 18203))
    box.sh("systemctl daemon-reload")
    start(box, "lvup")
    pid = show(box, "lvup.service", "MainPID")["MainPID"]
    assert show(box, "lvup-liveness.timer", "ActiveState")["ActiveState"] == "active"

    install(box, deb)

    assert show(box, "lvup.service", "MainPID", "ActiveState") == \
        {"MainPID": pid, "ActiveState": "active"}
    stale = box.sh("systemctl list-units --all --plain --no-legend 'lvup-liveness.*'").stdout
    assert "lvup-liveness" not in stale, stale
    assert show(box, "infer-units-liveness@lvup.timer", "ActiveState")["ActiveState"] == "active"
    # the unit and its probe's drop-in for the package's template, nothing more
    assert box.sh("ls /run/systemd/generator | grep lvup").stdout.split() == [
        "infer-units-liveness@lvup.service.d", "lvup.service"]
    box.sh("systemctl stop lvup")
    box.sh("rm -f /etc/infer-units/lvup.toml && systemctl daemon-reload")
