"""The operator commands of `infer-units` that touch GPUs, ports and systemd:
holders, wait-port, p2p-check, status, drain, resume (reap: cli/reap.py)."""

from __future__ import annotations

import logging
import os
import sys

import click

from ..argtypes import unit_name
from ..jsonout import echo_json
from ..die import die
from ..facts.gpus import Backend, Gpu
from .options import DURATION, HOST, PORT, complete_model_names
from .table import format_table

log = logging.getLogger(__name__)


def _gpus(selector: str | None) -> tuple[Backend, list[Gpu]]:
    """None (option not given): every GPU.  Any given text goes through the
    strict selector: "" or "," is a usage error, never "all"."""
    from ..facts.gpumemory import chosen
    from ..facts.gpus import GpuError, backend
    try:
        if selector is not None:
            return chosen(selector)
        b = backend()
        return b, b.gpus()
    except GpuError as e:
        die(str(e))


def _check_env_file(path: str | None) -> None:
    """Before any work: an env file we could not update later is exit 1 now."""
    if path is None:
        return
    from ..act.envfile import EnvFileError, read_env_file
    try:
        read_env_file(path)
    except EnvFileError as e:
        die(str(e))


# --------------------------------------------------------------------- holders

@click.command()
@click.option("--gpus", "selector", default=None, metavar="SEL",
              help='GPUs to look at: "0,1", "GPU-…", PCI ids or "all".  [default: all]')
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def holders(selector: str | None, as_json: bool) -> None:
    """Who uses which GPU: pid, user, unit or container, GPU, memory, cmdline."""
    from ..decide.attribution import attribute
    b, gpus = _gpus(selector)
    seen = attribute(b, gpus, own_unit=None, heirs=True)
    from ..facts.gpumemory import describe
    if as_json:
        echo_json({
            "backend": b.name, "exact": b.exact,
            "gpus": [{"index": g.index, "uuid": g.uuid, "pci": g.pci, "device": g.device,
                      "memory_total_mib": g.memory_total_mib,
                      "memory_used_mib": g.memory_used_mib} for g in gpus],
            "holders": [h.as_json() for h in seen.holders],
            # Not "free" unless both are empty: processes out of sight and
            # memory no listed process holds (another PID namespace).
            "unseen": seen.unseen,
            "unaccounted_mib": {str(k): v for k, v in sorted(seen.unaccounted.items())}})
        return
    if not b.exact:
        click.echo("note: no NVML; a process is shown on every GPU whose device file it holds "
                   "(every CUDA process holds them all)", err=True)
    rows = [("PID", "USER", "GPU", "MEM MiB", "UNIT/CONTAINER", "KIND", "COMMAND")]
    for h in seen.holders:
        i = h.info
        mem = sum(h.use.memory_mib.values()) if h.use.memory_mib else "-"
        rows.append((str(i.pid), i.user, ",".join(map(str, sorted(h.use.gpus))), str(mem),
                     i.unit or i.container or "-", h.kind, i.cmdline[:80]))
    for line in format_table(rows):
        click.echo(line)
    for line in describe(seen.unaccounted):
        click.echo(line)
    if seen.unseen:
        from ..facts.gpus import unseen_message
        click.echo(unseen_message(seen.unseen))
    elif len(rows) == 1 and not seen.unaccounted:
        click.echo(f"no process uses GPU {','.join(str(g.index) for g in gpus)}")


# --------------------------------------------------------------------- wait-port

@click.command("wait-port")
@click.option("--port", type=PORT, required=True, help="TCP port the server will listen on.")
@click.option("--host", default="127.0.0.1", type=HOST, metavar="ADDR",
              help="Address the server will bind.")
@click.option("--timeout", type=DURATION, default="60s", help="How long to wait; then exit 3.")
def wait_port(port: int, host: str, timeout: float) -> None:
    """Wait until the port is free; name who holds it if it is not."""
    from ..act.portwait import wait_ports
    sys.exit(wait_ports(host, [port], None, "wait", timeout))


# --------------------------------------------------------------------- p2p-check

@click.command("p2p-check")
@click.option("--gpus", "selector", required=True, metavar="SEL",
              help='GPUs to test pairwise: "0,1", "GPU-…", PCI ids or "all".')
@click.option("--env-file", default=None, metavar="PATH",
              help="Set or clear NCCL_P2P_DISABLE here.  [default: only report]")
@click.option("--python", "python", default=sys.executable, metavar="PATH",
              show_default="the interpreter running infer-units",
              help="Interpreter with torch (the engine's).")
