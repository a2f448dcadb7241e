"""The commands generated units run: pre-start, wait-ready, wait-free,
liveness-probe, group-watch (helpers/commands.py lists them).

Each parses its argv with argparse (hooks/parser.py) and never imports click:
`infer-units pre-start ...` reaches them through helpers/entry.py, after the
server's environment is scrubbed (helpers/hookenv.py).  What they do lives in
facts/, decide/ and act/, shared with the operator commands.  Their options
take choices and defaults from generator/settings.py, as the model files do.
"""

from __future__ import annotations

import argparse
import errno
import functools
import logging
import os
import pwd
import signal
import sys
import time
from typing import TYPE_CHECKING, Callable

from ...generator import settings
from ...generator.log import NOTICE, PROJECT
from .. import argtypes, exitcodes
from ..argtypes import unit_name
from ..decide.claims import GpuClaims
from ..die import die
from ..facts.gpus import Backend, Gpu
from .parser import HookParser, checked

if TYPE_CHECKING:
    from ..act.groupwatch import Watched


log = logging.getLogger(__name__)


class _LastError(logging.Handler):
    """The last error line a hook logged, for its closing line (_explained)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.message = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()


_last = _LastError()


def _explained(main: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """A failing hook's last journal line says what its exit code means:
    systemd names exit statuses after their LSB meanings (2 INVALIDARGUMENT,
    3 NOTIMPLEMENTED), which are not ours (helpers/exitcodes.py)."""
    @functools.wraps(main)
    def run(argv: list[str]) -> int:
        _last.message = ""
        logging.getLogger(PROJECT).addHandler(_last)
        try:
            code = main(argv)
        finally:
            logging.getLogger(PROJECT).removeHandler(_last)
        # Only where systemd's name misleads: 1 shows as FAILURE, which it is.
        meaning = exitcodes.explained(code) if code in (exitcodes.BLOCKED,
                                                        exitcodes.TIMED_OUT) else ""
        if meaning:
            log.error(f"{meaning}: {_last.message}" if _last.message else meaning)
        return code
    return run


_duration = checked(argtypes.duration)
_port = checked(argtypes.port)
_unit = checked(argtypes.unit)
_count = checked(argtypes.count)


def _gpus_or_exit(selector: str) -> tuple[Backend, list[Gpu]]:
    from ..facts.gpumemory import chosen
    from ..facts.gpus import GpuError
    try:
        return chosen(selector)
    except GpuError as e:
        die(str(e))


# ------------------------------------------------------------------ pre-start

def _refuse_without_restart(unit: str | None,
                            settle: Callable[[], object] | None = None) -> None:
    """Blocked: cancel our own start job so Restart=on-failure does not retry
    until the other service lets go of the GPUs and then take them unasked.
    `settle`: waits for pre-start's start-limit question, first: SIGTERM is
    ignored below, process-wide, and a systemctl its thread ran would
    inherit that and outlive the stop's SIGTERM."""
    from ..act.metrics import record_refused
    from ..facts.procinfo import read_cgroup, unit_of_cgroup
    record_refused(unit)
    if not unit or unit_of_cgroup(read_cgroup(os.getpid())) != unit:
        return      # run by hand, not as the unit's ExecStartPre: no start job to cancel
    if settle is not None:
        try:
            settle()
        except Exception:  # noqa: BLE001 - pre-start's finally says it, as an error line
            pass
    from ..facts.systemd import cancel_own_start
    # The stop job SIGTERMs us.  A Python handler runs only between bytecodes
    # and can lose that race (the hook then ends by 15/TERM): ignore
    # the signal instead, so we always leave with "blocked" (exit 2) ourselves,
    # at once after the cancel.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    reason = _last.message        # the closing line names why, not this consequence
    # systemctl says only "Job for X canceled." (our stop job replaced its
    # start job): this line names the reason and where the operator looks.
    name = unit.removesuffix(".service")
    why = reason.removeprefix(f"start of {unit} refused: ") or "see above"
    log.error(f"start of {unit} refused; no automatic restart: {why} "
              f"(`infer-units status {name}` says why; `systemctl start {unit}` again once "
              "that is fixed)")
    _last.message = reason
    why_not = cancel_own_start(unit)
    if why_not is not None:
        log.warning(f"could not cancel the start of {unit} ({why_not}): Restart= may retry it")


