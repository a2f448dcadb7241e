"""Hostile model files and trees (docs/model-files.md, "Bad input"): each is one
log line naming the file, the key when there is one, and the reason; no
traceback; the good neighbour is still generated; `infer-units check` says
the same and exits 1.  Then the hostile-but-accepted corpus: what must be
escaped, not refused (test_verify.py runs `systemd-analyze verify` on it)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

from ..support import PYTHON, base_env, run_cli
from ..unitfile import environment, exec_argv, values

GOOD = 'engine = "command"\ncommand = ["/opt/srv/serve"]\ngpus = [7]\n'
BASE = 'engine = "sglang"\nmodel = "/m"\ngpus = [0]\nport = 8000\n'


def deep_tables(n: int) -> str:
    return BASE + "[" + ".".join(["t"] * n) + "]\nx = 1\n"


def symlink_loop(path: Path) -> None:
    path.symlink_to(path.name)


def fifo(path: Path) -> None:
    os.mkfifo(path)


def directory(path: Path) -> None:
    path.mkdir()


# name -> (what to put where (relative to etc/), the file the line names
# (relative to etc/), the key or "" when none, the reason's text).
Writer = Callable[[Path], None]
HOSTILE: dict[str, tuple[dict[str, str | bytes | Writer], str, str, str]] = {
    # One file must not take the others down: exceptions of every kind.
    "int-5000-digits": ({"bad.toml": BASE.replace("8000", "1" + "0" * 5000)},
                        "bad.toml", "", "integer too large"),
    "int-hex-huge": ({"bad.toml": BASE.replace("8000", "0x" + "f" * 5000)},
                     "bad.toml", "port", "integer too large"),
    "int-65-bits-in-env": ({"bad.toml": BASE + "[env]\nX = 0x1" + "0" * 16 + "\n"},
                           "bad.toml", "env.X", "integer too large"),
    "gpu-index-huge": ({"bad.toml": BASE.replace("[0]", "[9223372036854775807]")},
                       "bad.toml", "gpus", "too large"),
    "tp-huge": ({"bad.toml": BASE.replace('gpus = [0]', 'gpus = "all"\ntensor-parallel = 0x' + "7" * 40)},
                "bad.toml", "tensor-parallel", "integer too large"),
    "timeout-nan": ({"bad.toml": BASE + "[reap]\ntimeout = nan\n"},
                    "bad.toml", "reap.timeout", "not a finite time span"),
    "timeout-inf": ({"bad.toml": BASE + "[ready]\ntimeout = inf\n"},
                    "bad.toml", "ready.timeout", "not a finite time span"),
    "timeout-float-huge": ({"bad.toml": BASE + "[ready]\ntimeout = 1e308\n"},
                           "bad.toml", "ready.timeout", "time span too long"),
    "duration-400-digits": ({"bad.toml": BASE + f'[reap]\ntimeout = "{"9" * 400}s"\n'},
                            "bad.toml", "reap.timeout", "number too large"),
    "duration-overflow": ({"bad.toml": BASE + '[reap]\nterm-grace = "9999999999d"\n'},
                          "bad.toml", "reap.term-grace", "time span too long"),
    "duration-int-overflow": ({"bad.toml": BASE + "[reap]\nterm-grace = 99999999999999999\n"},
                              "bad.toml", "reap.term-grace", "time span too long"),
    "duration-arabic-digits": ({"bad.toml": BASE + '[reap]\ntimeout = "١٢s"\n'},
                               "bad.toml", "reap.timeout", "expected a number"),
    "gpus-arabic-digits": ({"bad.toml": BASE.replace("[0]", '["١"]')},
                           "bad.toml", "gpus", "neither a GPU index"),
    "duration-two-dots": ({"bad.toml": BASE + '[ready]\ninterval = "1.2.3s"\n'},
                          "bad.toml", "ready.interval", "expected a number"),
    "arrays-5000-deep": ({"bad.toml": BASE + "args = " + "[" * 5000 + "]" * 5000 + "\n"},
                         "bad.toml", "", "nested too deeply"),
    "arrays-40-deep": ({"bad.toml": BASE + "args = " + "[" * 40 + "]" * 40 + "\n"},
                       "bad.toml", "args", "nested too deeply"),
    "tables-5000-deep": ({"bad.toml": deep_tables(5000)}, "bad.toml", "t.t.t", "nested too deeply"),
    "inline-tables-3000-deep": ({"bad.toml": BASE + "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n"},
                                "bad.toml", "", "nested too deeply"),
    "not-utf8": ({"bad.toml": BASE.encode() + b'description = "\xff\xfe"\n'},
                 "bad.toml", "", "not UTF-8"),
    "too-large": ({"bad.toml": BASE + "# " + "x" * (2 << 20) + "\n"}, "bad.toml", "", "too large"),
    "model-symlink-loop": ({"bad.toml": symlink_loop}, "bad.toml", "",
                           "cannot read: Too many levels of symbolic links"),
    "model-is-directory": ({"bad.toml": directory}, "bad.toml", "", "not a regular file (a directory)"),
    "model-is-fifo": ({"bad.toml": fifo}, "bad.toml", "", "not a regular file (a FIFO)"),
    "model-is-dev-zero": ({"bad.toml": lambda p: p.symlink_to("/dev/zero")}, "bad.toml", "",
                          "not a regular file (a device)"),
    "dropin-dir-symlink-loop": ({"bad.toml": BASE, "bad.toml.d": symlink_loop}, "bad.toml.d", "",
                                "cannot list drop-ins: Too many levels of symbolic links"),
    "dropin-is-fifo": ({"bad.toml": BASE, "bad.toml.d/": directory, "bad.toml.d/50-x.toml": fifo},
                       "bad.toml.d/50-x.toml", "", "not a regular file (a FIFO)"),
    "dropin-bad-value": ({"bad.toml": BASE, "bad.toml.d/": directory,
                          "bad.toml.d/50-x.toml": "[reap]\ntimeout = nan\n"},
                         "bad.toml.d/50-x.toml", "reap.timeout", "not a finite time span"),
    # Injection: nothing may start a new line or directive.
    "user-newline": ({"bad.toml": BASE + 'user = "root\\nExecStartPre=/bin/evil"\n'},
                     "bad.toml", "user", "not a valid user name"),
    "user-dot": ({"bad.toml": BASE + 'user = "a.b"\n'}, "bad.toml", "user", "not a valid user name"),
    "user-too-long": ({"bad.toml": BASE + f'user = "{"u" * 32}"\n'},
                      "bad.toml", "user", "not a valid user name"),
    "user-uid-65535": ({"bad.toml": BASE + 'user = "65535"\n'},
                       "bad.toml", "user", "not a valid numeric UID"),
    "description-newline": ({"bad.toml": BASE + 'description = "x\\nExecStartPre=/bin/evil"\n'},
                            "bad.toml", "description", "control character"),
    "description-cr": ({"bad.toml": BASE + 'description = "x\\rExecStartPre=/bin/evil"\n'},
                       "bad.toml", "description", "control character"),
    "description-backslash": ({"bad.toml": BASE + "description = 'x\\'\n"},
                              "bad.toml", "description", "line continuation"),
    "service-raw-cr": ({"bad.toml": BASE + '[service]\nNice = "5\\rExecStartPre=/bin/evil"\n'},
                       "bad.toml", "service", "control character"),
    "unit-raw-backslash": ({"bad.toml": BASE + "[unit]\nDocumentation = 'https://x/\\'\n"},
                           "bad.toml", "unit", "line continuation"),
    "service-raw-escape": ({"bad.toml": BASE + '[service]\nNice = "5\\u001b"\n'},
                           "bad.toml", "service", "control character"),
    "host-newline": ({"bad.toml": BASE + 'host = "127.0.0.1\\nUser=root"\n'},
                     "bad.toml", "host", "control character"),
    "host-flag": ({"bad.toml": BASE + 'host = "--evil"\n'}, "bad.toml", "host", "flag"),
    "model-flag": ({"bad.toml": BASE.replace('"/m"', '"--trust-remote-code"')},
                   "bad.toml", "model", "flag"),
    "ready-url-newline": ({"bad.toml": BASE + '[ready]\nurl = "http://x/\\nA"\n'},
                          "bad.toml", "ready.url", "control character"),
    "python-relative": ({"bad.toml": BASE + 'python = "venv/bin/python"\n'},
                        "bad.toml", "python", "relative path"),
    "python-dotdot": ({"bad.toml": BASE + 'python = "/opt/../bin/python"\n'},
                      "bad.toml", "python", "not a normalized path"),
    "python-dollar": ({"bad.toml": BASE + 'python = "/opt/$VENV/bin/python"\n'},
                      "bad.toml", "python", "variable"),
    "python-prefix": ({"bad.toml": BASE + 'python = "-python3"\n'}, "bad.toml", "python", "flag"),
    "executable-relative": ({"bad.toml": BASE.replace("sglang", "llamacpp").replace("port = 8000\n", "")
                             + 'port = 8000\nexecutable = "./llama-server"\n'},
                            "bad.toml", "executable", "relative path"),
    "command-relative": ({"bad.toml": 'engine = "command"\ncommand = ["bin/serve"]\ngpus = [1]\n'},
                         "bad.toml", "command", "relative path"),
    "nccl-key-space": ({"bad.toml": BASE + '[nccl]\n"socket ifname" = "eth0"\n'},
                       "bad.toml", "nccl.socket ifname", "not a valid environment variable name"),
    "nccl-key-dot": ({"bad.toml": BASE + '[nccl]\n"a.b" = "1"\n'},
                     "bad.toml", "nccl.a.b", "not a valid environment variable name"),
    "install-path-traversal": ({"bad.toml": BASE + '[install]\nWantedBy = "../../../etc/evil.target"\n'},
                               "bad.toml", "install.WantedBy", "not a unit name"),
    "reap-ignore-flag": ({"bad.toml": BASE + '[reap]\nignore = ["--foreign"]\n'},
                         "bad.toml", "reap.ignore", "flag"),
    "top-level-dotted": ({"bad.toml": BASE + '"reap.timeout" = "1s"\n'},
                         "bad.toml", "reap.timeout", "unknown key"),
    # Names: valid unit names only, and never one the system already has.
    "name-colon": ({"a:b.toml": BASE}, "a:b.toml", "", "':' is not allowed"),
    "name-template": ({"tmpl@.toml": BASE}, "tmpl@.toml", "", "template"),
    "name-leading-dash": ({"-x.toml": BASE}, "-x.toml", "", "must start with"),
    "name-newline": ({"a\nb.toml": BASE}, "a\nb.toml", "", "not a valid unit name"),
    "name-system-unit": ({"ssh.toml": BASE}, "ssh.toml", "",
                         "ssh.service already exists on the system's unit path"),
    "name-masked-system-unit": ({"dbus.toml": BASE}, "dbus.toml", "",
                                "dbus.service already exists on the system's unit path"),
}


def make_tree(tmp: Path, files: dict[str, str | bytes | Writer]) -> tuple[Path, Path]:
    etc = tmp / "etc"
    etc.mkdir()
    (etc / "good.toml").write_text(GOOD)
    for rel, content in files.items():
        path = etc / rel.rstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    units = tmp / "units"          # the "system" unit path of these tests
    (units / "usr").mkdir(parents=True)
    (units / "etc").mkdir()
    (units / "usr/ssh.service").write_text("[Service]\nExecStart=/usr/sbin/sshd -D\n")
    (units / "etc/dbus.service").symlink_to("/dev/null")           # masked: still a unit
    (units / "etc/ours.service").write_text(                       # `render --output` wrote it
        "# Automatically generated by infer-units-generator 0.1.0\n")
    return etc, units


def env_for(etc: Path, units: Path) -> dict[str, str]:
    return base_env(INFER_UNITS_CONFIG_PATH=str(etc),
                    INFER_UNITS_UNIT_PATH=f"{units / 'etc'}:{units / 'usr'}")


def escaped(text: str) -> str:
    """How a log line shows a path (control characters escaped)."""
    return text.replace("\n", "\\n")


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_input_is_one_line_and_spares_the_neighbour(case: str, tmp_path: Path) -> None:
    files, culprit, key, reason = HOSTILE[case]
    etc, units = make_tree(tmp_path, files)
    out = tmp_path / "out"
    out.mkdir()
    started = time.monotonic()
    done = subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=600, env=env_for(etc, units))
    assert time.monotonic() - started < 120, "the generator took too long (blocked?)"
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    log = done.stderr.splitlines()
    assert len(log) == 1, log
    line = log[0]
    assert f"{etc}/{escaped(culprit)}: " in line, line
    if key:
        assert f": {key}: " in line or f": {key}." in line, line
    assert reason in line, line
    assert line.endswith("(no unit generated)") and "(model " not in line, line
    assert len(line) < 600, line
    assert sorted(p.name for p in out.iterdir()) == ["good.service"]

    checked = run_cli("check", env=env_for(etc, units), timeout=60)
    assert checked.returncode == 1, (checked.stdout, checked.stderr)
    assert "Traceback" not in checked.stderr
    errors = [l for l in checked.stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1 and reason in errors[0], checked.stderr
    assert f"ok: {etc}/good.toml -> good.service" in checked.stdout


def test_render_never_prints_a_traceback(tmp_path: Path) -> None:
    files = {"bad.toml": BASE + "[reap]\ntimeout = nan\n", "deep.toml": deep_tables(5000)}
    etc, units = make_tree(tmp_path, files)
    done = run_cli("render", env=env_for(etc, units), timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "# good.service" in done.stdout
    assert len([l for l in done.stderr.splitlines() if l.startswith("error: ")]) == 2


def test_unreadable_search_directory_is_one_line(tmp_path: Path) -> None:
    etc, units = make_tree(tmp_path, {})
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    env = env_for(etc, units)
    env["INFER_UNITS_CONFIG_PATH"] = f"{loop}:{etc}"
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0
    assert done.stderr.splitlines() == [
        f"infer-units-generator: {loop}: cannot list: Too many levels of symbolic links "
        "(no model of this directory generated) (no unit generated)"]
    assert (out / "good.service").exists()


def test_unreadable_file_is_one_line(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Root reads any file, and CI runs as root: the generator runs here as
    nobody (uid 65534), in a tree it can read but for the one file."""
    import tempfile
    if os.geteuid() == 0:
        # pytest's own temporary directories are 0700 root's: use one nobody can enter
        tmp = Path(tempfile.mkdtemp(prefix="infer-units-unreadable-"))
        tmp.chmod(0o755)
        user: int | None = 65534
    else:
        tmp, user = tmp_path_factory.mktemp("unreadable"), None
    etc, units = make_tree(tmp, {"bad.toml": BASE})
    for path in (etc, units, *units.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (etc / "good.toml").chmod(0o644)
    (etc / "bad.toml").chmod(0)
    out = tmp / "out"
    out.mkdir()
    if user is not None:
        os.chown(out, user, user)
    done = subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=60, env=env_for(etc, units),
                          user=user, group=user, extra_groups=[] if user is not None else None)
    assert f"{etc}/bad.toml: cannot read: Permission denied" in done.stderr, done.stderr
    assert (out / "good.service").exists()
    if user is not None:
        import shutil
        shutil.rmtree(tmp)


