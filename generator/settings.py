"""Every model-file key, declared once: name, type, default and help.

The table drives parsing and validation (model.py), the defaults, and the key
reference in the README (`python3 -m infer_units.generator.settings` prints it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import nodes, urls
from .durations import parse_duration

ENGINES = ("sglang", "vllm", "trtllm", "tgi", "llamacpp", "command")

# The GPU and host health checks pre-start applies (helpers/health.py;
# docs/architecture.md): the names `[health] accept` takes.
HEALTH_CHECKS = ("remapped-rows", "retired-pages", "xid", "ecc", "persistence", "fabric", "mig",
                 "hmm", "cc", "iommu", "acs", "nvidia-uvm")

# [canary] api: the request shapes the known-answer check knows.
CANARY_APIS = ("openai", "llamacpp", "tgi")

# Processes every reaper must leave alone; [reap] ignore adds to these.
BUILTIN_IGNORE = ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter")
# [reap] foreign; also the choices of the hooks' and the CLI's --foreign.
REAP_FOREIGN = ("kill", "wait", "fail")

# Plain character sets: what each check allows, readable at a glance
# generator's path.
_HEX = frozenset("0123456789abcdefABCDEF")
_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_ENV_CHARS = _LETTERS | frozenset("0123456789_")
_DIRECTIVE_CHARS = _LETTERS | frozenset("0123456789")


def is_uuid(text: str) -> bool:
    """GPU-<hex and dashes> or MIG-<...>, as nvidia-smi -L prints them."""
    head, sep, rest = text.partition("-")
    return (head in ("GPU", "MIG") and bool(sep) and len(rest) >= 8
            and all(c in _HEX or c == "-" for c in rest))


def is_pci(text: str) -> bool:
    """[domain:]bus:device.function, e.g. 0000:41:00.0 or 41:00.0."""
    parts = text.split(":")
    if len(parts) == 3:
        domain = parts.pop(0)
        if not 4 <= len(domain) <= 8 or not _HEX.issuperset(domain):
            return False
    if len(parts) != 2:
        return False
    bus, rest = parts
    device, dot, function = rest.partition(".")
    return (len(bus) == 2 and _HEX.issuperset(bus) and len(device) == 2
            and _HEX.issuperset(device) and dot == "." and function in "01234567"
            and len(function) == 1)


def _is_env_name(name: str) -> bool:
    return bool(name) and _ENV_CHARS.issuperset(name) and not name[0].isdigit()


def _is_directive(name: str) -> bool:
    return bool(name) and _DIRECTIVE_CHARS.issuperset(name) and "A" <= name[0] <= "Z"


def _no_nul(value: str) -> str:
    if "\0" in value:
        raise ValueError("contains a NUL character, which no argv or environment can carry")
    return value


def check_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return _no_nul(value)


def check_nonempty_str(raw: Any) -> str:
    value = check_str(raw)
    if not value:
        raise ValueError("must not be empty")
    return value


# Bytes that end a line for systemd's unit parser (LF, CR, NUL) or have no
# business in a unit; tab is whitespace to systemd and stays allowed.
# NEL and the Unicode line separators too: they break lines for editors.
_CONTROL = frozenset(chr(c) for c in (*range(0x20), 0x7F, 0x85, 0x2028, 0x2029)) - {"\t"}


def show(value: Any, limit: int = 60) -> str:
    """repr() for error messages, cut short: a value can be a megabyte."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def no_control(value: str) -> str:
    """Refuse control characters (a newline or CR would start a new directive)."""
    if not value.isprintable():
        for ch in value:
            if ch in _CONTROL:
                raise ValueError(f"contains the control character {ch!r}, "
                                 "which could start a new line in the unit")
    return value


def check_line(raw: Any) -> str:
    """Text that lands verbatim on one unit line (Description=)."""
    value = no_control(check_nonempty_str(raw))
    if value.endswith("\\"):
        raise ValueError("ends with a backslash, which systemd reads as a line continuation")
    return value