@_explained
def pre_start(argv: list[str]) -> int:
    p = HookParser("pre-start",
                   description="ExecStartPre: claim the unit's GPUs, reap them, wait until "
                               "they and the port are free, run the P2P self-test.")
    p.option("--unit", required=True, type=_unit)
    p.option("--gpus", help='GPUs to clean: "0,1", UUIDs, PCI ids or "all"')
    p.option("--model-path", help="the model's path on this host (an absolute `model`): "
                                  "missing, the start is refused with no automatic restart")
    p.option("--foreign", choices=settings.REAP_FOREIGN,
             default=settings.default("reap.foreign"))
    p.option("--term-grace", type=_duration, default=settings.default("reap.term-grace"))
    p.option("--timeout", type=_duration, default=settings.default("reap.timeout"))
    p.option("--ignore", action="append", default=[])
    p.option("--port", dest="ports", action="append", type=_port, default=[],
             help="a TCP port the server binds (repeatable: the HTTP port first, then every "
                  "port the engine derives from it); each must be free")
    p.option("--host", default=settings.default("host"), type=checked(argtypes.host),
             help="the address the server binds its HTTP port (the first --port) on; the "
                  "others are bound on every address")
    p.option("--env-file", help="where resolved CUDA_VISIBLE_DEVICES / P2P results go")
    p.option("--resolve-gpus", action="store_true",
             help="write CUDA_VISIBLE_DEVICES for GPUs named by UUID or PCI id: their "
                  "indexes in PCI order")
    p.option("--p2p", action="store_true", help="run the P2P self-test")
    p.option("--python", default=sys.executable, help="interpreter with torch")
    p.option("--user", help="the model's user: the model path is looked at and the "
                            "self-test runs as them, never as root")
    p.option("--p2p-env", action="append", default=[], metavar="NAME=VALUE",
             help="the server's environment ([env]) for the self-test")
    p.option("--p2p-off-args", default="",
             help="server argv that P2P off needs beyond NCCL_P2P_DISABLE=1 "
                  "(e.g. --disable-custom-all-reduce), written to the env file")
    p.option("--wait-rendezvous", metavar="HOST:PORT", type=checked(argtypes.host_port),
             help="multi-node worker: then wait (unbounded) until the head forms a "
                  "group there")
    p.option("--head-url", type=checked(argtypes.http_url),
             help="multi-node worker: the head's health URL (its HTTP port refuses "
                  "while the head forms a group)")
    p.option("--p2p-off-env", action="append", default=[], metavar="NAME=VALUE",
             help="environment that P2P off needs beyond NCCL_P2P_DISABLE=1 "
                  "(e.g. VLLM_ALLREDUCE_USE_FLASHINFER=0), written to the env file")
    p.option("--p2p-ok-env", action="append", default=[], metavar="NAME=VALUE",
             help="environment for a start whose self-test found P2P working "
                  "(e.g. VLLM_SKIP_P2P_CHECK=1), written to the env file")
    p.option("--accept-health", type=checked(argtypes.health_checks), default=(),
             metavar="CHECK,...", help="[health] accept: health checks whose errors do "
                                       "not refuse the start")
    p.option("--restart-sec", type=_duration,
             help="systemd < 254: RestartSec=, the crash-loop back-off's first wait")
    p.option("--restart-steps", type=int, default=0,
             help="systemd < 254: RestartSteps=; pre-start waits out the back-off beyond "
                  "RestartSec= on an automatic restart (act/backoff.py)")
    p.option("--restart-max-delay", type=_duration,
             help="systemd < 254: RestartMaxDelaySec=, the back-off's ceiling")
    p.option("--root-dir", help=argparse.SUPPRESS)   # tests: a fake /proc, /sys, /dev
    a = p.read(argv)
    unit = unit_name(a.unit)
    from ..decide.fence import refusal
    fenced = refusal(unit)
    if fenced:            # `infer-units drain`: nothing starts until `resume`
        log.error(fenced)
        _refuse_without_restart(unit)
        return exitcodes.BLOCKED
    missing = _missing_model(a.model_path, unit, a.user) if a.model_path else None
    if missing:
        log.error(missing)
        _refuse_without_restart(unit)
        return exitcodes.CONFIG_ERROR
    if a.restart_steps and a.restart_sec and a.restart_max_delay:
        # Before anything is claimed: a crash loop waits holding nothing.
        from ..act.backoff import wait_out
        from ..facts.systemd import restarts_since_asked
        wait_out(unit, a.restart_sec, a.restart_steps, a.restart_max_delay,
                 restarts_since_asked)
    started = time.monotonic()
    # StartLimitBurst= is for crash loops: a start someone asked for is not
    # counted.  Asked of systemd beside the checks, waited for before leaving.
    from ..act.startlimit import forgive_asked_start_meanwhile
    forgiven = forgive_asked_start_meanwhile(unit)
    try:
        return _pre_start(a, unit, started, forgiven)
    finally:
        try:
            forgiven()
        except Exception as e:  # noqa: BLE001 - best effort: never decides the start's outcome
            log.error(f"start-limit question failed: {type(e).__name__}: {e}")


