"""The known-answer check: one deterministic request through the engine's
own API, its answer compared with the one recorded for this model on this
host (DESIGN.md, "Known-answer check"; docs/canary.md).

A server that answers health can still answer wrongly (corrupted weights, a
GPU with silent data corruption, P2P DMA under an IOMMU).  The check asks
for a few greedy tokens (temperature 0, a fixed seed and prompt) and keeps,
root-only under generator/canary.py's RECORD_DIR, the tokens and the key
they were recorded under: what legitimately changes an answer (the engine
and its version, the weights' file names, sizes and mtimes or the hub id,
the server's argv as systemd runs it, the GPUs' UUIDs, the driver).  A
changed key records anew and says why; the same key with other tokens is a
mismatch, named by its first differing token.

Everything the server sends is untrusted: read through the one probe
(facts/probe.py) under one deadline, bounded in size, parsed as JSON of an
expected shape (anything else is an error, never a pass), and escaped
(one_line) wherever it is said.  Nothing of the model's is run: the
engine's version is what the server answers at its own version endpoint,
the weights are stat()ed (lstat below the model's path, no link followed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

from ...generator import settings
from ...generator.atomicfile import UnsafePath, read_text, write_file
from ...generator.canary import RECORD_DIR
from ...generator.engines import ENGINE_SPECS
from ...generator.errors import one_line
from ...generator.urls import parse_url
from .. import argtypes
from ..facts.probe import http_probe

SEED = 1234
MAX_ANSWER = 65536       # bytes of the answer read; more is no answer
MAX_VERSION = 16384
WALK_FILES = 4096        # entries of the model's directory in the key
WALK_DEPTH = 8
SHOWN = 40               # characters of a token or text said in one line


class CanaryError(Exception):
    """The check got no usable answer: the message says why (escaped)."""


@dataclass(frozen=True)
class Options:
    """What the unit's `known-answer` line gives (render.py _canary)."""
    unit: str
    engine: str
    url: str                 # the server's origin: http://127.0.0.1:8000/
    api: str
    prompt: str
    tokens: int
    timeout: float
    on_mismatch: str
    served_name: str | None = None
    model: str | None = None
    gpus: str | None = None


@dataclass(frozen=True)
class Result:
    verdict: str             # MATCH | RECORDED | MISMATCH | ERROR
    message: str             # one escaped line
    seconds: float


MATCH, RECORDED, MISMATCH, ERROR = "match", "recorded", "mismatch", "error"


# ------------------------------------------------------------------ the unit's line

def declare_options(option: Callable[..., Any],
                    typed: Callable[[Callable[[str], Any]], Any]) -> None:
    """The options of the unit's known-answer line (render.py _canary), for
    the hook's parser and for `infer-units canary`, which reads the running
    unit's line.  `typed`: an option type from an argtypes check."""
    option("--unit", required=True, type=typed(argtypes.unit))
    option("--engine", required=True, choices=settings.ENGINES)
    option("--url", required=True, type=typed(argtypes.http_url),
           help="the server's origin; the API's path is its own")
    option("--api", required=True, choices=settings.CANARY_APIS)
    option("--prompt", default=settings.default("canary.prompt"))
    option("--tokens", type=typed(argtypes.count), default=settings.default("canary.tokens"))
    option("--timeout", type=typed(argtypes.duration),
           default=settings.default("canary.timeout"),
           help="one deadline for the check's requests")
    option("--on-mismatch", choices=("refuse", "warn"),
           default=settings.default("canary.on-mismatch"))
    option("--served-name", help='the "model" of an OpenAI-compatible request')
    option("--model", help="the model's path (its files are in the key) or hub id")
    option("--gpus", help="the model's GPUs (their UUIDs and the driver are in the key)")
    option("--pid", help="the server's pid ($MAINPID): gone, there is nothing to check")


def options_of(a: argparse.Namespace) -> Options:
    return Options(argtypes.unit_name(a.unit), a.engine, a.url, a.api, a.prompt,
                   max(1, a.tokens), a.timeout, a.on_mismatch, a.served_name, a.model, a.gpus)