def check_operand(raw: Any) -> str:
    """A value the server takes after a flag (the model): not itself a flag."""
    value = no_control(check_nonempty_str(raw))
    if value.startswith("-"):
        raise ValueError(f"{show(value)} starts with '-', so the server would read it as a flag")
    return value


def check_url(raw: Any) -> str:
    """A health URL, read as every hook reads it (urls.py)."""
    value = check_str(raw)
    urls.parse_url(value)
    return value


def check_host(value: Any) -> str:
    """The address the server binds: a name or an IP address, no port (urls.py)."""
    return urls.check_host(check_str(value))


def check_program(raw: Any) -> str:
    """The first word of an Exec line: an absolute, normalized path, or a bare
    name systemd looks up in its PATH (what `systemd-analyze verify` accepts)."""
    value = no_control(check_nonempty_str(raw))
    # Printable text has no whitespace but " " (the loop's only question).
    for ch in "" if value.isprintable() else value:
        if ch != " " and (ch.isspace() or not ch.isprintable()):
            # systemd's string_is_safe() refuses every control character (a tab
            # too: "Executable name contains special characters"), and other
            # whitespace in a program's name is a typo nobody can see.
            raise ValueError(f"{show(value)} contains {ch!r}, which systemd refuses in the "
                             "name of the program it runs")
    if "$" in value:
        # systemd expands $VAR in argv[0] but not in the path it executes:
        # no quoting makes both right ("$$" is "$" in one, "$$" in the other).
        raise ValueError(f"{show(value)} contains '$', which systemd would read as a variable")
    for c in "\\\"'\x7f":
        if c in value:
            # systemd's string_is_safe(): "Executable name contains special characters"
            raise ValueError(f"{show(value)} contains {c!r}, which systemd refuses in the "
                             "name of the program it runs")
    if value.startswith("/"):
        if any(part in ("", ".", "..") for part in value.split("/")[1:]):
            raise ValueError(f"{show(value)} is not a normalized path "
                             "(no '//', '.', '..' or trailing '/')")
        if len(value.encode()) >= 4096 or any(len(p.encode()) > 255 for p in value.split("/")):
            raise ValueError("path too long")
        return value
    if "/" in value:
        raise ValueError(f"{show(value)} is a relative path: give an absolute path, "
                         "or a bare name that systemd looks up in its PATH")
    if value in (".", "..") or len(value.encode()) > 255:
        raise ValueError(f"{show(value)} is not a program name")
    if value[0] in "-@+!:":
        raise ValueError(f"{show(value)} starts with {value[0]!r}, "
                         "which systemd reads as a flag of the Exec line")
    return value


_DIGITS = frozenset("0123456789")
_USER_CHARS = _ENV_CHARS | frozenset("-")


def check_user(raw: Any) -> str:
    """systemd's strict user name rules (what User= takes without a warning),
    or a numeric UID."""
    value = check_nonempty_str(raw)
    if _DIGITS.issuperset(value):
        if (len(value) > 10 or (len(value) > 1 and value[0] == "0")
                or int(value) > 4294967294 or int(value) == 65535):
            raise ValueError(f"{show(value)} is not a valid numeric UID")
        return value
    if not ((value[0] in _LETTERS or value[0] == "_") and _USER_CHARS.issuperset(value)
            and len(value) <= 31):
        raise ValueError(f"{show(value)} is not a valid user name (a letter or '_', then "
                         "letters, digits, '_' or '-', at most 31 characters; or a numeric UID)")
    return value


# Integers beyond 64 bits are no port, index or count, and str() of a huge one
# raises (Python limits int->str to 4300 digits): refuse them early.
INT_LIMIT = 2 ** 63
# CUDA and NVML take a GPU index as a C int.
GPU_INDEX_LIMIT = 2 ** 31


def check_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise ValueError("integer too large (more than 64 bits)")
    return value


def check_port(raw: Any) -> int:
    value = check_int(raw)
    if not 1 <= value <= 65535:
        raise ValueError(f"port {value} is outside 1..65535")
    return value


