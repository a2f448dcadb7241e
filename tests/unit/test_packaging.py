"""Packaging facts that need no container: build-deb installs what
debian/control asks for, no package host is named in the repository, and a
pip install into a venv makes units that call that venv's CLI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from infer_units.generator.paths import DEB_CLI, installed_cli
from ..support import ROOT, base_env
from ..unitfile import split_words, values

SYSTEM_PYTHON = "/usr/bin/python3"
MODEL = 'engine = "command"\ncommand = ["/bin/serve"]\ngpus = [0]\nport = 18400\n'


def test_build_deb_installs_every_build_dependency() -> None:
    control = (ROOT / "packaging/debian/control").read_text()
    field = re.search(r"^Build-Depends:(.*?)^\S", control, re.S | re.M)
    assert field
    wanted = {re.split(r"[\s(]", d.strip())[0] for d in field.group(1).split(",") if d.strip()}
    wanted.discard("debhelper-compat")     # provided by debhelper
    script = (ROOT / "packaging/build-deb").read_text()
    listed = set(re.search(r'^BUILD_DEPS="([^"]*)"', script, re.M).group(1).split())
    assert wanted <= listed, wanted - listed
    assert {"debhelper", "dpkg-dev"} <= listed
    assert "--ignore-builtin-builddeps" in script     # no build-essential for arch:all


def test_no_package_host_is_named_in_the_repository() -> None:
    hosts = ["deb." + "debian.org", "ftp." + "debian.org", "security." + "debian.org",
             "pypi." + "org", "files." + "pythonhosted.org", "archive." + "ubuntu.com"]
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split()
    named = []
    for name in files:
        path = ROOT / name
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        named += [f"{name}: {h}" for h in hosts if h in text]
    assert named == []


def _script(path: Path, text: str = "#!/bin/sh\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_cli_next_to_the_generator_or_its_interpreter(tmp_path: Path) -> None:
    venv_bin = tmp_path / "venv/bin"
    cli = _script(venv_bin / "infer-units")
    gen = _script(venv_bin / "infer-units-generator")
    linked = tmp_path / "etc/systemd/system-generators/infer-units-generator"
    linked.parent.mkdir(parents=True)
    linked.symlink_to(gen)
    assert installed_cli(str(gen), "/usr/bin/python3") == str(cli)
    assert installed_cli(str(linked), "/usr/bin/python3") == str(cli)        # link followed
    copied = _script(tmp_path / "gens/infer-units-generator")
    assert installed_cli(str(copied), str(venv_bin / "python")) == str(cli)  # its interpreter's bin/
    # the .deb: launcher in system-generators/, no CLI beside it or its python
    assert installed_cli(str(copied), str(tmp_path / "nothing/python3")) == DEB_CLI
    # not one of ours running (tests, python3 -m): always the .deb's path
    assert installed_cli(str(tmp_path / "x/pytest"), str(venv_bin / "python")) == DEB_CLI
    (venv_bin / "infer-units").chmod(0o644)                                   # not executable
    assert installed_cli(str(gen), str(venv_bin / "python")) == DEB_CLI


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("no Debian python3")
    path = tmp_path_factory.mktemp("venv") / "v"
    made = subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", str(path)],
                          capture_output=True, text=True, timeout=300)
    if made.returncode != 0:
        pytest.skip(f"python3 -m venv: {made.stderr.strip()[-200:]} (apt-get install python3-venv)")
    # A copy: setuptools builds in the source tree (build/, *.egg-info).
    src = path.parent / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    # Offline: Debian's setuptools and the dependencies come from the system site.
    done = subprocess.run([str(path / "bin/python"), "-m", "pip", "install", "-q", "--no-deps",
                           "--no-build-isolation", "--no-index", str(src)],
                          capture_output=True, text=True, timeout=600, env=_clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return path


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


def _without_block(argv: list[str]) -> list[str]:
    """wait-ready runs under `env --block-signal=TERM` (generator/render.py)."""
    return argv[2:] if argv[:2] == ["/usr/bin/env", "--block-signal=TERM"] else argv


def test_venv_install_generates_units_that_call_its_cli(venv: Path, tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text(MODEL)
    # installed the way README says for pip: the generator linked into a generator directory
    link = tmp_path / "system-generators/infer-units-generator"
    link.parent.mkdir()
    link.symlink_to(venv / "bin/infer-units-generator")
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([str(link), str(out), str(out), str(out)], capture_output=True, text=True,
                          timeout=60, env=_clean_env(INFER_UNITS_CONFIG_PATH=str(etc),
                                                     SYSTEMD_LOG_TARGET="console"))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    unit = (out / "m.service").read_text()
    hooks = [_without_block(split_words(v.lstrip("+-"), exec_line=True))
             for key in ("ExecStartPre", "ExecStartPost", "ExecStopPost")
             for v in values(unit, "Service", key)
             if not v.lstrip("+-").startswith("/bin/sh")]   # a cap's /bin/sh line calls no CLI
    assert hooks and all(argv[0] == str(venv / "bin/infer-units") for argv in hooks), hooks
    # the liveness template units, which the .deb ships, written beside it calling the venv's CLI
    for template in ("infer-units-liveness@.timer", "infer-units-liveness@.service",
                     "infer-units-group@.service"):
        assert (out / template).is_file(), template
    probe = values((out / "infer-units-liveness@.service").read_text(), "Service", "ExecStart")
    assert split_words(probe[0], exec_line=True) == [
        str(venv / "bin/infer-units"), "liveness-probe", "--unit", "%i.service"]
    # and the model's drop-in gives the probe its whole command, calling the venv's CLI
    dropin = (out / "infer-units-liveness@m.service.d/50-liveness.conf").read_text()
    assert split_words(values(dropin, "Service", "ExecStart")[-1], exec_line=True)[:2] == [
        str(venv / "bin/infer-units"), "liveness-probe"]
    # and that CLI runs from the venv, wherever the working directory is
    ran = subprocess.run([hooks[0][0], "pre-start", "--help"], capture_output=True, text=True,
                         timeout=60, cwd="/", env=_clean_env())
    assert ran.returncode == 0 and "usage" in ran.stdout.lower(), ran.stderr


def test_the_deb_installs_every_shipped_unit_calling_its_cli(tmp_path: Path) -> None:
    """debian/rules renders units/systemd/*.j2 with tools/make-units and
    installs each one; their commands call /usr/bin/infer-units."""
    done = subprocess.run([SYSTEM_PYTHON, str(ROOT / "tools/make-units"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=base_env())
    assert done.returncode == 0, done.stderr
    templates = sorted(p.name.removesuffix(".j2") for p in (ROOT / "units/systemd").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == templates
    rules = (ROOT / "packaging/debian/rules").read_text()
    installed = set(re.findall(r"debian/units/(\S+)", rules))
    assert installed == set(templates), installed ^ set(templates)
    commands = [split_words(value, exec_line=True) for name in templates
                for value in values((tmp_path / name).read_text(), "Service", "ExecStart")]
    assert len(commands) == 4 and all(argv[0] == DEB_CLI for argv in commands), commands


def _modules(top: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), top)
            for d, _dirs, files in os.walk(top, followlinks=True) if "__pycache__" not in d
            for f in files if f.endswith((".py", ".j2"))}


def test_the_checkout_imports_the_installed_tree(venv: Path) -> None:
    """infer_units/generator, helpers, units and _vendor are symlinks to the
    design card's folders: a checkout imports the same files under the same
    names as an install (a subpackage missing from setup.cfg, or a module only
    the checkout has, fails here)."""
    installed = next(venv.glob("lib/python3*/site-packages/infer_units"))
    checkout = ROOT / "infer_units"
    for name, folder in (("generator", "generator"), ("helpers", "helpers"),
                         ("units", "units"), ("_vendor", "vendor")):
        assert (checkout / name).resolve() == (ROOT / folder).resolve(), name
    # pynvml.py is put in vendor/ by build-deb only, never committed
    assert _modules(installed) == _modules(checkout) - {"_vendor/pynvml.py"}
    done = subprocess.run([SYSTEM_PYTHON, "-c", "import infer_units._vendor, "
                           "infer_units.helpers.facts.gpus as g; print(g.__file__)"],
                          cwd="/", env=base_env(PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == str(checkout / "helpers/facts/gpus.py"), done.stderr


def test_without_pystemd_status_says_so(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text(MODEL)
    # sys.modules[name] = None is how Python itself marks a module unimportable
    code = ("import sys; sys.modules['pystemd'] = None; sys.argv = ['infer-units', 'status', '--json'];"
            "from infer_units.helpers.entry import main; main()")
    done = subprocess.run([SYSTEM_PYTHON, "-c", code], capture_output=True, text=True, timeout=120,
                          env=base_env(INFER_UNITS_CONFIG_PATH=str(etc),
                                       INFER_UNITS_FAKE_GPUS=str(tmp_path / "none.json")))
    assert "pystemd is not installed" in done.stdout + done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
