"""`infer-units reap`: the operator's command (what restart scripts run
between a stop and a start, in place of SGLang's killall.py).  A click
command like every operator command; the unit's own reap is pre-start's
(hooks/unit.py), through the same Reaper (act/reaper.py)."""

from __future__ import annotations

import logging
import sys

import click

from ...generator import settings
from ...generator.durations import format_seconds
from .. import argtypes
from ..argtypes import unit_name
from ..die import die
from ..jsonout import echo_json
from .options import DURATION, Checked

log = logging.getLogger(__name__)


@click.command()
@click.option("--gpus", "selector", required=True, metavar="SEL",
              help='"0,1", "GPU-…", PCI ids, or "all".')
@click.option("--unit", type=Checked(argtypes.unit), default=None,
              help="The service doing the reaping (its cgroup is its own).")
@click.option("--foreign", type=click.Choice(list(settings.REAP_FOREIGN)),
              default=settings.default("reap.foreign"),
              help="Processes of no infer-units service: kill them, wait for them, or exit 2.")
@click.option("--term-grace", type=DURATION,
              default=format_seconds(settings.default("reap.term-grace")),
              help="Time from SIGTERM to SIGKILL.")
@click.option("--timeout", type=DURATION, default=format_seconds(settings.default("reap.timeout")),
              help="Overall limit after the grace.")
@click.option("--ignore", multiple=True, metavar="NAME",
              help="Process name never touched, beyond the built-ins (repeatable).")
@click.option("--env-file", default=None, metavar="PATH",
              help="Write CUDA_VISIBLE_DEVICES (indexes in PCI order) here.")
@click.option("--dry-run", is_flag=True, help="Say what would be done; touch nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def reap(selector: str, unit: str | None, foreign: str, term_grace: float, timeout: float,
         ignore: tuple[str, ...], env_file: str | None, dry_run: bool, as_json: bool) -> None:
    """Reap the users of GPUs and wait until they are free."""
    from ..act.reaper import Reaper, ReapPolicy
    from ..facts.gpumemory import chosen
    from ..facts.gpus import GpuError
    policy = ReapPolicy(foreign=foreign, term_grace=term_grace,
                        timeout=timeout, ignore=tuple(ignore), dry_run=dry_run)
    if env_file is not None:
        # Before any work: an env file we could not update later is exit 1 now.
        from ..act.envfile import EnvFileError, read_env_file
        try:
            read_env_file(env_file)
        except EnvFileError as e:
            die(str(e))
    try:
        b, gpus = chosen(selector)
    except GpuError as e:
        die(str(e))
    unit = unit_name(unit) if unit else None
    result = Reaper(b, gpus, unit, policy).run()
    if env_file and not dry_run and result.exit_code == 0:
        from ..act.envfile import EnvFileError, write_visible_devices
        try:
            write_visible_devices(env_file, gpus, b.gpus())
        except EnvFileError as e:
            die(str(e))
    if as_json:
        echo_json(result.as_json())
    else:
        sent = len(result.actions)
        log.info(f"reap GPU {','.join(str(g.index) for g in gpus)}: "
                 f"{result.message} after {result.seconds * 1000:.0f} ms"
                 + (f", {sent} signal(s) sent" if sent else ""))
    if not dry_run:
        from ..act.metrics import record_reap
        record_reap(unit, result)
    sys.exit(result.exit_code)