def check_positive_int(raw: Any) -> int:
    value = check_int(raw)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def check_str_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"expected an array of strings, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(f"item {i} is {type(item).__name__}, expected a string")
        _no_nul(item)
    return list(value)


def check_process_names(raw: Any) -> list[str]:
    """Names handed to the hooks as `--ignore NAME`: a name that looks like a
    flag would make the hook fail at every start."""
    value = check_str_list(raw)
    for i, name in enumerate(value):
        try:
            check_operand(name)
        except ValueError as e:
            raise ValueError(f"item {i}: {e}") from None
    return value


def check_argv(raw: Any) -> list[str]:
    value = check_str_list(raw)
    if not value:
        raise ValueError("must name at least the program to run")
    try:
        check_program(value[0])
    except ValueError as e:
        raise ValueError(f"item 0 (the program): {e}") from None
    return value


def check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {type(value).__name__}")
    return value


def check_duration(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a time span like \"10s\", got {type(value).__name__}")
    return parse_duration(value)


def check_gpus(value: Any) -> list[str | int] | str:
    """ints (PCI-bus order index), "GPU-<uuid>", PCI bus ids, or "all"."""
    if value == "all":
        return "all"
    if not isinstance(value, list):
        raise ValueError('expected an array of GPU indexes, UUIDs or PCI bus ids, or "all"')
    if not value:
        raise ValueError("names no GPU")
    seen: set[str] = set()
    out: list[str | int] = []
    for i, item in enumerate(value):
        if isinstance(item, bool):
            raise ValueError(f"item {i} is a boolean")
        if isinstance(item, int):
            if item < 0:
                raise ValueError(f"item {i}: GPU index {show(item)} is negative")
            if item >= GPU_INDEX_LIMIT:
                raise ValueError(f"item {i}: GPU index {show(item)} is too large")
        elif isinstance(item, str):
            if not (is_uuid(item) or is_pci(item)):
                raise ValueError(
                    f"item {i}: {show(item)} is neither a GPU index, a GPU-<uuid> nor a PCI bus id")
            if is_pci(item):
                item = normalize_pci(item)
        else:
            raise ValueError(f"item {i} is {type(item).__name__}")
        key = str(item).lower()
        if key in seen:
            raise ValueError(f"GPU {item} is listed twice")
        seen.add(key)
        out.append(item)
    return out


def normalize_pci(bus_id: str) -> str:
    """"41:00.0" and "00000000:41:00.0" both become "0000:41:00.0"."""
    bus_id = bus_id.lower()
    parts = bus_id.split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


