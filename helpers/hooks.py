"""The three commands generated units run: pre-start, wait-ready, wait-free.

They run on every start and stop, so they are parsed with argparse and never
import click (which alone costs a third of a hook's start-up); `infer-units
pre-start ...` reaches them through helpers/entry.py.  What they do lives in
reaper.py, ports.py, p2p.py and ready.py, shared with the operator commands.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from ..generator.durations import parse_duration
from . import exitcodes
from .ports import wait_port_reporting

def _say(message: str) -> None:
    print(f"infer-units: {message}", file=sys.stderr, flush=True)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors are exit 1 here, not argparse's 2
        self.print_usage(sys.stderr)
        _say(f"{self.prog}: {message}")
        sys.exit(exitcodes.CONFIG_ERROR)


def gpus_or_exit(selector: str):  # type: ignore[no-untyped-def]
    from .gpus import GpuError, backend, select
    try:
        b = backend()
        return b, select(b.gpus(), selector)
    except GpuError as e:
        _say(str(e))
        sys.exit(exitcodes.CONFIG_ERROR)


def unit_name(name: str | None) -> str | None:
    if name and not name.endswith((".service", ".scope")):
        return name + ".service"
    return name


# ------------------------------------------------------------------ pre-start

def _refuse_without_restart(unit: str | None) -> None:
    """Blocked: cancel our own start job so Restart=on-failure does not retry
    until the other service lets go of the GPUs and then take them unasked."""
    from .procinfo import read_cgroup, unit_of_cgroup
    if not unit or unit_of_cgroup(read_cgroup(os.getpid())) != unit:
        _say(f"not in {unit}'s cgroup ({read_cgroup(os.getpid())}): no start job to cancel")
        return      # run by hand, not as the unit's ExecStartPre
    from .systemd import cancel_own_start
    # The stop job SIGTERMs us: still leave with "blocked".
    signal.signal(signal.SIGTERM, lambda *_: os._exit(exitcodes.BLOCKED))
    # Said first: the stop job's SIGTERM can end us before StopUnit returns.
    _say(f"start of {unit} refused; no automatic restart (systemctl start it again "
         "once the GPUs are free)")
    why_not = cancel_own_start(unit)
    if why_not is not None:
        _say(f"could not cancel the start of {unit} ({why_not}): Restart= may retry it")


def pre_start(argv: list[str]) -> int:
    p = _Parser(prog="infer-units pre-start",
                description="ExecStartPre: reap the unit's GPUs, wait until they and the "
                            "port are free, run the P2P self-test.")
    p.add_argument("--unit", required=True)
    p.add_argument("--gpus", help='GPUs to clean: "0,1", UUIDs, PCI ids or "all"')
    p.add_argument("--foreign", choices=("kill", "wait", "fail"), default="kill")
    p.add_argument("--term-grace", type=_duration, default=10.0)
    p.add_argument("--timeout", type=_duration, default=60.0)
    p.add_argument("--ignore", action="append", default=[])
    p.add_argument("--port", type=int)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--env-file", help="where resolved CUDA_VISIBLE_DEVICES / P2P results go")
    p.add_argument("--resolve-pci", action="store_true",
                   help="write CUDA_VISIBLE_DEVICES (UUIDs) for PCI selectors")
    p.add_argument("--p2p", action="store_true", help="run the P2P self-test")
    p.add_argument("--python", default=sys.executable, help="interpreter with torch")
    p.add_argument("--p2p-off-args", default="",
                   help="server argv that P2P off needs beyond NCCL_P2P_DISABLE=1 "
                        "(e.g. --disable-custom-all-reduce), written to the env file")
    p.add_argument("--wait-rendezvous", metavar="HOST:PORT",
                   help="multi-node worker: then wait (unbounded) until the head listens there")
    p.add_argument("--p2p-off-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment that P2P off needs beyond NCCL_P2P_DISABLE=1 "
                        "(e.g. VLLM_ALLREDUCE_USE_FLASHINFER=0), written to the env file")
    a = p.parse_args(argv)
    unit = unit_name(a.unit)
    started = time.monotonic()
    if a.gpus:
        from .envfile import write_visible_devices
        from .metrics import record_reap
        from .reaper import Reaper, ReapPolicy
        b, gpus = gpus_or_exit(a.gpus)
        result = Reaper(b, gpus, unit, ReapPolicy(a.foreign, a.term_grace, a.timeout,
                                                  tuple(a.ignore))).run()
        record_reap(unit, result)
        gpu_list = ",".join(str(g.index) for g in gpus)
        _say(f"reap GPU {gpu_list}: {result.message} after {result.seconds * 1000:.0f} ms")
        if result.exit_code == exitcodes.BLOCKED:
            _refuse_without_restart(unit)
        if result.exit_code != exitcodes.CLEAN:
            return result.exit_code
        if a.resolve_pci and a.env_file:
            write_visible_devices(a.env_file, gpus)
    if a.port and not wait_port_reporting(a.host, a.port, a.timeout, _say):
        return exitcodes.TIMED_OUT
    if a.p2p and a.gpus and a.env_file:
        from .metrics import record_p2p
        from .p2p import check_p2p
        record_p2p(unit, check_p2p(gpus, a.env_file, a.python, off_args=a.p2p_off_args,
                                     off_env=dict(v.partition("=")[::2] for v in a.p2p_off_env)))
    if a.wait_rendezvous:
        from .rendezvous import wait_rendezvous
        wait_rendezvous(a.wait_rendezvous, _say)
    _say(f"start checks passed in {(time.monotonic() - started) * 1000:.0f} ms")
    return exitcodes.CLEAN


# ------------------------------------------------------------------ wait-ready

def wait_ready(argv: list[str]) -> int:
    p = _Parser(prog="infer-units wait-ready",
                description="ExecStartPost: wait until URL answers 2xx; fail at once if "
                            "the server (PID) dies.")
    p.add_argument("--url", required=True)
    p.add_argument("--pid", type=int)
    p.add_argument("--timeout", type=_duration, default=1200.0)
    p.add_argument("--interval", type=_duration, default=1.0)
    p.add_argument("--probe-timeout", type=_duration, default=10.0,
                   help="how long one health request may take (SGLang's /health generates "
                        "a token before it answers)")
    a = p.parse_args(argv)
    from .ready import wait_ready as wait
    result = wait(a.url, a.pid, a.timeout, a.interval, a.probe_timeout)
    if result.ready:
        return exitcodes.CLEAN
    if result.server_exited:
        from .systemd import main_exit_status
        status = main_exit_status(os.environ.get("INVOCATION_ID"), a.pid)
        _say(result.reason + (f"; exit status {status}" if status else ""))
        return status if status and 0 < status < 256 else exitcodes.CONFIG_ERROR
    _say(result.reason)
    return exitcodes.TIMED_OUT


# ------------------------------------------------------------------ wait-free

def wait_free(argv: list[str]) -> int:
    p = _Parser(prog="infer-units wait-free",
                description="ExecStopPost: wait until nothing but ignored tools uses the "
                            "GPUs; leftovers in the unit's own cgroup are reaped, others "
                            "are waited for and reported.")
    p.add_argument("--gpus", required=True)
    p.add_argument("--unit")
    p.add_argument("--timeout", type=_duration, default=60.0)
    p.add_argument("--ignore", action="append", default=[])
    p.add_argument("--result", default="", help="$SERVICE_RESULT, for the log")
    a = p.parse_args(argv)
    from .metrics import record_free
    from .reaper import Reaper, ReapPolicy
    unit = unit_name(a.unit)
    b, gpus = gpus_or_exit(a.gpus)
    result = Reaper(b, gpus, unit, ReapPolicy("wait", 0.0, a.timeout, tuple(a.ignore))).run()
    record_free(unit, result)
    where = f" ({unit} stopped: {a.result})" if a.result else ""
    if result.exit_code == exitcodes.CLEAN:
        _say(f"GPU {','.join(str(g.index) for g in gpus)} free after "
             f"{result.seconds * 1000:.0f} ms{where}")
    else:   # the reaper has logged each holder left, with why
        _say(f"GPU not free{where}: {result.message}")
    return result.exit_code


COMMANDS = {"pre-start": pre_start, "wait-ready": wait_ready, "wait-free": wait_free}


def run(argv: list[str]) -> int:
    return COMMANDS[argv[0]](argv[1:])