def test_a_unit_this_generator_wrote_is_not_a_system_unit(tmp_path: Path) -> None:
    etc, units = make_tree(tmp_path, {"ours.toml": BASE})
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=60, env=env_for(etc, units))
    assert done.stderr == ""
    assert (out / "ours.service").exists()


# ---------------------------------------------------------------- accepted, escaped

ACCEPTED: dict[str, str | bytes | Writer] = {
    # The header comment names every file applied: a drop-in name with a
    # newline (and one with a byte that is not UTF-8) must stay on its line.
    "named.toml": BASE.replace("[0]", "[1]").replace("8000", "8001"),
    "named.toml.d/": directory,
    "named.toml.d/50-a\nExecStartPre=evil.toml": "[env]\nINJECTED = \"no\"\n",
    "named.toml.d/60-\udcff.toml": "[env]\nBYTE = \"yes\"\n",
    # The default description comes from the argv: newline, CR, a trailing backslash.
    "argv.toml": ('engine = "command"\ngpus = [2]\n'
                  'command = ["/opt/srv/serve", "a\\nExecStartPre=/bin/evil", "b\\r", "c\\\\"]\n'),
    # Strings that are escaped, not refused.
    "strings.toml": ('engine = "command"\ngpus = [3]\ncommand = ["serve", "%n $HOME \\u001b \\u2028 \\u0085"]\n'
                     'description = "100% sure, ünï \\t tab, \\\\ in the middle"\n'
                     'user = "_svc-1"\n'
                     '[env]\nCTRL = "a\\u0001b\\rc\\nd\\\\"\nPCT = "%i %%"\n'
                     '[nccl]\nsocket-ifname = "eth0\\n"\nNCCL_DEBUG = "INFO"\n'),
    # Durations at both ends: a microsecond and ten years.
    "durations.toml": (BASE.replace("[0]", "[4]").replace("8000", "8004")
                       + 'user = "1000"\n[reap]\nterm-grace = "1us"\ntimeout = "3650d"\n'
                       '[ready]\ntimeout = "315360000s"\ninterval = 0.0015\n'),
}