def _missing_model(path: str, unit: str, user: str | None) -> str | None:
    """Why the model's path is missing on this host, or None.  A stat and
    nothing more, with the rights of the account the server runs as (its
    `user`; root only for a model without one): root's stat through a link
    that account placed would tell it what exists in root's files.  Only an
    answer that the path is not there refuses (a dangling link, a symbolic
    link loop, a file where a directory is named); any other (no permission,
    root squashed on NFS, an I/O error) is the server's to meet, and is said
    as a warning."""
    account = None
    if user and os.geteuid() == 0:
        try:
            account = pwd.getpwnam(user)
        except KeyError:
            log.warning(f"model: {path}: not looked at: the model's user {user} is not an "
                        "account here")
            return None
    if account is not None and account.pw_uid == 0:
        account = None
    code = _stat_as(path, account)
    if code == 0:
        return None
    as_whom = f" as {account.pw_name}" if account is not None else ""
    if code == _DANGLING:
        why = "a symbolic link whose target is missing"
    elif code in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
        why = os.strerror(code)
    else:
        reason = "the look failed" if code == _UNKNOWN else os.strerror(code)
        log.warning(f"model: {path}: cannot tell{as_whom} whether it exists ({reason}); "
                    "the server will")
        return None
    name = unit.removesuffix(".service")
    return (f"model: {path} does not exist on this host ({why}{as_whom}; `infer-units cat "
            f"{name}` shows the file that sets `model`: fix it there, or put the model at "
            "that path)")


# _stat_as's answers besides 0 (there) and stat's errno: a symbolic link
# whose target is missing, and a look that could not be made.
_DANGLING, _UNKNOWN = 255, 254


def _look(path: str) -> int:
    try:
        os.stat(path)
        return 0
    except OSError as e:
        if e.errno == errno.ENOENT and os.path.islink(path):
            return _DANGLING
        return e.errno if e.errno and 0 < e.errno < _UNKNOWN else _UNKNOWN


def _stat_as(path: str, account: pwd.struct_passwd | None) -> int:
    """_look(path) as `account` (None: as ourselves): a child drops to its
    uid, gid and groups (as systemd's User= gives them) and looks; only the
    answer's number comes back, so root never follows a path the account
    controls, and learns, and says, no more than the account could see."""
    if account is None:
        return _look(path)
    groups = os.getgrouplist(account.pw_name, account.pw_gid)
    pid = os.fork()
    if pid == 0:            # the child: nothing but the drop, the look and _exit
        code = _UNKNOWN
        try:
            os.setgroups(groups)
            os.setresgid(account.pw_gid, account.pw_gid, account.pw_gid)
            os.setresuid(account.pw_uid, account.pw_uid, account.pw_uid)
            code = _look(path)
        finally:
            os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return code if 0 <= code <= _DANGLING else _UNKNOWN


