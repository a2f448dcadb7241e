"""The Ansible role of contrib/ansible against real systemd: the
controller is this machine (ansible-core from tools/setup's venv), each managed
host a Debian container booted for this module, reached through the nsenter
connection in ansible_plugins/ (no sshd in the container; its own network
namespace, so the models' ports are its own).  The role installs the .deb
itself: the container gets only the package's dependencies beforehand, as a
host's apt would fetch them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .container import Container, suites
from .e2e_support import (FAKE_TABLE, install_fake_gpus, install_fakes, model_toml, show,
                          wait_until)

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = Path("/var/cache/infer-units-tools/venv/bin/ansible-playbook")
FENCE = "/run/infer-units/drain.fence"
ALPHA = model_toml("alpha", [0], 18301)
BETA = model_toml("beta", [1], 18302)
BETA_DROPIN = 'description = "beta, from its drop-in"\n'


@pytest.fixture(scope="module", params=suites())
def host(request: pytest.FixtureRequest, deb: Path):
    if not PLAYBOOK.exists():
        pytest.skip(f"{PLAYBOOK} missing: run tools/setup")
    c = Container(request.param)
    try:
        c.boot()
        install_fakes(c, ROOT)
        install_fake_gpus(c)
        depends = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True,
                                 text=True, check=True).stdout.strip()
        # python3-apt: what Ansible's apt module needs on a managed host.
        c.sh(f"apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get satisfy -y -qq "
             f"--no-install-recommends '{depends}' python3-apt", timeout=900, net=True)
        yield c
    finally:
        c.shutdown()


def play(box: Container, tmp: Path, models: list[dict], state: str = "serving",
         deb: Path | None = None, deb_url: str = "") -> tuple[int, str, int]:
    """Run the role on the container: exit status, output, and the recap's changed count."""
    (tmp / "inventory").write_text(f"box ansible_host={box.leader} ansible_connection=nsenter "
                                   "ansible_python_interpreter=/usr/bin/python3\n")
    (tmp / "site.yml").write_text(json.dumps([{
        "hosts": "box", "gather_facts": False,
        # The fake GPU table for the CLI the role runs (drain reaps their holders).
        "environment": {"INFER_UNITS_FAKE_GPUS": FAKE_TABLE},
        "roles": ["infer_units"]}]))
    (tmp / "vars.json").write_text(json.dumps({
        "infer_units_models": models, "infer_units_state": state,
        "infer_units_deb": str(deb) if deb else "", "infer_units_deb_url": deb_url}))
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROOT / "contrib/ansible/roles"),
               ANSIBLE_CONNECTION_PLUGINS=str(Path(__file__).parent / "ansible_plugins/connection"),
               ANSIBLE_HOME=str(tmp / "home"), ANSIBLE_LOCAL_TEMP=str(tmp / "home/tmp"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_RETRY_FILES_ENABLED="0")
    done = subprocess.run([str(PLAYBOOK), "-i", str(tmp / "inventory"),
                           "-e", f"@{tmp / 'vars.json'}", str(tmp / "site.yml")],
                          env=env, capture_output=True, text=True, timeout=900, cwd=tmp)
    out = done.stdout + done.stderr
    recap = re.search(r"^box\s*:\s.*\bchanged=(\d+)", out, re.M)
    assert recap, out
    return done.returncode, out, int(recap.group(1))


def models(alpha: str = ALPHA, beta_dropin: str = BETA_DROPIN) -> list[dict]:
    return [{"name": "alpha", "content": alpha},
            {"name": "beta", "content": BETA,
             "dropins": [{"name": "50-description.toml", "content": beta_dropin}]}]


def journals(box: Container) -> str:
    """The models' journals, for the message of a failed assertion."""
    return box.sh("journalctl -u alpha -u beta -o short-precise --no-pager | tail -n 60",
                  check=False).stdout


def main_pids(box: Container) -> dict[str, str]:
    pids = {}
    for name in ("alpha", "beta"):
        props = show(box, f"{name}.service", "ActiveState", "MainPID")
        assert props["ActiveState"] == "active", (name, props)
        pids[name] = props["MainPID"]
    return pids