def test_hostile_but_accepted_units_are_escaped(tmp_path: Path) -> None:
    etc, units = make_tree(tmp_path, ACCEPTED)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=60, env=env_for(etc, units))
    assert done.stderr == ""
    names = sorted(p.name for p in out.glob("*.service") if "-liveness." not in p.name)
    assert names == ["argv.service", "durations.service", "good.service", "named.service",
                     "strings.service"]
    # every file written, the [liveness] companions (timers, probes, drop-ins) too
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        assert "\r" not in text
        # (and the drain's port fence removed, its table named by the port alone)
        assert all(l.startswith("ExecStartPre=+/usr/bin/infer-units ")
                   or re.fullmatch(r'ExecStartPre=-\+/usr/sbin/nft "add table inet '
                                   r'infer_units_drain_(\d+); delete table inet '
                                   r'infer_units_drain_\1"', l)
                   for l in lines if l.startswith("ExecStartPre="))
        assert all(not l.endswith("\\") for l in lines)
    named = (out / "named.service").read_text(encoding="utf-8")
    header = named.splitlines()[1]
    assert header.endswith("/named.toml.d/50-a\\x0aExecStartPre=evil.toml "
                           f"{etc}/named.toml.d/60-\\xff.toml")
    assert environment(named)["INJECTED"] == "no" and environment(named)["BYTE"] == "yes"
    argv = (out / "argv.service").read_text(encoding="utf-8")
    assert exec_argv(values(argv, "Service", "ExecStart")[-1]) == [
        "/opt/srv/serve", "a\nExecStartPre=/bin/evil", "b\r", "c\\"]
    assert [l for l in argv.splitlines() if l.startswith("ExecStartPre=")] == \
        [l for l in argv.splitlines() if l.startswith("ExecStartPre=+/usr/bin/infer-units ")]
    assert values(argv, "Unit", "Description") == [
        "/opt/srv/serve a ExecStartPre=/bin/evil b  c\\ on GPUs 2 (infer-units)"]
    strings = (out / "strings.service").read_text(encoding="utf-8")
    env = environment(strings)
    assert env["CTRL"] == "a\x01b\rc\nd\\" and env["PCT"] == "%i %%"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0\n" and env["NCCL_DEBUG"] == "INFO"
    assert values(strings, "Service", "User") == ["_svc-1"]
    durations = (out / "durations.service").read_text(encoding="utf-8")
    pre = exec_argv(values(durations, "Service", "ExecStartPre")[0])
    assert pre[pre.index("--term-grace") + 1] == "1us"
    assert pre[pre.index("--timeout") + 1] == "315360000s"
    post = exec_argv(values(durations, "Service", "ExecStartPost")[0])
    assert post[post.index("--interval") + 1] == "1500us"


def test_unreadable_host_defaults_refuse_every_model_by_name(tmp_path: Path) -> None:
    """defaults.toml.d may hold what makes a host safe (p2p = "off" on a
    SEV-SNP host): when it cannot be read, no model starts without it."""
    etc, units = make_tree(tmp_path, {"other.toml": BASE, "defaults.toml.d": symlink_loop})
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=60, env=env_for(etc, units))
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"infer-units-generator: {etc}/defaults.toml.d: cannot list drop-ins: "
        f"Too many levels of symbolic links (model {name}) (no unit generated)"
        for name in ("good", "other")]
    assert not list(out.iterdir())
    checked = run_cli("check", "other", env=env_for(etc, units), timeout=60)
    assert checked.returncode == 1 and "(model other)" in checked.stderr
    assert "(model good)" not in checked.stderr and "Traceback" not in checked.stderr