def check_env_table(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError("expected a table")
    out: dict[str, str] = {}
    for name, item in value.items():
        if not _is_env_name(name):
            raise ValueError(f"{show(name)} is not a valid environment variable name")
        out[name] = scalar_text(item, name)
    return out


# What the dynamic loader and glibc read at every program start, root's
# included (glibc drops them only for setuid programs).  The unit's Environment=
# reaches the root (+) hooks too, so one of these pointing at a directory the
# service user writes would run their code as root: refused (docs/trust.md).  PYTHON* variables stay allowed: the hooks run `python3 -I`.
LOADER_ENV = frozenset({"GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
                        "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF",
                        "RES_OPTIONS", "TZDIR", "GLIBC_TUNABLES"})


def is_loader_env(name: str) -> bool:
    return name.startswith("LD_") or name in LOADER_ENV


def check_server_env(value: Any) -> dict[str, str]:
    out = check_env_table(value)
    for name in out:
        if is_loader_env(name):
            raise ValueError(f"{name}: read by the dynamic loader of every process of the unit, "
                             "its root hooks included; refused (set it in the server's own "
                             "wrapper script, engine = \"command\")")
    return out


def is_env_name(name: str) -> bool:
    """What systemd's Environment= takes as a name: [A-Za-z_][A-Za-z0-9_]*."""
    return _is_env_name(name)


def scalar_text(item: Any, name: str) -> str:
    if isinstance(item, bool):
        return "1" if item else "0"
    if isinstance(item, int):
        try:
            return str(check_int(item))
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    if isinstance(item, float):
        return str(item)
    if isinstance(item, str):
        return _no_nul(item)
    raise ValueError(f"{name}: expected a string, number or boolean, got {type(item).__name__}")


# Raw directives that belong to another section than the one they are in
# (systemd ignores them there with a warning nobody reads), and [service]
# directives that would undo what the unit is for.
_UNIT_ONLY = frozenset({
    "Description", "Documentation", "Wants", "Requires", "Requisite", "BindsTo", "PartOf",
    "Upholds", "Conflicts", "Before", "After", "OnFailure", "OnSuccess", "PropagatesReloadTo",
    "ReloadPropagatedFrom", "JoinsNamespaceOf", "RequiresMountsFor", "OnFailureJobMode",
    "IgnoreOnIsolate", "StopWhenUnneeded", "RefuseManualStart", "RefuseManualStop",
    "AllowIsolate", "DefaultDependencies", "CollectMode", "FailureAction", "SuccessAction",
    "JobTimeoutSec", "JobRunningTimeoutSec", "JobTimeoutAction", "StartLimitIntervalSec",
    "StartLimitBurst", "StartLimitAction", "RebootArgument", "SourcePath"})
_INSTALL_ONLY = frozenset({"Alias", "WantedBy", "RequiredBy", "UpheldBy", "Also",
                           "DefaultInstance"})
_SERVICE_ONLY = frozenset({
    "Type", "ExitType", "RemainAfterExit", "GuessMainPID", "PIDFile", "BusName", "ExecStart",
    "ExecStartPre", "ExecStartPost", "ExecCondition", "ExecReload", "ExecStop",
    "ExecStopPost", "RestartSec", "RestartSteps", "RestartMaxDelaySec", "TimeoutStartSec", "TimeoutStopSec", "TimeoutAbortSec",
    "TimeoutSec", "RuntimeMaxSec", "WatchdogSec", "Restart", "RestartForceExitStatus",
    "SuccessExitStatus", "RestartPreventExitStatus", "KillMode", "KillSignal", "User",
    "Group", "Environment", "EnvironmentFile", "PassEnvironment", "UnsetEnvironment",
    "WorkingDirectory", "LimitNOFILE", "LimitMEMLOCK", "Nice", "CPUAffinity",
    "StandardOutput", "StandardError", "SyslogIdentifier", "MemoryMax", "CPUQuota"})
_SECTION_OF = {**{k: "unit" for k in _UNIT_ONLY}, **{k: "install" for k in _INSTALL_ONLY},
               **{k: "service" for k in _SERVICE_ONLY}}
_SERVICE_REFUSED = {
    "ExecStart": "the server's argv is ExecStart: use command/args (or engine = \"command\")",
    "Environment": "reaches the root hooks as well as the server: use [env]",
    "EnvironmentFile": "reaches the root hooks as well as the server: use [env]",
    "PassEnvironment": "reaches the root hooks as well as the server: use [env]",
    "UnsetEnvironment": "would unset what the generated unit sets: use [env]",
}


def check_section(value: Any, section: str) -> dict[str, list[str]]:
    out = check_directives(value)
    for name in out:
        home = _SECTION_OF.get(name)
        if home is not None and home != section:
            raise ValueError(f"{name} is a [{home.capitalize()}] directive, not "
                             f"[{section.capitalize()}]: put it under [{home}]")
        if section == "service" and name in _SERVICE_REFUSED:
            raise ValueError(f"{name}: {_SERVICE_REFUSED[name]}")
    return out


def check_directives(value: Any) -> dict[str, list[str]]:
    """Raw systemd directives; a list value repeats the directive.  Passed
    through verbatim (specifiers and all), so a value that could end its line
    early or continue it onto the next is refused, not escaped."""
    if not isinstance(value, dict):
        raise ValueError("expected a table of systemd directives")
    out: dict[str, list[str]] = {}
    for name, item in value.items():
        if not _is_directive(name):
            raise ValueError(f"{show(name)} is not a systemd directive name (like TimeoutStopSec)")
        items = item if isinstance(item, list) else [item]
        texts = []
        for element in items:
            if isinstance(element, bool):
                texts.append("yes" if element else "no")
            elif isinstance(element, (int, float, str)):
                try:
                    if isinstance(element, str):
                        text = no_control(element)
                    elif isinstance(element, int):
                        text = str(check_int(element))
                    elif element != element or element in (float("inf"), float("-inf")):
                        raise ValueError("not a finite number")
                    else:
                        text = str(element)
                except ValueError as e:
                    raise ValueError(f"{name}: {e}") from None
                if text.endswith("\\"):
                    raise ValueError(f"{name}: ends with a backslash, which systemd reads "
                                     "as a line continuation")
                texts.append(text)
            else:
                raise ValueError(f"{name}: expected strings, numbers or booleans")
        out[name] = texts
    return out


def check_health_accept(value: Any) -> list[str]:
    """[health] accept: names of health checks whose errors do not refuse a start."""
    if not isinstance(value, list):
        raise ValueError("expected a list of check names")
    out: list[str] = []
    for item in value:
        if item not in HEALTH_CHECKS:
            raise ValueError(f"{show(item)} is not a health check (known: "
                             + ", ".join(HEALTH_CHECKS) + ")")
        if item not in out:
            out.append(item)
    return out


def check_choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if isinstance(value, str) and value in choices:
            return value
        raise ValueError(f"{show(value)} is not one of: {', '.join(choices)}")
    return check


def _tuple_or_none(value: Any) -> Any:
    return None if value is None else tuple(value)


# Setting(attr=DERIVED): no Model attribute of its own; generator/model.py
# derives one from it and other values (the engine's defaults, the nodes).
DERIVED = ""
_FROM_KEY = "(the key as a name)"


@dataclass
class Setting:
    """One key: how it is read (check), its default, its help line in the
    docs, and the Model attribute it becomes (model.py fills those from this
    table: no setting is copied by hand)."""

    key: str                        # dotted: "reap.term-grace"
    check: Callable[[Any], Any]     # validates and normalizes; ValueError with the reason
    default: Any                    # None: unset unless the engine supplies it
    help: str
    # Model attribute: by default the key as a name ("reap_term_grace");
    # DERIVED: model.py computes the attribute from this and more.
    attr: str = _FROM_KEY
    convert: Callable[[Any], Any] | None = None    # checked value -> the Model's

    def __post_init__(self) -> None:
        if self.attr == _FROM_KEY:
            self.attr = self.key.replace(".", "_").replace("-", "_")


SETTINGS: tuple[Setting, ...] = (
    Setting("engine", check_choice(ENGINES), None,
            "Server to run: " + ", ".join(ENGINES) + ". Required."),
    Setting("model", check_operand, None,
            "Model path or hub id (every engine but command). An absolute path must "
            "exist on this host: the unit waits for its mount (RequiresMountsFor=) and "
            "a start without it is refused, with no automatic restart."),
    Setting("gpus", check_gpus, None,
            'GPUs: indexes (PCI-bus order, as nvidia-smi), "GPU-<uuid>", PCI bus ids, or "all".'),
    Setting("port", check_port, None, "TCP port the server listens on."),
    Setting("host", check_host, "127.0.0.1", "Address the server binds."),
    Setting("tensor-parallel", check_positive_int, None,
            "Tensor-parallel size; default: the number of GPUs."),
    Setting("args", check_str_list, [], "Extra argv for the server, passed verbatim.",
            convert=tuple),
    Setting("command", check_argv, None, "engine = \"command\": the whole argv.",
            convert=_tuple_or_none),
    Setting("python", check_program, "/usr/bin/python3",
            "Interpreter for sglang, vllm and trtllm (`<python> -m <module>`)."),
    Setting("executable", check_program, None,
            "Server binary for tgi and llamacpp (default: text-generation-launcher, llama-server)."),
    Setting("user", check_user, None, "User= the server runs as (hooks stay root)."),
    Setting("description", check_line, None, "Description= of the unit."),
    Setting("env", check_server_env, {}, "Extra environment, verbatim, applied last."),
    Setting("nccl.p2p", check_choice(("on", "off", "auto")), "on",
            'on: NCCL decides; off: NCCL_P2P_DISABLE=1; auto: copy-and-compare self-test at start.'),
    Setting("reap.foreign", check_choice(REAP_FOREIGN), "kill",
            "What to do with processes of no infer-units service on this model's GPUs."),
    Setting("reap.term-grace", check_duration, 10.0, "Time between SIGTERM and SIGKILL."),
    Setting("reap.timeout", check_duration, 60.0,
            "How long to wait for GPUs (and the port) to become free."),
    Setting("reap.ignore", check_process_names, [],
            "Process names never touched, added to: " + ", ".join(BUILTIN_IGNORE) + ".",
            attr=DERIVED),
    Setting("ready.url", check_url, None, "Health URL; default: the engine's."),
    Setting("ready.timeout", check_duration, 1200.0, "How long the server may take to load."),
    Setting("ready.interval", check_duration, 0.05,
            "Time between health requests once the port listens (until then a connect() "
            "attempt every 50ms, which the server never sees); the unit is active within "
            "about this long of the server's first 2xx."),
    Setting("ready.probe-timeout", check_duration, None,
            "How long one health request may take; default per engine (SGLang's /health "
            "generates a token: 30s; others 10s).", attr=DERIVED),
    Setting("stop.drain", check_duration, None,
            "On stop and restart, how long the requests in flight may finish while new ones "
            "are refused; default per engine (vLLM, SGLang, TRT-LLM 30s; TGI 90s, for its "
            "router, then its shards; llama.cpp and command 0s: llama.cpp cannot drain). "
            "\"0s\": requests in flight are cut at once. vLLM gets --shutdown-timeout, TGI "
            "--graceful-termination-timeout, SGLang SGL_FORCE_SHUTDOWN=1 when 0s; SGLang and "
            "TRT-LLM drain until TimeoutStopSec= otherwise.", attr=DERIVED),
    Setting("stop.timeout", check_duration, None,
            "The whole stop after SIGTERM: the drain (twice for TGI) and the engine's teardown; "
            "default the drain + 30s. TimeoutStopSec= is this + 15s.", attr=DERIVED),
    Setting("nodes.hosts", nodes.check_hosts, None,
            "One model across hosts: every host, in rank order (sglang, vllm).", attr=DERIVED),
    Setting("nodes.addr", nodes.check_addr, None,
            "Rendezvous host:port (SGLang --dist-init-addr, vLLM --master-addr/--master-port); "
            "default: the first host, port 29500.", attr=DERIVED),
    Setting("nodes.rank", nodes.check_rank, None,
            "This host's rank; default: its name's position in hosts (set it in a host-local "
            "drop-in).", attr=DERIVED),
    Setting("nodes.head-url", check_url, None,
            "Where the other hosts probe the group's health; default: http://<addr host>:<port>"
            "<health path>.", attr=DERIVED),
    Setting("unit", lambda v: check_section(v, "unit"), {}, "Raw [Unit] directives.",
            attr="unit_directives"),
    Setting("service", lambda v: check_section(v, "service"), {},
            "Raw [Service] directives (they win over ours).", attr="service_directives"),
    Setting("install", lambda v: check_section(v, "install"), {},
            "[Install]: WantedBy=/RequiredBy= become .wants/.requires links.",
            attr="install_directives"),
    Setting("health.accept", check_health_accept, [],
            "Health checks whose errors do not refuse a start (logged as warnings), e.g. "
            '["xid"] after a GPU reset; names as `infer-units doctor` prints them.',
            convert=tuple),
    Setting("liveness.interval", check_duration, 30.0,
            "Time between health probes once the unit is active; \"0\" turns liveness off.",
            attr=DERIVED),
    Setting("liveness.failures", check_positive_int, 4,
            "Consecutive failed probes after which systemd restarts the unit.", attr=DERIVED),
    Setting("liveness.timeout", check_duration, None,
            "How long one probe may take (a slower or non-2xx answer fails it); default: "
            "[ready] probe-timeout (per engine: SGLang 30s, others 10s).", attr=DERIVED),
    Setting("liveness.probe", check_choice(("health", "generate")), None,
            "health: GET the health URL; generate: POST a one-token completion to the "
            "engine's OpenAI-compatible /v1/completions (max_tokens 1), so a server whose "
            "health endpoint answers while its engine is broken is restarted; default per "
            "engine (vLLM and llama.cpp: generate, their /health reads a flag (vllm#36960); "
            "SGLang and TGI: health, theirs already generates).", attr=DERIVED),
    Setting("liveness.max-restarts", check_int, 3,
            "Liveness restarts allowed within restart-window; one more hang and the unit is "
            "stopped and left failed.", attr=DERIVED),
    Setting("liveness.restart-window", check_duration, 21600.0,
            "The window max-restarts counts in.", attr=DERIVED),

    Setting("canary.enabled", check_bool, None,
            "The known-answer check before the unit turns active: one greedy request "
            "(temperature 0, a fixed seed and prompt) compared with the answer recorded for "
            "this model on this host (docs/canary.md). Default: on for every engine but "
            "command (on there once `api` is set); false where the engine's kernels are not "
            "deterministic at batch 1.", attr=DERIVED),
    Setting("canary.on-mismatch", check_choice(("refuse", "warn")), "refuse",
            "A different answer under the same key (engine and version, weights, argv, GPUs, "
            "driver): refuse the start (no automatic restart) or go on with a warning; "
            "\"warn\" also lets a start go on when the check gets no usable answer.",
            attr=DERIVED),
    Setting("canary.prompt", check_nonempty_str, "The quick brown fox",
            "The request's prompt.", attr=DERIVED),
    Setting("canary.tokens", check_positive_int, 16,
            "Tokens generated (at most 256).", attr=DERIVED),
    Setting("canary.timeout", check_duration, 30.0,
            "One deadline for the check's requests (the answer and the version).",
            attr=DERIVED),
    Setting("canary.api", check_choice(CANARY_APIS), None,
            "The request's shape: openai (/v1/completions), llamacpp (/completion), tgi "
            "(/generate); default per engine (vLLM, SGLang, TRT-LLM: openai); engine = "
            "\"command\" has none unless set.", attr=DERIVED),
)

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


def default(key: str) -> Any:
    """The default of a dotted key ("reap.term-grace"): the hooks' and the CLI's
    options take theirs from here, so each default is declared once."""
    return BY_KEY[key].default


# The [service] directives of the crash-loop back-off, each overridable from
# [service]: 5 s before the first automatic restart, then about twice as long
# each time, up to 5 minutes (docs/engines.md, "Restarts").  systemd < 254
# knows only RestartSec=: there pre-start waits out the rest.
RESTART_DEFAULTS = {"RestartSec": "5s", "RestartSteps": "6", "RestartMaxDelaySec": "5min"}


# Tables whose own keys are fixed (others are free-form: env, unit, service, install).
FIXED_TABLES = ("reap", "ready", "stop", "nodes", "liveness", "health", "canary")


def reference_markdown() -> str:
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    from .durations import format_seconds
    for s in SETTINGS:
        if s.default in (None, [], {}):
            default = ""
        elif s.check is check_duration:
            default = f'"{format_seconds(s.default)}"'
        elif isinstance(s.default, str):
            default = f'"{s.default}"'
        else:
            default = str(s.default)        # as a file writes it: failures = 4

        lines.append(f"| `{s.key}` | {default} | {s.help} |")
    lines.append("| `nccl.<name>` | | Any other NCCL variable: `socket-ifname` or `NCCL_SOCKET_IFNAME`. |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown())
