"""`infer-units status`: per model, systemd's view (pystemd), its GPUs with
memory and processes, its port, and whether health answers."""

from __future__ import annotations

import os
import re
import time
from typing import Any

from ...generator.build import load_all
from ...generator.durations import format_seconds
from ...generator.errors import one_line
from ...generator.log import IDENT
from ...generator.model import Model
from ...generator.render import health_url
from ..decide.attribution import attribute
from ..facts.gpus import GpuError, backend, select
from ..decide.health import check_gpus, worst
from ..act.canary import view as canary_view
from ..act.liveness import cell as liveness_cell, view as liveness_view
from ..act.metrics import METRICS_DIR_VAR, load_state, record_seen, write_textfile
from ..act.ready import NOT_READY, probe
from ..facts.systemd import SystemdUnavailable, UnitState, unit_state
from .render import file_model_name
from .table import format_table

SCHEMA_VERSION = 1


def _gpu_view(model: Model) -> dict[str, Any]:
    selector = model.gpu_selector()
    if selector is None:
        return {"available": True, "gpus": [], "processes": []}
    try:
        b = backend()
        gpus = select(b.gpus(), selector)
        seen = attribute(b, gpus, own_unit=model.unit_name)
        used = b.memory(gpus)
        health = check_gpus(b, gpus)
    except GpuError as e:
        return {"available": False, "error": str(e), "gpus": [], "processes": []}
    return {
        "available": True, "backend": b.name, "exact": b.exact,
        "unseen": seen.unseen,
        "unaccounted_mib": {str(k): v for k, v in sorted(seen.unaccounted.items())},
        # the same "used" as holders and the reaper (NVML v2: without the
        # driver's own reservation), v1's where v2 is not there
        "gpus": [{"index": g.index, "uuid": g.uuid,
                  "memory_used_mib": used.get(g.index, (g.memory_used_mib,))[0],
                  "memory_total_mib": g.memory_total_mib,
                  # doctor's checks of this GPU: its worst level and what is not ok
                  "health": {"level": worst(health.of_gpu(g.index)),
                             "findings": [f.as_json() for f in health.of_gpu(g.index)
                                          if f.level != "ok"]}} for g in gpus],
        "processes": [{"pid": h.info.pid, "kind": h.kind, "unit": h.info.unit,
                       "gpus": sorted(h.use.gpus),
                       "memory_mib": sum(h.use.memory_mib.values()) or None,
                       "cmdline": h.info.cmdline[:200]} for h in seen.holders],
    }


def _rss_mib(pid: int) -> int | None:
    if not pid:
        return None
    import psutil
    try:
        return psutil.Process(pid).memory_info().rss // (1 << 20)
    except psutil.Error:
        return None


def _port_view(model: Model, unit_active: bool) -> dict[str, Any] | None:
    """Who listens on the model's port when it is not the model: a foreign
    answer is never shown as the model's health."""
    if not model.port:
        return None
    from ..decide.identity import in_unit
    from ..facts.ports import port_users
    users = port_users(model.host, model.port)
    if users is None:
        return {"foreign": [], "out_of_sight": True}
    foreign = [{"pid": i.pid, "comm": i.comm, "user": i.user, "how": how,
                "where": i.unit or i.container or i.cgroup, "cmdline": i.cmdline[:200]}
               for i, how in users if not (unit_active and in_unit(i.cgroup, model.unit_name))]
    return {"foreign": foreign, "out_of_sight": False}


HOOK_PREFIX = f"{IDENT}: "      # generator/log.py's JournalFormatter: every hook line starts so