class _LineParser(argparse.ArgumentParser):
    """Any error is a ValueError (argparse would print its usage and exit)."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def options_of_unit_line(words: list[str]) -> Options:
    """The options of a known-answer line as systemd loaded it (the words
    after `known-answer`: `--option value` or `--option=value`, as render.py
    writes them); ValueError for one this version cannot read."""
    p = _LineParser(prog="known-answer", add_help=False, allow_abbrev=False)
    declare_options(p.add_argument, lambda check: check)
    glued: list[str] = []
    rest = iter(words)
    for word in rest:
        if word.startswith("--") and "=" not in word:
            value = next(rest, None)
            if value is None:
                raise ValueError(f"{word} without a value")
            word = f"{word}={value}"
        glued.append(word)
    return options_of(p.parse_args(glued))


def stopping(unit: str, pid: str | None) -> str | None:
    """Why there is nothing to check, or None: the unit is being stopped or
    restarted (systemd still runs the ExecStartPost= after wait-ready's when
    a stop came while the server loaded), or its server is gone (systemd
    handles its exit).  SystemdUnavailable is the caller's."""
    if pid and pid.isascii() and pid.isdigit():
        try:
            os.close(os.pidfd_open(int(pid)))
        except ProcessLookupError:
            return f"the server (pid {pid}) is gone"
        except OSError:
            pass
    from ..facts.systemd import pending_job_type
    job = pending_job_type(unit)
    return f"{unit} is being stopped (a {job} job)" if job in ("stop", "restart") else None


def server_argv(unit: str) -> list[str]:
    """The server's argv as systemd runs it (ExecStart of the loaded unit):
    the key's engine arguments.  SystemdUnavailable when it cannot say."""
    from ..facts.systemd import exec_argvs
    argvs = exec_argvs(unit, "ExecStart")
    return argvs[0] if argvs else []


# ------------------------------------------------------------------ the request

def request(api: str, prompt: str, tokens: int,
            served_name: str | None) -> tuple[str, str]:
    """(target, JSON body) of the greedy request in the API's own shape."""
    if api == "llamacpp":
        return "/completion", json.dumps({
            "prompt": prompt, "n_predict": tokens, "temperature": 0, "top_k": 1,
            "seed": SEED, "cache_prompt": False, "return_tokens": True, "stream": False})
    if api == "tgi":
        return "/generate", json.dumps({"inputs": prompt, "parameters": {
            "max_new_tokens": tokens, "do_sample": False, "seed": SEED, "details": True}})
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": tokens, "temperature": 0,
                            "seed": SEED, "logprobs": 0, "stream": False}
    if served_name:
        body["model"] = served_name
    return "/v1/completions", json.dumps(body)


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CanaryError(f"{what} is not JSON: {_shown(data.decode('utf-8', 'replace'))}") \
            from None
    if not isinstance(value, dict):
        raise CanaryError(f"{what} is not a JSON object")
    return value


def answer_tokens(api: str, data: bytes) -> tuple[list[str], str]:
    """(tokens, text) of an answer: the tokens the server says it generated
    (ids where the API gives them), else the text as one.  CanaryError for
    anything not of the API's shape."""
    answer = _json_object(data, "the answer")
    tokens: Any = None
    if api == "llamacpp":
        text = answer.get("content")
        tokens = answer.get("tokens")
    elif api == "tgi":
        text = answer.get("generated_text")
        details = answer.get("details")
        if isinstance(details, dict) and isinstance(details.get("tokens"), list):
            tokens = [t.get("id") if isinstance(t, dict) else None for t in details["tokens"]]
    else:
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise CanaryError("the answer has no choices")
        text = choices[0].get("text")
        logprobs = choices[0].get("logprobs")
        if isinstance(logprobs, dict):
            tokens = logprobs.get("tokens")
    if not isinstance(text, str):
        raise CanaryError("the answer has no generated text")
    if isinstance(tokens, list) and tokens and all(
            isinstance(t, str) or (isinstance(t, int) and not isinstance(t, bool))
            for t in tokens):
        return [str(t) for t in tokens], text
    return [text], text


