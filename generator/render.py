"""A validated Model becomes the text of its .service file and its .wants links."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import __version__
from .durations import format_seconds, parse_duration
from .engines import ENGINE_SPECS, flag_value
from .liveness import (DEFAULT_INTERVAL_S, DROPIN, PROBE_MARGIN_S, TEMPLATE_PROBE_TIMEOUT_S,
                       TEMPLATES, accuracy, cap_marker, group_watch_name, probe_name,
                       state_dir, timer_name)
from .model import Model
from .settings import BUILTIN_IGNORE, RESTART_DEFAULTS
from .systemdversion import RESTART_STEPS_SINCE, systemd_version
from .systemd_quote import (Expand, comment_text, environment_assignments, exec_line,
                            exec_word, path_value, plain_value, unquoted_word)

# the CLI the hooks call, the runtime and cache directories (generator/paths.py)
from .paths import CACHE_DIR, HOOK_CLI, RUN_DIR
from .urls import parse_url

if TYPE_CHECKING:
    import jinja2

ENV_FILE_DIR = RUN_DIR
# Headroom in TimeoutStartSec beyond the sum of the hooks' own timeouts.
START_MARGIN_S = 30.0
P2P_ALLOWANCE_S = 120.0
# TimeoutStopSec beyond the server's drain window ([stop] timeout): systemd
# gives the main process and then ExecStopPost each TimeoutStopSec, and
# wait-free (bounded by [stop] timeout) must end before systemd kills it.
STOP_MARGIN_S = 15.0
# With p2p = "auto" the self-test's verdict reaches the server's argv through
# systemd's unbraced $VAR expansion (split into words; none when empty).
P2P_ARGS_VAR = "INFER_UNITS_P2P_OFF_ARGS"
# How wait-ready is started: with SIGTERM already blocked (render()).
BLOCK_SIGTERM = ("/usr/bin/env", "--block-signal=TERM")
VLLM_DEFAULT_READY_S = 600   # vLLM's own VLLM_ENGINE_READY_TIMEOUT_S default

# What the engines compile at start, each in a subdirectory of the model's
# CacheDirectory= (docs/engines.md, "Compile caches").  Every model gets all
# of them: vLLM, SGLang, TRT-LLM and TGI's shards are torch programs
# (inductor, Triton), vLLM and SGLang run FlashInfer, a CUDA program with
# no kernel for its GPU has the driver JIT PTX, and a command may be any of
# these; a variable a server never reads costs nothing.  Not XDG_CACHE_HOME:
# it moves the Hugging Face hub cache too ($XDG_CACHE_HOME/huggingface), and
# a hub id already downloaded into the user's cache would be fetched again.
CACHE_ENV = (
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),   # default /tmp/torchinductor_<user>
    ("TRITON_CACHE_DIR", "triton"),                 # default ~/.triton/cache
    ("VLLM_CACHE_ROOT", "vllm"),                    # default ~/.cache/vllm (torch.compile's)
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),    # its JIT cache is <base>/.cache/flashinfer
    ("CUDA_CACHE_PATH", "cuda"),                    # default ~/.nv/ComputeCache
)

_INSTALL_DIRS = {"WantedBy": ".wants", "RequiredBy": ".requires", "UpheldBy": ".upholds"}


@dataclass(frozen=True)
class RenderedUnit:
    name: str                   # "sglang-qwen.service"
    text: str
    links: tuple[str, ...]      # directories to link from: "multi-user.target.wants"


# The templates live in the units package (units/*.j2, shipped as package data).
TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "units")


@functools.cache
def templates() -> jinja2.Environment:
    """The one jinja2 environment of a run: each template is compiled once and
    kept (Environment's own cache).  Values reach the templates as text; the
    systemd quoting is done by systemd_quote.py, as filters or before.
    Imported here, not at the top: the hooks import health_url() from this
    module and render nothing."""
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
                             undefined=jinja2.StrictUndefined, autoescape=False,
                             keep_trailing_newline=True, trim_blocks=True,
                             auto_reload=False)   # one run: no stat of each template per use
    env.filters.update(exec_word=exec_word, plain_value=plain_value, path_value=path_value)
    return env


def fill(template: str, values: Mapping[str, object]) -> str:
    """units/<template>.j2 rendered with `values` (every name it uses: a
    missing one is an error, StrictUndefined)."""
    return templates().get_template(template + ".j2").render(values)


def health_url(m: Model) -> str | None:
    """The URL readiness (and liveness) probe.  A worker of a multi-node model
    probes the head's: the group answers only when every rank joined."""
    if m.is_worker:
        assert m.nodes is not None
        return m.nodes.head_url
    if m.ready_url is not None:
        return m.ready_url
    path = ENGINE_SPECS[m.engine].health_path
    if m.port is None or path is None:
        return None
    host = m.host
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{m.port}{path}"


def _engine_argv(m: Model) -> list[str | Expand]:
    """The server's command, from the engine's row of ENGINE_SPECS."""
    spec = ENGINE_SPECS[m.engine]
    if m.engine == "command":
        assert m.command is not None
        return [*m.command, *m.args]
    argv: list[str | Expand]
    if spec.module is not None:
        argv = [m.python, "-m", spec.module, *spec.subcommand]
    else:
        argv = [m.executable or spec.default_executable or ""]
    model = m.model or ""
    looks_local = model.startswith(("/", ".")) or model.endswith(".gguf")
    flag = spec.hub_flag if spec.hub_flag and not looks_local else spec.model_flag
    argv += [flag, model] if flag else [model]
    if spec.tp_flag:
        tp = m.tensor_parallel
        if tp is None and isinstance(m.gpus, list):
            tp = len(m.gpus) * (m.nodes.count if m.nodes else 1)   # the whole group's
        argv += [spec.tp_flag, str(tp)]
    argv += [spec.host_flag, m.host, "--port", str(m.port)]
    # Then, in this order: per-instance ports and paths, the multi-node flags,
    # P2P off, and the user's args last (so they can override).
    argv += [word for pair in m.instance_args for word in pair]
    if m.nodes is not None:
        argv += _node_args(m)
    if spec.p2p_off_args and m.nccl_p2p == "off":
        argv += spec.p2p_off_args
    if spec.p2p_off_args and m.nccl_p2p == "auto":
        argv.append(Expand(f"${P2P_ARGS_VAR}"))     # the self-test's verdict, as words (or none)
    return argv + list(m.args)


def _node_args(m: Model) -> list[str]:
    nodes = m.nodes
    assert nodes is not None
    common = ["--nnodes", str(nodes.count), "--node-rank", str(nodes.rank)]
    if m.engine == "sglang":
        return common + ["--dist-init-addr", nodes.addr]
    # vllm: ranks > 0 run only engine workers, no API server
    return common + ["--master-addr", nodes.addr_host, "--master-port", str(nodes.addr_port)] \
        + (["--headless"] if not nodes.is_head else [])


def _environment(m: Model, selector: str | None, by_name: bool) -> str:
    """The Environment= lines (`selector`, `by_name`: m.gpu_selector(), m.gpus_by_name)."""
    env: dict[str, str] = {}
    if isinstance(m.gpus, list) and not by_name:
        assert selector is not None
        env["CUDA_VISIBLE_DEVICES"] = selector
    spec = ENGINE_SPECS[m.engine]
    if m.nccl_p2p == "off":
        env["NCCL_P2P_DISABLE"] = "1"
        env.update(spec.p2p_off_env)
    elif m.nccl_p2p == "auto" and spec.p2p_off_args:
        env[P2P_ARGS_VAR] = ""      # until the self-test says otherwise (EnvironmentFile=)
    if m.engine == "vllm":
        # vLLM aborts its own start after this many seconds ("often caused by
        # slow weight loading"): never before our [ready] timeout.
        env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(max(VLLM_DEFAULT_READY_S,
                                                     -int(-m.ready_timeout // 1)))   # ceil
        # Unset, vLLM SIGKILLs EngineCore and its workers right after SIGTERM
        # (--shutdown-timeout 0); this gives them time to free the GPUs cleanly.
        env["VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"] = "10"
    if m.drain == 0:
        env.update(spec.no_drain_env)     # SGLang: no wait for its requests in flight
    # The literal path, not $CACHE_DIRECTORY: Environment= expands nothing.
    # [env] below overrides them.
    env.update((name, f"{CACHE_DIR}/{m.name}/{sub}") for name, sub in CACHE_ENV)
    env.update(m.nccl_env)
    env.update(m.env)
    return "\n".join(["Environment=" + text for text in environment_assignments(env)])


def _ignore_args(m: Model) -> list[str]:
    args = []
    for name in m.reap_ignore:
        if name not in BUILTIN_IGNORE:   # the helpers always spare those
            args += ["--ignore", name]
    return args


def model_path(m: Model) -> str | None:
    """The model's path on this host, when `model` is one (absolute): a hub
    id or a relative name is the engine's to resolve, and is checked by none."""
    if m.engine == "command" or not m.model or not m.model.startswith("/"):
        return None
    return m.model


def _requires_mounts(path: str | None) -> str:
    """RequiresMountsFor= of the model's path: a model on NFS or a disk that
    mounts late is waited for at boot, not refused by pre-start.  None for a
    path with a ".." component: systemd ignores a path that is not
    normalized, and where it leads is the kernel's to say (pre-start still
    checks it)."""
    if path is None or ".." in path.split("/"):
        return ""
    return "RequiresMountsFor=" + unquoted_word(path)


def _exec_start_pre(m: Model, selector: str | None, by_name: bool, ignore: list[str]) -> str:
    """One privileged process for every start check (each process started
    lengthens a restart: docs/performance.md).  Every model has
    one, with neither gpus nor port too: the drain fence is its first check.
    (`selector`, `by_name`, `ignore`: m.gpu_selector(), m.gpus_by_name, _ignore_args(m).)"""
    argv = ["pre-start", "--unit", m.unit_name]
    path = model_path(m)
    if path is not None:
        # Checked right after the drain fence: a missing model ends the
        # start with no automatic restart (no retry brings it).
        argv += ["--model-path", path]
    p2p = m.nccl_p2p == "auto" and selector is not None
    if m.user and (path is not None or p2p):
        # The path is looked at, and the P2P self-test runs, with the model
        # account's rights, never root's (helpers/hooks/unit.py, helpers/act/p2p.py).
        argv += ["--user", m.user]
    waited = _waited_by_pre_start(m)
    if waited is not None:
        argv += ["--restart-sec", format_seconds(waited.first), "--restart-steps",
                 str(waited.steps), "--restart-max-delay", format_seconds(waited.ceiling)]
    if selector is not None:
        argv += ["--gpus", selector, "--foreign", m.reap_foreign,
                 "--term-grace", format_seconds(m.reap_term_grace),
                 "--timeout", format_seconds(m.reap_timeout)]
        argv += ignore
        if m.health_accept:
            argv += ["--accept-health", ",".join(m.health_accept)]
    if m.bound_ports:
        # Every TCP port the server binds, its HTTP port first (bound on
        # `host`; the engines bind the others on every address): one that
        # is held fails the server's start just as well (docs/engines.md, "Ports").
        argv += ["--host", m.host]
        for port in m.bound_ports:
            argv += ["--port", str(port)]
    if m.is_worker:
        assert m.nodes is not None
        # Parked here, holding no GPU, until the head forms a group: hosts may
        # start in any order (helpers/act/rendezvous.py).
        argv += ["--wait-rendezvous", m.nodes.addr, "--head-url", m.nodes.head_url]
    if by_name or p2p:
        argv += ["--env-file", f"{ENV_FILE_DIR}/{m.name}.env"]
    if by_name:
        # GPUs named by UUID or PCI id: the hook writes their indexes at start.
        argv.append("--resolve-gpus")
    if p2p:
        argv.append("--p2p")
        spec = ENGINE_SPECS[m.engine]
        if spec.p2p_off_args:
            # --opt=value: the value starts with dashes
            argv.append("--p2p-off-args=" + " ".join(spec.p2p_off_args))
        for name, value in spec.p2p_off_env:
            argv += ["--p2p-off-env", f"{name}={value}"]
        for name, value in spec.p2p_ok_env:
            # The env file would override the operator's own [env] setting.
            if name not in m.env:
                argv += ["--p2p-ok-env", f"{name}={value}"]
        if spec.module:
            argv += ["--python", m.python]
        # The self-test has the server's [env] and nothing of the hook's.
        for name, value in m.env.items():
            if not name.startswith("INFER_UNITS_"):
                argv += ["--p2p-env", f"{name}={value}"]
    return "ExecStartPre=+" + exec_line([HOOK_CLI, *argv])


@dataclass(frozen=True)
class Backoff:
    """The crash-loop back-off in effect: systemd's RestartSec=, RestartSteps=
    and RestartMaxDelaySec= (the template's, or the model's [service])."""
    first: float
    steps: int
    ceiling: float

    @property
    def extra(self) -> float:
        """The longest wait beyond RestartSec= (what pre-start waits out
        itself where systemd cannot)."""
        return max(0.0, self.ceiling - self.first) if self.steps else 0.0


def _backoff(m: Model) -> Backoff | None:
    """The model's back-off; None when [service] turns it off or sets it in a
    form this code does not read (then systemd's own reading stands)."""
    chosen = {key: (m.service_directives.get(key) or [default])[-1]
              for key, default in RESTART_DEFAULTS.items()}
    try:
        first = parse_duration(chosen["RestartSec"])
        ceiling = parse_duration(chosen["RestartMaxDelaySec"])
        steps = int(chosen["RestartSteps"])
    except ValueError:
        return None
    if steps <= 0 or first <= 0 or ceiling <= first:
        return None
    return Backoff(first, steps, ceiling)


def _restart_lines(m: Model) -> str:
    """RestartSec= and, on systemd >= 254, the back-off's RestartSteps= and
    RestartMaxDelaySec= (the model's [service] lines come after, and win)."""
    names = ("RestartSec", "RestartSteps", "RestartMaxDelaySec") \
        if systemd_version() >= RESTART_STEPS_SINCE else ("RestartSec",)
    return "\n".join(f"{name}={RESTART_DEFAULTS[name]}" for name in names)


def _service_directives(m: Model) -> dict[str, list[str]]:
    """[service] as written, less the back-off directives systemd < 254 does
    not know: pre-start does what they say there (_waited_by_pre_start)."""
    if systemd_version() >= RESTART_STEPS_SINCE:
        return m.service_directives
    return {name: value for name, value in m.service_directives.items()
            if name not in ("RestartSteps", "RestartMaxDelaySec")}


def _waited_by_pre_start(m: Model) -> Backoff | None:
    """The back-off pre-start waits out itself: on systemd < 254, which knows
    only RestartSec=."""
    if systemd_version() >= RESTART_STEPS_SINCE:
        return None
    return _backoff(m)


def _canary(m: Model, url: str | None, selector: str | None) -> str:
    """The known-answer check's ExecStartPost= (root: its record is root's),
    after wait-ready's: systemd runs it once the server answered health, and
    the unit is active only once it passed.  Its options are all the check
    and `infer-units canary` need (they read them from the unit that runs)."""
    c = m.canary
    if c is None or url is None or m.is_worker:
        return ""
    from .engines import flag_value
    from .urls import parse_url
    spec = ENGINE_SPECS[m.engine]
    argv = ["known-answer", "--unit", m.unit_name, "--engine", m.engine,
            "--url", parse_url(url).with_target("/").text(), "--api", c.api,
            "--prompt", c.prompt, "--tokens", str(c.tokens),
            "--timeout", format_seconds(c.timeout), "--on-mismatch", c.on_mismatch]
    name = (flag_value(m.args, spec.model_name_flag) if spec.model_name_flag else None) \
        or m.model
    if name and c.api == "openai":
        argv += ["--served-name", name]     # vLLM answers 404 to any other name
    if m.model:
        argv += ["--model", m.model]
    if selector is not None:
        argv += ["--gpus", selector]
    # The server's pid: gone (a stop while it loaded), there is nothing to
    # check.  Braced, within the word: an empty MAINPID (the server reaped)
    # is an empty value, not a missing one.
    return "ExecStartPost=+" + exec_line([HOOK_CLI, *argv, Expand("--pid=${MAINPID}")])


def _timeout_start(m: Model, url: str | None) -> str:
    """`url`: health_url(m)."""
    if m.is_worker:
        # A worker waits for its head as long as it takes (the hooks bound
        # every other step themselves).
        return "infinity"
    total = m.reap_term_grace + 2 * m.reap_timeout + START_MARGIN_S   # reap, then port
    waited = _waited_by_pre_start(m)
    if waited is not None:
        total += waited.extra
    if url is not None:
        total += m.ready_timeout + m.ready_probe_timeout
        if m.canary is not None:
            total += m.canary.timeout
    if m.nccl_p2p == "auto":
        total += P2P_ALLOWANCE_S
    return format_seconds(total)


# What stops a server that SIGTERM cannot stop: $MAINPID is systemd's, set
# for ExecStop=; "-": a server already gone is not a failed stop.
_STOP_BY_SIGKILL = "ExecStop=-" + exec_line(["/bin/sh", "-c", 'kill -s KILL $MAINPID'])


def _exec_stop(m: Model) -> str:
    """ExecStop= for a server a stop must SIGKILL ("" for one that gets
    SIGTERM).  Never KillSignal=SIGKILL: the stop job a refusing pre-start
    queues sends KillSignal= to pre-start itself, and a SIGKILL (a success
    status of these units) would end the refused start inactive, not failed."""
    if (m.engine == "sglang" and m.is_worker) or ENGINE_SPECS[m.engine].stop_signal == "SIGKILL":
        # SGLang's ranks > 0 ignore SIGTERM (only rank 0 can stop the group)
        # and have nothing to drain.
        return _STOP_BY_SIGKILL
    return ""


# While a server drains, its port refuses new connections (a TCP reset at
# once, so a client or load balancer moves on) and the connections open go
# on: SGLang takes new requests until it exits, vLLM's /health stays 200.
# A table of its own per port, made by ExecStop= before the drain's SIGTERM;
# ExecStopPost= and the next start's ExecStartPre= remove it ("add; delete":
# no error when it is not there).  Only new connections: a keep-alive
# connection can still carry a request (docs/engines.md, "Stopping").
# With no drain the requests in flight are cut: ExecStop= resets the port's
# open connections first, since vLLM's HTTP server, its requests aborted,
# waits for their connections to close until TimeoutStopSec kills it.
NFT = "/usr/sbin/nft"
SS = "/usr/bin/ss"


def _port_fence(m: Model) -> tuple[str, str]:
    """(the ExecStop= that closes the port or cuts its connections, the
    command line that opens it again); ("", "") for a server whose stop
    SIGKILLs it, that has no HTTP port here, or a command's (its drain is
    only systemd's wait)."""
    port = m.ports.get("port")
    if port is None or _exec_stop(m) or m.engine == "command":
        return "", ""
    if m.drain <= 0:
        # "-": a kernel without socket destroy leaves the stop as before.
        return ("ExecStop=-+" + exec_line([SS, "-K", "-t", "state", "established",
                                           "sport", "=", f":{port}"]), "")
    table = f"inet infer_units_drain_{port}"
    close = (f"add table {table}; add chain {table} input {{ type filter hook input priority -10; "
             f"policy accept; }}; add rule {table} input tcp dport {port} "
             "tcp flags & (syn | ack) == syn reject with tcp reset")
    # "-": a host without nf_tables still drains, as before.
    return ("ExecStop=-+" + exec_line([NFT, close]),
            "-+" + exec_line([NFT, f"add table {table}; delete table {table}"]))


def _stop_post_timeout(m: Model) -> float:
    """wait-free waits for the unit's own processes and their memory once the
    server has exited, its drain over: bounded by the teardown part of the
    stop window, so that it ends before TimeoutStopSec (stop.timeout +
    margin) kills it."""
    teardown = m.stop_timeout - m.drain * ENGINE_SPECS[m.engine].drain_rounds
    return min(m.reap_timeout, max(1.0, teardown))


def _directives(directives: dict[str, list[str]]) -> list[str]:
    return [f"{key}={value}" for key, values in directives.items() for value in values]


def _description(m: Model, gpus: str | None) -> str:
    """`gpus`: m.gpu_selector()."""
    if m.description:
        return m.description
    what = " ".join(m.command) if m.command else f"{m.engine} {m.model}"
    return f"{what}" + (f" on GPUs {gpus}" if gpus else "") + \
        (f", port {m.port}" if m.port else "") + " (infer-units)"


# A model without GPUs (no wait-free, which does the same: --liveness-cap):
# its ExecStopPost= after its liveness restart cap: fails (exit 1) only
# for the invocation the marker names (the probe writes it just before it
# stops the model), and always removes it, so a stale marker can never fail
# a later, ordinary stop.
_CAP_SCRIPT = "m=$(cat $1 2>/dev/null) || exit 0; rm -f $1; test x$m != x$INVOCATION_ID"


def _liveness(m: Model, url: str | None) -> tuple[str, str]:
    """The model's Wants= of its liveness units and its cap ExecStopPost=."""
    if m.liveness is None or url is None:
        return "", ""
    wants = [timer_name(m.name)]
    if m.nodes is not None:
        wants.append(group_watch_name(m.name))
    cap = exec_line(["/bin/sh", "-c", _CAP_SCRIPT, "liveness-cap",
                     cap_marker(m.name, state_dir(m.env))])
    return "\n".join(f"Wants={w}" for w in wants), "ExecStopPost=+" + cap


def _generation_probe(m: Model, url: str) -> tuple[str, str] | None:
    """(URL, JSON body) of the one-token completion liveness posts when the
    model's `[liveness] probe` is "generate" (vLLM's default: its /health reads
    a flag, vllm#36960), else None.  A multi-node worker probes its head's
    health instead.  The name asked for is the one the server serves."""
    if m.liveness is None or m.liveness.probe != "generate" or m.is_worker or m.port is None:
        return None
    spec = ENGINE_SPECS[m.engine]
    name = (flag_value(m.args, spec.model_name_flag) if spec.model_name_flag else None) \
        or m.model or ""
    return (parse_url(url).with_target("/v1/completions").text(),
            json.dumps({"model": name, "prompt": "1", "max_tokens": 1, "temperature": 0}))


def _hook_settings(m: Model) -> str:
    """Environment= of the model's INFER_UNITS_* [env] settings for its
    companion units: the hooks keep of them what hooks' environment rule
    allows (helpers/hookenv.py), as they do in the model's own unit."""
    env = {k: v for k, v in m.env.items()
           if k.startswith("INFER_UNITS_") and k != "INFER_UNITS_FAKE_GPUS"}
    return "\n".join("Environment=" + text for text in environment_assignments(env))


def liveness_argv(m: Model, url: str) -> list[str]:
    """The probe's whole command: every setting it needs, as the model's
    unit was generated (the probe reads no model file)."""
    live = m.liveness
    assert live is not None
    generate = _generation_probe(m, url)
    probed, post = (url, []) if generate is None else (generate[0], ["--post", generate[1]])
    return [HOOK_CLI, "liveness-probe", "--unit", m.unit_name, "--url", probed,
            "--interval", format_seconds(live.interval), "--failures", str(live.failures),
            "--timeout", format_seconds(live.timeout),
            "--max-restarts", str(live.max_restarts),
            "--restart-window", format_seconds(live.restart_window), *post]


def group_watch_argv(m: Model) -> list[str]:
    """The group watch's whole command (it reads no model file)."""
    nodes, live = m.nodes, m.liveness
    assert nodes is not None and live is not None
    return [HOOK_CLI, "group-watch", "--unit", m.unit_name, "--user", m.user or "root",
            "--hosts", ",".join(nodes.hosts), "--rank", str(nodes.rank),
            "--rendezvous", nodes.addr,
            "--max-restarts", str(live.max_restarts),
            "--restart-window", format_seconds(live.restart_window)]


def liveness_dropins(m: Model) -> list[RenderedUnit]:
    """The model's settings for the shipped templates: the probe's and the
    group watch's commands and hook settings, the timer's interval where it
    is not the template's, and a probe timeout beyond the probe service's."""
    live, url = m.liveness, health_url(m)
    if live is None or url is None:
        return []
    settings = _hook_settings(m)
    units = []
    if live.interval != DEFAULT_INTERVAL_S:
        every = format_seconds(live.interval)
        units.append(RenderedUnit(f"{timer_name(m.name)}.d/{DROPIN}", fill("liveness-timer", {
            "version": __version__, "unit": m.unit_name, "interval": every,
            "accuracy": format_seconds(accuracy(live.interval))}), ()))
    timeout = live.timeout + PROBE_MARGIN_S
    units.append(RenderedUnit(f"{probe_name(m.name)}.d/{DROPIN}", fill("liveness-service", {
        "version": __version__, "unit": m.unit_name, "environment": settings,
        "exec_start": exec_line(liveness_argv(m, url)),
        "timeout_start": format_seconds(timeout) if timeout > TEMPLATE_PROBE_TIMEOUT_S else ""}),
        ()))
    if m.nodes is not None:
        units.append(RenderedUnit(f"{group_watch_name(m.name)}.d/{DROPIN}", fill("group-service", {
            "version": __version__, "unit": m.unit_name, "environment": settings,
            "exec_start": exec_line(group_watch_argv(m))}), ()))
    return units


def shipped_units(cli: str = HOOK_CLI, names: Iterable[str] = TEMPLATES) -> list[RenderedUnit]:
    """The systemd units the package ships (units/systemd/NAME.j2), calling
    the CLI `cli`.  tools/make-units renders every one with the .deb's CLI at
    the package's build (shipped_names()); the generator of an install
    without the .deb (pip, a venv) writes the liveness template units beside
    the models' units, calling that install's CLI."""
    return [RenderedUnit(name, fill("systemd/" + name, {"cli": cli}), ()) for name in names]


def shipped_names() -> list[str]:
    """Every unit of units/systemd/."""
    names = os.listdir(os.path.join(TEMPLATE_DIR, "systemd"))
    return sorted(name.removesuffix(".j2") for name in names if name.endswith(".j2"))


def _sources(sources: tuple[str, ...]) -> str:
    """The files applied, for the unit's second comment line."""
    joined = " ".join(sources)
    if joined.isprintable():        # each one is: comment_text() would change none
        return joined
    return " ".join([comment_text(s) for s in sources])


def render(m: Model) -> RenderedUnit:
    url = health_url(m)
    post = []
    if url is not None:
        # SIGTERM blocked before the interpreter starts (coreutils' env; the
        # mask survives exec): a stop in wait-ready's first moments, before its
        # handler is in place, would otherwise end the hook by default action
        # and leave a loading server that ignores SIGTERM to TimeoutStopSec.
        # wait-ready unblocks it once its handler is installed.
        post.append("ExecStartPost=" + exec_line([
            *BLOCK_SIGTERM, HOOK_CLI, "wait-ready", "--url", url,
            "--timeout", format_seconds(m.ready_timeout),
            "--interval", format_seconds(m.ready_interval),
            "--probe-timeout", format_seconds(m.ready_probe_timeout),
            "--pid", Expand("$MAINPID")]))
    # Asked once here, handed to the parts that need them.
    selector = m.gpu_selector()
    by_name = m.gpus_by_name
    ignore = _ignore_args(m) if selector is not None else []
    canary = _canary(m, url, selector)
    if canary:
        post.append(canary)
    liveness_wants, liveness_stop_post = _liveness(m, url)
    cap: tuple[str, ...] = ()
    if selector and liveness_stop_post:
        # wait-free checks the cap itself: no /bin/sh process on every stop.
        cap, liveness_stop_post = ("--liveness-cap", cap_marker(m.name, state_dir(m.env))), ""
    fence_close, fence_open = _port_fence(m)
    stop_post = exec_line([HOOK_CLI, "wait-free", "--gpus", selector, "--unit", m.unit_name,
                           "--timeout", format_seconds(_stop_post_timeout(m)), *ignore,
                           *cap, "--result", Expand("$SERVICE_RESULT")]) if selector else ""
    values = {
        "version": __version__,
        "sources": _sources(m.sources),
        "description": _description(m, selector),
        "liveness_wants": liveness_wants,
        "liveness_stop_post": liveness_stop_post,
        "requires_mounts": _requires_mounts(model_path(m)),
        "source_path": m.main_path,
        "unit_directives": "\n".join(_directives(m.unit_directives)),
        "user": m.user or "",
        "name": m.name,
        "run_dir": ENV_FILE_DIR,
        "environment": _environment(m, selector, by_name),
        "exec_start_pre": _exec_start_pre(m, selector, by_name, ignore),
        "exec_start": exec_line(_engine_argv(m)),
        "exec_start_post": "\n".join(post),
        "exec_stop_post": stop_post,
        "timeout_start": _timeout_start(m, url),
        "exec_stop": _exec_stop(m),
        "port_fence_close": fence_close,
        "port_fence_open": fence_open,
        "restart": _restart_lines(m),
        "timeout_stop": format_seconds(m.stop_timeout + STOP_MARGIN_S),
        "service_directives": "\n".join(_directives(_service_directives(m))),
    }
    text = fill("service", values)
    links = tuple(f"{target}{_INSTALL_DIRS[key]}"
                  for key, targets in m.install_directives.items() for target in targets)
    return RenderedUnit(name=m.unit_name, text=text, links=links)