def _pre_start(a: argparse.Namespace, unit: str, started: float,
               settle: Callable[[], object]) -> int:
    """pre-start after the fence: what the last stop left in the unit's own
    cgroup, health, park (multi-node worker), claim, then the start checks."""
    from ..act.reaper import sweep_own_cgroup
    sweep_own_cgroup(unit)
    from ..decide.fence import refusal
    claims = None
    gpus: list[Gpu] = []
    if a.env_file:
        from ..act.envfile import EnvFileError, read_env_file
        try:
            read_env_file(a.env_file)     # unusable: say so before touching anything
        except EnvFileError as e:
            log.error(str(e))
            return exitcodes.CONFIG_ERROR
    if a.gpus is not None:       # --gpus "" is a usage error, not "nothing to do"
        from ..facts.gpumemory import chosen
        from ..facts.gpus import GpuError
        try:
            b, gpus = chosen(a.gpus)
        except GpuError as e:
            # No driver, or GPUs this host does not have: no retry helps.
            log.error(str(e))
            _refuse_without_restart(unit, settle)
            return exitcodes.CONFIG_ERROR
        if not _healthy_enough(b, gpus, unit, a.accept_health, a.root_dir):
            _refuse_without_restart(unit, settle)
            return exitcodes.BLOCKED
    if a.wait_rendezvous:
        # A multi-node worker parks here, unbounded, until its head forms a
        # group: before it claims or reaps anything, so that while it waits
        # its GPUs are free for any other model (which then wins them: the
        # claim below refuses this start, by name).
        from ..act.rendezvous import wait_rendezvous
        if a.gpus is not None:
            from ..act.reaper import reap_own_leftovers
            # What is left of this unit's last run goes first: systemd's kill
            # of the cgroup can fail, and a restart's stop leaves the
            # reaping to this start (wait-free), which may park for hours.
            left = reap_own_leftovers(b, gpus, unit, a.timeout, tuple(a.ignore))
            if left.actions:
                log.info(f"reaped {len({x.pid for x in left.actions})} process(es) of {unit}'s "
                         f"last run before parking, after {left.seconds * 1000:.0f} ms")
            if left.exit_code != exitcodes.CLEAN:
                log.error(f"cannot park: {left.message}")
                return left.exit_code
            # A claim of this unit's that outlived its run (a crash before
            # wait-free) would read as live while the unit is activating.
            GpuClaims(gpus, unit).release()
        wait_rendezvous(a.wait_rendezvous, a.head_url)
        fenced = refusal(unit)       # a drain began while it waited
        if fenced:
            log.error(fenced)
            _refuse_without_restart(unit, settle)
            return exitcodes.BLOCKED
        started = time.monotonic()       # what follows is the start checks proper
    if a.gpus is not None:
        from ..decide.claims import ClaimError
        claims = GpuClaims(gpus, unit)
        try:
            conflicts = claims.acquire()
        except ClaimError as e:
            log.error(f"cannot claim GPU {','.join(str(g.index) for g in gpus)}: {e}")
            return exitcodes.TIMED_OUT if e.timed_out else exitcodes.CONFIG_ERROR
        if conflicts:
            for line in conflicts:
                log.error(f"blocked: {line}")
            _refuse_without_restart(unit, settle)
            return exitcodes.BLOCKED
    code = _start_checks(a, unit, claims, settle)
    if code != exitcodes.CLEAN:
        if claims is not None:
            claims.release()      # a failed start holds no GPU
        return code
    from ..act.metrics import record_checks_passed
    record_checks_passed(unit)
    log.info(f"start checks passed in {(time.monotonic() - started) * 1000:.0f} ms")
    return exitcodes.CLEAN


