"""`infer-units liveness-probe`: one health probe of a model that is active,
run by infer-units-liveness@<name>.timer; after `failures` failed probes in a row it
restarts the model through systemd, after `max-restarts` such restarts within
`restart-window` it stops the model and leaves it failed.

State (consecutive failures, last answers, liveness restarts) lives in
<dir>/<name>.liveness.json (dir: RUN_DIR, or INFER_UNITS_LIVENESS_DIR),
written atomically; `infer-units status` reads it.  The restarts that count
toward the cap are CLOCK_BOOTTIME stamps of this boot (with its boot id),
not wall-clock ones: a clock set back would keep a restart in the window
for longer (an hour back: seven hours of a six-hour window; an RTC a year
ahead corrected by NTP: a year), and leave a model failed at a cap it never
reached; set forward, it would forget restarts early.  The other stamps
(last probe, last restart, cap) are wall clock, for people to read.

A probe that answers 2xx asks systemd only whether the unit's automatic
restarts are to be forgotten (a healthy server starts the crash-loop
back-off over); the unit's state is asked only when a probe fails.

Its options are parsed with the other unit hooks' (hooks/unit.py); systemd
is asked through facts/systemd.py (Liveness).
"""

from __future__ import annotations

import copy
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ...generator.atomicfile import ensure_dir, read_text, write_file
from ...generator.durations import format_seconds
from ...generator.liveness import cap_marker, state_dir
from ...generator.log import JOURNAL_SOCKET, NAMES_UNIT, NOTICE, journal_send, priority
from ..facts.probe import Answer, http_probe  # re-exported: the one probe
from ..facts.procinfo import boot_id
from ..facts.systemd import ModelState

log = logging.getLogger(__name__)


def _name(unit: str) -> str:
    return unit.removesuffix(".service")


