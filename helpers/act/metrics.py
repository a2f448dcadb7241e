"""Per-unit counters for Prometheus' node_exporter textfile collector.

State lives in $INFER_UNITS_STATE_DIR (default RUN_DIR/state), one JSON file
per unit.  When INFER_UNITS_METRICS_DIR is set (e.g. in a host-wide
defaults.toml.d drop-in's [env], or the hook's environment), every update also
rewrites <dir>/infer-units.prom atomically (generator/atomicfile.py).  That
directory is the operator's, not ours: it is never created, and refused (the
metrics are not written, the hook goes on) when it or a directory above it is
not root's or is writable by group or others, as Debian's
/var/lib/prometheus is (owned by prometheus): see README "Trust model".
"""

from __future__ import annotations

import logging
import json
import math
import os
import time
from typing import Any

from ...generator.atomicfile import ensure_dir, open_dir, read_text
from ...generator.paths import run_dir

log = logging.getLogger(__name__)


STATE_DIR = os.environ.get("INFER_UNITS_STATE_DIR") or os.path.join(run_dir(), "state")
TEXTFILE = "infer-units.prom"
METRICS_DIR_VAR = "INFER_UNITS_METRICS_DIR"


def _write_state(name: str, state: dict[str, Any]) -> None:
    with ensure_dir(STATE_DIR) as d:         # ours: 0755 whatever the umask
        d.write(name, json.dumps(state))


def _state_path(unit: str) -> str:
    return os.path.join(STATE_DIR, unit.replace("/", "_") + ".json")


def load_state(unit: str) -> dict[str, Any]:
    """The unit's counters; {} for a missing or damaged file (one that is not a
    JSON object, numbers that are not finite): metrics start again rather
    than fail a start, a stop or `status`."""
    try:
        state = json.loads(read_text(_state_path(unit)) or "{}")
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(state, dict):
        return {}
    return {k: v for k, v in state.items() if isinstance(k, str) and _plain(v)}