def _healthy_enough(b: Backend, gpus: list[Gpu], unit: str, accept: tuple[str, ...],
                    root: str | None) -> bool:
    """The health checks of the model's GPUs (health.py): an error-level
    finding refuses the start (journal: err), unless `[health] accept` names
    its check; warnings and accepted errors go to the journal as warnings."""
    from ..act.metrics import record_gpu_health
    from ..decide.health import check_gpus, gate, line
    report = check_gpus(b, gpus, root)
    record_gpu_health(report)
    refusing, logged = gate(report, accept)
    for f in logged:
        log.warning(line(f, accepted=f.check in accept))
    for f in refusing:
        log.error(f"refused: {line(f)}")
    if refusing:
        checks = list(dict.fromkeys(f.check for f in refusing))
        quoted = ", ".join(f'"{c}"' for c in checks)
        log.error(f"start of {unit} refused: GPU health ({', '.join(checks)}); `infer-units doctor` "
                  f"shows every check; to start anyway: [health] accept = [{quoted}]")
    return not refusing


def _start_checks(a: argparse.Namespace, unit: str, claims: GpuClaims | None,
                  settle: Callable[[], object]) -> int:
    """Reap, env file, port, P2P: pre-start after the GPUs are claimed."""
    gpus = claims.gpus if claims is not None else []
    if claims is not None:
        from ..act.envfile import EnvFileError, write_visible_devices
        from ..facts.gpus import backend
        from ..act.metrics import record_reap
        from ..act.reaper import Reaper, ReapPolicy
        result = Reaper(backend(), gpus, unit, ReapPolicy(a.foreign, a.term_grace, a.timeout,
                                                          tuple(a.ignore))).run()
        record_reap(unit, result)
        gpu_list = ",".join(str(g.index) for g in gpus)
        log.log(logging.INFO if result.exit_code == exitcodes.CLEAN else logging.ERROR,
                f"reap GPU {gpu_list}: {result.message} after {result.seconds * 1000:.0f} ms")
        if result.exit_code == exitcodes.BLOCKED:
            _refuse_without_restart(unit, settle)
        if result.exit_code != exitcodes.CLEAN:
            return result.exit_code
        if a.resolve_gpus and a.env_file:
            try:
                write_visible_devices(a.env_file, gpus, backend().gpus())
            except EnvFileError as e:
                log.error(str(e))
                return exitcodes.CONFIG_ERROR
    if a.ports:
        from ..act.portwait import wait_ports
        code = wait_ports(a.host, a.ports, unit, a.foreign, a.timeout)
        if code == exitcodes.BLOCKED:
            _refuse_without_restart(unit, settle)
        if code != exitcodes.CLEAN:
            return code
    if a.p2p and claims is not None and a.env_file:
        from ..act.envfile import EnvFileError
        from ..act.metrics import record_p2p
        from ..act.p2p import check_p2p
        try:
            record_p2p(unit, check_p2p(gpus, a.env_file, a.python, off_args=a.p2p_off_args,
                                       off_env=dict(v.partition("=")[::2]
                                                    for v in a.p2p_off_env),
                                       user=a.user,
                                       server_env=dict(v.partition("=")[::2]
                                                       for v in a.p2p_env),
                                       ok_env=dict(v.partition("=")[::2]
                                                   for v in a.p2p_ok_env)))
        except EnvFileError as e:
            log.error(str(e))
            return exitcodes.CONFIG_ERROR
    return exitcodes.CLEAN


# ------------------------------------------------------------------ wait-ready

