"""A merged model file, validated against settings.SETTINGS, as a typed Model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .canary import Canary, build_canary
from .durations import MAX_SECONDS
from .engines import (ENGINE_SPECS, TEARDOWN_S, EngineSpec, derived_ports, env_name,
                      flag_value)
from .errors import ConfigError
from .liveness import Liveness, build_liveness
from .loader import MergedConfig
from .nodes import Nodes, build_nodes
from .settings import (BUILTIN_IGNORE, BY_KEY, DERIVED, FIXED_TABLES, SETTINGS, is_env_name,
                       is_pci, no_control, scalar_text, show)

Gpus = list[str | int] | str   # "all" or a list of selectors


@dataclass(frozen=True, eq=False)
class Model:
    """One validated model; the fields below are all it holds.  Those of a
    setting (settings.SETTINGS, attr) are filled from the table by
    build_model(); the others are derived there.  A setting whose attribute
    is not declared here fails the first model (an unexpected argument), as
    does a field no setting or derivation fills (a missing one)."""

    name: str                       # unit name without .service
    main_path: str
    sources: tuple[str, ...]
    engine: str
    model: str | None
    gpus: Gpus | None
    port: int | None
    host: str
    tensor_parallel: int | None
    args: tuple[str, ...]
    command: tuple[str, ...] | None
    python: str
    executable: str | None
    user: str | None
    description: str | None
    env: dict[str, str]
    nccl_p2p: str
    nccl_env: dict[str, str]
    reap_foreign: str
    reap_term_grace: float
    reap_timeout: float
    reap_ignore: tuple[str, ...]
    ready_url: str | None
    ready_timeout: float
    ready_interval: float
    ready_probe_timeout: float
    drain: float                    # [stop] drain: requests in flight may finish this long
    stop_timeout: float             # [stop] timeout: the drain and the teardown
    # Per-instance ports and paths for engines whose defaults collide on one
    # host, rendered after the engine's argv: ("--master-port", "8001"), ...
    instance_args: tuple[tuple[str, str], ...]
    ports: dict[str, int]           # what listens where: {"port": 8000, "--master-port": 8001}
    bound_ports: tuple[int, ...]    # the TCP ports the server binds here: pre-start checks each
    nodes: Nodes | None             # one model across hosts: this host's part
    unit_directives: dict[str, list[str]]
    service_directives: dict[str, list[str]]
    install_directives: dict[str, list[str]]
    liveness: Liveness | None       # [liveness]; None: off (interval = "0")
    health_accept: tuple[str, ...]  # [health] accept: checks whose errors do not refuse
    canary: Canary | None           # [canary]: the known-answer check; None: off

    @property
    def unit_name(self) -> str:
        return f"{self.name}.service"

    @property
    def is_worker(self) -> bool:
        """A rank > 0 of a multi-node model: the head's health is its own."""
        return self.nodes is not None and not self.nodes.is_head

    @property
    def gpus_by_name(self) -> bool:
        """GPUs named by UUID or PCI bus id: the server gets them as indexes
        in PCI order, which pre-start resolves on the host.  CUDA takes no
        PCI id, and vLLM reads CUDA_VISIBLE_DEVICES with int() (a UUID
        crashes its start); with CUDA_DEVICE_ORDER=PCI_BUS_ID every engine
        reads an index the same way."""
        return isinstance(self.gpus, list) and any(isinstance(g, str) for g in self.gpus)

    def gpu_selector(self) -> str | None:
        """The --gpus argument the helpers take: "0,1", "GPU-..,GPU-..", "all"."""
        if self.gpus is None:
            return None
        if self.gpus == "all":
            return "all"
        return ",".join(str(g) for g in self.gpus)


