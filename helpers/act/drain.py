"""`infer-units drain` and `resume`: before a driver reload, fence starts,
stop every running infer-units service, and reap every holder of /dev/nvidia*
(not just CUDA users: anything that keeps the module busy), sparing the
ignore list; afterwards lift the fence and start exactly what drain stopped.

The order is what makes the fence hold: the fence is written before the
units are listed, so a unit whose pre-start passed the fence just before is
already activating when listed, and is stopped with the rest; any start
after that (Restart=, a timer, an operator) is refused by its pre-start
(helpers/decide/fence.py).  `--dry-run` runs the same plan with nothing written,
stopped or signalled, and reports it in the same shape (`--json`)."""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import exitcodes
from ..decide import fence
from ..decide.attribution import SERVICE, _service_parent, attribute
from ..decide.identity import is_infer_units_service, service_of
from ..facts.gpus import Backend, FdScan, Gpu, GpuError, GpuUse, backend, fd_holders
from .reaper import ReapPolicy, Reaper

log = logging.getLogger(__name__)

REFCNT = "/sys/module/nvidia/refcnt"
PROC_MODULES = "/proc/modules"
# Every state a unit can be in when drain lists it, and what drain does:
#   active, reloading                          stop it; resume starts it
#   activating (start-pre .. start-post)       stop it; resume starts it
#   activating/auto-restart (Restart= pending) stop it (that cancels the restart); resume
#   deactivating, the stop half of a restart   stop it (the restart job is replaced); resume
#     or a server that exited and is cleaned up before Restart= decides: the same
#   any of those with a stop job pending       an operator's stop: waited for, not resumed
#   inactive or failed with a start job queued stop it (cancels the job); resume
#   inactive, failed                           left alone, not resumed
#   ... unless it left "active" after the fence went up (a restart whose start
#   half the fence refused before the listing): resumed
DOWN = ("inactive", "failed")
SCHEMA_VERSION = 1


class DeviceHolders(Backend):
    """Every process holding any GPU device node counts as a user of every GPU."""

    def __init__(self, base: Backend) -> None:
        self.base = base
        self.name = f"{base.name}+device-files"

    def gpus(self) -> list[Gpu]:
        return self.base.gpus()

    def users(self, gpus: list[Gpu]) -> dict[int, GpuUse]:
        every = {g.index for g in gpus}
        scan = FdScan(set(self.base.device_files()))
        self.unseen = scan.unseen
        return {pid: GpuUse(pid, set(every)) for pid in scan.held}

    def memory(self, gpus: list[Gpu]) -> dict[int, tuple[int, int]]:
        return self.base.memory(gpus)

    def device_files(self) -> list[str]:
        return self.base.device_files()


