"""One test per fixture under tests/cases (quadlet style): each fixture holds
its own expectations in `## assert-...` lines, and the generator's whole
output is compared with tests/golden/<case>/ (INFER_UNITS_UPDATE_GOLDEN=1
rewrites those).

A case is a single model file (cases/x.toml) or a directory whose run/, etc/,
local/ and lib/ subdirectories are the search path, highest first.

Assertions (apply to the unit of the file they stand in):
  assert-argv WORD...             ExecStart argv after systemd's unquoting
  assert-json argv|env JSON       the same, as JSON (for tabs, newlines)
  assert-exec DIRECTIVE N WORD... argv of the Nth such directive
  assert-prefix DIRECTIVE CHARS   every such directive starts with CHARS
  assert-env NAME VALUE           environment after unquoting
  assert-no-env NAME
  assert-key SECTION KEY VALUE    last value of KEY
  assert-has SECTION KEY VALUE    one of the values of KEY
  assert-no-key SECTION KEY
  assert-link DIR                 DIR/<unit> links to ../<unit>
  assert-sources FILE...          the files applied, in order (relative)
  assert-error KEY TEXT           no unit; one log line names file, key, TEXT
  assert-conflict KEY TEXT        unit generated; a log line names file, key, TEXT
  assert-no-unit NAME
  assert-other FILE SECTION KEY VALUE      last value of KEY in another generated file
                                           (the liveness timer, probe, drop-in)
  assert-other-exec FILE DIRECTIVE N WORD...
  assert-no-file FILE                      nothing generated under that name

`## systemd N`: the systemd version the generator sees (default 257, see
SYSTEMD_VERSION), whatever this host runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from ..support import run_generator
from ..unitfile import environment, exec_argv, values

CASES = Path(__file__).parents[1] / "cases"
GOLDEN = Path(__file__).parents[1] / "golden"
LEVELS = ("run", "etc", "local", "lib")


def case_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in CASES.iterdir()
                  if p.is_dir() or p.suffix == ".toml")


def unit_of(path: Path) -> str | None:
    if path.parent.name.endswith(".toml.d"):
        return path.parent.name.removesuffix(".toml.d")
    if path.suffix == ".toml":
        return path.stem
    return None


def assertions(case_dir: Path) -> list[tuple[str | None, list[str], Path]]:
    found = []
    for path in sorted(case_dir.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("## assert-json "):
                # JSON for strings shell quoting cannot carry (tabs, newlines)
                _, what, data = line[3:].split(" ", 2)
                found.append((unit_of(path), ["assert-json", what, json.loads(data)], path))
            elif line.startswith("## systemd "):
                continue          # the version the generator sees (systemctl_stub)
            elif line.startswith("## assert-"):
                found.append((unit_of(path), shlex.split(line[3:]), path))
    return found


def prepare(case: str, tmp: Path) -> tuple[Path, list[str]]:
    src = CASES / case if (CASES / case).is_dir() else CASES / f"{case}.toml"
    root = tmp / "config"
    if src.is_dir():
        shutil.copytree(src, root, symlinks=True)
        # As an operator installs them: root's alone (a checkout made under
        # umask 002 has group-writable files, which the loader refuses).
        for path in [root, *root.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & ~0o022)
        dirs = [str(root / level) for level in LEVELS if (root / level).is_dir()]
    else:
        (root / "etc").mkdir(parents=True)
        shutil.copy(src, root / "etc" / src.name)
        dirs = [str(root / "etc")]
    return root, dirs


def check_golden(case: str, out: Path, root: Path) -> None:
    produced = {}
    for path in sorted(out.rglob("*")):
        rel = str(path.relative_to(out))
        if path.is_symlink():
            produced[rel + ".link"] = os.readlink(path) + "\n"
        elif path.is_file():
            produced[rel] = path.read_text(encoding="utf-8").replace(str(root), "@CONFIG@")
    golden_dir = GOLDEN / case
    if os.environ.get("INFER_UNITS_UPDATE_GOLDEN"):
        shutil.rmtree(golden_dir, ignore_errors=True)
        for rel, text in produced.items():
            (golden_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden_dir / rel).write_text(text, encoding="utf-8")
    expected = {str(p.relative_to(golden_dir)): p.read_text(encoding="utf-8")
                for p in sorted(golden_dir.rglob("*")) if p.is_file()} if golden_dir.exists() else {}
    assert produced == expected, f"output differs from tests/golden/{case} " \
                                 "(INFER_UNITS_UPDATE_GOLDEN=1 to accept)"


# The systemd version the generator sees (`systemctl --version`): a case's
# `## systemd N` line, else this one, whatever this host runs.
SYSTEMD_VERSION = "257"


def systemctl_stub(root: Path, tmp: Path) -> str:
    """A PATH whose `systemctl --version` says the case's systemd version."""
    version = SYSTEMD_VERSION
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.startswith("## systemd "):
                    version = line.split()[2]
    stub = tmp / "bin"
    stub.mkdir()
    (stub / "systemctl").write_text(f"#!/bin/sh\necho 'systemd {version} (test)'\n")
    (stub / "systemctl").chmod(0o755)
    return f"{stub}:{os.environ.get('PATH', '/usr/bin:/bin')}"