def _shown(text: str) -> str:
    text = one_line(text)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def _deadline_left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise CanaryError("no answer within the check's timeout")
    return left


def ask(opts: Options, deadline: float) -> tuple[list[str], str]:
    """The server's answer to the greedy request, within the deadline."""
    target, body = request(opts.api, opts.prompt, opts.tokens, opts.served_name)
    url = parse_url(opts.url).with_target(target)
    answer = http_probe(url, _deadline_left(deadline), body, read=MAX_ANSWER)
    if not answer.ok or answer.body is None:
        raise CanaryError(f"{url.text()}: {one_line(answer.text)}")
    return answer_tokens(opts.api, answer.body)


def engine_version(opts: Options, deadline: float) -> str | None:
    """What the server says its version is (the engine's own endpoint, e.g.
    vLLM's /version, llama.cpp's /props build_info); None where the engine
    has none.  CanaryError where it has one and it does not answer: a
    version that comes and goes would change the key and record anew,
    hiding a mismatch."""
    spec = ENGINE_SPECS.get(opts.engine)
    if spec is None or spec.version_path is None:
        return None
    url = parse_url(opts.url).with_target(spec.version_path)
    answer = http_probe(url, _deadline_left(deadline), read=MAX_VERSION)
    if answer.text == "HTTP 404":
        return f"unknown ({spec.version_path}: HTTP 404)"     # a build without it: stable
    if not answer.ok or answer.body is None:
        raise CanaryError(f"version: {url.text()}: {one_line(answer.text)}")
    found = _json_object(answer.body, "the version answer")
    parts = [f"{k}={one_line(str(found[k]))[:200]}" for k in spec.version_keys
             if isinstance(found.get(k), (str, int, float)) and not isinstance(found[k], bool)]
    if not parts:
        raise CanaryError(f"version: {url.text()} names no "
                          + " or ".join(spec.version_keys))
    return " ".join(parts)


# ------------------------------------------------------------------ the key

def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns]


def weights(model: str | None, deadline: float | None = None) -> Any:
    """The weights' part of the key: the hub id for a model the engine
    fetches (its revision, if pinned, is in the argv), else each file under
    the model's path with its size and mtime (a link: its target, not
    followed), bounded.  Contents are never read: a silent change of a byte
    keeps the key, so the answer tells it."""
    if not model:
        return None
    if not model.startswith("/"):
        return {"hub": model}
    try:
        top = os.stat(model)       # the path the unit names, as pre-start checks it
    except OSError as e:
        raise CanaryError(f"model: {one_line(model)}: {e.strerror}") from None
    if not stat.S_ISDIR(top.st_mode):
        return {"path": model, "files": [[os.path.basename(model), *_stamp(top)]]}
    files: list[list[Any]] = []
    truncated = False
    stack: list[tuple[str, int]] = [("", 0)]
    while stack and not truncated:
        if deadline is not None:
            _deadline_left(deadline)
        rel, depth = stack.pop()
        try:
            with os.scandir(os.path.join(model, rel) if rel else model) as it:
                # A directory of millions (the model's account may make one)
                # costs no more than the bound.
                entries = sorted(itertools.islice(it, WALK_FILES + 1), key=lambda e: e.name)
        except OSError as e:
            files.append([rel, "unreadable", e.errno])
            continue
        for entry in entries:
            name = os.path.join(rel, entry.name) if rel else entry.name
            if len(files) >= WALK_FILES:
                truncated = True
                break
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    files.append([name, "->", os.readlink(entry.path)])
                elif stat.S_ISDIR(st.st_mode):
                    if depth < WALK_DEPTH:
                        stack.append((name, depth + 1))
                elif stat.S_ISREG(st.st_mode):
                    files.append([name, *_stamp(st)])
            except OSError as e:
                files.append([name, "unreadable", e.errno])
    files.sort(key=lambda f: str(f[0]))
    return {"path": model, "files": files, "truncated": truncated}


