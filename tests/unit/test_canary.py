"""The known-answer check (helpers/act/canary.py) against a real HTTP server
in this process: first answer recorded, the same answer matches, another
answer under the same key is a mismatch naming its first differing token,
a changed key records anew naming what changed, and an answer that is not
one (garbage, oversized, none within the deadline) is an error, never a
pass and never recorded."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from infer_units.helpers.act import canary
from infer_units.helpers.act.canary import (ERROR, MATCH, MISMATCH, RECORDED, Options, check,
                                            load_record, record_path)

from ..support import http_server


class Llama:
    """What the fake llama.cpp answers: tokens, or raw bytes, or nothing."""

    def __init__(self) -> None:
        self.tokens = [10, 11, 12]
        self.raw: bytes | None = None
        self.hang = threading.Event()        # set: never answer the completion
        self.asked: list[dict[str, Any]] = []


@pytest.fixture
def server() -> Iterator[tuple[Llama, str]]:
    state = Llama()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(json.dumps({"build_info": "b1-test"}).encode())

        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            state.asked.append(json.loads(self.rfile.read(length)))
            if state.hang.is_set():
                self.server_done.wait(30)   # type: ignore[attr-defined]
                return
            if state.raw is not None:
                self._send(state.raw)
                return
            self._send(json.dumps({"content": "".join(f"<{t}>" for t in state.tokens),
                                   "tokens": state.tokens}).encode())

    done = threading.Event()
    Handler.server_done = done      # type: ignore[attr-defined]
    with http_server(Handler) as httpd:
        try:
            yield state, f"http://127.0.0.1:{httpd.server_address[1]}/"
        finally:
            done.set()          # a hung answer ends before the server shuts down


@pytest.fixture
def model(tmp_path: Path) -> Path:
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"GGUF" + bytes(4096))
    return weights


def options(url: str, model: Path, **changes: Any) -> Options:
    values: dict[str, Any] = dict(unit="m.service", engine="llamacpp", url=url, api="llamacpp",
                                  prompt="p", tokens=3, timeout=5.0, on_mismatch="refuse",
                                  model=str(model))
    values.update(changes)
    return Options(**values)


ARGV = ["/usr/bin/llama-server", "--model", "tiny.gguf"]


def test_first_answer_is_recorded_root_only_then_the_same_answer_matches(
        server: tuple[Llama, str], model: Path, tmp_path: Path) -> None:
    state, url = server
    records = tmp_path / "records"
    first = check(options(url, model), ARGV, directory=str(records))
    assert first.verdict == RECORDED and "first check" in first.message
    assert state.asked[0]["temperature"] == 0 and state.asked[0]["seed"] == canary.SEED
    assert state.asked[0]["n_predict"] == 3
    path = Path(record_path("m.service", str(records)))
    assert stat.S_IMODE(records.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    record = load_record(str(path))
    assert record is not None and record["tokens"] == ["10", "11", "12"]
    assert record["key"]["version"] == "build_info=b1-test"
    again = check(options(url, model), ARGV, directory=str(records))
    assert again.verdict == MATCH, again.message


def test_a_weight_changed_in_place_with_size_and_mtime_kept_is_a_mismatch(
        server: tuple[Llama, str], model: Path, tmp_path: Path) -> None:
    state, url = server
    records = str(tmp_path / "records")
    assert check(options(url, model), ARGV, directory=records).verdict == RECORDED
    before = model.stat()
    with open(model, "r+b") as f:       # a byte changed; the key cannot see it
        f.seek(100)
        f.write(b"\x01")
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))
    state.tokens = [10, 99, 12]         # ... and the answer tells it
    result = check(options(url, model), ARGV, directory=records)
    assert result.verdict == MISMATCH
    assert 'token 1: recorded "11", now "99"' in result.message
    # The record keeps the known answer: a second start is refused as well.
    assert check(options(url, model), ARGV, directory=records).verdict == MISMATCH
    assert load_record(record_path("m.service", records))["last"]["verdict"] == MISMATCH  # type: ignore[index]


def test_a_changed_argument_records_anew_and_names_what_changed(
        server: tuple[Llama, str], model: Path, tmp_path: Path) -> None:
    state, url = server
    records = str(tmp_path / "records")
    assert check(options(url, model), ARGV, directory=records).verdict == RECORDED
    state.tokens = [7, 8, 9]
    result = check(options(url, model), ARGV + ["--ctx-size", "256"], directory=records)
    assert result.verdict == RECORDED
    assert "recorded anew: engine arguments (from word 3: --ctx-size 256) changed" \
        in result.message
    assert check(options(url, model), ARGV + ["--ctx-size", "256"],
                 directory=records).verdict == MATCH
    # The weights' size or mtime changed: recorded anew, the file named.
    state.tokens = [1, 2, 3]
    model.write_bytes(b"GGUF" + bytes(8192))
    result = check(options(url, model), ARGV + ["--ctx-size", "256"], directory=records)
    assert result.verdict == RECORDED and "weights (1 file(s), first tiny.gguf)" in result.message


@pytest.mark.parametrize("raw", [b"not json \x1b[2J\n<0>forged", b"[1, 2]", b'{"tokens": [1]}',
                                 b'{"content": "x", "tokens": [1]}' + b" " * 70000])
def test_an_answer_that_is_not_one_is_an_error_never_recorded(
        server: tuple[Llama, str], model: Path, tmp_path: Path, raw: bytes) -> None:
    state, url = server
    records = str(tmp_path / "records")
    state.raw = raw
    result = check(options(url, model), ARGV, directory=records)
    assert result.verdict == ERROR
    assert result.message.isprintable(), result.message      # escaped where it is said
    record = load_record(record_path("m.service", records))
    assert record is not None and "tokens" not in record and record["last"]["verdict"] == ERROR


def test_a_server_that_never_answers_ends_within_the_check_deadline(
        server: tuple[Llama, str], model: Path, tmp_path: Path) -> None:
    state, url = server
    state.hang.set()
    result = check(options(url, model, timeout=1.0), ARGV, directory=str(tmp_path / "r"))
    assert result.verdict == ERROR and "no answer within" in result.message


def test_openai_answer_tokens_come_from_logprobs_else_the_text() -> None:
    body = json.dumps({"choices": [{"text": " a b", "logprobs": {"tokens": [" a", " b"]}}]})
    assert canary.answer_tokens("openai", body.encode()) == ([" a", " b"], " a b")
    body = json.dumps({"choices": [{"text": " a b"}]})
    assert canary.answer_tokens("openai", body.encode()) == ([" a b"], " a b")
    tgi = {"generated_text": "xy", "details": {"tokens": [{"id": 5}, {"id": 6}]}}
    assert canary.answer_tokens("tgi", json.dumps(tgi).encode()) == (["5", "6"], "xy")


def test_the_weights_key_does_not_follow_links_below_the_model_path(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "w.safetensors").symlink_to("/etc/shadow")
    key = canary.weights(str(model))
    names = {f[0]: f for f in key["files"]}
    assert names["w.safetensors"] == ["w.safetensors", "->", "/etc/shadow"]
    assert names["config.json"][1] == 2
    assert canary.weights("org/model") == {"hub": "org/model"}


def test_accept_while_not_running_records_the_next_answer_once(
        server: tuple[Llama, str], model: Path, tmp_path: Path) -> None:
    state, url = server
    records = str(tmp_path / "records")
    assert check(options(url, model), ARGV, directory=records).verdict == RECORDED
    state.tokens = [4, 5, 6]
    assert check(options(url, model), ARGV, directory=records).verdict == MISMATCH
    canary.accept_next("m.service", records)
    result = check(options(url, model), ARGV, directory=records)
    assert result.verdict == RECORDED and "accepted" in result.message
    assert check(options(url, model), ARGV, directory=records).verdict == MATCH
    state.tokens = [4, 5, 7]
    assert check(options(url, model), ARGV, directory=records).verdict == MISMATCH


def test_infer_units_canary_reads_the_units_own_line_as_rendered() -> None:
    words = ["--unit", "m.service", "--engine", "vllm", "--url", "http://127.0.0.1:8000/",
             "--api", "openai", "--prompt", "-a prompt that starts with a dash", "--tokens", "4",
             "--timeout", "5s", "--on-mismatch", "warn", "--served-name", "tiny",
             "--pid=${MAINPID}"]
    opts = canary.options_of_unit_line(words)
    assert (opts.prompt, opts.tokens, opts.timeout, opts.on_mismatch, opts.served_name) == (
        "-a prompt that starts with a dash", 4, 5.0, "warn", "tiny")
    with pytest.raises(ValueError):
        canary.options_of_unit_line(words + ["--no-such-option", "x"])
    with pytest.raises(ValueError):
        canary.options_of_unit_line(words[2:])          # --unit missing
