"""Reaping the users of a set of GPUs: SIGTERM, grace, SIGKILL, and waiting on
pidfds until they are gone, then confirming with the GPU backend.

A killed process's GPU memory comes back well after /proc shows its fds
closed, and its pidfd becomes readable about when the memory is back
(docs/architecture.md), so the pidfd is the event to wait on; the backend's
process list is the confirmation.
"""

from __future__ import annotations

import logging
import os
import time
import signal
from dataclasses import dataclass, field

from .. import exitcodes
from ..decide.attribution import (ANCESTOR, FOREIGN, IGNORED, OWN, SERVICE, Attribution, Holder,
                          attribute)
from ..decide.claims import CGROUP_ROOTS
from ..decide.identity import own_cgroup_if, restarting_unit
from ..facts.gpumemory import describe as describe_unaccounted
from ..facts.systemd import queue_stop
from ..facts.gpus import Backend, Gpu, unseen_message
from .pidwait import PidSet
from ..facts.procinfo import ancestors, read_proc, read_stat, wchan
from .progress import Progress

log = logging.getLogger(__name__)

# How often to re-ask the backend while it still lists a pid whose pidfd said
# "exited" (NVML lags the exit by a little).
CONFIRM_POLL_S = 0.002
# After SIGKILL, how often a cheap backend (NVML) is asked whether the killed
# processes still hold the GPUs: under systemd their memory came back before
# their pidfd became readable (docs/performance.md), so the pidfd alone
# returns late.
KILLED_POLL_S = 0.005
# Memory no visible process accounts for is re-checked at this pace (backing
# off from CONFIRM_POLL_S): it belongs to processes we cannot wait on.
UNACCOUNTED_POLL_MAX_S = 0.1
# The only signals a reaper sends, by the names its journal lines give.
SIGNAL_NAMES: dict[int, str] = {signal.SIGTERM: "SIGTERM", signal.SIGKILL: "SIGKILL"}
# How long a pid the backend lists may be gone from /proc before the GPU's
# device file is searched for a child holding its context (attribution.py):
# well beyond the driver's teardown of a killed context, so a normal exit
# never makes a bystander look like an heir.
HEIR_AFTER_S = 1.0
# wait-free: how long memory may keep coming back after the unit's own
# processes are gone before what is left is reported as someone else's.
SETTLE_S = 0.3


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
    reported: list[Holder] = field(default_factory=list)     # seen, not touched, not waited on
    unaccounted: dict[int, int] = field(default_factory=dict)  # GPU -> MiB at the end
    unseen: int = 0
    seconds: float = 0.0
    message: str = ""

    def as_json(self) -> dict[str, object]:
        return {"exit": self.exit_code, "seconds": round(self.seconds, 4),
                "message": self.message,
                "actions": [a.as_json() for a in self.actions],
                "blocked_by": [h.as_json() for h in self.blocked_by],
                "ignored": [h.as_json() for h in self.ignored],
                "reported": [h.as_json() for h in self.reported],
                "unaccounted_mib": {str(k): v for k, v in sorted(self.unaccounted.items())},
                "unseen": self.unseen,
                "left": self.left}


@dataclass
class ReapPolicy:
    foreign: str = "kill"          # kill | wait | fail | report (wait-free: not waited on)
    term_grace: float = 10.0
    timeout: float = 60.0
    ignore: tuple[str, ...] = ()
    dry_run: bool = False
    # Processes of other infer-units services and of the caller's own parent
    # chain are never touched.  block: exit 2 at once (a start); spare: reap
    # the rest, then exit 2 naming them (drain); report: name them, go on.
    services: str = "block"



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


