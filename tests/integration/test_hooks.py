"""The unit's other hooks with real sockets, servers and processes:
wait-ready, wait-port, p2p-check (corruption path on a CPU stand-in for
torch), metrics; and render/check/status on real files."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path


from ..support import PYTHON, FakeGpus, base_env, fake_torch, run_cli

FAKE_TORCH = fake_torch()      # where nobody and the attacker can read it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


class _Later(threading.Thread):
    bound: threading.Event


def serve_later(port: int, delay: float) -> _Later:
    """Answer two health requests on `port` after `delay`; `.bound` is set once
    it listens.  Each request is waited for as long as a busy machine needs
    (a CLI's start-up), not a fixed few seconds."""
    def run() -> None:
        time.sleep(delay)
        server = http.server.HTTPServer(("127.0.0.1", port), _Health)
        t.bound.set()
        server.timeout = 300
        server.handle_request()
        server.handle_request()
        server.server_close()
    t = _Later(target=run, daemon=True)
    t.bound = threading.Event()
    t.start()
    return t


# ---------------------------------------------------------------- wait-ready

def test_wait_ready_returns_once_health_answers() -> None:
    port = free_port()
    serve_later(port, 0.5)
    started = time.monotonic()
    done = run_cli("wait-ready", "--url", f"http://127.0.0.1:{port}/health", "--timeout", "120s",
                   "--interval", "100ms")
    assert done.returncode == 0, done.stderr
    assert 0.5 <= time.monotonic() - started < 60       # not the timeout's 120 s
    assert "answered HTTP 200" in done.stderr


def test_wait_ready_fails_fast_when_the_server_dies() -> None:
    server = subprocess.Popen([PYTHON, "-c", "import time, sys; time.sleep(0.5); sys.exit(7)"])
    started = time.monotonic()
    done = run_cli("wait-ready", "--url", f"http://127.0.0.1:{free_port()}/health",
                   "--pid", str(server.pid), "--timeout", "300s", "--interval", "120s")
    took = time.monotonic() - started
    server.wait()
    assert done.returncode != 0 and done.returncode != 3
    assert f"server pid {server.pid} exited while loading" in done.stderr
    # Not at the next poll (120 s) nor at the timeout: at the death.
    assert took < 60, f"noticed the death only after {took:.1f}s"


def test_wait_ready_times_out_with_exit_3() -> None:
    done = run_cli("wait-ready", "--url", f"http://127.0.0.1:{free_port()}/health",
                   "--timeout", "0.5s", "--interval", "100ms")
    assert done.returncode == 3 and "no healthy answer within 0.5s" in done.stderr


# ---------------------------------------------------------------- wait-port

def test_wait_port_names_the_holder_and_waits_for_it() -> None:
    port = free_port()
    # The holder lets go only once wait-port has named it: no race with a
    # wait-port that starts late on a busy machine.
    holder = subprocess.Popen([PYTHON, "-c", (
        "import socket, sys; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); "
        "sys.stdin.readline()")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout and holder.stdin and holder.stdout.readline().strip() == "up"
    waiting = subprocess.Popen([PYTHON, "-m", "infer_units", "wait-port", "--port", str(port),
                                "--timeout", "120s"], stderr=subprocess.PIPE, text=True,
                               env=base_env())
    assert waiting.stderr
    said = [waiting.stderr.readline()]
    assert f"port {port} held by pid {holder.pid}" in said[0], said
    holder.stdin.write("go\n")
    holder.stdin.close()
    holder.wait()
    said.append(waiting.stderr.read())
    assert waiting.wait(120) == 0, said
    assert f"port {port} free after" in said[1], said


def test_wait_port_times_out_with_exit_3_naming_the_holder() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = run_cli("wait-port", "--port", str(port), "--timeout", "0.3s")
    assert done.returncode == 3
    assert f"port {port} still in use after 0.3s: pid {os.getpid()}" in done.stderr


# ---------------------------------------------------------------- p2p-check

def p2p(fake: FakeGpus, tmp_path: Path, gpus: str, **env: str) -> subprocess.CompletedProcess[str]:
    # The self-test gets only the server's environment (--env), nothing of ours.
    server_env = [f"--env={k}={v}" for k, v in
                  {"PYTHONPATH": str(FAKE_TORCH), **env}.items()]
    return run_cli("p2p-check", "--gpus", gpus, "--env-file", str(tmp_path / "m.env"),
                   "--python", PYTHON, *server_env, env=fake.env(
                       INFER_UNITS_P2P_CACHE=str(tmp_path / "p2p"), INFER_UNITS_P2P_MIB="1",
                       INFER_UNITS_STATE_DIR=str(tmp_path / "state")))


def test_p2p_corruption_disables_p2p_and_is_cached(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    done = p2p(fake_gpus, tmp_path, "0,1,2", FAKE_TORCH_CORRUPT="0>2")
    assert done.returncode == 0, done.stderr
    assert "P2P OFF" in done.stderr and "GPU 0->2: 1 words differ" in done.stderr
    assert (tmp_path / "m.env").read_text() == "NCCL_P2P_DISABLE=1\n"
    # A restart in the same boot reuses the verdict instead of copying again.
    again = p2p(fake_gpus, tmp_path, "0,1,2")
    assert "P2P OFF" in again.stderr and "[result cached this boot]" in again.stderr
    state = json.loads((tmp_path / "state" / "m.service.json").read_text())
    assert state["p2p_ok"] == 0


def test_p2p_copy_errors_disable_p2p(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    # torch numbers the visible GPUs 0, 1: its "1>0" is GPU 3 -> GPU 1
    done = p2p(fake_gpus, tmp_path, "1,3", FAKE_TORCH_FAIL="1>0")
    assert "P2P OFF" in done.stderr and "GPU 3->1: RuntimeError: CUDA error" in done.stderr


def test_p2p_clean_copies_keep_p2p_on(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    (tmp_path / "m.env").write_text("NCCL_P2P_DISABLE=1\nOTHER=x\n")
    done = p2p(fake_gpus, tmp_path, "0,1")
    assert "P2P on: every GPU pair copied and compared equal" in done.stderr
    assert (tmp_path / "m.env").read_text() == "OTHER=x\n"


def test_p2p_without_torch_disables_p2p_and_does_not_cache(fake_gpus: FakeGpus,
                                                           tmp_path: Path) -> None:
    done = run_cli("p2p-check", "--gpus", "0,1", "--env-file", str(tmp_path / "m.env"),
                   "--python", PYTHON, env=fake_gpus.env(
                       INFER_UNITS_P2P_CACHE=str(tmp_path / "p2p"),
                       INFER_UNITS_STATE_DIR=str(tmp_path / "state")))
    assert "could not run" in done.stderr and "P2P OFF" in done.stderr
    assert not (tmp_path / "p2p").exists()


def _pre_start_p2p(fake: FakeGpus, tmp_path: Path, gpus: str,
                   **env: str) -> subprocess.CompletedProcess[str]:
    """pre-start's self-test as a vLLM unit renders it (--p2p-ok-env)."""
    server_env = [f"--p2p-env={k}={v}" for k, v in
                  {"PYTHONPATH": str(FAKE_TORCH), **env}.items()]
    return run_cli("pre-start", "--unit", "m.service", "--gpus", gpus, "--p2p",
                   "--env-file", str(tmp_path / "m.env"), "--python", PYTHON,
                   "--p2p-off-env", "VLLM_ALLREDUCE_USE_FLASHINFER=0",
                   "--p2p-ok-env", "VLLM_SKIP_P2P_CHECK=1", *server_env,
                   env=fake.env(INFER_UNITS_P2P_CACHE=str(tmp_path / "p2p"),
                                INFER_UNITS_P2P_MIB="1",
                                INFER_UNITS_STATE_DIR=str(tmp_path / "state")))


def test_a_verified_p2p_skips_vllms_own_check(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    done = _pre_start_p2p(fake_gpus, tmp_path, "0,1")
    assert done.returncode == 0, done.stderr
    assert "P2P on: every GPU pair copied" in done.stderr
    assert (tmp_path / "m.env").read_text() == "VLLM_SKIP_P2P_CHECK=1\n"


def test_a_failed_p2p_test_leaves_vllms_own_check(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    # A pass written earlier (another boot) no longer counts.
    (tmp_path / "m.env").write_text("VLLM_SKIP_P2P_CHECK=1\n")
    done = _pre_start_p2p(fake_gpus, tmp_path, "0,1", FAKE_TORCH_CORRUPT="0>1")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m.env").read_text() == \
        "NCCL_P2P_DISABLE=1\nVLLM_ALLREDUCE_USE_FLASHINFER=0\n"


def test_one_gpu_verifies_no_p2p(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    done = _pre_start_p2p(fake_gpus, tmp_path, "2")
    assert done.returncode == 0, done.stderr
    assert "VLLM_SKIP_P2P_CHECK" not in (tmp_path / "m.env").read_text()


# ---------------------------------------------------------------- metrics

def test_metrics_textfile_written_atomically(fake_gpus: FakeGpus, holders, tmp_path: Path) -> None:
    holders([fake_gpus.devices[0]])
    metrics = tmp_path / "textfile"
    metrics.mkdir()
    models = tmp_path / "models"        # the series are written for models that exist
    models.mkdir()
    (models / "m.toml").write_text('engine = "command"\ncommand = ["/bin/true"]\n')
    env = fake_gpus.env(INFER_UNITS_STATE_DIR=str(tmp_path / "state"),
                        INFER_UNITS_METRICS_DIR=str(metrics), INFER_UNITS_CONFIG_PATH=str(models))
    run_cli("reap", "--gpus", "0", "--unit", "m.service", "--term-grace", "2s", env=env, check=0)
    run_cli("reap", "--gpus", "0", "--unit", "m.service", env=env, check=0)
    text = (metrics / "infer-units.prom").read_text()
    assert 'infer_units_reaps_total{unit="m.service"} 2' in text
    assert 'infer_units_processes_killed_total{unit="m.service"} 1' in text
    assert "# TYPE infer_units_last_reap_seconds gauge" in text
    assert [p.name for p in metrics.iterdir()] == ["infer-units.prom"]


# ---------------------------------------------------------------- render, check, status

def write_models(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "a.toml").write_text('engine = "vllm"\nmodel = "/m"\ngpus = [0, 1]\nport = 8000\n')
    (etc / "b.toml").write_text('engine = "sglang"\nmodel = "/m"\ngpus = [1]\nport = 8000\n')
    (etc / "c.toml").write_text('engine = "sglang"\nmodel = "/m"\ngpus = [2]\nport = "x"\n')
    return etc


def test_check_reports_each_error_with_file_key_and_reason(tmp_path: Path) -> None:
    etc = write_models(tmp_path)
    done = run_cli("check", env=base_env(INFER_UNITS_CONFIG_PATH=str(etc)))
    assert done.returncode == 1
    errors = sorted(l for l in done.stderr.splitlines() if l.startswith("error:"))
    assert errors == [
        f"error: {etc}/b.toml: gpus: GPU 1 also used by a ({etc}/a.toml)",
        f"error: {etc}/b.toml: port: port 8000 also used by a ({etc}/a.toml)",
        f"error: {etc}/c.toml: port: expected an integer, got str",
    ]
    assert f"ok: {etc}/a.toml -> a.service" in done.stdout
    # a clash concerns both files: checking either one shows it
    only_a = run_cli("check", "--no-verify", "a", env=base_env(INFER_UNITS_CONFIG_PATH=str(etc)))
    assert only_a.returncode == 1
    assert sorted(l for l in only_a.stderr.splitlines() if l.startswith("error:")) == errors[:2]
    assert f"ok: {etc}/a.toml -> a.service" in only_a.stdout


def test_render_prints_or_writes_units(tmp_path: Path) -> None:
    etc = write_models(tmp_path)
    env = base_env(INFER_UNITS_CONFIG_PATH=str(etc))
    done = run_cli("render", "a", env=env, check=0)
    assert "# a.service" in done.stdout and "--tensor-parallel-size" in done.stdout
    out = tmp_path / "out"
    run_cli("render", "a", "--output", str(out), env=env, check=0)
    assert (out / "a.service").read_text() in done.stdout
    missing = run_cli("render", "nope", env=env)
    assert missing.returncode == 1 and "no model file named nope.toml" in missing.stderr


def test_status_json_schema_without_systemd(fake_gpus: FakeGpus, holders, tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    port = free_port()
    (etc / "m.toml").write_text(f'engine = "sglang"\nmodel = "/m"\ngpus = [2, 3]\nport = {port}\n')
    h = holders([fake_gpus.devices[3]])
    assert serve_later(port, 0).bound.wait(60)
    env = fake_gpus.env(INFER_UNITS_CONFIG_PATH=str(etc), DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent")
    report = json.loads(run_cli("status", "--json", env=env, check=1).stdout)
    assert report["schema"] == 1 and report["errors"] == []
    [m] = report["models"]
    assert set(m) >= {"name", "unit", "source", "engine", "port", "health_url", "systemd",
                      "gpu", "health", "metrics"}
    assert m["systemd"]["available"] is False and m["systemd"]["error"]
    assert [g["index"] for g in m["gpu"]["gpus"]] == [2, 3]
    assert [(p["pid"], p["kind"]) for p in m["gpu"]["processes"]] == [(h.pid, "foreign")]
    # What answers on the port is this test, not the model: named, never its health
    # (the model's own answer is tested under systemd, tests/e2e/test_e2e.py).
    assert m["health"]["ok"] is False and m["health"]["foreign"] is True, m["health"]
    assert [p["pid"] for p in m["port_view"]["foreign"]] == [os.getpid()]
    table = run_cli("status", env=env, check=1).stdout   # 1: no systemd here
    assert "systemd unavailable" in table and f"pid {h.pid} (foreign)" in table


def test_settings_reference_lists_every_key() -> None:
    out = subprocess.run([PYTHON, "-m", "infer_units.generator.settings"], capture_output=True,
                         text=True, env=base_env(), check=True).stdout
    for key in ("engine", "gpus", "reap.term-grace", "ready.timeout", "nccl.p2p", "install"):
        assert f"`{key}`" in out


def test_the_key_reference_is_generated_from_the_settings() -> None:
    reference = subprocess.run([PYTHON, "-m", "infer_units.generator.settings"],
                               capture_output=True, text=True, env=base_env(), check=True).stdout
    doc = (Path(__file__).parents[2] / "docs/model-files.md").read_text(encoding="utf-8")
    assert reference.strip() in doc, "docs/model-files.md's key table is stale: paste " \
        "`python3 -m infer_units.generator.settings` into it"


def test_pre_start_reaps_then_waits_for_the_port(fake_gpus: FakeGpus, holders,
                                                 tmp_path: Path) -> None:
    stale = holders([fake_gpus.devices[0]])
    env = fake_gpus.env(INFER_UNITS_STATE_DIR=str(tmp_path / "state"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = run_cli("pre-start", "--unit", "m", "--gpus", "0", "--term-grace", "2s",
                       "--timeout", "0.3s", "--port", str(port), env=env)
    assert done.returncode == 3
    assert f"sending SIGTERM to pid {stale.pid}" in done.stderr
    assert f"port {port} held by pid {os.getpid()}" in done.stderr
    assert f"port {port} still in use after 0.3s: pid {os.getpid()}" in done.stderr
    again = run_cli("pre-start", "--unit", "m", "--gpus", "0", "--port", str(port), env=env)
    assert again.returncode == 0 and "start checks passed" in again.stderr


def test_pre_start_usage_errors_exit_1(fake_gpus: FakeGpus) -> None:
    done = run_cli("pre-start", "--gpus", "0", env=fake_gpus.env())
    assert done.returncode == 1 and "--unit" in done.stderr
    bad = run_cli("pre-start", "--unit", "m", "--gpus", "0", "--timeout", "soon",
                  env=fake_gpus.env())
    assert bad.returncode == 1 and "bad time span 'soon'" in bad.stderr


def test_p2p_check_without_env_file_only_reports(fake_gpus: FakeGpus, tmp_path: Path) -> None:
    done = run_cli("p2p-check", "--gpus", "0,1", "--python", PYTHON,
                   f"--env=PYTHONPATH={FAKE_TORCH}", "--env=FAKE_TORCH_CORRUPT=1>0",
                   env=fake_gpus.env(INFER_UNITS_P2P_CACHE=str(tmp_path / "p2p"),
                                     INFER_UNITS_P2P_MIB="1"))
    assert done.returncode == 0
    assert "P2P broken (would set NCCL_P2P_DISABLE=1): peer copy failed: GPU 1->0" in done.stderr