def wait_ready(argv: list[str]) -> int:
    p = HookParser("wait-ready",
                   description="ExecStartPost: wait until URL answers 2xx; fail at once if "
                               "the server (PID) dies.")
    p.option("--url", required=True, type=checked(argtypes.http_url))
    p.option("--pid", type=checked(argtypes.pid))
    p.option("--timeout", type=_duration, default=settings.default("ready.timeout"))
    p.option("--interval", type=_duration, default=settings.default("ready.interval"))
    p.option("--probe-timeout", type=_duration, default=10.0,
             help="how long one health request may take (SGLang's /health generates "
                  "a token before it answers)")
    a = p.read(argv)
    from ..act.ready import wait_ready as wait
    result = wait(a.url, a.pid, a.timeout, a.interval, a.probe_timeout)
    if result.ready:
        return exitcodes.CLEAN
    if result.stopped:
        # A stop or restart while loading is no failure of the start: exit 0
        # (a hook that died by the stop's SIGTERM failed the unit).
        log.info(f"{result.reason} ({result.seconds:.1f}s after ExecStartPost began)")
        return exitcodes.CLEAN
    if result.server_exited:
        from ..facts.procinfo import read_cgroup, unit_of_cgroup
        from ..facts.systemd import main_exit_status
        own_unit = unit_of_cgroup(read_cgroup(os.getpid()))
        status = main_exit_status(own_unit or "", os.environ.get("INVOCATION_ID"), a.pid)
        if status and 0 < status < 256:
            # The closing line says whose code this is: not one of ours.
            log.error(f"{result.reason}; exit {status} = the server's own exit status")
            return status
        log.error(f"{result.reason}; exit 1 (the server's exit status is unknown)")
        return exitcodes.CONFIG_ERROR
    log.error(f"exit 3 = timed out: {result.reason}")
    return exitcodes.TIMED_OUT


# ------------------------------------------------------------------ known-answer

def known_answer_parser() -> HookParser:
    p = HookParser("known-answer",
                   description="ExecStartPost, after wait-ready: one greedy request compared "
                               "with the answer recorded for this model on this host; a "
                               "mismatch refuses the start (--on-mismatch refuse).")
    from ..act.canary import declare_options
    declare_options(p.option, checked)
    return p


@_explained
def known_answer(argv: list[str]) -> int:
    a = known_answer_parser().read(argv)
    from ..act.canary import ERROR, MISMATCH, Result, check, options_of, server_argv, stopping
    opts = options_of(a)
    from ..act.metrics import record_canary
    from ..facts.systemd import SystemdUnavailable
    try:
        why_not = stopping(opts.unit, a.pid)
        if why_not is None:
            result = check(opts, server_argv(opts.unit))
            if result.verdict == ERROR:
                why_not = stopping(opts.unit, a.pid)    # stopped while it asked
        if why_not is not None:
            log.info(f"known answer: not checked: {why_not}")
            return exitcodes.CLEAN
    except SystemdUnavailable as e:
        result = Result(ERROR, f"no usable answer: systemd: {e}", 0.0)
    except OSError as e:      # the record (UnsafePath included)
        result = Result(ERROR, f"record not written: {e}", 0.0)
    record_canary(opts.unit, result)
    name = opts.unit.removesuffix(".service")
    line = f"known answer: {result.message} ({result.seconds * 1000:.0f} ms)"
    if result.verdict not in (MISMATCH, ERROR):
        log.log(logging.INFO if result.verdict == "match" else NOTICE, line)
        return exitcodes.CLEAN
    if opts.on_mismatch == "warn":
        log.warning(f"{line}; [canary] on-mismatch = \"warn\": starting anyway")
        return exitcodes.CLEAN
    if result.verdict == ERROR:
        log.error(f"{line}; the start fails (Restart= tries again)")
        return exitcodes.CONFIG_ERROR
    log.error(f"{line}; if the new answer is right (a change the key cannot see), `infer-units "
              f"canary {name} --accept` records it once the model runs")
    _refuse_without_restart(opts.unit)
    return exitcodes.BLOCKED


# ------------------------------------------------------------------ wait-free

