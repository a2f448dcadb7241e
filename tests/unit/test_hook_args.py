"""hooks/args.py's engine reads a command line exactly as the argparse parser
built from the same declarations (which answers --help and every usage
error): the same values for every line it reads itself, and argparse's own
answer, the same line and exit code, for every other."""

from __future__ import annotations

import contextlib
import io
import random
import subprocess
from typing import Any

import pytest

from infer_units.helpers.hooks import args as hook_args
from infer_units.helpers.hooks import reap, unit

from ..support import PYTHON, ROOT, base_env


class _Captured(Exception):
    pass


def _parsers() -> dict[str, Any]:
    """Each hook's parser, as its command builds it (caught at parse_args)."""
    got: dict[str, Any] = {}
    real = hook_args.Parser.parse_args

    def grab(self: Any, argv: Any = None) -> Any:
        got["p"] = self
        raise _Captured

    parsers: dict[str, Any] = {"reap": reap.parser()}
    hook_args.Parser.parse_args = grab      # type: ignore[method-assign]
    try:
        for name in ("pre-start", "wait-ready", "wait-free", "liveness-probe"):
            with contextlib.suppress(_Captured):
                unit.COMMANDS[name]([])
            parsers[name] = got.pop("p")
    finally:
        hook_args.Parser.parse_args = real      # type: ignore[method-assign]
    return parsers


def _outcome(parse: Any) -> tuple[Any, ...]:
    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        try:
            return ("values", sorted(vars(parse()).items(), key=str))
        except SystemExit as e:
            return ("exit", e.code, out.getvalue())


VALUES = ["0,1", "", "-bash", "--", "1s", "kill", "wait", "x", "18501", "70000", "--gpus",
          "a=b", "http://127.0.0.1:1/h", "-1", "5", "m", "m.service", "NAME=VALUE"]


@pytest.mark.parametrize("name", ["pre-start", "wait-ready", "wait-free", "liveness-probe",
                                  "reap"])
def test_the_engine_reads_what_argparse_reads(name: str) -> None:
    p = _parsers()[name]
    flags = [f for a in p._actions[1:] for f in a.option_strings]
    rng = random.Random(name)
    for _ in range(1500):
        argv: list[str] = []
        for _ in range(rng.randint(0, 6)):
            flag = rng.choice(flags + ["--gp", "-x", "--nope"] if rng.random() < .1 else flags)
            r = rng.random()
            argv += [f"{flag}={rng.choice(VALUES)}"] if r < .3 else \
                [flag, rng.choice(VALUES)] if r < .9 else [flag]
        if rng.random() < .1:
            argv.append("--")
        fast = _outcome(lambda: p.parse_args(argv))
        assert fast == _outcome(lambda: p._argparse().parse_args(p._glued(argv))), argv


def test_a_hook_imports_no_argparse_and_its_help_is_argparses() -> None:
    code = ("import sys, runpy; sys.argv = ['infer-units', 'wait-free', '--gpus', 'none-such']\n"
            "try:\n    runpy.run_module('infer_units', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in ('argparse', 'gettext', 'locale') "
            "if m in sys.modules))")
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=base_env())
    assert "LOADED []" in done.stdout, done.stdout + done.stderr
    shown = subprocess.run([PYTHON, "-m", "infer_units", "wait-free", "--help"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT, env=base_env())
    assert shown.returncode == 0 and shown.stdout.startswith("usage: infer-units wait-free")
    assert "--liveness-cap" in shown.stdout