def boottime() -> float:
    """The clock the restart window is measured on: it never jumps, and it
    counts a suspend, as a window of hours should."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def window_restarts(state: dict[str, Any], now: float, clock: float,
                    window: float) -> list[float]:
    """The liveness restarts within `window` before `clock` (CLOCK_BOOTTIME),
    saved back into `state` as such stamps of this boot.  A state without
    this boot's id holds wall-clock stamps (written before the restarts were
    kept on CLOCK_BOOTTIME): each is moved onto this clock by its wall-clock
    age at `now`, and one from the future is taken as just now.  (Another
    boot's stamps, in a state directory that outlived a boot, read that way
    are decades old: a reboot starts the window over.)"""
    stamps = [float(t) for t in state.get("restarts", [])
              if isinstance(t, (int, float)) and not isinstance(t, bool)]
    me = boot_id()
    if state.get("boot_id") != me or not me:
        stamps = [clock - max(0.0, now - t) for t in stamps]
    recent = [t for t in stamps if 0.0 <= clock - t < window]
    state["restarts"], state["boot_id"] = recent, me
    return recent


def state_path(unit: str, directory: str | None = None) -> str:
    return os.path.join(directory or state_dir(dict(os.environ)), f"{_name(unit)}.liveness.json")


# ------------------------------------------------------------------ the probe

# The probe itself is facts/probe.py's (readiness uses the same one).


# ------------------------------------------------------------------ state

def load_state(path: str) -> dict[str, Any]:
    try:
        state = json.loads(read_text(path) or "{}")
        return state if isinstance(state, dict) else {}
    except (OSError, ValueError):
        return {}


def save_state(path: str, state: dict[str, Any], durable: bool = False) -> None:
    write_file(path, json.dumps(state, indent=1, sort_keys=True), durable=durable,
               dir_mode=0o755)


@contextmanager
def state_lock(unit: str, directory: str) -> Iterator[None]:
    """Held from reading a model's state to saving it: the liveness probe and
    the group watch both count restarts in it, and a count read before the
    other's save and written after it would undo that restart.  Root's alone
    (0600), so no other account can take it and hold a restart back."""
    with ensure_dir(directory, 0o755) as d:
        fd = d.open_regular(f"{_name(unit)}.liveness.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ------------------------------------------------------------------ the decision

@dataclass(frozen=True)
class Config:
    unit: str
    url: str
    interval: float
    failures: int
    timeout: float
    max_restarts: int
    restart_window: float
    post: str | None = None     # a one-token completion to POST instead of a GET


OK, SKIP, COUNT, RESTART, CAP = "ok", "skip", "count", "restart", "cap"


def decide(state: dict[str, Any], now: float, answer: Answer, model: ModelState | None,
           cfg: Config, clock: float | None = None) -> str:
    """Update `state` with one probe and say what to do.  `model` is None when
    the probe passed (systemd is not asked then) or systemd cannot be asked.
    `now`: wall clock, for the record; `clock`: CLOCK_BOOTTIME, for the
    restart window (default: `now`, for a caller with one clock)."""
    state["last_probe"] = {"time": now, "ok": answer.ok, "answer": answer.text,
                           "seconds": round(answer.seconds, 3)}
    if answer.ok:
        state["consecutive_failures"] = 0
        state["answers"] = []
        state["last_ok"] = now
        state.pop("capped", None)           # started again since the cap
        return OK
    if model is None or not model.serving:
        # Not counted: failures count within one running invocation only.
        state["consecutive_failures"] = 0
        state["answers"] = []
        state["last_probe"]["skipped"] = ("systemd unavailable" if model is None
                                          else model.describe())
        return SKIP
    if state.get("invocation") != model.invocation:
        state["invocation"] = model.invocation
        state["consecutive_failures"] = 0
        state["answers"] = []
    failures = int(state.get("consecutive_failures", 0)) + 1
    state["consecutive_failures"] = failures
    state["answers"] = (list(state.get("answers", [])) + [answer.text])[-cfg.failures:]
    if failures < cfg.failures:
        return COUNT
    recent = window_restarts(state, now, now if clock is None else clock, cfg.restart_window)
    return RESTART if len(recent) < cfg.max_restarts else CAP


def record_restart(state: dict[str, Any], now: float, why: str,
                   clock: float | None = None) -> None:
    state["restarts"] = list(state.get("restarts", [])) + [now if clock is None else clock]
    state["boot_id"] = boot_id()
    state["restarts_total"] = int(state.get("restarts_total", 0)) + 1
    state["last_restart"] = {"time": now, "why": why}
    state["consecutive_failures"] = 0
    state["answers"] = []


def record_cap(state: dict[str, Any], now: float, why: str) -> None:
    # The window starts afresh: whoever starts it again has looked at it.
    state["restarts"] = []
    state["capped"] = {"time": now, "why": why}
    state["consecutive_failures"] = 0
    state["answers"] = []


def _span(seconds: float) -> str:
    return format_seconds(seconds, "large")


def restart_or_cap(unit: str, directory: str, state: dict[str, Any], now: float, why: str,
                   max_restarts: int, restart_window: float, invocation: str,
                   systemd: Any, clock: float | None = None) -> str | None:
    """The one way a model is restarted for liveness (its probe, the group
    watch): restart it through systemd, or at max-restarts liveness restarts
    within restart-window stop it and leave it failed.  Call with
    state_lock() held and `state` just loaded.  RESTART or CAP once systemd
    took the job; None when it did not (said, and the state put back).

    The restart (or the cap) is saved, fsynced, before systemd is asked:
    asking may end the caller at once (the group watch is PartOf= the model,
    any hook can be killed), and a restart asked for but not yet counted is
    one the cap never sees."""
    path = state_path(unit, directory)
    clock = now if clock is None else clock
    window_restarts(state, now, clock, restart_window)
    before = copy.deepcopy(state)
    count = len(state["restarts"])
    marker = cap_marker(_name(unit), directory)
    if count < max_restarts:
        record_restart(state, now, why, clock)
        save_state(path, state, durable=True)
        journal_line(f"liveness: restarting {unit}: {why} (liveness restart {count + 1} of "
                     f"{max_restarts} within {_span(restart_window)})", logging.WARNING, unit)
        failed = systemd.try_restart(unit)
        action, doing = RESTART, "restart it"
    else:
        # The marker tells the model's ExecStopPost to leave it failed.
        write_file(marker, invocation, dir_mode=0o755)
        record_cap(state, now, why)
        save_state(path, state, durable=True)
        journal_line(f"liveness: stopping {unit} and leaving it failed: {why}; {count} "
                     f"liveness restarts within {_span(restart_window)} is the cap "
                     f"(max-restarts = {max_restarts}); start it by hand once fixed "
                     f"(systemctl start {unit})", logging.ERROR, unit)
        failed = systemd.stop(unit)
        action, doing = CAP, "stop it at the restart cap"
    if failed is None:
        return action
    if action == CAP:
        os.unlink(marker)
    state.clear()
    state.update(before)
    save_state(path, state, durable=True)
    journal_line(f"liveness: could not {doing} ({unit}): {failed}; not counted", logging.ERROR,
                 unit)
    return None


def why_line(state: dict[str, Any], cfg: Config) -> str:
    answers = "; ".join(state.get("answers", []))
    what = "one-token generations" if cfg.post is not None else "health probes"
    return (f"{state.get('consecutive_failures', 0)} {what} in a row failed "
            f"(every {_span(cfg.interval)}, timeout {_span(cfg.timeout)}; last answers: "
            f"{answers}) at {cfg.url}")


# ------------------------------------------------------------------ logging

def journal_line(message: str, level: int, unit: str,
                 path: str | None = None) -> bool:
    """One journal entry that `journalctl -u <model>` shows (OBJECT_SYSTEMD_UNIT=,
    trusted from root) as well as `-u <name>-liveness`; logged (stdout) if no
    journal."""
    path = path or os.environ.get("INFER_UNITS_JOURNAL_SOCKET") or JOURNAL_SOCKET
    if journal_send({"MESSAGE": message, "PRIORITY": str(priority(level)),
                     "SYSLOG_IDENTIFIER": "infer-units-liveness", "OBJECT_SYSTEMD_UNIT": unit,
                     "INFER_UNITS_UNIT": unit}, path):
        return True
    log.log(level, message, extra=NAMES_UNIT)
    return False


# ------------------------------------------------------------------ one run

def run_probe(cfg: Config, systemd: Any, directory: str | None = None,
              now: float | None = None, clock: float | None = None) -> str:
    """Probe once, decide, act, save; returns the action taken."""
    directory = directory or state_dir(dict(os.environ))
    path = state_path(cfg.unit, directory)
    # Probed before the state is read: the group watch may count a restart
    # meanwhile, and the state is read and saved under one lock.
    answer = http_probe(cfg.url, cfg.timeout, cfg.post)
    now = time.time() if now is None else now
    clock = boottime() if clock is None else clock
    model = None if answer.ok else systemd.model_state(cfg.unit)
    with state_lock(cfg.unit, directory):
        state = load_state(path)
        state.update(unit=cfg.unit, url=cfg.url, interval=cfg.interval, failures=cfg.failures,
                     timeout=cfg.timeout, max_restarts=cfg.max_restarts,
                     restart_window=cfg.restart_window)
        before = (state.get("consecutive_failures", 0), bool(state.get("capped")))
        restarted = False
        action = decide(state, now, answer, model, cfg, clock)
        marker = cap_marker(_name(cfg.unit), directory)
        if action == OK and os.path.lexists(marker):
            os.unlink(marker)       # left by a cap whose stop did not run its ExecStopPost
        if action == OK and before[0]:
            log.log(NOTICE, f"{cfg.unit}: health probe passed again after {before[0]} failed "
                    f"({answer.text} in {answer.seconds:.1f}s)", extra=NAMES_UNIT)
        if action == OK:
            forgot = systemd.forget_restarts(cfg.unit)
            if forgot:
                journal_line(f"liveness: {cfg.unit} is healthy after {forgot} automatic "
                             f"restart{'s' if forgot != 1 else ''}: the crash-loop back-off "
                             "starts over", NOTICE, cfg.unit)
        if action == COUNT:
            log.log(NOTICE, f"{cfg.unit}: health probe {state['consecutive_failures']}/"
                    f"{cfg.failures} failed: {answer.text}", extra=NAMES_UNIT)
        elif action == SKIP and model is not None:
            log.info(f"{cfg.unit} is {model.describe()}: probe not counted ({answer.text})",
                     extra=NAMES_UNIT)
        elif action in (RESTART, CAP):
            assert model is not None
            restarted = restart_or_cap(cfg.unit, directory, state, now, why_line(state, cfg),
                                       cfg.max_restarts, cfg.restart_window, model.invocation,
                                       systemd, clock) == RESTART
        save_state(path, state)
    if before != (state.get("consecutive_failures", 0), bool(state.get("capped"))) or restarted:
        from .metrics import record_liveness
        record_liveness(cfg.unit, state, restarted)
    return action


# ------------------------------------------------------------------ status

def view(model: Any) -> dict[str, Any] | None:
    """`infer-units status`'s liveness entry of a model: None when off."""
    live = getattr(model, "liveness", None)
    if live is None:
        return None
    from ...generator.render import health_url
    if health_url(model) is None:
        return None
    # The probe's directory is the model's [env] (INFER_UNITS_LIVENESS_DIR), as it runs.
    state = load_state(state_path(model.unit_name,
                                  state_dir({**os.environ, **model.env})))
    now = time.time()
    last = state.get("last_probe")
    return {
        "interval": live.interval, "failures": live.failures, "timeout": live.timeout,
        "max_restarts": live.max_restarts, "restart_window": live.restart_window,
        "last_probe": last,
        "last_probe_age_s": round(now - last["time"], 1) if last else None,
        "consecutive_failures": int(state.get("consecutive_failures", 0)),
        "last_answers": state.get("answers", []),
        "restarts_in_window": len(window_restarts(dict(state), now, boottime(),
                                                  live.restart_window)),
        "restarts_total": int(state.get("restarts_total", 0)),
        "last_restart": state.get("last_restart"),
        "capped": state.get("capped"),
    }


def cell(entry: dict[str, Any] | None) -> str:
    """The LIVENESS column: "ok 12s ago", "2/4 failed: HTTP 503", "capped", "off"."""
    if entry is None:
        return "off"
    restarts = entry["restarts_total"]
    tail = f", {restarts} restart{'s' if restarts != 1 else ''}" if restarts else ""
    if entry["capped"]:
        return "capped: stopped" + tail
    last = entry["last_probe"]
    if not last:
        return "no probe yet" + tail
    age = entry["last_probe_age_s"]
    if last["ok"]:
        return f"ok {age:.0f}s ago" + tail
    if entry["consecutive_failures"]:
        return (f"{entry['consecutive_failures']}/{entry['failures']} failed: "
                f"{last['answer'][:24]}" + tail)
    return f"not counted ({last.get('skipped', last['answer'])[:24]})" + tail