def module_users(refcnt: str = REFCNT, modules: str = PROC_MODULES) -> tuple[int | None, str]:
    """(users of the nvidia module, where the figure comes from).  The module's
    own refcnt when the kernel exposes it; else the "used by" count of
    /proc/modules (what lsmod prints); None when neither says (module not
    loaded, or unload support compiled out: the count is "-").  Either way
    it counts open device files plus dependent modules (nvidia_uvm,
    nvidia_modeset, nvidia_drm), not processes."""
    try:
        with open(refcnt, encoding="ascii") as f:
            return int(f.read().strip()), refcnt
    except (OSError, ValueError):
        pass
    try:
        with open(modules, encoding="ascii", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and fields[0] == "nvidia":
                    if fields[2].isdigit():
                        return int(fields[2]), f"{modules} ({refcnt} absent)"
                    return None, f"{modules} shows no count ({refcnt} absent: module unload disabled?)"
    except OSError:
        pass
    return None, "nvidia module not loaded"


def describe_module(users: int | None, source: str) -> str:
    if users is None:
        return f"nvidia module refcount unknown: {source}"
    return f"nvidia module refcount {users} (from {source})"



def _service_of(holder: Any) -> str | None:
    return service_of(holder.info.cgroup) or _service_parent(holder.info)


def plan(active_state: str, job_type: str, left_after_fence: bool) -> tuple[bool, bool]:
    """(stop it, resume it) for one infer-units unit: the table above."""
    if active_state in DOWN:
        queued = job_type not in ("", "stop")
        return queued, queued or left_after_fence
    if job_type == "stop":
        return True, left_after_fence
    return True, True


def plan_lines(down: set[str], stop: list[str], again: list[str], already: list[str],
               dry_run: bool) -> list[str]:
    """What drain says of its plan, true of each unit: the units it stops
    (a down one only has its queued start cancelled), those an earlier
    drain stopped (a second drain finds them down, or unloaded), and those that
    left active after the fence went up."""
    lines = []
    earlier = [u for u in already if u not in stop]
    if earlier:
        # (systemd may have unloaded them since: they need not be listed now)
        lines.append("already drained (an earlier drain stopped them): "
                     + ", ".join(earlier) + "; resume starts them")
    for unit in again:
        if unit not in stop and unit not in already:
            lines.append(f"{unit} left active after the fence went up: resume starts it")
    running = [u for u in stop if u not in down]
    queued = [u for u in stop if u in down]
    if running:
        lines.append(("would stop " if dry_run else "stopping ") + ", ".join(running))
    if queued:
        lines.append(("would cancel" if dry_run else "cancelling")
                     + " the queued start of " + ", ".join(queued))
    return lines


def _plan_units(fenced_since: float, fenced_since_monotonic: float | None = None,
                ) -> tuple[list[str], list[str], set[str]]:
    """(units to stop, units resume starts, those of either that are down)
    from one listing of systemd's units.  The fence's moment on
    CLOCK_MONOTONIC where it has one (the wall clock may have been set since)."""
    from ..facts.systemd import left_active_at_us, list_units_with_jobs
    stop, record, down = [], [], set()
    for u in list_units_with_jobs(["*.service"]):
        if not is_infer_units_service(u.name):
            continue
        # Only a unit that is down or being stopped asks systemd one more question.
        asks = u.job_type == "stop" or (u.active_state in DOWN and not u.job_type)
        left = asks and (
            left_active_at_us(u.name) >= fenced_since * 1e6 if fenced_since_monotonic is None
            else left_active_at_us(u.name, monotonic=True) >= fenced_since_monotonic * 1e6)
        halt, again = plan(u.active_state, u.job_type, left)
        if halt:
            stop.append(u.name)
        if again:
            record.append(u.name)
        if u.active_state in DOWN:
            down.add(u.name)
    return stop, record, down


def drain(timeout: float, term_grace: float, ignore: tuple[str, ...],
          dry_run: bool) -> tuple[int, dict[str, Any]]:
    """(exit code, report).  The report has the same keys with and without
    dry_run: "stop" (units), "signal" (pids), "fence"; a dry run's is the
    prediction of the real run's."""
    from ..facts.systemd import SystemdUnavailable, stop_units
    report: dict[str, Any] = {"schema": SCHEMA_VERSION, "dry_run": dry_run,
                              "fence": {"path": fence.path(), "stopped": []},
                              "stop": [], "not_stopped": [], "signal": [],
                              "end_with_units": [], "spare": [], "systemd": None}

    def done(code: int) -> tuple[int, dict[str, Any]]:
        report["exit"] = code
        return code, report

    import time
    since: float = time.time()
    since_monotonic: float | None = time.monotonic()
    if not dry_run:
        try:
            written = fence.write([])      # before listing: see the module's docstring
            since, mono = written["since"], written.get("since_monotonic")
            since_monotonic = float(mono) if isinstance(mono, (int, float)) else None
        except OSError as e:
            log.info(f"cannot fence starts at {fence.path()}: {e.strerror or e}; nothing stopped")
            return done(exitcodes.CONFIG_ERROR)
    try:
        already = fence.merged([])      # what an earlier drain stopped (a second drain)
        services, again, down = _plan_units(since, since_monotonic)
        report["stop"] = services
        if dry_run:
            report["fence"]["stopped"] = fence.merged(again)
        else:
            report["fence"]["stopped"] = fence.write(again)["stopped"]
        for line in plan_lines(down, services, again, already, dry_run):
            log.info(line)
        if services:
            if not dry_run:
                report["not_stopped"] = left = stop_units(services, timeout)
                if left:
                    log.info("did not stop in time: " + ", ".join(left))
    except SystemdUnavailable as e:
        report["systemd"] = str(e)
        report["fence"]["stopped"] = fence.merged([])
        log.info(f"systemd unavailable ({e}); reaping device holders only")
    log.info(("would fence" if dry_run else "fenced") + f" starts: {fence.path()} "
             "(`infer-units resume` lifts it)")
    try:
        view = DeviceHolders(backend())
        gpus = view.gpus()
    except GpuError as e:
        log.info(str(e))
        return done(exitcodes.CONFIG_ERROR)
    if dry_run and report["stop"]:
        # Their processes end with the stop, not by our signals.
        seen = attribute(view, gpus, None, ignore)
        report["end_with_units"] = sorted(h.info.pid for h in seen.of_kind(SERVICE)
                                          if _service_of(h) in report["stop"])
        for pid in report["end_with_units"]:
            log.info(f"pid {pid} would end with its unit's stop")
    # A leftover of an infer-units service (its stop timed out, say) is never
    # touched, but it must not stop the rest from being reaped: spare it,
    # reap everything else, then exit 2 naming it (exit 2 = blocked).
    policy = ReapPolicy(foreign="kill", term_grace=term_grace, timeout=timeout,
                        ignore=ignore, dry_run=dry_run, services="spare")
    result = Reaper(view, gpus, None, policy).run()
    report["signal"] = sorted({a.pid for a in result.actions})
    report["spare"] = sorted({h.info.pid for h in result.ignored + result.reported}
                             - set(report["end_with_units"]))
    report["reap"] = result.as_json()
    remaining = fd_holders(set(view.device_files()))
    spared = {h.info.pid for h in result.ignored}
    users, source = module_users()
    report["module"] = {"users": users, "source": source}
    report["device_holders_left"] = len(remaining)
    log.info(f"{describe_module(users, source)}; {len(remaining)} process(es) hold /dev/nvidia*"
             + (f" ({len(spared)} on the ignore list)" if spared else ""))
    code = exitcodes.CLEAN if dry_run else result.exit_code
    if dry_run:
        log.info("dry run: nothing touched")
    elif code == exitcodes.CLEAN:
        log.info("drained")
    else:
        log.info(f"not drained: {result.message}")
    return done(code)


class _Progress:
    """resume's lines while it waits: one per unit as it becomes active or
    fails, one when a unit is crash-looping (it may loop until the timeout),
    and a line on what is still starting every PERIOD seconds."""

    PERIOD = 60.0

    def __init__(self, units: list[str], wait: float | None) -> None:
        self.units, self.wait = units, wait
        self.said: dict[str, str] = {}
        self.started = self.last_line = time.monotonic()
        self.states: dict[str, str] = {}

    def __call__(self, state: Any) -> None:
        unit = state.name
        self.states[unit] = f"{state.active_state}/{state.sub_state}"
        name = unit.removesuffix(".service")
        if state.active_state in ("active", "failed"):
            key = state.active_state
        elif state.restarts > 0 and state.active_state == "activating":
            key = "looping"
        else:
            key = ""
        if key and self.said.get(unit) != key:
            self.said[unit] = key
            done = sum(1 for k in self.said.values() if k == "active")
            progress = f"({done} of {len(self.units)} active)"
            if key == "active":
                log.info(f"{unit} active {progress}")
            elif key == "failed":
                log.info(f"{unit} failed {progress}: `infer-units status {name}` says why")
            else:
                log.info(f"{unit} is crash-looping ({state.restarts} automatic restart(s)) "
                         f"{progress}: `infer-units status {name}`; waiting for it")
        now = time.monotonic()
        if now - self.last_line >= self.PERIOD:
            self.last_line = now
            waiting = [f"{u} ({s})" for u, s in self.states.items()
                       if not s.startswith(("active/", "failed/"))]
            if waiting:
                bound = f" of {self.wait:.0f}s" if self.wait else ""
                log.info(f"still waiting after {now - self.started:.0f}s{bound} for "
                         + ", ".join(waiting))


def resume(wait: float | None) -> tuple[int, dict[str, Any]]:
    """Lift the fence, then start exactly the units drain stopped (0 when
    all are active; 3 when one failed or is still starting after `wait`)."""
    from ..facts.systemd import SystemdUnavailable, list_unit_states, start_units
    report: dict[str, Any] = {"schema": SCHEMA_VERSION, "fence": fence.path(),
                              "was_fenced": False, "start": [], "states": {}}
    try:
        record = fence.read()
    except fence.FenceError as e:
        fence.lift()
        log.info(f"{e}; lifted it, but cannot tell what drain stopped: start the models yourself")
        report["exit"] = exitcodes.CONFIG_ERROR
        return exitcodes.CONFIG_ERROR, report
    if record is None:
        log.info(f"no fence at {fence.path()}: not drained, nothing to start")
        report["exit"] = exitcodes.CLEAN
        return exitcodes.CLEAN, report
    report["was_fenced"] = True
    units = [u for u in record["stopped"] if isinstance(u, str) and u.endswith(".service")]
    report["start"] = units
    if units:
        try:
            list_unit_states(units)     # systemd must be there to start them: else keep the fence
        except SystemdUnavailable as e:
            log.info(f"cannot start {', '.join(units)}: {e}; the fence stays ({fence.path()})")
            report["exit"] = exitcodes.CONFIG_ERROR
            return exitcodes.CONFIG_ERROR, report
    fence.lift()
    log.info(f"lifted the fence {fence.path()}" + (f"; starting {', '.join(units)}" if units
                                                  else "; drain stopped nothing"))
    if not units:
        report["exit"] = exitcodes.CLEAN
        return exitcodes.CLEAN, report
    try:
        states = start_units(units, wait, _Progress(units, wait))
    except SystemdUnavailable as e:
        log.info(f"cannot start {', '.join(units)}: {e}")
        report["exit"] = exitcodes.CONFIG_ERROR
        return exitcodes.CONFIG_ERROR, report
    report["states"] = states
    bad = {u: s for u, s in states.items()
           if s != "active" and (wait is not None or s.startswith("not started"))}
    for unit, state in bad.items():
        log.info(f"{unit}: {state} (journalctl -u {unit})")
    code = exitcodes.TIMED_OUT if bad else exitcodes.CLEAN
    report["exit"] = code
    return code, report