@click.option("--timeout", type=DURATION, default="90s", help="Limit for the whole self-test.")
@click.option("--user", default=None, metavar="USER",
              help="Run the interpreter as USER (as root: never root itself).  "
                   "[default: nobody]")
@click.option("--env", "server_env", multiple=True, metavar="NAME=VALUE",
              help="Environment for the interpreter (the server's [env]); nothing else "
                   "of this command's environment reaches it.")
def p2p_check(selector: str, env_file: str | None, python: str, timeout: float,
              user: str | None, server_env: tuple[str, ...]) -> None:
    """Copy-and-compare between every GPU pair; NCCL_P2P_DISABLE=1 on failure."""
    from ..act.envfile import EnvFileError
    from ..act.metrics import record_p2p
    from ..act.p2p import check_p2p
    seconds = timeout
    _check_env_file(env_file)
    _b, gpus = _gpus(selector)
    try:
        verdict = check_p2p(gpus, env_file, python, seconds, user=user,
                            server_env=dict(v.partition("=")[::2] for v in server_env))
    except EnvFileError as e:
        die(str(e))
    if env_file:
        # RUN_DIR/<name>.env belongs to <name>.service
        record_p2p(unit_name(os.path.basename(env_file).removesuffix(".env")), verdict)


# --------------------------------------------------------------------- status

@click.command()
@click.argument("names", nargs=-1, shell_complete=complete_model_names)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--write-metrics", is_flag=True,
              help="Also store each model's up (unit active) and ready (its own server "
                   "answers health) for the metrics file, and rewrite the file in every "
                   "INFER_UNITS_METRICS_DIR the models name (root; infer-units-metrics.timer "
                   "runs this).")
def status(names: tuple[str, ...], as_json: bool, write_metrics: bool) -> None:
    """systemd state, GPUs, memory and health of every model (or NAMES), and
    why: a drained host, a refused or failed start and its reason, a crash
    loop, a foreign process on a model's port.  Exit 0 when none has failed;
    3 when one has failed or is crash-looping (like `systemctl status`);
    1 for an unknown name, a model file that does not load, or when systemd
    cannot be asked."""
    from .status import collect, exit_code, table, write_metrics as store
    report = collect(list(names))
    if write_metrics:
        store(report)
    if as_json:
        echo_json(report)
    else:
        click.echo(table(report))
    for name in report["unknown"]:
        close = report["suggestions"].get(name)
        log.error(f"no model file named {name}.toml on the search path"
                  + (f" (did you mean {close}?)" if close else ""))
    if report["errors"]:
        log.error(f"{len(report['errors'])} model file error(s) (above): a model whose file "
                  "does not load has no unit; `infer-units check` shows each")
    for error in sorted({m["systemd"]["error"] for m in report["models"]
                         if not m["systemd"]["available"]}):
        log.error(f"systemd's view unavailable: {error}")
    sys.exit(exit_code(report))


# --------------------------------------------------------------------- drain

@click.command()
@click.option("--timeout", type=DURATION, default="60s",
              help="How long the services may take to stop, and the holders to go after the grace.")
@click.option("--term-grace", type=DURATION, default="10s", help="Time from SIGTERM to SIGKILL.")
@click.option("--ignore", multiple=True, metavar="NAME",
              help="Process name never touched, beyond the built-ins (repeatable).")
@click.option("--dry-run", is_flag=True,
              help="Say which units would stop and which pids get signals; change nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable: units stopped, pids signalled, the fence, module users.")
def drain(timeout: float, term_grace: float, ignore: tuple[str, ...], dry_run: bool,
          as_json: bool) -> None:
    """Before a driver reload: fence starts, stop every running infer-units
    service, reap every /dev/nvidia* holder.  Models stay fenced (a start,
    Restart= included, is refused) until `infer-units resume`."""
    from ..act.drain import drain as run_drain
    code, report = run_drain(timeout, term_grace, ignore, dry_run)
    if as_json:
        echo_json(report)
    sys.exit(code)


@click.command()
@click.option("--timeout", type=DURATION, default="20min",
              help="How long to wait for the units to become active; then exit 3.")
@click.option("--no-block", is_flag=True, help="Queue the starts; do not wait for them.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def resume(timeout: float, no_block: bool, as_json: bool) -> None:
    """Lift drain's fence and start again exactly the units drain stopped."""
    from ..act.drain import resume as run_resume
    code, report = run_resume(None if no_block else timeout)
    if as_json:
        echo_json(report)
    sys.exit(code)