def _plain(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    return isinstance(value, str)


def _update(unit: str | None, change: dict[str, Any], add: dict[str, float]) -> None:
    if not unit:
        return
    try:
        state = load_state(unit)
        for key, value in add.items():
            before = state.get(key, 0)
            state[key] = (before if isinstance(before, (int, float)) else 0) + value
        state.update(change)
        state["updated"] = time.time()
        _write_state(os.path.basename(_state_path(unit)), state)
        write_textfile()
    except (OSError, ValueError) as e:
        # Metrics must never fail a start or a stop; stderr: stdout may be --json.
        log.info(f"metrics not written: {e}")


# up and ready fall at once where a hook sees them fall (a start begins, a
# start is refused, a stop ends, a health probe fails) and rise when
# `infer-units status --write-metrics` (infer-units-metrics.timer) or the
# next passing liveness probe sees them risen: the hook that ends a start
# runs as the model's user, who cannot write root's state.
DOWN = {"up": 0, "ready": 0, "draining": 0}


def record_reap(unit: str | None, result: Any) -> None:
    killed = {a.pid for a in result.actions}
    _update(unit, {"last_reap_seconds": result.seconds, "last_reap_exit": result.exit_code,
                   "refused": 0, **DOWN},
            {"reaps_total": 1, "processes_killed_total": len(killed)})


def record_refused(unit: str | None) -> None:
    """A start pre-start refused (no automatic restart follows): from the
    first refusal on the model has a series, so an alert on a failed model
    fires for one that never reached its first reap (refused at boot)."""
    _update(unit, {"refused": 1, **DOWN}, {"starts_refused_total": 1})


def record_seen(unit: str, up: bool, ready: bool, draining: bool = False) -> None:
    """What `status --write-metrics` saw: the unit active, its own server
    answering health, a stop draining its requests in flight."""
    _update(unit, {"up": int(up), "ready": int(up and ready), "draining": int(draining)}, {})


def record_checks_passed(unit: str | None) -> None:
    """A start passed pre-start's checks: it is no longer refused.  Written
    only where the last start was (a reap writes it on every start anyway)."""
    if unit and load_state(unit).get("refused") == 1:
        _update(unit, {"refused": 0}, {})


def record_free(unit: str | None, result: Any) -> None:
    _update(unit, {"last_free_seconds": result.seconds, "last_free_exit": result.exit_code,
                   **DOWN}, {})


def record_p2p(unit: str | None, verdict: Any) -> None:
    _update(unit, {"p2p_ok": 1 if verdict.ok else 0, "p2p_reason": verdict.reason},
            {})


def record_liveness(unit: str | None, state: dict[str, Any], restarted: bool) -> None:
    """After a liveness probe that changed something (helpers/act/liveness.py)."""
    failing = state.get("consecutive_failures", 0)
    _update(unit, {"liveness_consecutive_failures": failing, "ready": 0 if failing else 1,
                   "liveness_capped": 1 if state.get("capped") else 0},
            {"liveness_restarts_total": 1 if restarted else 0})


def record_canary(unit: str | None, result: Any) -> None:
    """After a known-answer check (helpers/act/canary.py)."""
    _update(unit, {"canary_mismatch": 1 if result.verdict == "mismatch" else 0,
                   "canary_error": 1 if result.verdict == "error" else 0,
                   "canary_verdict": result.verdict, "canary_message": result.message,
                   "last_canary_seconds": result.seconds},
            {"canary_checks_total": 1})


_METRICS = (
    ("up", "gauge", "1 while the model's unit is active (its server answered health at "
                    "the start), 0 from a start, a refusal or a stop on."),
    ("ready", "gauge", "1 while the model's own server answers health (the last "
                       "look: metrics timer, liveness), 0 otherwise."),
    ("draining", "gauge", "1 while a stop lets the server's requests in flight finish "
                          "([stop] drain), 0 otherwise (as `status --write-metrics` saw it)."),
    ("refused", "gauge", "1 if the model's last start was refused by its start checks "
                         "(no automatic restart), 0 once a start passes them."),
    ("starts_refused_total", "counter", "Starts refused by the start checks."),
    ("reaps_total", "counter", "Reaps run by the start hook."),
    ("processes_killed_total", "counter", "Processes signalled by the reaper."),
    ("last_reap_seconds", "gauge", "Seconds the last reap took until the GPUs were free."),
    ("last_free_seconds", "gauge", "Seconds after stop until the GPUs were free."),
    ("p2p_ok", "gauge", "1 if the last P2P self-test passed, 0 if P2P was disabled."),
    ("liveness_restarts_total", "counter", "Restarts by liveness (failed health probes)."),
    ("liveness_consecutive_failures", "gauge", "Health probes failed in a row (liveness)."),
    ("liveness_capped", "gauge", "1 if liveness stopped the unit at its restart cap."),
    ("canary_mismatch", "gauge", "1 if the last known-answer check found an answer other "
     "than the one recorded under the same key."),
    ("canary_error", "gauge", "1 if the last known-answer check got no usable answer."),
    ("canary_checks_total", "counter", "Known-answer checks run."),
    ("last_canary_seconds", "gauge", "Seconds the last known-answer check took."),
)


# Written for every model with a state file (0 until seen otherwise): the
# alert rules join on refused.
EVERY_MODEL = ("up", "ready", "draining", "refused")


# GPU health findings (health.py), per GPU: what pre-start and `doctor
# --write-metrics` last saw.  Not a unit's file: its name does not end in .json.
GPU_HEALTH_FILE = "gpu-health.state"


def record_gpu_health(report: Any) -> None:
    """Merge these GPUs' findings into the GPU health state (other GPUs keep
    theirs) and rewrite the textfile.  Never fails the caller."""
    from ..decide.health import SEVERITY
    try:
        state = load_gpu_health()
        for f in report.findings:
            key = f.uuid or "host"
            entry = state.setdefault(key, {"gpu": f.gpu, "checks": {}})
            entry["checks"][f.check] = SEVERITY[f.level]
        _write_state(GPU_HEALTH_FILE, state)
        write_textfile()
    except (OSError, ValueError) as e:
        log.info(f"metrics not written: {e}")


def load_gpu_health() -> dict[str, Any]:
    """uuid (or "host") -> {"gpu": index, "checks": {check: -1|0|1|2}}; {} when
    missing or damaged."""
    try:
        state = json.loads(read_text(os.path.join(STATE_DIR, GPU_HEALTH_FILE)) or "{}")
    except (OSError, ValueError, RecursionError):
        return {}
    out: dict[str, Any] = {}
    if not isinstance(state, dict):
        return out
    for key, entry in state.items():
        if (isinstance(key, str) and isinstance(entry, dict)
                and isinstance(entry.get("checks"), dict)
                and (entry.get("gpu") is None or isinstance(entry.get("gpu"), int))):
            checks = {c: v for c, v in entry["checks"].items()
                      if isinstance(c, str) and v in (-1, 0, 1, 2) and not isinstance(v, bool)}
            out[key] = {"gpu": entry.get("gpu"), "checks": checks}
    return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _gpu_health_lines() -> list[str]:
    lines = ["# HELP infer_units_gpu_health Health check of a GPU (or the host: gpu=\"\"): "
             "0 ok, 1 warning, 2 error (refuses a start), -1 unknown (not readable here).",
             "# TYPE infer_units_gpu_health gauge"]
    for key, entry in sorted(load_gpu_health().items()):
        gpu = "" if entry["gpu"] is None else str(entry["gpu"])
        uuid = "" if key == "host" else key
        for check, value in sorted(entry["checks"].items()):
            lines.append(f'infer_units_gpu_health{{gpu="{gpu}",uuid="{_label(uuid)}",'
                         f'check="{_label(check)}"}} {value}')
    return lines


def _models() -> set[str]:
    """The units of the model files on the search path now: the series of a
    model whose file is gone are not written (its state stays, should the
    file come back)."""
    from ...generator.loader import Loader
    return {f"{name}.service" for name in Loader().discover()[0]}


def render_textfile() -> str:
    try:
        names = sorted(n for n in os.listdir(STATE_DIR) if n.endswith(".json"))
    except OSError:
        names = []
    models = _models()
    states = [(n[:-5], load_state(n[:-5])) for n in names if n[:-5] in models]
    lines = []
    for key, kind, help_text in _METRICS:
        lines.append(f"# HELP infer_units_{key} {help_text}")
        lines.append(f"# TYPE infer_units_{key} {kind}")
        for unit, state in states:
            if key in EVERY_MODEL:
                lines.append(f'infer_units_{key}{{unit="{unit}"}} '
                             f'{1 if state.get(key) == 1 else 0}')
            elif isinstance(state.get(key), (int, float)):
                lines.append(f'infer_units_{key}{{unit="{unit}"}} {float(state[key]):g}')
    lines += _gpu_health_lines()
    return "\n".join(lines) + "\n"


def write_textfile(directories: set[str] | None = None) -> None:
    """Into INFER_UNITS_METRICS_DIR, or the `directories` given (the ones the
    models' [env] name, for `status --write-metrics`)."""
    if directories is None:
        directory = os.environ.get(METRICS_DIR_VAR)
        directories = {directory} if directory else set()
    text = render_textfile() if directories else ""
    for directory in sorted(directories):
        with open_dir(directory) as d:
            d.write(TEXTFILE, text)