def executable(argv: list[str] | None) -> list[Any] | None:
    """The server program's path, size and mtime (binary engines' build; for
    Python engines their interpreter): read as data, never run."""
    if not argv or not argv[0].startswith("/"):
        return None
    try:
        return [argv[0], *_stamp(os.stat(argv[0]))]
    except OSError:
        return [argv[0], "missing"]


def gpu_facts(selector: str | None) -> tuple[list[str], str | None]:
    """The GPUs' UUIDs (in the selector's order) and the driver's version."""
    if selector is None:
        return [], None
    from ..facts.gpumemory import chosen
    from ..facts.gpus import GpuError
    try:
        b, gpus = chosen(selector)
    except GpuError as e:
        raise CanaryError(f"GPUs: {e}") from None
    version = b.driver_facts().get("version")
    return [g.uuid for g in gpus], version if isinstance(version, str) else None


def key_of(opts: Options, version: str | None, argv: list[str] | None,
           deadline: float | None = None) -> dict[str, Any]:
    uuids, driver = gpu_facts(opts.gpus)
    return {"engine": opts.engine, "version": version, "executable": executable(argv),
            "argv": argv, "weights": weights(opts.model, deadline), "gpus": uuids,
            "driver": driver,
            "request": [opts.api, opts.prompt, opts.tokens, SEED]}


# The key's parts as a journal line names them.
_PARTS = {"engine": "engine", "version": "engine version", "executable": "server program",
          "argv": "engine arguments", "weights": "weights", "gpus": "GPUs",
          "driver": "driver", "request": "the request ([canary] prompt, tokens)"}


def changed(old: Any, new: dict[str, Any]) -> list[str]:
    """What differs between two keys, each part named, with a short detail
    for the weights (the first file that differs)."""
    if not isinstance(old, dict):
        return ["no key recorded"]
    out = []
    for part, label in _PARTS.items():
        if old.get(part) == new.get(part):
            continue
        if part == "weights" and isinstance(old.get(part), dict) and isinstance(new[part], dict):
            before = {str(f[0]): f for f in old[part].get("files", []) if isinstance(f, list) and f}
            after = {str(f[0]): f for f in new[part].get("files", [])}
            names = sorted(n for n in before.keys() | after.keys()
                           if before.get(n) != after.get(n))
            if names:
                label += f" ({len(names)} file(s), first {_shown(names[0])})"
        elif part == "argv" and isinstance(old.get(part), list) and isinstance(new[part], list):
            a, b = old[part], new[part]
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            label += f" (from word {i}: {_shown(' '.join(str(w) for w in b[i:]))})"
        elif part == "version":
            label += f" ({_shown(str(old.get(part)))} -> {_shown(str(new.get(part)))})"
        out.append(label)
    return out or ["the record's format"]


def first_difference(recorded: list[str], now: list[str]) -> str:
    """'token 3: recorded "x", now "y"' for the first token that differs."""
    i = next((i for i, (a, b) in enumerate(zip(recorded, now)) if a != b),
             min(len(recorded), len(now)))
    was = _shown(recorded[i]) if i < len(recorded) else "(the end)"
    got = _shown(now[i]) if i < len(now) else "(the end)"
    return f'token {i}: recorded "{was}", now "{got}"'


# ------------------------------------------------------------------ the record

def record_dir() -> str:
    """RECORD_DIR; INFER_UNITS_CANARY_DIR for tests (hookenv lets such a
    variable through only on a host marked for tests)."""
    return os.environ.get("INFER_UNITS_CANARY_DIR") or RECORD_DIR


def record_path(unit: str, directory: str | None = None) -> str:
    return os.path.join(directory or record_dir(), unit.removesuffix(".service") + ".json")


