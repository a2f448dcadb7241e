"""The GPU commands of `infer-units`: holders, reap, wait-free, wait-port,
wait-ready, p2p-check, drain."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from . import exitcodes
from .cli import _duration, main


def _fail(message: str, code: int = exitcodes.CONFIG_ERROR) -> None:
    click.echo(f"infer-units: {message}", err=True)
    sys.exit(code)


def _gpus(selector: str | None):  # type: ignore[no-untyped-def]
    from .gpus import GpuError, backend, select
    try:
        b = backend()
        every = b.gpus()
        return b, (select(every, selector) if selector else every)
    except GpuError as e:
        _fail(str(e))
        raise AssertionError("unreachable")


def _unit(name: str | None) -> str | None:
    if name and not name.endswith((".service", ".scope")):
        return name + ".service"
    return name


# --------------------------------------------------------------------- holders

@main.command()
@click.option("--gpus", "selector", default=None, help="GPUs to look at (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def holders(selector: str | None, as_json: bool) -> None:
    """Who uses which GPU: pid, user, unit or container, GPU, memory, cmdline."""
    from .attribution import attribute
    b, gpus = _gpus(selector)
    seen = attribute(b, gpus, own_unit=None)
    if as_json:
        click.echo(json.dumps({
            "backend": b.name, "exact": b.exact,
            "gpus": [{"index": g.index, "uuid": g.uuid, "pci": g.pci, "device": g.device,
                      "memory_total_mib": g.memory_total_mib,
                      "memory_used_mib": g.memory_used_mib} for g in gpus],
            "holders": [h.as_json() for h in seen.holders]}, indent=2))
        return
    if not b.exact:
        click.echo("note: no NVML; GPU per process is a hint from CUDA_VISIBLE_DEVICES", err=True)
    rows = [("PID", "USER", "GPU", "MEM MiB", "UNIT/CONTAINER", "KIND", "COMMAND")]
    for h in seen.holders:
        i = h.info
        mem = sum(h.use.memory_mib.values()) if h.use.memory_mib else "-"
        rows.append((str(i.pid), i.user, ",".join(map(str, sorted(h.use.gpus))), str(mem),
                     i.unit or i.container or "-", h.kind, i.cmdline[:80]))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    for r in rows:
        click.echo("  ".join(r[c].ljust(widths[c]) for c in range(len(widths))) + "  " + r[-1])
    if len(rows) == 1:
        click.echo(f"no process uses GPU {','.join(str(g.index) for g in gpus)}")


# --------------------------------------------------------------------- reap

def _resolve_pci_env(gpus, env_file: str) -> None:  # type: ignore[no-untyped-def]
    from .envfile import update_env_file
    update_env_file(env_file, {"CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus)})


@main.command()
@click.option("--gpus", "selector", required=True, help='"0,1", "GPU-…", PCI ids, or "all".')
@click.option("--unit", default=None, help="The service doing the reaping (its cgroup is its own).")
@click.option("--foreign", type=click.Choice(["kill", "wait", "fail"]), default="kill")
@click.option("--term-grace", default="10s", help="SIGTERM to SIGKILL.")
@click.option("--timeout", default="60s", help="Overall limit after the grace.")
@click.option("--ignore", multiple=True, help="Process names never touched (adds to the built-ins).")
@click.option("--env-file", default=None, help="Write CUDA_VISIBLE_DEVICES (UUIDs) here.")
@click.option("--dry-run", is_flag=True, help="Say what would be done; touch nothing.")
@click.option("--json", "as_json", is_flag=True)
def reap(selector: str, unit: str | None, foreign: str, term_grace: str, timeout: str,
         ignore: tuple[str, ...], env_file: str | None, dry_run: bool, as_json: bool) -> None:
    """Reap the users of GPUs and wait until they are free."""
    from .metrics import record_reap
    from .reaper import Reaper, ReapPolicy
    policy = ReapPolicy(foreign=foreign, term_grace=_duration(term_grace, "--term-grace"),
                        timeout=_duration(timeout, "--timeout"), ignore=ignore, dry_run=dry_run)
    b, gpus = _gpus(selector)
    result = Reaper(b, gpus, _unit(unit), policy).run()
    if env_file and not dry_run and result.exit_code == exitcodes.CLEAN:
        _resolve_pci_env(gpus, env_file)
    if as_json:
        click.echo(json.dumps(result.as_json(), indent=2))
    else:
        killed = sum(1 for a in result.actions)
        click.echo(f"infer-units: reap GPU {','.join(str(g.index) for g in gpus)}: "
                   f"{result.message} after {result.seconds * 1000:.0f} ms"
                   + (f", {killed} signal(s) sent" if killed else ""), err=True)
    if not dry_run:
        record_reap(_unit(unit), result)
    sys.exit(result.exit_code)


# --------------------------------------------------------------------- wait-free

@main.command("wait-free")
@click.option("--gpus", "selector", required=True)
@click.option("--unit", default=None)
@click.option("--timeout", default="60s")
@click.option("--ignore", multiple=True)
@click.option("--result", "service_result", default="", help="$SERVICE_RESULT, for the log.")
def wait_free(selector: str, unit: str | None, timeout: str, ignore: tuple[str, ...],
              service_result: str) -> None:
    """Wait until nothing (but ignored tools) uses the GPUs; report what is left."""
    from .metrics import record_free
    from .reaper import ReapPolicy, Reaper
    b, gpus = _gpus(selector)
    policy = ReapPolicy(foreign="wait", term_grace=0.0, timeout=_duration(timeout, "--timeout"),
                        ignore=ignore)
    result = Reaper(b, gpus, _unit(unit), policy).run()
    where = f" ({unit} stopped: {service_result})" if service_result else ""
    if result.exit_code == exitcodes.CLEAN:
        click.echo(f"infer-units: GPU {','.join(str(g.index) for g in gpus)} free after "
                   f"{result.seconds * 1000:.0f} ms{where}", err=True)
    else:
        for h in result.blocked_by:
            click.echo(f"infer-units: still held by {h.info.describe()} ({h.why})", err=True)
        click.echo(f"infer-units: GPU not free{where}: {result.message}", err=True)
    record_free(_unit(unit), result)
    sys.exit(result.exit_code)


# --------------------------------------------------------------------- wait-port

@main.command("wait-port")
@click.option("--port", type=int, required=True)
@click.option("--host", default="127.0.0.1")
@click.option("--timeout", default="60s")
def wait_port(port: int, host: str, timeout: str) -> None:
    """Wait until the port is free; name who holds it if it is not."""
    from .ports import port_holders, wait_port_free
    started = time.monotonic()
    first = port_holders(port)
    if first:
        for info in first:
            click.echo(f"infer-units: port {port} held by {info.describe()}; waiting", err=True)
    if wait_port_free(host, port, _duration(timeout, "--timeout")):
        if first:
            click.echo(f"infer-units: port {port} free after "
                       f"{(time.monotonic() - started) * 1000:.0f} ms", err=True)
        return
    holders_now = port_holders(port)
    who = "; ".join(i.describe() for i in holders_now) if holders_now else \
        "a process out of sight (another network namespace?)"
    _fail(f"port {port} still in use after {timeout}: {who}", exitcodes.TIMED_OUT)


# --------------------------------------------------------------------- wait-ready

@main.command("wait-ready")
@click.option("--url", required=True)
@click.option("--pid", type=int, default=None, help="The server's main pid ($MAINPID).")
@click.option("--timeout", default="20min")
@click.option("--interval", default="1s")
def wait_ready(url: str, pid: int | None, timeout: str, interval: str) -> None:
    """Wait until URL answers 2xx; fail at once if the server dies."""
    from .ready import wait_ready as wait
    from .systemd import main_exit_status
    result = wait(url, pid, _duration(timeout, "--timeout"), _duration(interval, "--interval"))
    if result.ready:
        return
    if result.server_exited:
        status = main_exit_status(os.environ.get("INVOCATION_ID"), pid)
        code = status if status and 0 < status < 256 else exitcodes.CONFIG_ERROR
        _fail(f"{result.reason}" + (f"; exit status {status}" if status else ""), code)
    _fail(result.reason, exitcodes.TIMED_OUT)


# --------------------------------------------------------------------- p2p-check

@main.command("p2p-check")
@click.option("--gpus", "selector", required=True)
@click.option("--env-file", required=True)
@click.option("--python", "python", default=sys.executable,
              help="Interpreter with torch (the engine's).")
@click.option("--timeout", default="90s")
def p2p_check(selector: str, env_file: str, python: str, timeout: str) -> None:
    """Copy-and-compare between every GPU pair; NCCL_P2P_DISABLE=1 on failure."""
    from .metrics import record_p2p
    from .p2p import check_p2p
    _b, gpus = _gpus(selector)
    verdict = check_p2p(gpus, env_file, python, _duration(timeout, "--timeout"))
    record_p2p(os.path.basename(env_file).removesuffix(".env"), verdict)


# --------------------------------------------------------------------- drain

@main.command()
@click.option("--timeout", default="60s")
@click.option("--term-grace", default="10s")
@click.option("--ignore", multiple=True)
@click.option("--dry-run", is_flag=True)
def drain(timeout: str, term_grace: str, ignore: tuple[str, ...], dry_run: bool) -> None:
    """Stop every infer-units service and reap every /dev/nvidia* holder (before a driver reload)."""
    from .drain import drain as run_drain
    code = run_drain(_duration(timeout, "--timeout"), _duration(term_grace, "--term-grace"),
                     ignore, dry_run)
    sys.exit(code)