@_explained
def wait_free(argv: list[str]) -> int:
    p = HookParser("wait-free",
                   description="ExecStopPost: wait until the unit's own processes (orphaned "
                               "workers included) are gone and their memory is back; other "
                               "users of the GPUs are reported, not waited on.")
    p.option("--gpus", required=True)
    p.option("--unit", type=_unit)
    p.option("--timeout", type=_duration, default=60.0,
             help="keep it under TimeoutStopSec: systemd kills a hook that outlives it")
    p.option("--ignore", action="append", default=[])
    p.option("--result", default="", help="$SERVICE_RESULT, for the log")
    p.option("--liveness-cap", metavar="MARKER",
             help="liveness' restart-cap marker: this stop fails (exit 1) when it "
                  "names this invocation; removed whatever it names")
    a = p.read(argv)
    capped = _liveness_capped(a.liveness_cap) if a.liveness_cap else False
    unit = unit_name(a.unit) if a.unit else None
    if unit and not capped and _restarting(unit):
        # The unit's own pre-start comes next: it reaps what is left of this
        # run and waits until the GPUs are free, under the claim this run
        # keeps, so waiting here too would only put a second wait (and a
        # second interpreter's imports) on every restart's path.  systemd
        # SIGKILLs what is left of the cgroup as soon as this hook ends.
        log.info(f"{unit} is restarting: its start reaps and waits for GPU {a.gpus}"
                 + (f" ({unit} stopped: {a.result})" if a.result else ""))
        return exitcodes.CLEAN
    from ..act.metrics import record_free
    from ..act.reaper import reap_own_leftovers
    b, gpus = _gpus_or_exit(a.gpus)
    result = reap_own_leftovers(b, gpus, unit, a.timeout, tuple(a.ignore))
    record_free(unit, result)
    where = f" ({unit} stopped: {a.result})" if a.result else ""
    gpu_list = ",".join(str(g.index) for g in gpus)
    if result.exit_code == exitcodes.CLEAN:
        if unit:
            GpuClaims(gpus, unit).release()
        others = len(result.reported) + len(result.unaccounted)
        log.info(f"GPU {gpu_list} free after {result.seconds * 1000:.0f} ms{where}"
                 if not others else
                 f"GPU {gpu_list}: {unit or 'the unit'}'s processes gone after "
                 f"{result.seconds * 1000:.0f} ms{where}; {others} other user(s) left, "
                 "not waited on (the next start handles them per [reap] foreign)")
    else:   # the reaper has logged each holder left, with why
        log.error(f"GPU not free{where}: {result.message}")
    if capped and result.exit_code == exitcodes.CLEAN:
        log.error(f"{unit or 'the unit'} was stopped by liveness at its restart cap: "
                  "left failed")
        return exitcodes.CONFIG_ERROR
    return result.exit_code


def _restarting(unit: str) -> bool:
    """Whether this stop is the first half of a restart (`systemctl restart`,
    liveness' try-restart): asked of systemd only as the unit's own hook
    (decide/identity.py), over the private bus; any doubt is "no", and the
    stop waits as every other stop does.  An automatic restart (Restart=)
    has no job yet while the stop runs: it waits too.  A restart replaced by
    a stop after this hook ran (or whose start fails before its pre-start)
    is not waited for: systemd has SIGKILLed the cgroup, and the kept claim
    is stale once the unit is inactive (decide/claims.py claim_live)."""
    if not os.environ.get("INVOCATION_ID"):
        return False
    from ..decide.identity import own_cgroup_if
    if own_cgroup_if(unit) is None:
        return False
    from ..facts.systemd import SystemdUnavailable, pending_job_type, sigkills_leftovers
    try:
        # Only where systemd itself kills the old run's leftovers before the
        # start: with KillMode=process they would hold the GPUs, unreported,
        # should the start never come (the restart replaced by a stop).
        return pending_job_type(unit) == "restart" and sigkills_leftovers(unit)
    except SystemdUnavailable:
        return False


def _liveness_capped(marker: str) -> bool:
    """Whether liveness stopped this invocation at its restart cap (its probe
    writes the marker, naming $INVOCATION_ID, just before it stops the unit).
    The marker is removed whatever it names, so a stale one never fails a
    later, ordinary stop.  Here rather than in a /bin/sh ExecStopPost=: one
    process fewer on every stop."""
    try:
        os.lstat(marker)
    except FileNotFoundError:
        return False         # every stop but liveness' at its cap: nothing more to import
    except OSError:
        pass                 # unreadable: said and removed below
    from ...generator.atomicfile import UnsafePath, read_text
    try:
        named = read_text(marker, 4096)
    except (OSError, UnsafePath, UnicodeDecodeError) as e:
        named = None
        log.warning(f"liveness cap marker {marker} unreadable ({e}): removed")
    try:
        os.unlink(marker)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning(f"liveness cap marker {marker} not removed: {e}")
    invocation = os.environ.get("INVOCATION_ID", "")
    return bool(invocation) and named is not None and named.strip() == invocation