def load_record(path: str) -> dict[str, Any] | None:
    try:
        text = read_text(path)
    except (OSError, UnsafePath, UnicodeDecodeError):
        return None
    try:
        record = json.loads(text) if text else None
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def save_record(path: str, record: dict[str, Any]) -> None:
    # 0700 directories, a 0600 file: the answers and keys are root's alone.
    write_file(path, json.dumps(record, indent=1, sort_keys=True), mode=0o600, durable=True,
               dir_mode=0o700)


# ------------------------------------------------------------------ the check

def decide(record: dict[str, Any] | None, key: dict[str, Any], tokens: list[str],
           text: str, accept: bool) -> tuple[str, str, bool]:
    """(verdict, message, whether to record the answer now)."""
    shown = _shown(text)
    if accept:
        return RECORDED, f'answer accepted and recorded: "{shown}"', True
    if record is None or not isinstance(record.get("tokens"), list):
        return RECORDED, f'first check on this host: answer recorded ("{shown}")', True
    if record.get("key") != key:
        why = ", ".join(changed(record.get("key"), key))
        return RECORDED, f'recorded anew: {why} changed ("{shown}")', True
    if [str(t) for t in record["tokens"]] == tokens:
        return MATCH, f'answer matches the one recorded ("{shown}")', False
    return MISMATCH, ("answer differs from the one recorded under the same engine, weights, "
                      "arguments, GPUs and driver: "
                      + first_difference([str(t) for t in record["tokens"]], tokens)
                      + f' (now "{shown}")'), False


def check(opts: Options, argv: list[str] | None, accept: bool = False,
          directory: str | None = None) -> Result:
    """Ask, compare, record.  `argv`: the server's argv as systemd runs it
    (facts/systemd.py exec_argvs of ExecStart)."""
    started = time.monotonic()
    deadline = started + opts.timeout
    path = record_path(opts.unit, directory)
    try:
        tokens, text = ask(opts, deadline)
        key = key_of(opts, engine_version(opts, deadline), argv, deadline)
    except CanaryError as e:
        result = Result(ERROR, f"no usable answer: {e}", time.monotonic() - started)
        _note(path, result)
        return result
    record = load_record(path)
    # `infer-units canary NAME --accept` while the model was not running.
    accept = accept or bool(record and record.get("accept_next") is True)
    verdict, message, keep = decide(record, key, tokens, text, accept)
    result = Result(verdict, message, time.monotonic() - started)
    if keep:
        record = {"key": key, "tokens": tokens, "text": text, "recorded": time.time(),
                  "why": message}
    _note(path, result, record)
    return result


def _note(path: str, result: Result, record: dict[str, Any] | None = None) -> None:
    """The record with this check's outcome as `last` (status reads it)."""
    if record is None:
        record = load_record(path) or {}
    record["last"] = {"time": time.time(), "verdict": result.verdict,
                      "message": result.message, "seconds": round(result.seconds, 3)}
    save_record(path, record)


def accept_next(unit: str, directory: str | None = None) -> None:
    """The next check of `unit` records its answer whatever it is (the
    operator judged the change that makes it differ)."""
    path = record_path(unit, directory)
    record = load_record(path) or {}
    record["accept_next"] = True
    save_record(path, record)


def last(unit: str, directory: str | None = None) -> dict[str, Any] | None:
    """The last check's outcome ({"verdict", "message", "time", ...}); None
    when there is none or it cannot be read (not root: the record is root's)."""
    record = load_record(record_path(unit, directory))
    entry = record.get("last") if record else None
    return entry if isinstance(entry, dict) else None



def view(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """`status`'s entry for the last check, from the unit's metrics state
    (readable by every account, unlike the record); None: never checked."""
    verdict = metrics.get("canary_verdict")
    if not isinstance(verdict, str):
        return None
    message = metrics.get("canary_message")
    return {"verdict": verdict, "message": one_line(message) if isinstance(message, str) else "",
            "seconds": metrics.get("last_canary_seconds")}
