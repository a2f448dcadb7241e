"""`infer-units status`: per model, systemd's view (pystemd), its GPUs with
memory and processes, its port, and whether health answers."""

from __future__ import annotations

import time
from typing import Any

from ...generator.build import load_all
from ...generator.model import Model
from ...generator.render import health_url
from ..decide.attribution import attribute
from ..facts.gpus import GpuError, backend, select
from ..decide.health import check_gpus, worst
from ..act.canary import view as canary_view
from ..act.liveness import cell as liveness_cell, view as liveness_view
from ..act.metrics import load_state
from ..act.ready import probe
from ..facts.systemd import SystemdUnavailable, unit_state
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
    users = port_users(model.port)
    if users is None:
        return {"foreign": [], "out_of_sight": True}
    foreign = [{"pid": i.pid, "comm": i.comm, "user": i.user, "how": how,
                "where": i.unit or i.container or i.cgroup, "cmdline": i.cmdline[:200]}
               for i, how in users if not (unit_active and in_unit(i.cgroup, model.unit_name))]
    return {"foreign": foreign, "out_of_sight": False}


def hooks_last_error(unit: str) -> str | None:
    """The last error line the unit's hooks wrote to the journal (each
    failing hook's closing line says what its exit code means); None where
    the journal cannot be read."""
    import subprocess
    try:
        done = subprocess.run(["journalctl", "--no-pager", "-q", "-o", "cat", "-u", unit,
                               "-t", "infer-units", "-p", "err", "-n", "1"],
                              capture_output=True, text=True, timeout=10, errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    return " ".join(lines[-1].split())[:300] if done.returncode == 0 and lines else None


def _why(entry: dict[str, Any], fence: dict[str, Any] | None) -> list[str]:
    """What the state alone does not say: a drained host, a crash loop and
    its last exit, a foreign process on the model's port."""
    why: list[str] = []
    sd = entry["systemd"]
    active = sd.get("active_state") == "active"
    if fence is not None and not active:
        since = f" since {fence['since_text']}" if fence.get("since_text") else ""
        why.append(f"drained by `infer-units drain`{since}: starts are refused until "
                   "`infer-units resume`")
    if sd.get("available") and (sd.get("sub_state") == "auto-restart"
                                or (sd.get("active_state") == "activating"
                                    and sd.get("restarts", 0) > 0)):
        status = sd.get("exec_main_status") or 0
        last = f"last result {sd.get('result') or '?'}"
        if status:
            last += f", main process exit status {status}"
        said = entry.get("last_error")
        why.append(f"crash loop: {sd.get('restarts', 0)} automatic restart(s), {last}; "
                   + (f"its hooks' last error: {said}" if said else
                      f"the failing step's reason: journalctl -u {entry['unit']} -p err"))
    elif sd.get("active_state") == "failed" and entry.get("last_error"):
        why.append(f"failed; its hooks' last error: {entry['last_error']}")
    port = entry.get("port_view")
    if port and port["foreign"]:
        who = "; ".join(f"pid {p['pid']} ({p['comm']}, user {p['user']}, {p['where']}, "
                        f"{p['how']})" for p in port["foreign"])
        why.append(f"port {entry['port']} is held by a process not of {entry['unit']}: {who}")
    return why


def model_status(model: Model, fence: dict[str, Any] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": model.name, "unit": model.unit_name,
                             "source": model.main_path, "engine": model.engine,
                             "port": model.port, "health_url": health_url(model)}
    try:
        state = unit_state(model.unit_name)
        entry["systemd"] = {"available": True, **state.as_json(),
                            "exec_main_status": state.exec_main_status}
        entry["since_s"] = (round(time.time() - state.active_since_us / 1e6, 1)
                            if state.active_since_us and state.active_state == "active" else None)
        entry["main_rss_mib"] = _rss_mib(state.main_pid)
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
    entry["liveness"] = liveness_view(model)
    sd = entry["systemd"]
    if sd.get("active_state") == "failed" or sd.get("sub_state") == "auto-restart" or \
            (sd.get("active_state") == "activating" and sd.get("restarts", 0) > 0):
        entry["last_error"] = hooks_last_error(model.unit_name)
    entry["why"] = _why(entry, fence)
    return entry


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
    return {"rank": nodes.rank, "hosts": list(nodes.hosts), "head": nodes.hosts[0],
            "group": group}


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
            "errors": [str(e) for e in loaded.errors + loaded.conflicts],
            "unknown": unknown,
            "suggestions": suggestions(unknown),
            "fence": fence}


def suggestions(unknown: list[str]) -> dict[str, str]:
    """name -> the known model name it is most likely a typo of."""
    if not unknown:
        return {}
    import difflib
    from ...generator.loader import discover
    known = sorted(discover()[0])
    close = {n: difflib.get_close_matches(n, known, n=1) for n in unknown}
    return {n: match[0] for n, match in close.items() if match}


def unknown_names(names: list[str], loaded: Any) -> list[str]:
    """Names given that no model file has (status and doctor exit 1)."""
    known = {m.name for m in loaded.models} | {file_model_name(str(e.path)) for e in loaded.errors}
    return sorted({n.removesuffix(".service") for n in names} - known)


def _age(seconds: float | None) -> str:
    from ...generator.durations import format_seconds
    return "-" if seconds is None else format_seconds(seconds, "about")


def table(report: dict[str, Any]) -> str:
    rows = [("MODEL", "STATE", "PID", "SINCE", "RESTARTS", "GPUS", "MEM MiB", "PORT", "HEALTH",
             "LIVENESS")]
    notes: list[str] = []
    for m in report["models"]:
        sd = m["systemd"]
        if sd["available"]:
            state = f"{sd['active_state']}/{sd['sub_state']}"
            pid, restarts = str(sd["main_pid"] or "-"), str(sd["restarts"])
        else:
            state, pid, restarts = "systemd unavailable", "-", "-"
            notes.append(f"{m['name']}: {sd['error']}")
        if m.get("nodes"):
            n = m["nodes"]
            notes.append(f"{m['name']}: rank {n['rank']} of {len(n['hosts'])}, head {n['head']}, "
                         f"group {n['group']}")
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
    return "\n".join(lines)


# Exit codes of `infer-units status` (README "Commands"):
#   1  an unknown name, a model file that failed to load (its unit does not
#      exist: `systemctl start` would say "not found"), or systemd could not
#      be asked about some model: like
#      systemctl without a running systemd ("System has not been booted with
#      systemd", exit 1); the report cannot say whether models run.
#   3  a model is failed: `systemctl status` exits 3 for a unit that is not
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
    if any(m["systemd"].get("active_state") == "failed" for m in models):
        return FAILED
    return CLEAN
