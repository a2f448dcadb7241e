"""[liveness]: the settings as a Liveness, and the companion units that carry it.

Per model with a health URL and a non-zero interval the generator writes

  <name>-liveness.timer     started with the model (Wants= in the drop-in), only
                            once the model is active (After=, Requisite=), stopped
                            and restarted with it (PartOf=, StopWhenUnneeded=)
  <name>-liveness.service   Type=oneshot: one `infer-units liveness-probe` run
  <name>.service.d/50-liveness.conf
                            the model's Wants= of the timer, and the ExecStopPost=
                            that leaves the model failed when liveness stops it
                            after its restart cap

The probe itself (helpers/act/liveness.py) decides, counts and restarts.  Nothing
here imports more than the generator already has (see bench/).
"""

from __future__ import annotations

from .errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .loader import MergedConfig
    from .model import Model
    from .render import RenderedUnit

MIN_INTERVAL_S = 1.0     # a probe is a process start: more often is only noise
# The probe service's own start timeout beyond the probe's: D-Bus calls and
# the interpreter's start.
PROBE_MARGIN_S = 30.0
# Where the probe keeps its state and the cap marker (tmpfs: a reboot forgets).
STATE_DIR = "/run/infer-units"
DROPIN = "50-liveness.conf"


class Liveness:
    __slots__ = ("interval", "failures", "timeout", "max_restarts", "restart_window", "probe")

    def __init__(self, interval: float, failures: int, timeout: float, max_restarts: int,
                 restart_window: float, probe: str = "health") -> None:
        self.probe = probe      # "health" | "generate"
        self.interval = interval
        self.failures = failures
        self.timeout = timeout
        self.max_restarts = max_restarts
        self.restart_window = restart_window


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
    return Liveness(interval, values["liveness.failures"], timeout,
                    values["liveness.max-restarts"], values["liveness.restart-window"], probe)


def generation_probe(m: Model) -> tuple[str, str] | None:
    """(URL, JSON body) of the one-token completion liveness posts, or None
    when liveness probes health (or the model has no API of its own here: a
    multi-node worker probes its head's health)."""
    from .engines import ENGINE_SPECS, flag_value
    from .render import health_url
    if m.liveness is None or m.liveness.probe != "generate" or m.is_worker:
        return None
    health = health_url(m)
    if health is None or m.port is None:
        return None
    scheme, _, rest = health.partition("://")
    url = f"{scheme}://{rest.split('/', 1)[0]}/v1/completions"
    spec = ENGINE_SPECS[m.engine]
    name = (flag_value(m.args, spec.model_name_flag) if spec.model_name_flag else None) \
        or m.model or ""
    return url, ('{"model": ' + _json_string(name) +
                 ', "prompt": "1", "max_tokens": 1, "temperature": 0}')


def _json_string(text: str) -> str:
    """A JSON string literal (json's import is a cost the generator avoids)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def timer_name(model_name: str) -> str:
    return f"{model_name}-liveness.timer"


def probe_name(model_name: str) -> str:
    return f"{model_name}-liveness.service"


def state_dir(env: dict[str, str]) -> str:
    """INFER_UNITS_LIVENESS_DIR in the model's [env] moves state and marker (tests)."""
    return env.get("INFER_UNITS_LIVENESS_DIR") or STATE_DIR


def cap_marker(model_name: str, state_dir: str = STATE_DIR) -> str:
    """Written by the probe (the model's invocation id) just before it stops
    the model at its cap; the model's ExecStopPost fails when it matches."""
    return f"{state_dir}/{model_name}.liveness-cap"


# Fails (exit 1) only for the invocation the marker names, and always removes
# it, so a stale marker can never fail a later, ordinary stop.
_CAP_SCRIPT = "m=$(cat $1 2>/dev/null) || exit 0; rm -f $1; test x$m != x$INVOCATION_ID"


def companions(m: Model) -> list[RenderedUnit]:
    """The timer, the probe service and the model's drop-in; none when off."""
    from .. import __version__
    from .durations import format_seconds
    from .render import HOOK_CLI, RenderedUnit, fill, health_url
    from .systemd_quote import comment_text, environment_assignment, exec_line, path_value

    live = m.liveness
    url = health_url(m)
    if live is None or url is None:
        return []
    unit = m.unit_name
    generate = generation_probe(m)
    if generate is not None:
        url = generate[0]
    probe = [HOOK_CLI, "liveness-probe", "--unit", unit, "--url", url,
             "--interval", format_seconds(live.interval), "--failures", str(live.failures),
             "--timeout", format_seconds(live.timeout),
             "--max-restarts", str(live.max_restarts),
             "--restart-window", format_seconds(live.restart_window)]
    if generate is not None:
        probe += ["--post", generate[1]]
    # The hooks' own settings (metrics and state directories) reach the probe too.
    env = [f"Environment={environment_assignment(k, v)}" for k, v in m.env.items()
           if k.startswith("INFER_UNITS_") and k != "INFER_UNITS_FAKE_GPUS"]
    values = {
        "version": __version__,
        "sources": " ".join(comment_text(s) for s in m.sources),
        "source_path": path_value(m.main_path),
        "unit": unit,
        "name": m.name,
        "interval": format_seconds(live.interval),
        # Timers coalesce within AccuracySec= (default 1min): far too coarse here.
        "accuracy": format_seconds(min(1.0, live.interval / 10)),
        "probe": probe_name(m.name),
        "timer": timer_name(m.name),
        "exec_start": exec_line(probe),
        "environment": "\n".join(env),
        "timeout_start": format_seconds(live.timeout + PROBE_MARGIN_S),
        "exec_stop_post": "+" + exec_line(["/bin/sh", "-c", _CAP_SCRIPT, "liveness-cap",
                                          cap_marker(m.name, state_dir(m.env))]),
    }
    return [
        RenderedUnit(timer_name(m.name), fill("liveness-timer", values), ()),
        RenderedUnit(probe_name(m.name), fill("liveness-service", values), ()),
        RenderedUnit(f"{unit}.d/{DROPIN}", fill("liveness-dropin", values), ()),
    ]
