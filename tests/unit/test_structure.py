"""The layout docs/architecture.md's "Where to change what" describes, checked: one command
table that the hooks and the click CLI both read, hooks free of click, no
import cycle, and the rooms in flow order (facts -> decide -> act -> hooks,
cli: a room imports only rooms before it)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from typing import Any

import click

from ..support import PYTHON, ROOT, FakeGpus, base_env

HELPERS = ROOT / "infer_units" / "helpers"
ROOMS = ["facts", "decide", "act", "hooks", "cli"]


def _imports() -> dict[str, set[str]]:
    """module -> the infer_units modules it imports (anywhere in it: a lazy
    import inside a function is a dependency too)."""
    graph: dict[str, set[str]] = {}
    top = ROOT / "infer_units"
    for path in sorted(top.rglob("*.py")) + sorted(HELPERS.rglob("*.py")) + \
            sorted((top / "generator").rglob("*.py")):
        rel = path.relative_to(top).with_suffix("")
        parts = ["infer_units", *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        package = parts if path.name == "__init__.py" else parts[:-1]
        deps = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                if not target.startswith("infer_units"):
                    continue
                deps.add(target)
                for alias in node.names:     # `from . import exitcodes` imports a module
                    deps.add(f"{target}.{alias.name}")
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("infer_units"))
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def test_no_import_cycle_on_the_helpers_side() -> None:
    graph = _imports()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if not d.startswith("infer_units.helpers"):
                continue
            if state.get(d) == 1:
                cycles.append(path[path.index(d):] + [d] if d in path else [m, d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m.startswith("infer_units.helpers") and m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_rooms_import_only_rooms_before_them() -> None:
    for module, deps in _imports().items():
        parts = module.split(".")
        if len(parts) < 4 or parts[1] != "helpers" or parts[2] not in ROOMS:
            continue
        room = ROOMS.index(parts[2])
        for dep in deps:
            d = dep.split(".")
            if len(d) >= 3 and d[1] == "helpers" and d[2] in ROOMS:
                # hooks and cli are siblings: they share commands.py, not code
                assert {parts[2], d[2]} != {"hooks", "cli"}, f"{module} imports {dep}"
                assert ROOMS.index(d[2]) <= room, f"{module} imports {dep}: against the flow"


def test_one_command_table_for_the_hooks_and_the_cli() -> None:
    """helpers/commands.py: hooks are argparse mains, every other command a
    click command of the same name that --help lists."""
    import importlib
    from infer_units.helpers import commands
    from infer_units.helpers.cli.root import all_commands
    loaded = all_commands()
    assert set(loaded) == {n for n, c in commands.COMMANDS.items() if not c.hook}
    for name, spec in commands.COMMANDS.items():
        target = getattr(importlib.import_module(f"infer_units.helpers.{spec.module}"), spec.attr)
        if spec.hook:
            assert spec.module.startswith("hooks.") and spec.summary, name
            assert callable(target) and not isinstance(target, click.Command), name
        else:
            assert spec.module.startswith("cli."), name
            assert loaded[name] is target and target.name == name and not target.hidden, name
    assert set(commands.HOOKS) == {"pre-start", "wait-ready", "wait-free", "liveness-probe",
                                   "group-watch", "known-answer"}


def test_the_hooks_path_imports_neither_click_nor_the_cli() -> None:
    code = ("import sys, runpy; sys.argv = ['infer-units', 'wait-ready', '--help']\n"
            "try:\n    runpy.run_module('infer_units', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('click', 'jinja2') or m.startswith('infer_units.helpers.cli'))\n"
            "print('LOADED', bad)")
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                          env=base_env())
    assert "LOADED []" in done.stdout, done.stdout + done.stderr


def test_reap_is_a_click_command(fake_gpus: FakeGpus) -> None:
    """`infer-units reap` is an operator command: click, like the others."""
    done = subprocess.run([PYTHON, "-m", "infer_units", "reap", "--gpus", "0", "--dry-run"],
                          capture_output=True, text=True, timeout=60, env=fake_gpus.env())
    assert done.returncode == 0 and "dry run" in done.stderr, done.stderr
    shown = subprocess.run([PYTHON, "-m", "infer_units", "reap", "--help"], capture_output=True,
                           text=True, timeout=60, env=fake_gpus.env()).stdout
    assert shown.startswith("Usage: infer-units reap [OPTIONS]")
    for flag in ("--gpus", "--unit", "--foreign", "--term-grace", "--timeout", "--ignore",
                 "--env-file", "--dry-run", "--json"):
        assert flag in shown, flag


def _with_a_pynvml(tmp_path: Path, source: str, script: str) -> str:
    """Run script (with _load_pynvml imported) in a fresh `-IS` interpreter
    whose pynvml is `source`; its stdout."""
    (tmp_path / "pynvml.py").write_text(source)
    done = subprocess.run([PYTHON, "-IS", "-c", "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
                           "from infer_units.helpers.facts.gpus import _load_pynvml\n" + script,
                           str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_pynvml_that_asks_ctypes_util_while_it_loads_gets_the_real_one(tmp_path: Path) -> None:
    """The stand-in answers any use during the import (review): the module's
    attribute, a call at import time; nothing is left of it afterwards."""
    out = _with_a_pynvml(tmp_path, "import ctypes.util\nfrom ctypes.util import find_library\n"
                                   "A = ctypes.util.find_library('c')\nB = find_library('c')\n", (
        "m = _load_pynvml(); import ctypes, ctypes.util\n"
        "print(m.A == m.B == ctypes.util.find_library('c') is not None,"
        " ctypes.util.__spec__ is not None, sys.modules['ctypes.util'] is ctypes.util)\n"))
    assert out.split() == ["True", "True", "True"], out


def test_loading_pynvml_leaves_the_standard_library_as_it_is(tmp_path: Path) -> None:
    """pynvml is imported plainly: every module it imports is the real one in
    sys.modules before and after, and nothing of ours is put there."""
    out = _with_a_pynvml(tmp_path, "import string, threading, functools, ctypes.util\n", (
        "before = dict(sys.modules)\n"
        "m = _load_pynvml()\n"
        "changed = [k for k, v in before.items() if sys.modules.get(k) is not v]\n"
        "added = [k for k in sys.modules if k not in before]\n"
        "print(changed)\n"
        "print(all(getattr(sys.modules[k], '__spec__', None) is not None for k in added"
        " if k != 'pynvml'))\n"
        "import string, threading, functools\n"
        "print(m.string is string and m.threading is threading and m.functools is functools)\n"))
    assert out.split("\n")[:3] == ["[]", "True", "True"], out


def test_the_architecture_doc_names_every_module_in_its_room() -> None:
    text = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    start = text.index("## Where to change what")
    section = text[start:text.index("\n## ", start)]
    for folder in ("generator", "units", "helpers", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            assert path.name in section, f"docs/architecture.md does not name {path}"
    for room in ROOMS:
        block = section[section.index(f"{room}/"):]
        for path in sorted((HELPERS / room).glob("*.py")):
            if path.name != "__init__.py":
                # named after its room, before the next room
                nxt = min((block.index(f"{r}/", 1) for r in ROOMS if f"{r}/" in block[1:]),
                          default=len(block))
                assert path.name in block[:nxt], f"{path.name} not named under {room}/"