def test_role_converges_is_idempotent_and_rolls_only_the_changed_model(
        host: Container, deb: Path, tmp_path: Path) -> None:
    code, out, changed = play(host, tmp_path, models(), deb=deb)
    assert code == 0 and changed > 0, out + journals(host)
    assert "install ok installed" in host.sh("dpkg-query -W -f='${Status}' infer-units").stdout
    assert host.path("/usr/share/infer-units/prometheus/infer-units.rules.yml").stat().st_size
    before = main_pids(host)
    assert show(host, "beta.service", "Description")["Description"] == "beta, from its drop-in"

    code, out, changed = play(host, tmp_path, models(), deb=deb)
    assert code == 0 and changed == 0, out + journals(host)
    assert main_pids(host) == before

    # alpha's file changes: alpha alone restarts; beta keeps its server.
    alpha2 = model_toml("alpha", [0], 18301, load=0.5)
    code, out, changed = play(host, tmp_path, models(alpha=alpha2), deb=deb)
    assert code == 0 and changed > 0, out + journals(host)
    after = main_pids(host)
    assert after["alpha"] != before["alpha"] and after["beta"] == before["beta"], (before, after)
    assert host.path("/etc/infer-units/alpha.toml").read_text() == alpha2

    # A drop-in that fails check (beta onto alpha's GPU, seen only merged):
    # the role stops before any live file or unit is touched.
    code, out, changed = play(host, tmp_path, models(alpha=alpha2, beta_dropin="gpus = [0]\n"),
                              deb=deb)
    assert code != 0 and "Check the staged files" in out, out
    assert "gpus" in out, out
    dropin = host.path("/etc/infer-units/beta.toml.d/50-description.toml")
    assert dropin.read_text() == BETA_DROPIN
    assert main_pids(host) == after
    # The staging directory is gone, and no model is marked for a restart.
    work = host.path("/var/cache/infer-units-ansible")
    assert sorted(p.name for p in work.iterdir()) == sorted([deb.name, "pending"])
    assert list((work / "pending").iterdir()) == []

    # A start that fails stops the role before the next model: beta's new
    # drop-in is in place but its server is the old one ...
    beta2 = 'description = "beta, second"\n'
    broken = alpha2.replace('"/usr/local/bin/fake-engine"', '"/bin/false"')
    assert broken != alpha2
    code, out, changed = play(host, tmp_path, models(alpha=broken, beta_dropin=beta2), deb=deb)
    assert code != 0 and "Start or restart alpha" in out, out
    assert show(host, "beta.service", "MainPID")["MainPID"] == after["beta"]
    assert host.path("/etc/infer-units/beta.toml.d/50-description.toml").read_text() == beta2
    assert sorted(p.name for p in (work / "pending").iterdir()) == ["alpha", "beta"]
    # ... and the next run restarts beta too, although its files no longer change.
    code, out, changed = play(host, tmp_path, models(alpha=alpha2, beta_dropin=beta2), deb=deb)
    assert code == 0, out + journals(host)
    fixed = main_pids(host)
    assert fixed["beta"] != after["beta"], (after, fixed)
    assert show(host, "beta.service", "Description")["Description"] == "beta, second"
    code, out, changed = play(host, tmp_path, models(alpha=alpha2, beta_dropin=beta2), deb=deb)
    assert code == 0 and changed == 0, out + journals(host)
    assert main_pids(host) == fixed


def test_role_drains_and_resumes_the_host(host: Container, tmp_path: Path) -> None:
    code, out, _ = play(host, tmp_path, models())
    assert code == 0, out + journals(host)
    main_pids(host)

    code, out, changed = play(host, tmp_path, models(), state="drained")
    assert code == 0 and changed > 0, out + journals(host)
    for name in ("alpha", "beta"):
        assert show(host, f"{name}.service", "ActiveState")["ActiveState"] == "inactive"
    assert host.sh(f"test -e {FENCE}", check=False).returncode == 0
    code, out, changed = play(host, tmp_path, models(), state="drained")
    assert code == 0 and changed == 0, out + journals(host)

    code, out, changed = play(host, tmp_path, models())
    assert code == 0 and changed > 0, out + journals(host)
    main_pids(host)
    assert host.sh(f"test -e {FENCE}", check=False).returncode == 1
    code, out, changed = play(host, tmp_path, models())
    assert code == 0 and changed == 0, out + journals(host)


def test_role_installs_from_a_url(host: Container, deb: Path, tmp_path: Path) -> None:
    """The package from a URL the host fetches (here a server on the
    container's loopback); once installed, a second run changes nothing; a
    URL that answers 404 fails the run."""
    shutil.copy(deb, host.path("/srv") / deb.name)
    host.sh("systemd-run --unit=deb-http python3 -m http.server 18399 --bind 127.0.0.1 "
            "--directory /srv")
    try:
        assert wait_until(lambda: host.sh("python3 -c 'import urllib.request; urllib.request."
                                          "urlopen(\"http://127.0.0.1:18399/\")'",
                                          check=False).returncode == 0, timeout=30)
        url = f"http://127.0.0.1:18399/{deb.name}"
        code, out, _ = play(host, tmp_path, models(), deb_url=url)
        assert code == 0, out + journals(host)
        assert "install ok installed" in host.sh("dpkg-query -W -f='${Status}' infer-units").stdout
        code, out, changed = play(host, tmp_path, models(), deb_url=url)
        assert code == 0 and changed == 0, out + journals(host)
        code, out, _ = play(host, tmp_path, models(),
                            deb_url="http://127.0.0.1:18399/no-such.deb")
        assert code != 0 and "Install the package" in out, out
    finally:
        host.sh("systemctl stop deb-http.service; rm -f /srv/*.deb", check=False)
