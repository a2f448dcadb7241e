"""The hooks read their argv with argparse (hooks/parser.py), through the
real command: a usage error is one line and exit 1 (never argparse's exit 2,
which here means "blocked"), a value may start with a dash, --help is
argparse's, and no abbreviation is taken for an option."""

from __future__ import annotations

import subprocess

import pytest

from infer_units.helpers.commands import HOOKS

from ..support import PYTHON, ROOT, FakeGpus, base_env, needs_root, run_cli


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "usage:" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


REQUIRED = {"pre-start": ["--unit", "m"], "wait-ready": ["--url", "http://127.0.0.1:1/"],
            "wait-free": ["--gpus", "0"], "liveness-probe": ["--unit", "m"], "group-watch": ["--unit", "m", "--hosts", "a,b",
                                                             "--rank", "0", "--rendezvous", "a:1"],
            "known-answer": ["--unit", "m", "--engine", "llamacpp", "--url",
                             "http://127.0.0.1:1/", "--api", "llamacpp"]}


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_an_unknown_option_is_one_line_and_exit_1(hook: str) -> None:
    line = one_line(run_cli(hook, *REQUIRED[hook], "--no-such-option", "x"))
    assert f"{hook}: " in line and "--no-such-option" in line and "see --help" in line, line


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_help_is_argparses(hook: str) -> None:
    done = run_cli(hook, "--help")
    assert done.returncode == 0 and done.stdout.startswith(f"usage: infer-units {hook}"), done


def test_a_missing_required_option_and_a_bad_value_name_the_option() -> None:
    assert "--unit" in one_line(run_cli("pre-start"))
    assert "--unit" in one_line(run_cli("group-watch"))
    line = one_line(run_cli("wait-ready", "--url", "http://127.0.0.1:1/", "--timeout", "soon"))
    assert "--timeout" in line and "bad time span" in line, line
    line = one_line(run_cli("pre-start", "--unit", "m", "--foreign", "maybe"))
    assert "--foreign" in line and "maybe" in line, line


def test_no_abbreviations() -> None:
    assert "--gp" in one_line(run_cli("wait-free", "--gp", "0"))


@needs_root
def test_a_value_may_start_with_a_dash(fake_gpus: FakeGpus) -> None:
    """The generator writes `--ignore NAME`; a name may start with "-"."""
    done = run_cli("wait-free", "--gpus", "0", "--ignore", "-bash", "--timeout", "5s",
                   env=fake_gpus.env())
    assert done.returncode == 0, done.stderr
    line = one_line(run_cli("wait-free", "--gpus", "0", "--ignore", env=fake_gpus.env()))
    assert "--ignore" in line and "expected one argument" in line, line


def test_a_hook_imports_no_click() -> None:
    code = ("import sys, runpy; sys.argv = ['infer-units', 'wait-free', '--gpus', 'none-such']\n"
            "try:\n    runpy.run_module('infer_units', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'click'))")
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=base_env())
    assert "LOADED []" in done.stdout, done.stdout + done.stderr