def sweep_own_cgroup(unit: str, timeout: float = 10.0) -> list[int]:
    """SIGKILL whatever else is in this unit's own cgroup when its start
    begins, and wait until it is gone.  Before ExecStart nothing of the unit
    runs but this hook, so any other process there outlived the last stop:
    systemd 252 can fail to kill a cgroup on a hybrid hierarchy ("Failed to
    kill control group ... Input/output error"), and wait-free, which reaps
    what it leaves, can itself be killed (then the next start failed with
    219/CGROUP).  Only as the unit's own root hook (identity.own_cgroup_if);
    returns the pids signalled."""
    own = own_cgroup_if(unit)
    if own is None:
        return []
    me = os.getpid()
    pids: list[int] = []
    for root in CGROUP_ROOTS:
        try:
            with open(f"{root}{own}/cgroup.procs", encoding="ascii") as f:
                pids = [int(p) for p in f.read().split() if int(p) != me]
            break
        except OSError:
            continue
    signalled = []
    with PidSet() as left:
        for pid in pids:
            info = read_proc(pid)
            if info is None or pid in ancestors(me) or not left.add(info):
                continue
            log.info(f"sending SIGKILL to pid {pid} (user {info.user}, {unit}): {info.cmdline} -- "
                     f"left in {unit}'s own cgroup by its last stop")
            if left.signal(pid, signal.SIGKILL):
                signalled.append(pid)
        still = left.wait(time.monotonic() + timeout)
    if still:
        log.info(f"still in {unit}'s cgroup after SIGKILL: pid {', '.join(map(str, still))}")
    return signalled


def reap_own_leftovers(backend: Backend, gpus: list[Gpu], unit: str | None, timeout: float,
                       ignore: tuple[str, ...] = ()) -> ReapResult:
    """SIGKILL what is left of this unit's own run on its GPUs (no grace: the
    server's stop is over) and wait until it is gone; everyone else is
    reported, never touched or waited on.  wait-free at every stop, and a
    multi-node worker before it parks: systemd's own SIGKILL of the cgroup
    can fail (seen: "Failed to kill control group ... Input/output error",
    systemd 252 on a hybrid cgroup hierarchy, the workers left running)."""
    policy = ReapPolicy("report", 0.0, timeout, ignore, services="report")
    return Reaper(backend, gpus, unit, policy).run()


