"""[liveness]: the settings as a Liveness, and the names of the units that carry it.

The package ships two template units (units/systemd/), so a model with
liveness is still ONE generated file:

  infer-units-liveness@<name>.timer     every interval, only once the model is
                                        active (After=, Requisite=), stopped and
                                        restarted with it (PartOf=)
  infer-units-liveness@<name>.service   Type=oneshot: one `infer-units
                                        liveness-probe` run, its whole command in
                                        the generator's drop-in
  infer-units-group@<name>.service      multi-node models only: watches the
                                        group's connections, restarts a rank
                                        left behind (helpers/act/groupwatch.py)

The model's own unit Wants= them and carries the ExecStopPost= that leaves it
failed at the restart cap (generator/render.py).  Drop-ins carry what the
templates cannot know: the probe's and the watch's whole commands (no hook
reads a model file: what systemd loaded is what runs), an interval other
than the default, a probe that may take longer than the template allows.  The instance is the
model's name, so no model's name can collide with another's companions.

The probe (helpers/act/liveness.py) decides, counts and restarts; the model layer (generator/model.py) builds a Liveness; rendering the lines
is render.py's.  This module imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .loader import TEMP_EXTRA, MergedConfig
from .paths import RUN_DIR

MIN_INTERVAL_S = 1.0     # a probe is a process start: more often is only noise
# The probe service's own start timeout beyond the probe's: D-Bus calls and
# the interpreter's start.
PROBE_MARGIN_S = 30.0
# Where the probe keeps its state and the cap marker (tmpfs: a reboot forgets).
STATE_DIR = RUN_DIR
DROPIN = "50-liveness.conf"   # of the timer or the probe, when the template's values do not fit


@dataclass(frozen=True)
class Liveness:
    interval: float
    failures: int
    timeout: float
    max_restarts: int
    restart_window: float
    probe: str = "health"       # "health" | "generate"


def build_liveness(values: dict[str, Any], merged: MergedConfig,
                   probe_timeout: float, default_probe: str = "health") -> Liveness | None:
    """None when `interval = "0"`; range errors name the file and key."""
    def fail(key: str, reason: str) -> None:
        raise ConfigError(merged.file_of(key), key, reason)

    interval = values["liveness.interval"]
    if interval == 0:
        return None
    if interval < MIN_INTERVAL_S:
        fail("liveness.interval", f'{interval:g}s is below {MIN_INTERVAL_S:g}s ("0" turns '
             "liveness off)")
    timeout = values["liveness.timeout"]
    if timeout is None:
        # The readiness probe's per-request time already knows the engine
        # (SGLang's /health generates a token, up to SGLANG_HEALTH_CHECK_TIMEOUT).
        timeout = probe_timeout
    elif timeout <= 0:
        fail("liveness.timeout", "must be longer than 0s")
    if values["liveness.max-restarts"] < 0:
        fail("liveness.max-restarts", f"must be 0 or more, got {values['liveness.max-restarts']}")
    if values["liveness.restart-window"] <= 0:
        fail("liveness.restart-window", "must be longer than 0s")
    probe = values["liveness.probe"] or default_probe
    if probe == "generate" and values["engine"] == "command":
        fail("liveness.probe", '"generate" needs an engine with an OpenAI-compatible API, '
             'not engine = "command"')
    # The longest names of its own: the template units' instances, the
    # drop-in directories the generator may write for them (NAME.service.d),
    # and the probe's state NAME.liveness.json through its temporary name.
    longest = len(merged.name) + _longest_extra()
    if longest > UNIT_NAME_MAX:
        limit = UNIT_NAME_MAX - max(len(probe_name("")) + 2, TEMP_EXTRA + len(".liveness.json"))
        fail("liveness.interval", f"the model's name is too long for its liveness units "
             f"and state (names of up to {longest} characters, file and unit names "
             f"allow {UNIT_NAME_MAX}; at most {limit} with liveness): shorten the name, "
             'or turn liveness off (interval = "0")')
    return Liveness(interval, values["liveness.failures"], timeout,
                    values["liveness.max-restarts"], values["liveness.restart-window"], probe)


_EXTRA: list[int] = []


def _longest_extra() -> int:
    """What the longest name of a model's own (above) adds to the model's name."""
    if not _EXTRA:
        _EXTRA.append(max(len(probe_name("")) + 2, len(timer_name("")) + 2,
                          len(group_watch_name("")), TEMP_EXTRA + len(".liveness.json")))
    return _EXTRA[0]


# The templates' own values (units/systemd/infer-units-liveness@.*): a model
# that keeps them needs no drop-in.
DEFAULT_INTERVAL_S = 30.0
TEMPLATE_ACCURACY_S = 1.0
TEMPLATE_PROBE_TIMEOUT_S = 300.0
TIMER_TEMPLATE = "infer-units-liveness@.timer"
PROBE_TEMPLATE = "infer-units-liveness@.service"
GROUP_TEMPLATE = "infer-units-group@.service"
TEMPLATES = (TIMER_TEMPLATE, PROBE_TEMPLATE, GROUP_TEMPLATE)
UNIT_NAME_MAX = 255       # systemd's UNIT_NAME_MAX


def timer_name(model_name: str) -> str:
    return f"infer-units-liveness@{model_name}.timer"


def probe_name(model_name: str) -> str:
    return f"infer-units-liveness@{model_name}.service"


def group_watch_name(model_name: str) -> str:
    return f"infer-units-group@{model_name}.service"


def accuracy(interval: float) -> float:
    """Timers coalesce within AccuracySec= (default 1min): far too coarse here."""
    return min(TEMPLATE_ACCURACY_S, interval / 10)


def state_dir(env: dict[str, str]) -> str:
    """INFER_UNITS_LIVENESS_DIR in the model's [env] moves state and marker (tests)."""
    return env.get("INFER_UNITS_LIVENESS_DIR") or STATE_DIR


def cap_marker(model_name: str, state_dir: str = STATE_DIR) -> str:
    """Written by the probe (the model's invocation id) just before it stops
    the model at its cap; the model's ExecStopPost fails when it matches."""
    return f"{state_dir}/{model_name}.liveness-cap"