def hooks_last_error(unit: str, invocation: str = "") -> str | None:
    """The last error line the unit's own hooks wrote (each failing hook's
    closing line says what its exit code means; a refused start's line says
    why), for its latest run (`invocation`), else its last since boot; None
    where there is none or the journal cannot be read.  Asked by the fields
    journald itself sets (_SYSTEMD_UNIT, _SYSTEMD_INVOCATION_ID): the units
    log under the model's name (SyslogIdentifier=), not under infer-units."""
    import subprocess
    runs = ([f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else []) + ["-b"]
    for run in runs:
        try:
            done = subprocess.run(["journalctl", "--no-pager", "-q", "-o", "cat",
                                   f"_SYSTEMD_UNIT={unit}", run, "-p", "err", "-n", "200"],
                                  capture_output=True, text=True, timeout=10, errors="replace")
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0:
            return None
        said = [ln for ln in done.stdout.splitlines() if ln.startswith(HOOK_PREFIX)]
        if said:
            # What the hook printed is escaped here, where it is read.
            return one_line(" ".join(said[-1][len(HOOK_PREFIX):].split()))[:400]
    return None


def systemd_last_exit(unit: str) -> str | None:
    """systemd's own line on how the unit's last process ended ("Control
    process exited, code=exited, status=217/USER"): the last try's real
    result, whichever step it was (Result= is reset while the unit starts
    again, ExecMain* say nothing of a start check that failed).  Asked of
    PID 1's records alone (_PID=1, UNIT=)."""
    import subprocess
    try:
        done = subprocess.run(["journalctl", "--no-pager", "-q", "-o", "cat", "_PID=1",
                               f"UNIT={unit}", "-b", "-n", "50"],
                              capture_output=True, text=True, timeout=10, errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    # One list of exits per try ("Starting X..." opens one); the server's own
    # exit is the story where there is one (wait-ready then exits with its status).
    tries: list[list[re.Match[str]]] = [[]]
    for line in done.stdout.splitlines():
        if line.startswith("Starting "):
            tries.append([])
        elif (match := _EXITED.search(line)) is not None:
            tries[-1].append(match)
    ended = next((t for t in reversed(tries) if t), None)
    if ended is None:
        return None
    who, code, status, name = next((m for m in ended if m.group(1) == "Main"),
                                   ended[-1]).groups()
    step = "main process" if who == "Main" else "a start or stop step (control process)"
    if code == "exited":
        number = int(status)
        meaning = f" ({number}/{_SYSTEMD_STATUSES[number]})" if number in _SYSTEMD_STATUSES else ""
        return f"{step} exit status {number}{meaning}"
    return f"{step} {code} (signal {name or status})"


# systemd's line, as service.c writes it: "Main process exited, code=exited, status=7/NOTRUNNING"
_EXITED = re.compile(r"\b(Main|Control) process exited, code=(\w+), status=(\d+)(?:/(\w+))?")


def crash_looping(sd: dict[str, Any]) -> bool:
    """Restart= is bringing the unit back after a failure: waiting to restart,
    starting again after one, or tearing down a failed try on the way back.
    Never `failed` by design (Restart=always), so `status` counts it as
    failed for its exit code and says so."""
    if not sd.get("available"):
        return False
    again = sd.get("restarts", 0) > 0
    return sd.get("sub_state") == "auto-restart" or \
        (again and sd.get("active_state") == "activating") or \
        (again and sd.get("active_state") == "deactivating"
         and sd.get("result") not in (None, "", "success"))


_MAIN_CODES = {1: "exited", 2: "killed", 3: "dumped core"}
# systemd's own exit statuses for a process it could not start as written
# (systemd.exec(5) "Process Exit Codes"): the server never ran.
_SYSTEMD_STATUSES = {200: "CHDIR: its working directory is missing",
                     203: "EXEC: the program could not be executed",
                     217: "USER: the account `user` names does not exist on this host"}


def last_try(sd: dict[str, Any]) -> str:
    """How the last try ended.  While it starts again systemd has reset Result=
    to success for the new try: then the main process' last exit says it."""
    code, status = sd.get("exec_main_code") or 0, sd.get("exec_main_status") or 0
    main = ""
    if code == 1:
        main = f"main process exit status {status}"
        if status in _SYSTEMD_STATUSES:
            main += f" ({status}/{_SYSTEMD_STATUSES[status]})"
    elif code in _MAIN_CODES:
        main = f"main process {_MAIN_CODES[code]} (signal {status})"
    result = sd.get("result") or "?"
    if sd.get("sub_state") == "auto-restart" or sd.get("active_state") == "failed":
        return f"last result {result}" + (f", {main}" if main and result != "success" else "")
    return f"last try: {main}" if main else "last try: failed before its server started"


def _why(entry: dict[str, Any], fence: dict[str, Any] | None) -> list[str]:
    """What the state alone does not say: a drained host, a crash loop and
    its last exit, a refused or failed start and why, a foreign process on
    the model's port."""
    why: list[str] = []
    sd = entry["systemd"]
    unit = entry["unit"]
    active = sd.get("active_state") == "active"
    if fence is not None and not active:
        since = f" since {fence['since_text']}" if fence.get("since_text") else ""
        why.append(f"drained by `infer-units drain`{since}: starts are refused until "
                   "`infer-units resume`")
    if entry.get("stale"):
        why.append(entry["stale"])
    said = entry.get("last_error")
    # The server's own output (a traceback) is logged at info: -p err would hide it.
    output = f"the server's own output: journalctl -u {unit} -n 50"
    ended = entry.get("last_exit")
    if said and f"timed out: {NOT_READY} " in said:
        # wait-ready gave up and systemd stopped the server: its exit
        # (status 15, SIGTERM) was that stop's, not the reason.
        ended = "the ready timeout stopped it ([ready] timeout)"
    if crash_looping(sd):
        last = f"last try: {ended}" if ended else last_try(sd)
        why.append(f"crash loop: {sd.get('restarts', 0)} automatic restart(s), {last}; "
                   + (f"its hooks' last error: {said}; " if said else "") + output)
    elif sd.get("active_state") == "failed":
        last = f"last result {sd.get('result') or '?'}" + (f", {ended}" if ended else "")
        why.append(f"failed ({last if ended else last_try(sd)})"
                   + (f": {said}" if said else f"; {output}"))
    drain = entry.get("draining")
    if drain:
        why.append(f"draining: stopping for {drain['since_s']:g}s; requests in flight may "
                   f"finish within the [stop] drain of {format_seconds(drain['bound_s'])}, "
                   "then the server is stopped")
    port = entry.get("port_view")
    if port and port["foreign"]:
        who = "; ".join(f"pid {p['pid']} ({p['comm']}, user {p['user']}, {p['where']}, "
                        f"{p['how']})" for p in port["foreign"])
        why.append(f"port {entry['port']} is held by a process not of {unit}: {who}")
    return why


GENERATED = b"# Automatically generated by infer-units-generator"
RELOAD = "run systemctl daemon-reload"


def stale(model: Model, unit_file: str, need_reload: bool, loaded: str = "") -> str | None:
    """Whether the unit systemd runs was generated from other files than the
    model's now: systemd itself notices only the main file (SourcePath=), not
    a drop-in or a host default changed, added or removed since.  The
    generated unit's mtime is when the generator wrote it (at the last
    daemon-reload); its header names the files it applied.  `loaded`:
    systemd's LoadState= of the unit."""
    if need_reload:
        return f"stale: the unit's files changed since systemd loaded it; {RELOAD}"
    if not unit_file:
        if loaded == "not-found":
            return (f"no unit yet: {one_line(model.main_path)} was added since the units were "
                    f"generated; {RELOAD}")
        return None
    try:
        with open(unit_file, "rb") as f:
            generated = os.fstat(f.fileno()).st_mtime_ns
            head = f.read(8192)
    except OSError:
        return None
    if not head.startswith(GENERATED):
        return None             # not the generator's unit (e.g. one in /etc/systemd/system)
    lines = head.decode("utf-8", "replace").splitlines()
    recorded = next((ln[len("# from "):] for ln in lines[:3] if ln.startswith("# from ")), None)
    now = " ".join(model.sources)
    compared = recorded is not None and now.isprintable() and recorded != now
    added = [source for source in model.sources if compared and source not in (recorded or "")]
    if added:
        return f"stale: {one_line(added[0])} was added since the unit was generated; {RELOAD}"
    for source in model.sources:
        try:
            if os.stat(source).st_mtime_ns > generated:
                return f"stale: {one_line(source)} changed since the unit was generated; {RELOAD}"
        except OSError:
            continue
    if compared:
        return (f"stale: a file applied when the unit was generated is gone (it applied "
                f"{one_line(recorded or '')}); {RELOAD}")
    return None


def model_status(model: Model, fence: dict[str, Any] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": model.name, "unit": model.unit_name,
                             "source": model.main_path, "engine": model.engine,
                             "port": model.port, "health_url": health_url(model),
                             "metrics_dir": model.env.get(METRICS_DIR_VAR)}
    try:
        state = unit_state(model.unit_name)
        entry["systemd"] = {"available": True, **state.as_json(),
                            "exec_main_status": state.exec_main_status,
                            "exec_main_code": state.exec_main_code,
                            "invocation_id": state.invocation_id}
        entry["since_s"] = (round(time.time() - state.active_since_us / 1e6, 1)
                            if state.active_since_us and state.active_state == "active" else None)
        entry["main_rss_mib"] = _rss_mib(state.main_pid)
        entry["stale"] = stale(model, state.fragment_path, state.need_daemon_reload,
                               state.load_state)
        entry["draining"] = draining(model, state)
    except SystemdUnavailable as e:
        entry["systemd"] = {"available": False, "error": str(e)}
    entry["gpu"] = _gpu_view(model)
    active = entry["systemd"].get("active_state") == "active"
    entry["port_view"] = _port_view(model, active)
    url = entry["health_url"]
    if url and entry["port_view"] and entry["port_view"]["foreign"]:
        entry["health"] = {"ok": False, "answer": "not the model's: a foreign port holder",
                           "foreign": True}
    elif url:
        ok, answer = probe(url, 2.0)
        entry["health"] = {"ok": ok, "answer": answer}
    else:
        entry["health"] = None
    entry["metrics"] = load_state(model.unit_name)
    entry["canary"] = canary_view(entry["metrics"])
    if model.nodes is not None:
        entry["nodes"] = _nodes_view(model, entry)
    entry["liveness"] = live = liveness_view(model)
    since = entry["systemd"].get("active_since")
    if live and live["last_probe"] and since and live["last_probe"].get("time", 0) < since:
        # A probe of the server before the last (re)start says nothing of this one.
        live["last_probe"], live["last_probe_age_s"] = None, None
    sd = entry["systemd"]
    if sd.get("active_state") == "failed" or crash_looping(sd):
        entry["last_error"] = hooks_last_error(model.unit_name,
                                               sd.get("invocation_id") or "")
        entry["last_exit"] = systemd_last_exit(model.unit_name)
    entry["why"] = _why(entry, fence)
    return entry


def draining(model: Model, state: UnitState) -> dict[str, float] | None:
    """A stop whose server has its SIGTERM and the model's drain window
    (requests in flight finish, new ones are not the server's to take):
    seconds since the stop began, and the drain's bound.  None otherwise."""
    if model.drain <= 0 or state.active_state != "deactivating" or \
            state.sub_state not in ("stop-sigterm", "stop") or not state.active_exit_us:
        return None
    return {"since_s": round(max(0.0, time.time() - state.active_exit_us / 1e6), 1),
            "bound_s": model.drain}


def _nodes_view(model: Model, entry: dict[str, Any]) -> dict[str, Any]:
    """A multi-node model: this host's rank, the head, and the group as this
    host sees it (health is the head's: it answers only for a whole group)."""
    nodes = model.nodes
    assert nodes is not None
    sd = entry["systemd"]
    if entry["health"] and entry["health"]["ok"]:
        group = "healthy"
    elif sd.get("available") and sd.get("sub_state") == "start-pre" and not nodes.is_head:
        group = "parked"        # waiting for the head to form a group
    elif sd.get("available") and sd.get("active_state") == "activating":
        group = "forming"
    else:
        group = "down"
    view: dict[str, Any] = {"rank": nodes.rank, "hosts": list(nodes.hosts),
                            "head": nodes.hosts[0], "group": group}
    if nodes.is_head:
        # The group watch's own reading of which ranks it cannot see.
        from ..act.groupwatch import not_watched, other_ranks
        unseen = other_ranks(nodes)[1]
        if unseen:
            view["ranks"] = {str(rank): not_watched(host) for rank, host in unseen}
    return view


def _fence() -> dict[str, Any] | None:
    from ..decide.fence import FenceError, path, read
    try:
        record = read()
    except FenceError as e:
        return {"path": path(), "error": str(e)}
    return None if record is None else {"path": path(), **record}


def collect(names: list[str]) -> dict[str, Any]:
    """"unknown": names given that no model file has (the CLI exits 1), each
    with the closest known name in "suggestions"."""
    loaded = load_all(names)
    unknown = unknown_names(names, loaded)
    fence = _fence()
    return {"schema": SCHEMA_VERSION,
            "models": [model_status(m, fence) for m in loaded.models],
            "errors": [str(e) for e in loaded.errors],
            # Two models on one GPU or port: both units exist and alternate
            # (the second start is refused while the first holds it), as the
            # generator has them; `check` is where it is an error.
            "shared": [str(e) for e in loaded.conflicts],
            "unknown": unknown,
            "suggestions": suggestions(unknown),
            "fence": fence}


def write_metrics(report: dict[str, Any]) -> None:
    """Each model's up and ready as this report saw them, then the textfile
    in every metrics directory the models' [env] name (or this command's
    INFER_UNITS_METRICS_DIR).  A model systemd could not be asked about
    keeps what the hooks last wrote."""
    directories = {m["metrics_dir"] for m in report["models"] if m["metrics_dir"]}
    if os.environ.get(METRICS_DIR_VAR):
        directories.add(os.environ[METRICS_DIR_VAR])
    for m in report["models"]:
        sd = m["systemd"]
        if sd["available"]:
            health = m["health"]
            record_seen(m["unit"], sd.get("active_state") == "active",
                        bool(health and health["ok"]), bool(m.get("draining")))
    try:
        write_textfile(directories)
    except OSError as e:
        raise SystemExit(f"infer-units: metrics not written: {e}")


def suggestions(unknown: list[str]) -> dict[str, str]:
    """name -> the known model name it is most likely a typo of."""
    if not unknown:
        return {}
    import difflib
    from ...generator.loader import Loader
    known = sorted(Loader().discover()[0])
    close = {n: difflib.get_close_matches(n, known, n=1) for n in unknown}
    return {n: match[0] for n, match in close.items() if match}


def unknown_names(names: list[str], loaded: Any) -> list[str]:
    """Names given that no model file has (status and doctor exit 1)."""
    known = {m.name for m in loaded.models} | {file_model_name(str(e.path)) for e in loaded.errors}
    return sorted({n.removesuffix(".service") for n in names} - known)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else format_seconds(seconds, "about")


def table(report: dict[str, Any]) -> str:
    rows = [("MODEL", "STATE", "PID", "SINCE", "RESTARTS", "GPUS", "MEM MiB", "PORT", "HEALTH",
             "LIVENESS")]
    notes: list[str] = []
    for m in report["models"]:
        sd = m["systemd"]
        if sd["available"]:
            state = f"{sd['active_state']}/{sd['sub_state']}"
            if m.get("draining"):
                state = "draining"
            pid, restarts = str(sd["main_pid"] or "-"), str(sd["restarts"])
        else:
            state, pid, restarts = "systemd unavailable", "-", "-"
            notes.append(f"{m['name']}: {sd['error']}")
        if m.get("nodes"):
            n = m["nodes"]
            notes.append(f"{m['name']}: rank {n['rank']} of {len(n['hosts'])}, head {n['head']}, "
                         f"group {n['group']}")
            notes.extend(f"{m['name']}: rank {rank} {what}"
                         for rank, what in n.get("ranks", {}).items())
        gpu = m["gpu"]
        if gpu["available"]:
            gpus = ",".join(str(g["index"]) for g in gpu["gpus"]) or "-"
            used = [g["memory_used_mib"] for g in gpu["gpus"] if g["memory_used_mib"] is not None]
            mem = str(sum(used)) if used else "-"
            foreign = [p for p in gpu["processes"] if p["kind"] != "own"]
            if foreign:
                notes.append(f"{m['name']}: also on its GPUs: " +
                             ", ".join(f"pid {p['pid']} ({p['kind']})" for p in foreign))
            for index, mib in gpu.get("unaccounted_mib", {}).items():
                notes.append(f"{m['name']}: GPU {index}: {mib} MiB used by no visible process")
            for g in gpu["gpus"]:
                for f in g.get("health", {}).get("findings", []):
                    if f["level"] in ("warning", "error"):
                        notes.append(f"{m['name']}: GPU {g['index']} {f['check']} {f['level']}: "
                                     f"{f['fact']}")
            if gpu.get("unseen"):
                from ..facts.gpus import unseen_message
                notes.append(f"{m['name']}: {unseen_message(gpu['unseen'])}")
        else:
            gpus, mem = "?", "-"
            notes.append(f"{m['name']}: GPUs unknown: {gpu['error']}")
        health = m["health"]
        answer = "-" if health is None else ("ok" if health["ok"] else health["answer"][:30])
        if health is not None and health.get("foreign"):
            answer = "foreign"
        # Liveness probes only an active unit: its last probe says nothing of a stopped one.
        live = liveness_cell(m.get("liveness")) if sd.get("active_state") == "active" or \
            m.get("liveness") is None else "- (not active)"
        rows.append((m["name"], state, pid, _age(m.get("since_s")), restarts, gpus, mem,
                     str(m["port"] or "-"), answer, live))
        notes += [f"{m['name']}: {why}" for why in m.get("why", [])]
        if m.get("canary") and m["canary"]["verdict"] in ("mismatch", "error"):
            notes.append(f"{m['name']}: known answer {m['canary']['verdict']}: "
                         f"{m['canary']['message']}")
    lines = format_table(rows)
    fence = report.get("fence")
    if fence is not None:
        lines.append(f"note: this host is drained (fence {fence['path']}): no model starts "
                     "until `infer-units resume`" + (f"; {fence['error']}" if "error" in fence
                                                     else ""))
    lines += [f"error: {e}" for e in report["errors"]] + [f"note: {n}" for n in notes]
    lines += [f"note: {e}: the two alternate (a start is refused while the other holds it)"
              for e in report.get("shared", [])]
    return "\n".join(lines)


# Exit codes of `infer-units status` (README "Commands"):
#   1  an unknown name, a model file that failed to load (its unit does not
#      exist: `systemctl start` would say "not found"), or systemd could not
#      be asked about some model: like
#      systemctl without a running systemd ("System has not been booted with
#      systemd", exit 1); the report cannot say whether models run.
#   3  a model is failed, or crash-looping (Restart= bringing it back after a
#      failure: never `failed` by design, but not serving either):
#      `systemctl status` exits 3 for a unit that is not
#      running (LSB), so scripts and monitoring read it the same way.  The
#      number is also the hooks' "timed out with holders left" (helpers/exitcodes.py); status never
#      reaps, so the two cannot meet in one command.
#   0  otherwise (stopped models are not failures: an operator stopped them).
FAILED = 3


def exit_code(report: dict[str, Any]) -> int:
    from ..exitcodes import CLEAN, CONFIG_ERROR
    models = report["models"]
    if report["unknown"] or report["errors"] or \
            any(not m["systemd"]["available"] for m in models):
        return CONFIG_ERROR
    if any(m["systemd"].get("active_state") == "failed" or crash_looping(m["systemd"])
           for m in models):
        return FAILED
    return CLEAN