class Reaper:
    def __init__(self, backend: Backend, gpus: list[Gpu], own_unit: str | None,
                 policy: ReapPolicy) -> None:
        self.backend = backend
        self.gpus = gpus
        self.own_unit = own_unit
        self.policy = policy
        self.started = time.monotonic()
        self.result = ReapResult()
        self._reported: set[int] = set()
        self._poll_s = CONFIRM_POLL_S
        self._settle_until: float | None = None
        self._last_unaccounted = -1
        self._warned_unseen = False
        self._stopped_units: set[str] = set()
        # When each set of holders had its SIGTERM (monotonic): the grace runs
        # from there for every member, the ones that appear later included.
        self._termed: dict[str, float] = {}
        self._confirmed = False     # a look found no holder after a set was signalled
        self._vanished_since: dict[int, float] = {}   # listed pid -> first seen gone
        self._heirs: set[int] = set()   # pids holding a gone pid's context: never listed

    def _attribute(self) -> Attribution:
        now = time.monotonic()
        heirs = any(now - since >= HEIR_AFTER_S for since in self._vanished_since.values())
        seen = attribute(self.backend, self.gpus, self.own_unit, self.policy.ignore, heirs)
        self._vanished_since = {pid: self._vanished_since.get(pid, now) for pid in seen.vanished}
        self._heirs |= seen.heirs
        return seen

    def _now(self) -> float:
        return time.monotonic() - self.started

    def _signal(self, pids: PidSet, holder: Holder, signum: int, why: str) -> None:
        name = SIGNAL_NAMES[signum]
        i = holder.info
        self.result.actions.append(Action(i.pid, name, why, i.cmdline, self._now()))
        verb = "would send" if self.policy.dry_run else "sending"
        log.info(f"{verb} {name} to pid {i.pid} (user {i.user}, "
                 f"{i.unit or i.container or 'no unit'}, GPU {','.join(map(str, sorted(holder.use.gpus)))}): {i.cmdline} -- {why}")
        if not self.policy.dry_run:
            pids.signal(i.pid, signum)

    def _stop_restarting_units(self, foreign: list[Holder]) -> list[Holder]:
        """The foreign holders that are the main process of a system service
        systemd would restart (identity.restarting_unit): their unit is
        stopped through systemd, once, and they are waited for, never
        signalled (a kill is undone after RestartSec=).  Returns them; a
        unit systemd refuses to stop leaves its process to the kill."""
        out = []
        for h in foreign:
            i = h.info
            found = restarting_unit(i.pid, i.cgroup)
            if found is None:
                continue
            unit, restart = found
            why = (f"{h.why}: main process of {unit} (Restart={restart}), which systemd "
                   "would start again after a kill")
            if unit not in self._stopped_units:
                verb = "would stop" if self.policy.dry_run else "stopping"
                log.info(f"{verb} {unit} through systemd for pid {i.pid} (user {i.user}, GPU "
                         f"{','.join(map(str, sorted(h.use.gpus)))}): {i.cmdline} -- {why}")
                why_not = None if self.policy.dry_run else queue_stop(unit)
                if why_not is not None:
                    log.info(f"cannot stop {unit} ({why_not}): signalling pid {i.pid} instead")
                    continue
                self._stopped_units.add(unit)
                self.result.actions.append(Action(i.pid, "StopUnit", f"{unit}: {why}",
                                                  i.cmdline, self._now()))
            out.append(h)
        return out

    def _report(self, holders: list[Holder], label: str) -> None:
        """One line per process, once per run."""
        for h in holders:
            if h.info.pid not in self._reported:
                self._reported.add(h.info.pid)
                self.result.reported.append(h)
                log.info(f"{label}: pid {h.info.pid} {h.why}; not touching it: {h.info.cmdline}")

    def run(self) -> ReapResult:
        try:
            self._run()
        finally:
            self.result.seconds = self._now()
        return self.result

    def _run(self) -> None:
        policy = self.policy
        deadline = self.started + policy.term_grace + policy.timeout
        with PidSet() as pids:
            while True:
                seen = self._attribute()
                self.result.ignored = seen.of_kind(IGNORED)
                self.result.unseen = seen.unseen
                self.result.unaccounted = dict(seen.unaccounted)
                if seen.unseen and os.geteuid() != 0:
                    # Their fds are closed to us: any of them may hold the GPU.
                    self.result.exit_code = exitcodes.CONFIG_ERROR
                    self.result.message = unseen_message(seen.unseen)
                    log.info(self.result.message)
                    return
                if seen.unseen and not self._warned_unseen:
                    self._warned_unseen = True      # root, yet some fds are closed to us
                    log.info(unseen_message(seen.unseen))
                hands_off = seen.of_kind(SERVICE) + seen.of_kind(ANCESTOR)
                if hands_off:
                    if policy.services == "block":
                        self._block(hands_off, "blocked", _hands_off_message(hands_off))
                        return
                    self._report(hands_off, "spared" if policy.services == "spare" else "not ours")
                own, foreign = seen.of_kind(OWN), seen.of_kind(FOREIGN)
                if policy.foreign == "fail" and (foreign or seen.unaccounted):
                    for line in describe_unaccounted(seen.unaccounted):
                        log.info(f"blocked (foreign = fail): {line}")
                    self._block(foreign, "blocked (foreign = fail)",
                                "foreign GPU users and foreign = \"fail\"")
                    return
                if policy.foreign == "report":
                    self._report(foreign, "also on the GPU")
                stopping = self._stop_restarting_units(foreign) if policy.foreign == "kill" else []
                through_systemd = {h.info.pid for h in stopping}
                to_kill = own + ([h for h in foreign if h.info.pid not in through_systemd]
                                 if policy.foreign == "kill" else [])
                to_wait = (foreign if policy.foreign == "wait" else []) + stopping
                if not to_kill and not to_wait:
                    if self._termed and not self._confirmed:
                        # A set we signalled may be between a fork and an exit:
                        # a look lists /proc before it reads each pid's fds, so
                        # a copy born meanwhile whose parent then left is in
                        # neither.  Free only when a second look agrees.
                        self._confirmed = True
                        continue
                    if self._idle(seen, deadline):
                        continue
                    return
                self._confirmed = False
                if policy.dry_run:
                    for h in to_kill:
                        self._signal(pids, h, signal.SIGTERM, h.why)
                    for h in to_wait:
                        log.info(f"would wait for pid {h.info.pid}: {h.info.cmdline} -- {h.why}")
                    self.result.message = "dry run"
                    return
                for h in to_kill + to_wait:
                    pids.add(h.info)
                # The pidfds now pin the processes: ask the backend again, so a
                # pid that stopped using the GPU (or was reused by an innocent
                # process) after the first listing is not signalled.
                self._drop_non_users(pids, to_kill + to_wait)
                self._reap_round(pids, [h for h in to_kill if h.info.pid in pids.fds],
                                 to_kill + to_wait, deadline)
                # No cap on rounds: a holder that forks a copy of itself on
                # SIGTERM is met again in the next round, its set's grace
                # already running, until the timeout (docs/trust.md).
                if time.monotonic() >= deadline:
                    self._time_out(pids)
                    return

    def _idle(self, seen: Attribution, deadline: float) -> bool:
        """No process left to reap or wait for.  True: look again (a listed pid
        is still exiting, or memory no visible process holds may come back);
        False: done, result set."""
        now = time.monotonic()
        pending = bool(seen.vanished) or bool(seen.unaccounted)
        if pending and not self.policy.dry_run and now < deadline:
            if self.policy.foreign == "report" and not seen.vanished:
                # wait-free: memory still coming back is ours; memory that
                # stays is someone else's (another namespace): report it.
                total = sum(seen.unaccounted.values())
                if self._settle_until is None or total < self._last_unaccounted:
                    self._settle_until = min(deadline, now + SETTLE_S)
                self._last_unaccounted = total
                pending = now < self._settle_until
            if pending:
                time.sleep(self._poll_s)
                self._poll_s = min(self._poll_s * 2, UNACCOUNTED_POLL_MAX_S)
                return True
        if seen.unaccounted:
            lines = describe_unaccounted(seen.unaccounted)
            if self.policy.foreign == "report":
                for line in lines:
                    log.info(f"not ours: {line}; not waited on")
            elif self.policy.dry_run:
                for line in lines:
                    log.info(f"would wait: {line}")
                self.result.message = "dry run"
                return False
            else:
                self._time_out(None, seen)
                return False
        elif seen.vanished and not self.policy.dry_run:
            self._time_out(None, seen)
            return False
        if self.policy.dry_run:
            self.result.message = "dry run"
        elif self.policy.services == "spare" and self.result.reported:
            self.result.exit_code = exitcodes.BLOCKED
            self.result.message = ("reaped the rest; left alone: " +
                                   ", ".join(f"pid {h.info.pid} ({h.why})"
                                             for h in self.result.reported))
        else:
            self.result.message = "GPUs free" + (
                f" of this unit's processes ({len(self.result.reported)} other user(s) reported)"
                if self.result.reported else "")
        return False

    def _drop_non_users(self, pids: PidSet, holders: list[Holder]) -> list[int]:
        """Stop tracking (never signal) processes the backend no longer lists.
        Run while their pidfds are open: a pid still listed whose pidfd has not
        exited is the very process we looked at, so the listing is about it."""
        listed = self.backend.users(self.gpus)
        dropped = []
        for h in holders:
            pid = h.info.pid
            if pid not in pids.fds or pid in listed or pid in self._heirs or pids.exited(pid):
                continue
            log.info(f"pid {pid} no longer uses GPU {','.join(map(str, sorted(h.use.gpus)))}; "
                     f"not signalling it: {h.info.cmdline}")
            pids.drop(pid)
            dropped.append(pid)
        return dropped

    def _block(self, holders: list[Holder], label: str, message: str) -> None:
        """Exit 2, touching nothing."""
        self.result.blocked_by = holders
        self.result.exit_code = exitcodes.BLOCKED
        for h in holders:
            log.info(f"{label}: pid {h.info.pid} {h.why}; not touching it: {h.info.cmdline}")
        self.result.message = message

    def _reap_round(self, pids: PidSet, to_kill: list[Holder], tracked: list[Holder],
                    deadline: float) -> None:
        """TERM, wait for grace, KILL, wait for exit, then until the backend
        agrees.  A holder is a set (holder_set): the first member met gets
        SIGTERM and starts the set's grace; a member met later (a copy it
        forked on SIGTERM, with the GPU's fds) gets no SIGTERM of its own,
        and every member still there when the set's grace is over gets
        SIGKILL."""
        now = time.monotonic()
        for h in to_kill:
            key = holder_set(h)
            if key not in self._termed and h.info.pid in pids.fds:
                self._termed[key] = now
        # The latest grace of the sets met in this round: no member is killed
        # before its own set's grace is over.
        grace_end = min(deadline, max([now] + [self._termed[holder_set(h)] + self.policy.term_grace
                                               for h in to_kill if holder_set(h) in self._termed]))
        for h in to_kill:
            if h.info.pid in pids.fds and self._termed.get(holder_set(h)) == now:
                self._signal(pids, h, signal.SIGTERM, h.why)
        progress = Progress("waiting for GPU users to exit")
        started = time.monotonic()

        def tick(alive: list[int]) -> list[int]:
            progress.update(f"pid {', '.join(map(str, alive))}, "
                            f"{time.monotonic() - started:.0f}s")
            # A process may let go of the GPU and live on: stop waiting for it.
            return self._drop_non_users(pids, tracked)

        alive = set(pids.wait(grace_end, tick))
        if alive & {h.info.pid for h in to_kill}:
            self._drop_non_users(pids, to_kill)     # confirm again before SIGKILL
        killed = []
        for h in to_kill:
            if h.info.pid in pids.fds:
                first = h.info.pid in {a.pid for a in self.result.actions if a.signal == "SIGTERM"}
                self._signal(pids, h, signal.SIGKILL,
                             f"still alive {self.policy.term_grace:g}s after SIGTERM" if first
                             else f"its set ({holder_set(h)}) had SIGTERM "
                                  f"{self.policy.term_grace:g}s ago")
                killed.append(h)
        if killed and self.backend.cheap_users:
            # The memory is the event: stop waiting for a killed process as soon
            # as the backend no longer lists it, even before its exit is reported
            # (the others as before, with the usual tick about every second).
            killed_pids = {h.info.pid for h in killed}
            slow_tick = [time.monotonic() + 1.0]

            def let_go(alive: list[int]) -> list[int]:
                listed = self.backend.users(self.gpus)
                done = [pid for pid in alive if pid in killed_pids and pid not in listed
                        and pid not in self._heirs]
                if time.monotonic() >= slow_tick[0]:
                    slow_tick[0] = time.monotonic() + 1.0
                    done += [pid for pid in tick(alive) or () if pid not in done]
                return done
            pids.wait(deadline, let_go, tick_s=KILLED_POLL_S)
        else:
            pids.wait(deadline, tick)
        gone = {h.info.pid for h in to_kill} - set(pids.alive())
        # The exit is the event; the backend (NVML) must stop listing the pid too.
        # A backend that reads /proc (fake, proc) cannot list an exited pid:
        # asking it would cost one scan of every process's fds for nothing.
        while gone and self.backend.cheap_users and time.monotonic() < deadline:
            listed = set(self.backend.users(self.gpus)) & gone
            if not listed:
                break
            time.sleep(CONFIRM_POLL_S)
        if gone:
            log.info(f"exited: pid {', '.join(map(str, sorted(gone)))} "
                     f"({self._now() * 1000:.0f} ms since start)")

    def _time_out(self, pids: PidSet | None, seen: Attribution | None = None) -> None:
        seen = seen or self._attribute()
        self.result.unaccounted = dict(seen.unaccounted)
        stuck = [h.info.pid for h in seen.holders if h.kind in (OWN, FOREIGN)
                 and (self.policy.foreign != "report" or h.kind == OWN)]
        alive = set(pids.alive()) if pids is not None else set()
        self.result.left = describe_left(sorted(set(stuck) | alive))
        self.result.left += [{"pid": pid, "state": "?", "wchan": "?", "unit": None,
                              "note": "listed by the GPU backend but not in /proc",
                              "cmdline": ""} for pid in seen.vanished]
        if self.policy.foreign != "report":
            self.result.left += [{"gpu": index, "unaccounted_mib": mib}
                                 for index, mib in sorted(seen.unaccounted.items())]
        if not self.result.left:
            self._idle(seen, 0.0)
            return
        self.result.exit_code = exitcodes.TIMED_OUT
        for item in self.result.left:
            if "gpu" in item:
                log.info(f"timed out: unaccounted {item['unaccounted_mib']} MiB on GPU "
                         f"{item['gpu']}: used by no visible process (another PID namespace or "
                         "container?)")
                continue
            log.info(f"timed out: pid {item['pid']} still holds the GPU, state {item['state']}, "
                     f"wchan {item['wchan']} {item['note']}".rstrip()
                     + f" ({item['unit'] or 'no unit'}): {item['cmdline']}")
        self.result.message = "timed out with holders left"


def holder_set(holder: Holder) -> str:
    """The set a holder belongs to: the processes of its user on the GPUs
    being reaped (own leftovers: the unit's).  A process cannot leave its
    account the way it can leave its process group (setsid) or pick a name."""
    if holder.kind == OWN:
        return "own leftovers"
    return f"user {holder.info.user}"


def _hands_off_message(holders: list[Holder]) -> str:
    if all(h.kind == ANCESTOR for h in holders):
        return "GPU held by this command's own parent chain"
    return "GPU held by another infer-units service"