@_explained
def liveness_probe(argv: list[str]) -> int:
    p = HookParser("liveness-probe",
                   description="One liveness probe of an active model (run by "
                               "infer-units-liveness@<name>.service, whose drop-in the "
                               "generator writes with every setting); restarts it through "
                               "systemd after FAILURES failed probes in a row.")
    p.option("--unit", type=_unit, required=True)
    p.option("--url", type=checked(argtypes.http_url))
    p.option("--interval", type=_duration, default=settings.default("liveness.interval"),
             help="for the log only")
    p.option("--failures", type=_count, default=settings.default("liveness.failures"))
    p.option("--timeout", type=_duration, default=10.0)
    p.option("--max-restarts", type=_count,
             default=settings.default("liveness.max-restarts"))
    p.option("--restart-window", type=_duration,
             default=settings.default("liveness.restart-window"))
    p.option("--state-dir", default=None)
    p.option("--post", default=None, metavar="JSON",
             help="POST this body (a one-token completion) instead of a GET")
    a = p.read(argv)
    from ..act.liveness import Config, run_probe
    from ..facts.systemd import Liveness
    unit = unit_name(a.unit)
    if a.url is None:
        # The template unit alone: its model's drop-in is missing.
        log.error(f"{unit}: cannot probe: no --url; the generator gives every setting in a drop-in "
                  "of this unit for a model with liveness on (systemctl daemon-reload)")
        return exitcodes.CONFIG_ERROR
    cfg = Config(unit, a.url, a.interval, max(1, a.failures), a.timeout,
                 max(0, a.max_restarts), a.restart_window, a.post)
    try:
        run_probe(cfg, Liveness(), a.state_dir)
    except OSError as e:
        log.error(f"{unit}: liveness state not written: {e}")
        return exitcodes.CONFIG_ERROR
    return exitcodes.CLEAN


def watched_of(argv: list[str]) -> Watched:
    """group-watch's argv (the generator's drop-in) as what the watch knows."""
    p = HookParser("group-watch",
                   description="Run by infer-units-group@<name>.service, whose drop-in the "
                               "generator writes with every setting: restart a rank of a "
                               "multi-node model whose group lost a rank.")
    p.option("--unit", type=_unit, required=True)
    p.option("--user", default="root", help="the server's account: its sockets are the ranks'")
    p.option("--hosts", required=True, help="every host, in rank order, comma-separated")
    p.option("--rank", type=_count, required=True, help="this host's")
    p.option("--rendezvous", required=True, metavar="HOST:PORT",
             help="the group's rendezvous (the head's)")
    p.option("--max-restarts", type=_count, default=settings.default("liveness.max-restarts"))
    p.option("--restart-window", type=_duration,
             default=settings.default("liveness.restart-window"))
    a = p.read(argv)
    from ...generator.nodes import Nodes
    from ...generator.urls import parse_host_port
    from ..act.groupwatch import Watched
    hosts = tuple(a.hosts.split(","))
    if not 0 <= a.rank < len(hosts):
        p.error(f"--rank {a.rank}: not a rank of --hosts ({len(hosts)} hosts)")
    try:
        host, port = parse_host_port(a.rendezvous)
    except ValueError as e:
        p.error(f"--rendezvous: {e}")
    return Watched(unit_name(a.unit), a.user, Nodes(hosts, a.rank, host, port, ""),
                   a.max_restarts, a.restart_window)


@_explained
def group_watch(argv: list[str]) -> int:
    from ..act.groupwatch import run as watch
    return watch(watched_of(argv))