@pytest.mark.parametrize("case", case_names())
def test_case(case: str, tmp_path: Path) -> None:
    root, dirs = prepare(case, tmp_path)
    out = tmp_path / "out"
    done = run_generator(out, ":".join(dirs), PATH=systemctl_stub(root, tmp_path))
    assert done.returncode == 0, done.stderr
    log = done.stderr.splitlines()
    checks = assertions(root)
    assert checks, f"case {case} asserts nothing"
    error_units = set()
    for unit, (verb, *args), path in checks:
        text_path = out / f"{unit}.service"
        text = text_path.read_text(encoding="utf-8") if text_path.exists() else None
        where = f"{path.relative_to(root)}: {verb} {args}"
        if verb == "assert-error":
            key, reason = args
            error_units.add(unit)
            assert text is None, f"{where}: a unit was generated"
            main_file = str(path)
            hits = [l for l in log if main_file in l and reason in l
                    and (not key or f": {key}:" in l)]
            assert len(hits) == 1, f"{where}: log was {log}"
            continue
        if verb == "assert-no-unit":
            assert not (out / f"{args[0]}.service").exists(), where
            continue
        if verb == "assert-no-file":
            assert not (out / args[0]).exists(), where
            continue
        if verb in ("assert-other", "assert-other-exec"):
            other = out / args[0]
            assert other.is_file(), f"{where}: not generated; log: {log}"
            text = other.read_text(encoding="utf-8")
            if verb == "assert-other":
                _name, section, key, *value = args
                assert values(text, section, key)[-1:] == [" ".join(value)], \
                    f"{where}: got {values(text, section, key)}"
            else:
                _name, directive, index, *argv = args
                section = "Service" if directive.startswith("Exec") else "Timer"
                lines = values(text, section, directive)
                assert exec_argv(lines[int(index)]) == argv, f"{where}: got {lines}"
            continue
        if verb == "assert-conflict":
            key, reason = args
            assert any(str(path) in l and f": {key}:" in l and reason in l for l in log), \
                f"{where}: log was {log}"
            assert text is not None, f"{where}: a conflict must not drop the unit"
            continue
        assert text is not None, f"{where}: no unit generated; log: {log}"
        if verb == "assert-argv":
            assert exec_argv(values(text, "Service", "ExecStart")[-1]) == args, where
        elif verb == "assert-json":
            what, expected = args
            if what == "argv":
                assert exec_argv(values(text, "Service", "ExecStart")[-1]) == expected, where
            else:
                env = environment(text)
                assert {k: env.get(k) for k in expected} == expected, where
        elif verb == "assert-exec":
            directive, index, *argv = args
            lines = values(text, "Service", directive)
            assert exec_argv(lines[int(index)]) == argv, f"{where}: got {lines}"
        elif verb == "assert-prefix":
            directive, prefix = args
            own = [v for v in values(text, "Service", directive) if "infer-units" in v]
            assert own and all(v.startswith(prefix) for v in own), where
        elif verb == "assert-env":
            assert environment(text).get(args[0]) == args[1], \
                f"{where}: got {environment(text).get(args[0])!r}"
        elif verb == "assert-no-env":
            assert args[0] not in environment(text), where
        elif verb == "assert-key":
            section, key, *value = args
            assert values(text, section, key)[-1:] == [" ".join(value)], \
                f"{where}: got {values(text, section, key)}"
        elif verb == "assert-has":
            section, key, *value = args
            assert " ".join(value) in values(text, section, key), where
        elif verb == "assert-no-key":
            assert not values(text, args[0], args[1]), where
        elif verb == "assert-link":
            link = out / args[0] / f"{unit}.service"
            assert link.is_symlink() and os.readlink(link) == f"../{unit}.service", where
        elif verb == "assert-sources":
            header = next(l for l in text.splitlines() if l.startswith("# from "))
            got = [os.path.relpath(p, root) for p in header[len("# from "):].split()]
            assert got == args, f"{where}: got {got}"
            assert values(text, "Unit", "SourcePath") == [str(root / args[[
                i for i, a in enumerate(args) if unit_of(Path(a)) == unit
                and not Path(a).parent.name.endswith(".toml.d")][0]])], where
        else:
            raise AssertionError(f"{where}: unknown assertion")
    # Nothing else is logged: every error line belongs to an asserted error or conflict.
    generated = {p.stem for p in out.glob("*.service")}
    for line in log:
        assert any(f"/{u}.toml" in line for u in error_units) or "also used" in line \
            or "overlap" in line, f"unexpected log line: {line}"
    assert not generated & error_units
    check_golden(case, out, root)


def test_templates_are_rendered_strictly() -> None:
    """The unit templates are jinja2's, rendered at run time: a value the
    template uses and the generator did not give is an error (StrictUndefined),
    never an empty string in a unit; an optional directive with no value
    leaves no line."""
    import jinja2

    from infer_units.generator import render
    with pytest.raises(jinja2.UndefinedError):
        render.fill("liveness-service", {"version": "1", "unit": "x.service"})
    env = render.templates()
    assert env.undefined is jinja2.StrictUndefined and not env.autoescape
    names = {"version": "1", "sources": "a.toml", "description": "d %n", "liveness_wants": "",
             "liveness_stop_post": "", "requires_mounts": "", "source_path": "/etc/a%.toml",
             "unit_directives": "",
             "user": "", "name": "a", "run_dir": "/run/x", "environment": "",
             "exec_start_pre": "ExecStartPre=+/bin/true", "exec_start": "/bin/serve",
             "exec_start_post": "", "exec_stop_post": "", "exec_stop": "",
             "port_fence_close": "", "port_fence_open": "",
             "timeout_start": "1min", "timeout_stop": "45s", "service_directives": "",
             "restart": "RestartSec=5s"}
    text = render.fill("service", names)
    assert "Description=d %%n\n" in text and "SourcePath=/etc/a%%.toml\n" in text
    assert "\n\n\n" not in text and "User=" not in text and "ExecStopPost" not in text
    assert "RequiresMountsFor" not in text
    assert "User=svc\n" in render.fill("service", {**names, "user": "svc"})