def _flatten(data: dict[str, Any], merged: MergedConfig,
             errors: list[ConfigError]) -> dict[str, Any]:
    """Dotted keys for the fixed tables; free-form tables stay whole.  A key
    that is not one is added to `errors`, and the others still read."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _TABLES:
            if "." in key or key not in _TOP_LEVEL:
                # (A quoted top-level "reap.timeout" is not [reap] timeout.)
                errors.append(ConfigError(merged.file_of(key), key,
                                          unknown_key(key, _TOP_LEVEL)))
                continue
            flat[key] = value
        elif key == "nccl":
            if not isinstance(value, dict):
                errors.append(ConfigError(merged.file_of(key), key, "expected a table"))
                continue
            for sub, subvalue in value.items():
                flat[f"nccl.{sub}"] = subvalue
        else:
            if not isinstance(value, dict):
                errors.append(ConfigError(merged.file_of(key), key, "expected a table"))
                continue
            for sub, subvalue in value.items():
                dotted = f"{key}.{sub}"
                if dotted not in BY_KEY:
                    known = [k.split(".", 1)[1] for k in BY_KEY if k.startswith(key + ".")]
                    errors.append(ConfigError(merged.file_of(dotted), dotted, unknown_key(
                        sub, known, f" (known in [{key}]: {', '.join(known)})")))
                    continue
                flat[dotted] = subvalue
    return flat


_TABLES = frozenset(("nccl", *FIXED_TABLES))      # the tables _flatten takes apart
# What a file may set at its top level: the settings' own keys and tables.
_TOP_LEVEL = tuple(dict.fromkeys([*(s.key.split(".")[0] for s in SETTINGS), "nccl"]))


def unknown_key(key: str, known: tuple[str, ...] | list[str], listed: str = "") -> str:
    """The reason for a key no setting has, with the nearest known one when a
    typo is likely (`prot` -> `port`)."""
    import difflib      # here: only a refused file needs it
    close = difflib.get_close_matches(key, known, n=1)
    return f"unknown key{listed}" + (f"; did you mean `{close[0]}`?" if close else "")


def _nccl_name(key: str) -> str:
    if key.startswith("NCCL_"):
        return key
    return "NCCL_" + key.upper().replace("-", "_")


def build_model(merged: MergedConfig) -> Model:
    _check_path(merged.main_path)
    # Every key is checked before the file is refused: all its errors at once.
    errors: list[ConfigError] = []
    flat = _flatten(merged.data, merged, errors)
    # Every setting's default (shared objects, as always), then what the files set, checked.
    values = dict(_DEFAULTS)
    nccl_env: dict[str, str] = {}
    for key, raw in flat.items():
        setting = BY_KEY.get(key)
        if setting is not None:
            try:
                values[key] = setting.check(raw)
            except ValueError as e:
                errors.append(ConfigError(merged.file_of(key), key, str(e)))
        elif key.startswith("nccl."):       # any NCCL variable (nccl.p2p is a setting)
            try:
                name = _nccl_name(key[5:])
                if not is_env_name(name):
                    raise ValueError(f"becomes {show(name)}, which is not a valid environment "
                                     "variable name (letters, digits, '_', '-')")
                nccl_env[name] = scalar_text(raw, key)
            except ValueError as e:
                errors.append(ConfigError(merged.file_of(key), key, str(e)))
        else:
            errors.append(ConfigError(merged.file_of(key), key, unknown_key(key, _TOP_LEVEL)))
    if errors:
        # The checks across keys need valid values: they wait for these.
        errors[0].also = errors[1:]
        raise errors[0]
    _cross_check(values, merged)
    spec = ENGINE_SPECS[values["engine"]]
    nodes = None
    if not _NODES_KEYS.isdisjoint(flat) and any(values[key] is not None for key in _NODES_KEYS):
        nodes = build_nodes(values, merged, spec.health_path or "/health")
    instance_args, ports = _instance_ports(merged.name, values, spec, merged)
    if nodes is not None:
        if nodes.is_head:
            ports["rendezvous"] = nodes.addr_port
        elif values["engine"] == "vllm":
            del ports["port"]           # --headless: no HTTP server
    ports.update(derived_ports(values["engine"], values["port"], values["args"],
                               nodes.addr_port if nodes is not None and nodes.is_head else None,
                               nodes.count if nodes is not None else 1))
    probe_timeout = _probe_timeout(values, spec)
    fields: dict[str, Any] = {"name": merged.name, "main_path": merged.main_path,
              "sources": tuple(merged.sources)}
    # Every setting that is an attribute as it is (settings.SETTINGS says which)...
    for key, attr, convert in _DIRECT:
        fields[attr] = values[key] if convert is None else convert(values[key])
    # ... and those derived from settings, the engine and the nodes.
    fields["nccl_env"] = nccl_env
    fields["reap_ignore"] = tuple(dict.fromkeys(BUILTIN_IGNORE + tuple(values["reap.ignore"])))
    fields["ready_probe_timeout"] = probe_timeout
    drain, drain_args = _drain(values, spec, merged)
    fields["drain"] = drain
    fields["stop_timeout"] = _stop_timeout(values, spec, merged, drain)
    fields["instance_args"] = instance_args + drain_args
    fields["ports"] = ports
    fields["bound_ports"] = _bound_ports(values, ports)
    fields["nodes"] = nodes
    fields["liveness"] = build_liveness(values, merged, probe_timeout, spec.liveness_probe)
    fields["canary"] = build_canary(values, merged, spec)
    return Model(**fields)


_NODES_KEYS = frozenset(s.key for s in SETTINGS if s.key.startswith("nodes."))   # all None by default
# (key, Model attribute, conversion) of every setting the Model holds as it is.
_DIRECT = tuple((s.key, s.attr, s.convert) for s in SETTINGS if s.attr != DERIVED)
_DEFAULTS = {s.key: s.default for s in SETTINGS}


def _probe_timeout(v: dict[str, Any], spec: EngineSpec) -> float:
    """[ready] probe-timeout, or the engine's; SGLang's /health may take up to
    SGLANG_HEALTH_CHECK_TIMEOUT (its [env] can raise it) to answer."""
    given: float | None = v["ready.probe-timeout"]
    if given is not None:
        return given
    raised = v["env"].get("SGLANG_HEALTH_CHECK_TIMEOUT") if v["engine"] == "sglang" else None
    if raised is not None and raised.isascii() and raised.isdigit():
        return max(spec.probe_timeout, int(raised) + 10.0)
    return spec.probe_timeout


def _given(v: dict[str, Any], spec: EngineSpec, flag: str) -> str | None:
    """What the user set `flag` to: in args, or (clap engines) in [env]."""
    given = flag_value(v["args"], flag)
    if given is None and spec.flags_from_env:
        given = v["env"].get(env_name(flag))
    return given


def _drain_seconds(v: dict[str, Any], spec: EngineSpec, merged: MergedConfig) -> float | None:
    """The drain window the user's args (or, for TGI, its [env]) ask the
    server for: whole seconds, as vLLM (int) and TGI (u64) read them; any
    other value (nan, inf, -1, 1e20, 10s) is refused by name, never turned
    into a TimeoutStopSec= systemd would ignore."""
    if not spec.drain_flag:
        return None
    given = flag_value(v["args"], spec.drain_flag)
    key = "args"
    if given is None and spec.flags_from_env:
        key = f"env.{env_name(spec.drain_flag)}"
        given = v["env"].get(env_name(spec.drain_flag))
    if given is None:
        return None
    if not (given.isascii() and given.isdigit()) or len(given) > 12 \
            or int(given) * spec.drain_rounds + TEARDOWN_S > MAX_SECONDS:
        raise ConfigError(merged.file_of(key), key,
                          f"{spec.drain_flag} {show(given)}: expected whole seconds, "
                          f"0 to {int((MAX_SECONDS - TEARDOWN_S) // spec.drain_rounds)}")
    return float(int(given))


def _drain(v: dict[str, Any], spec: EngineSpec, merged: MergedConfig,
           ) -> tuple[float, tuple[tuple[str, str], ...]]:
    """[stop] drain (or the drain the user's args give the server, or the
    engine's default) and the server flag that asks for it, when the args do
    not already: (seconds, (("--shutdown-timeout", "30"),) or ())."""
    given = _drain_seconds(v, spec, merged)
    asked: float | None = v["stop.drain"]
    if asked is not None and given is not None and asked != given:
        raise ConfigError(merged.file_of("stop.drain"), "stop.drain",
                          f"{asked:g}s, but args give the server {spec.drain_flag} {given:g}: "
                          "set the drain in one place")
    if asked is not None and asked > 0 and not spec.can_drain:
        raise ConfigError(merged.file_of("stop.drain"), "stop.drain",
                          f"{v['engine']} cannot drain: SIGTERM cuts the requests in flight "
                          '(docs/engines.md, "Stopping"); set drain = "0s"')
    if given is not None:
        return given, ()
    drain = spec.drain if asked is None else asked
    if asked is None and v["stop.timeout"] is not None:
        # A stop window set without a drain bounds the default drain: the
        # teardown still fits (a file that set only [stop] timeout keeps the
        # stop it had).
        room = (v["stop.timeout"] - TEARDOWN_S) / spec.drain_rounds
        drain = min(drain, float(max(0, int(room))))
    if spec.drain_flag is None or drain == spec.own_drain:
        return drain, ()
    # The server counts whole seconds: round up, never cut the drain short.
    seconds = int(-(-drain // 1))
    if seconds * spec.drain_rounds + TEARDOWN_S > MAX_SECONDS:
        raise ConfigError(merged.file_of("stop.drain"), "stop.drain",
                          f"{drain:g}s: at most {int((MAX_SECONDS - TEARDOWN_S) // spec.drain_rounds)}s")
    return float(seconds), ((spec.drain_flag, str(seconds)),)


def _stop_timeout(v: dict[str, Any], spec: EngineSpec, merged: MergedConfig,
                  drain: float) -> float:
    """[stop] timeout, or the drain (times its rounds: TGI's router, then its
    shards) plus the engine's teardown; never shorter than the drain."""
    if v["stop.timeout"] is None:
        return min(MAX_SECONDS, drain * spec.drain_rounds + TEARDOWN_S)
    if v["stop.timeout"] < drain * spec.drain_rounds:
        raise ConfigError(merged.file_of("stop.timeout"), "stop.timeout",
                          f"{v['stop.timeout']:g}s is shorter than "
                          + (f"the server's own {spec.drain_flag} {drain:g}" if spec.drain_flag
                             else f"[stop] drain {drain:g}s")
                          + (f" (x{spec.drain_rounds}: router, then shards)"
                             if spec.drain_rounds > 1 else "")
                          + ": systemd would kill it draining")
    timeout: float = v["stop.timeout"]
    return timeout


def _instance_ports(name: str, v: dict[str, Any], spec: EngineSpec, merged: MergedConfig,
                    ) -> tuple[tuple[tuple[str, str], ...], dict[str, int]]:
    """The engine's per-instance ports (derived from `port` unless args set
    them) and paths, so two models of one engine never share its defaults."""
    args: list[tuple[str, str]] = []
    ports: dict[str, int] = {}
    if v["port"] is not None:
        ports["port"] = v["port"]
    for flag, offset in spec.port_flags:
        given = _given(v, spec, flag)
        if given is None:
            port = v["port"] + offset
            if port > 65535:
                raise ConfigError(merged.file_of("port"), "port",
                                  f"{v['engine']} also needs {flag} = port + {offset}, which is "
                                  f"above 65535; choose a lower port or set {flag} in args")
            args.append((flag, str(port)))
            ports[flag] = port
        elif given.isascii() and given.isdigit():
            ports[flag] = int(given)
    for flag, pattern in spec.path_flags:
        if _given(v, spec, flag) is None:
            args.append((flag, pattern.format(name=name)))
    return tuple(args), ports


def _bound_ports(v: dict[str, Any], ports: dict[str, int]) -> tuple[int, ...]:
    """The ports of `ports` this host's server binds, the HTTP port first:
    TGI's torch master port only with more than one shard (one shard starts
    no torch.distributed store)."""
    shards = v["tensor-parallel"] or (len(v["gpus"]) if isinstance(v["gpus"], list) else 2)
    bound = [port for what, port in ports.items()
             if not (v["engine"] == "tgi" and what == "--master-port" and shards == 1)]
    return tuple(dict.fromkeys(bound))


def _check_path(path: str) -> None:
    """The model file's path lands in SourcePath= ('%' is escaped there): it
    must be text systemd can read on one line."""
    try:
        no_control(path)
        path.encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        raise ConfigError(path, None, "the file's path has control characters or is "
                          "not UTF-8; SourcePath= cannot carry it") from None


def _cross_check(v: dict[str, Any], merged: MergedConfig) -> None:
    def fail(key: str, reason: str) -> None:
        raise ConfigError(merged.file_of(key), key, reason)

    engine = v["engine"]
    if engine is None:
        fail("engine", "required (one of: " + ", ".join(ENGINE_SPECS) + ")")
    spec = ENGINE_SPECS[engine]
    if engine == "command":
        if v["command"] is None:
            fail("command", 'required with engine = "command"')
        if v["model"] is not None:
            fail("model", 'not used with engine = "command" (put it in command)')
    else:
        if v["command"] is not None:
            fail("command", f'only for engine = "command" (engine is "{engine}"; use args)')
        if v["model"] is None:
            fail("model", f'required with engine = "{engine}"')
        if v["port"] is None:
            fail("port", f'required with engine = "{engine}"')
        if v["gpus"] is None:
            fail("gpus", f'required with engine = "{engine}"')
    if v["executable"] is not None and not spec.uses_executable:
        fail("executable", f'not used with engine = "{engine}"'
             + (" (set python)" if spec.module else ""))
    tp = v["tensor-parallel"]
    gpus = v["gpus"]
    if tp is not None and not spec.tp_flag:
        fail("tensor-parallel", f'{engine} has no tensor-parallel flag; it uses every GPU given')
    hosts = len(v["nodes.hosts"]) if isinstance(v["nodes.hosts"], list) else 1
    if isinstance(gpus, list) and tp is not None and tp > len(gpus) * hosts:
        fail("tensor-parallel", f"{tp} is more than the {len(gpus) * hosts} GPUs in gpus"
             + (f" on {hosts} hosts" if hosts > 1 else ""))
    if gpus == "all" and tp is None and spec.tp_flag:
        fail("tensor-parallel", 'required with gpus = "all" (the GPU count is only known at start)')
    if isinstance(gpus, list):
        kinds = {("pci" if isinstance(g, str) and is_pci(g) else
                  "uuid" if isinstance(g, str) else "index") for g in gpus}
        if len(kinds) > 1:
            fail("gpus", "mixes indexes, UUIDs and PCI bus ids; use one kind")
        mig = [g for g in gpus if isinstance(g, str) and g.upper().startswith("MIG-")]
        if mig:
            # Refused here, not at the start: pre-start finds a GPU's users,
            # reaps them and waits for its memory per whole GPU, and vLLM
            # would crash on the name besides.
            fail("gpus", f"{mig[0]} is a MIG device: infer-units runs servers on whole GPUs "
                 "(it finds their users and waits for their memory per GPU)"
                 + (", and vLLM reads CUDA_VISIBLE_DEVICES with int(), which a MIG device's "
                    "name fails at start (vllm#41848)" if engine == "vllm" else "")
                 + "; name the whole GPU with MIG off (nvidia-smi -i N -mig 0)")
    for key, instead in (("TimeoutStopSec", "[stop] timeout"),
                         ("TimeoutStartSec", "[ready] timeout")):
        if key in v["service"]:
            fail(f"service.{key}", f"derived by infer-units so that its hooks fit; set "
                 f"{instead} instead")
    ready_env = v["env"].get("VLLM_ENGINE_READY_TIMEOUT_S")
    if engine == "vllm" and ready_env is not None:
        try:
            seconds = float(ready_env)
        except ValueError:
            seconds = -1.0
        if not seconds >= v["ready.timeout"]:
            fail("env.VLLM_ENGINE_READY_TIMEOUT_S",
                 f"{ready_env!r} is below [ready] timeout ({v['ready.timeout']:g}s): vLLM "
                 "would abort its own start first (leave it unset: infer-units sets it)")
    for key, targets in v["install"].items():
        if key not in ("WantedBy", "RequiredBy", "UpheldBy"):
            fail(f"install.{key}", "generated units only support WantedBy, RequiredBy, UpheldBy")
        for target in targets:
            # Each becomes the directory <target>.wants/ under the generator's
            # output: a unit name, never a path.
            if not _is_unit_name(target):
                fail(f"install.{key}", f"{show(target)} is not a unit name like multi-user.target")


_UNIT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:-_.\\@")
_UNIT_TYPES = ("service", "socket", "target", "device", "mount", "automount", "swap", "timer",
               "path", "slice", "scope")


def _is_unit_name(text: str) -> bool:
    """systemd's unit_name_is_valid(), for the names [install] may link from."""
    stem, dot, suffix = text.rpartition(".")
    return (bool(stem) and bool(dot) and suffix in _UNIT_TYPES and len(text) <= 255
            and _UNIT_CHARS.issuperset(stem) and not stem.startswith(".")
            and stem.count("@") <= 1 and not stem.startswith("@"))
