"""Reaping the users of a set of GPUs: SIGTERM, grace, SIGKILL, and waiting on
pidfds until they are gone, then confirming with the GPU backend.

Measured on H200 (DESIGN.md): GPU memory comes back 70-200 ms after /proc
shows the fds closed, and a pidfd becomes readable within 1 ms of that, so the
pidfd is the event to wait on; the backend's process list is the confirmation.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field

from . import exitcodes
from .attribution import FOREIGN, IGNORED, OWN, SERVICE, Attribution, Holder, attribute
from .gpus import Backend, Gpu
from .pidwait import PidSet
from .procinfo import read_proc, read_stat, wchan
from .progress import Progress

# How often to re-ask the backend while it still lists a pid whose pidfd said
# "exited" (NVML lags the exit by well under this on H200).
CONFIRM_POLL_S = 0.002


@dataclass
class Action:
    pid: int
    signal: str
    why: str
    cmdline: str
    at_s: float

    def as_json(self) -> dict[str, object]:
        return {"pid": self.pid, "signal": self.signal, "why": self.why,
                "cmdline": self.cmdline, "at_s": round(self.at_s, 4)}


@dataclass
class ReapResult:
    exit_code: int = exitcodes.CLEAN
    actions: list[Action] = field(default_factory=list)
    blocked_by: list[Holder] = field(default_factory=list)
    left: list[dict[str, object]] = field(default_factory=list)
    ignored: list[Holder] = field(default_factory=list)
    seconds: float = 0.0
    message: str = ""

    def as_json(self) -> dict[str, object]:
        return {"exit": self.exit_code, "seconds": round(self.seconds, 4),
                "message": self.message,
                "actions": [a.as_json() for a in self.actions],
                "blocked_by": [h.as_json() for h in self.blocked_by],
                "ignored": [h.as_json() for h in self.ignored],
                "left": self.left}


@dataclass
class ReapPolicy:
    foreign: str = "kill"          # kill | wait | fail
    term_grace: float = 10.0
    timeout: float = 60.0
    ignore: tuple[str, ...] = ()
    dry_run: bool = False


def _log(message: str) -> None:
    print(f"infer-units: {message}", file=sys.stderr, flush=True)


def describe_left(pids: list[int]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for pid in pids:
        stat = read_stat(pid)
        if stat is None:
            continue
        state = stat[0]
        note = {"D": "uninterruptible (D-state): likely stuck in the driver",
                "Z": "zombie", "T": "stopped"}.get(state, "")
        info = read_proc(pid)
        out.append({"pid": pid, "state": state, "wchan": wchan(pid), "note": note,
                    "unit": info.unit if info else None,
                    "cmdline": info.cmdline if info else ""})
    return out


class Reaper:
    def __init__(self, backend: Backend, gpus: list[Gpu], own_unit: str | None,
                 policy: ReapPolicy) -> None:
        self.backend = backend
        self.gpus = gpus
        self.own_unit = own_unit
        self.policy = policy
        self.started = time.monotonic()
        self.result = ReapResult()

    def _attribute(self) -> Attribution:
        return attribute(self.backend, self.gpus, self.own_unit, self.policy.ignore)

    def _now(self) -> float:
        return time.monotonic() - self.started

    def _signal(self, pids: PidSet, holder: Holder, signum: int, why: str) -> None:
        name = signal.Signals(signum).name
        i = holder.info
        self.result.actions.append(Action(i.pid, name, why, i.cmdline, self._now()))
        verb = "would send" if self.policy.dry_run else "sending"
        _log(f"{verb} {name} to pid {i.pid} (user {i.user}, {i.unit or i.container or 'no unit'}, "
             f"GPU {','.join(map(str, sorted(holder.use.gpus)))}): {i.cmdline} -- {why}")
        if not self.policy.dry_run:
            pids.signal(i.pid, signum)

    def run(self) -> ReapResult:
        try:
            self._run()
        finally:
            self.result.seconds = self._now()
        return self.result

    def _run(self) -> None:
        policy = self.policy
        deadline = self.started + policy.term_grace + policy.timeout
        rounds = 0
        with PidSet() as pids:
            while True:
                rounds += 1
                seen = self._attribute()
                self.result.ignored = seen.of_kind(IGNORED)
                blockers = seen.of_kind(SERVICE)
                if blockers:
                    self._block(blockers, "blocked", "GPU held by another infer-units service")
                    return
                own, foreign = seen.of_kind(OWN), seen.of_kind(FOREIGN)
                if foreign and policy.foreign == "fail":
                    self._block(foreign, "blocked (foreign = fail)",
                                "foreign GPU users and foreign = \"fail\"")
                    return
                to_kill = own + (foreign if policy.foreign == "kill" else [])
                to_wait = foreign if policy.foreign == "wait" else []
                if not to_kill and not to_wait:
                    self.result.message = "GPUs free"
                    return
                if policy.dry_run:
                    for h in to_kill:
                        self._signal(pids, h, signal.SIGTERM, h.why)
                    for h in to_wait:
                        _log(f"would wait for pid {h.info.pid}: {h.info.cmdline} -- {h.why}")
                    self.result.message = "dry run"
                    return
                for h in to_kill + to_wait:
                    pids.add(h.info)
                self._reap_round(pids, to_kill, deadline)
                if time.monotonic() >= deadline or rounds > 50:
                    self._time_out(pids)
                    return

    def _block(self, holders: list[Holder], label: str, message: str) -> None:
        """Exit 2, touching nothing."""
        self.result.blocked_by = holders
        self.result.exit_code = exitcodes.BLOCKED
        for h in holders:
            _log(f"{label}: pid {h.info.pid} {h.why}; not touching it: {h.info.cmdline}")
        self.result.message = message

    def _reap_round(self, pids: PidSet, to_kill: list[Holder], deadline: float) -> None:
        """TERM, wait for grace, KILL, wait for exit, then until the backend agrees."""
        grace_end = min(deadline, time.monotonic() + self.policy.term_grace)
        for h in to_kill:
            if h.info.pid in pids.fds:
                self._signal(pids, h, signal.SIGTERM, h.why)
        progress = Progress("waiting for GPU users to exit")
        started = time.monotonic()

        def tick(alive: list[int]) -> None:
            progress.update(f"pid {', '.join(map(str, alive))}, "
                            f"{time.monotonic() - started:.0f}s")

        alive = set(pids.wait(grace_end, tick))
        for h in to_kill:
            if h.info.pid in alive:
                self._signal(pids, h, signal.SIGKILL,
                             f"still alive {self.policy.term_grace:g}s after SIGTERM")
        pids.wait(deadline, tick)
        gone = {h.info.pid for h in to_kill} - set(pids.alive())
        # The exit is the event; the backend (NVML) must stop listing the pid too.
        while gone and time.monotonic() < deadline:
            listed = set(self.backend.users(self.gpus)) & gone
            if not listed:
                break
            time.sleep(CONFIRM_POLL_S)
        if gone:
            _log(f"exited: pid {', '.join(map(str, sorted(gone)))} "
                 f"({self._now() * 1000:.0f} ms since start)")

    def _time_out(self, pids: PidSet) -> None:
        seen = self._attribute()
        stuck = [h.info.pid for h in seen.holders if h.kind in (OWN, FOREIGN)]
        self.result.left = describe_left(sorted(set(stuck) | set(pids.alive())))
        if not self.result.left:
            self.result.message = "GPUs free"
            return
        self.result.exit_code = exitcodes.TIMED_OUT
        for item in self.result.left:
            _log(f"timed out: pid {item['pid']} still holds the GPU, state {item['state']}, "
                 f"wchan {item['wchan']} {item['note']}".rstrip()
                 + f" ({item['unit'] or 'no unit'}): {item['cmdline']}")
        self.result.message = "timed out with holders left"
