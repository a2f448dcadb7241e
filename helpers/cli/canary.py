"""`infer-units canary NAME [--accept]`: the known-answer check of a running
model, on demand (helpers/act/canary.py).

It asks with the options of the running unit's own known-answer line (as
systemd loaded it, not the file on disk since), so the request, the key
and the record are those of the start; --accept records the current answer
after the operator has judged it right.
"""

from __future__ import annotations

import os
import sys

import click

from .. import exitcodes
from ..die import die
from ..jsonout import echo_json


@click.command()
@click.argument("name")
@click.option("--accept", is_flag=True,
              help="Record the current answer as the known one (after a change the key "
                   "cannot see, judged right).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def canary(name: str, accept: bool, as_json: bool) -> None:
    """Run the known-answer check of the running model NAME: exit 0 when the
    answer matches (or was recorded), 2 on a mismatch, 1 when the model has
    no check, is not running, or no usable answer came.  With --accept on a
    model that is not running (a start refused for a mismatch), its next
    start records its answer."""
    from ..act.canary import ERROR, MISMATCH, check, options_of_unit_line, server_argv
    from ..act.metrics import record_canary
    from ..argtypes import unit_name
    from ..facts.systemd import SystemdUnavailable, unit_state
    if os.geteuid() != 0:
        die("canary: the recorded answers are root's", hint="run it as root")
    unit = unit_name(name)
    try:
        running = unit_state(unit).active_state == "active"
        lines = [argv for argv in _exec_start_post(unit) if "known-answer" in argv]
        argv = server_argv(unit)
    except SystemdUnavailable as e:
        die(f"canary: systemd cannot be asked: {e}")
    if not lines:
        die(f"canary: {unit} has no known-answer check",
            hint="[canary] enabled = false, or no health URL; or it is not an infer-units model")
    if not running and accept:
        # A start refused for a mismatch leaves nothing to ask: the next
        # start records its answer instead.
        from ..act.canary import accept_next
        accept_next(unit)
        if as_json:
            echo_json({"unit": unit, "verdict": "accept-next", "exit": exitcodes.CLEAN})
        else:
            click.echo(f"{unit}: not active: its next start records its answer "
                       f"(systemctl start {unit})")
        sys.exit(exitcodes.CLEAN)
    if not running:
        die(f"canary: {unit} is not active", hint=f"systemctl start {unit}")
    words = lines[0]
    # The hooks' own settings of the model's [env] (the metrics directory; on
    # a host marked for tests, the fake GPU table), as its hook has them.
    os.environ.update(_hook_settings_of(name.removesuffix(".service")))
    try:
        opts = options_of_unit_line(words[words.index("known-answer") + 1:])
    except ValueError as e:
        die(f"canary: {unit}'s known-answer line: {e}",
            hint="systemctl daemon-reload after an upgrade")
    result = check(opts, argv, accept=accept)
    record_canary(unit, result)
    code = {MISMATCH: exitcodes.BLOCKED, ERROR: exitcodes.CONFIG_ERROR}.get(
        result.verdict, exitcodes.CLEAN)
    if as_json:
        echo_json({"unit": unit, "verdict": result.verdict, "message": result.message,
                   "seconds": round(result.seconds, 3), "exit": code})
    else:
        click.echo(f"{unit}: {result.verdict}: {result.message}")
    sys.exit(code)


def _exec_start_post(unit: str) -> list[list[str]]:
    from ..facts.systemd import exec_argvs
    return exec_argvs(unit, "ExecStartPost")


def _hook_settings_of(name: str) -> dict[str, str]:
    """The INFER_UNITS_* settings of the model's [env] that a hook honours
    (helpers/hookenv.py); none when its file does not load."""
    from ...generator.loader import Loader
    from ...generator.model import build_model
    from ..hookenv import hook_settings
    loader = Loader()
    path = loader.discover()[0].get(name)
    if path is None:
        return {}
    try:
        return hook_settings(build_model(loader.load_model(name, path)).env)
    except Exception:  # noqa: BLE001 - the check goes on with the host's own settings
        return {}
