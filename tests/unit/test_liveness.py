"""Liveness: the probe against a real local HTTP server, the decision over a
sequence of probes, one probe run end to end with its state file, journal
entry (a real datagram socket) and metrics, the cap's ExecStopPost script
run by a real shell, and the status view.

systemd itself is the boundary here: a recording stand-in answers the model's
state and takes the restart/stop jobs (tests/e2e/test_liveness_e2e.py drives the
real one)."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from infer_units.generator.log import PROJECT, StdioHandler, setup as setup_logging
from infer_units.helpers.act import liveness as lv
from infer_units.helpers.act import metrics
from ..support import base_env, http_server, needs_root, run_cli
from ..unitfile import exec_argv, values


class Health:
    """A real HTTP server whose /health does what the test says."""

    def __init__(self) -> None:
        self.mode = "ok"          # ok | 503 | hang | slow | close
        self.delay = 0.0
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.requests += 1
                if outer.mode == "hang":
                    time.sleep(300)
                    return
                if outer.mode == "close":
                    self.close_connection = True
                    return
                time.sleep(outer.delay)
                if outer.mode == "redirect" and self.path == "/health":
                    self.send_response(302)
                    self.send_header("Location", "/health/ok")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                code = 503 if outer.mode == "503" else 200
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.handler = Handler
        self.url = ""             # set once it listens


@pytest.fixture
def health():
    server = Health()
    with http_server(server.handler) as httpd:
        server.url = f"http://127.0.0.1:{httpd.server_address[1]}/health"
        yield server


# ------------------------------------------------------------------ the probe

def test_probe_answers(health: Health) -> None:
    answer = lv.http_probe(health.url, 2.0)
    assert answer.ok and answer.text == "HTTP 200"
    health.mode = "503"
    answer = lv.http_probe(health.url, 2.0)
    assert not answer.ok and answer.text == "HTTP 503"
    health.mode = "close"
    assert not lv.http_probe(health.url, 2.0).ok


def test_redirects_are_followed_as_readiness_follows_them(health: Health) -> None:
    health.mode = "redirect"
    answer = lv.http_probe(health.url, 2.0)
    assert answer.ok and answer.text == "HTTP 200" and health.requests == 2   # 302, then 200


def test_slow_answer_within_timeout_is_healthy(health: Health) -> None:
    health.delay = 0.4
    answer = lv.http_probe(health.url, 1.0)
    assert answer.ok and answer.seconds >= 0.4


def test_no_answer_fails_at_the_timeout(health: Health) -> None:
    health.mode = "hang"
    started = time.monotonic()
    answer = lv.http_probe(health.url, 0.3)
    elapsed = time.monotonic() - started
    assert not answer.ok and answer.text == "no answer within 0.3s"
    assert 0.28 <= elapsed < 60                  # the timeout, not the hang's 300 s


def test_nothing_listening() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]     # bound, not listening: refused
        answer = lv.http_probe(f"http://127.0.0.1:{port}/health", 1.0)
    assert not answer.ok and "refused" in answer.text.lower()


def test_ipv6_literal() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")

    class V6(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(204 if self.path == "/v1/alive" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with contextlib.ExitStack() as stack:
        try:
            httpd = stack.enter_context(http_server(Handler, "::1", V6))
        except OSError:
            pytest.skip("::1 not available")
        answer = lv.http_probe(f"http://[::1]:{httpd.server_address[1]}/v1/alive", 2.0)
        assert answer.ok and answer.text == "HTTP 204"


# ------------------------------------------------------------------ the decision

CFG = lv.Config("m.service", "http://127.0.0.1:1/health", interval=1.0, failures=3,
                timeout=1.0, max_restarts=2, restart_window=3600.0)
UP = lv.ModelState("active", "running", "aa" * 16, "")
FAIL = lv.Answer(False, "HTTP 503", 0.01)
GOOD = lv.Answer(True, "HTTP 200", 0.01)


def test_restart_after_failures_in_a_row_only() -> None:
    state: dict = {}
    assert lv.decide(state, 0, FAIL, UP, CFG) == lv.COUNT
    assert lv.decide(state, 1, FAIL, UP, CFG) == lv.COUNT
    assert lv.decide(state, 2, GOOD, None, CFG) == lv.OK      # one good answer resets
    assert state["consecutive_failures"] == 0
    assert [lv.decide(state, t, FAIL, UP, CFG) for t in (3, 4, 5)] == \
        [lv.COUNT, lv.COUNT, lv.RESTART]
    assert state["answers"] == ["HTTP 503"] * 3


def test_loading_stopping_or_queued_jobs_are_never_counted() -> None:
    state: dict = {}
    for model in (lv.ModelState("activating", "start-post", "bb" * 16, ""),
                  lv.ModelState("deactivating", "stop-sigterm", "bb" * 16, ""),
                  lv.ModelState("active", "running", "bb" * 16, "stop"),
                  lv.ModelState("failed", "failed", "bb" * 16, ""), None):
        for t in range(5):
            assert lv.decide(state, t, FAIL, model, CFG) == lv.SKIP
    assert state["consecutive_failures"] == 0
    assert state["last_probe"]["skipped"] == "systemd unavailable"


def test_a_new_invocation_starts_counting_afresh() -> None:
    state: dict = {}
    lv.decide(state, 0, FAIL, UP, CFG)
    lv.decide(state, 1, FAIL, UP, CFG)
    again = lv.ModelState("active", "running", "cc" * 16, "")
    assert lv.decide(state, 2, FAIL, again, CFG) == lv.COUNT
    assert state["consecutive_failures"] == 1 and state["invocation"] == "cc" * 16


def _hang(state: dict, t: float) -> str:
    for i in range(CFG.failures - 1):
        assert lv.decide(state, t + i, FAIL, UP, CFG) == lv.COUNT
    return lv.decide(state, t + CFG.failures - 1, FAIL, UP, CFG)


def test_cap_within_the_window_then_a_fresh_budget() -> None:
    state: dict = {}
    assert _hang(state, 0) == lv.RESTART
    lv.record_restart(state, 2, "why")
    assert _hang(state, 100) == lv.RESTART
    lv.record_restart(state, 102, "why")
    assert _hang(state, 200) == lv.CAP            # a third hang within the hour
    lv.record_cap(state, 202, "why")
    assert state["capped"] and state["restarts"] == [] and state["restarts_total"] == 2
    # Started again by hand: healthy clears the cap, the budget is whole again.
    assert lv.decide(state, 300, GOOD, None, CFG) == lv.OK and "capped" not in state
    assert _hang(state, 400) == lv.RESTART


def test_restarts_older_than_the_window_do_not_count() -> None:
    state: dict = {"restarts": [0.0, 10.0]}
    assert _hang(state, 3600.0 + 5) == lv.RESTART   # 0.0 fell out, 10.0 is in
    assert state["restarts"] == [10.0]


def test_a_clock_set_back_keeps_no_restart_past_its_window() -> None:
    """The window is measured on CLOCK_BOOTTIME: an hour set back on the wall
    clock does not keep a restart counted for an hour more (then a hang
    within the real window's end would have capped the model)."""
    cfg = lv.Config("m.service", "u", 1.0, 1, 1.0, max_restarts=1, restart_window=60.0)
    state: dict = {}
    lv.record_restart(state, 10_000.0, "why", clock=500.0)
    # 61 s later on the boot clock, the wall clock an hour behind.
    assert lv.decide(state, 10_000.0 - 3600 + 61, FAIL, UP, cfg, clock=561.0) == lv.RESTART
    assert state["restarts"] == []


def test_a_clock_set_forward_forgets_no_restart_within_its_window() -> None:
    cfg = lv.Config("m.service", "u", 1.0, 1, 1.0, max_restarts=1, restart_window=60.0)
    state: dict = {}
    lv.record_restart(state, 10_000.0, "why", clock=500.0)
    assert lv.decide(state, 10_000.0 + 3600 + 5, FAIL, UP, cfg, clock=505.0) == lv.CAP


def test_wall_clock_stamps_from_the_future_count_one_window_from_now() -> None:
    """A state without this boot's id holds wall-clock restarts (an older
    version's): one an hour ahead (the clock set back since) counts as just
    now, so for one window, not for the window and the hour."""
    cfg = lv.Config("m.service", "u", 1.0, 1, 1.0, max_restarts=1, restart_window=60.0)
    state: dict = {"restarts": [10_000.0 + 3600, 10_000.0 - 100]}
    assert lv.decide(state, 10_000.0, FAIL, UP, cfg, clock=500.0) == lv.CAP
    assert state["restarts"] == [500.0] and state["boot_id"] == lv.boot_id()
    assert lv.decide(state, 10_000.0 + 61, FAIL, UP, cfg, clock=561.0) == lv.RESTART


def test_max_restarts_zero_stops_at_the_first_hang() -> None:
    cfg = lv.Config("m.service", "u", 1.0, 1, 1.0, max_restarts=0, restart_window=60.0)
    assert lv.decide({}, 0, FAIL, UP, cfg) == lv.CAP


# ------------------------------------------------------------------ one probe run

class RecordingSystemd:
    """Stands in for D-Bus: the model's state and the jobs queued."""

    def __init__(self, model: lv.ModelState | None = UP, refuse: str | None = None,
                 restarts: int = 0) -> None:
        self.model = model
        self.refuse = refuse
        self.jobs: list[tuple[str, str]] = []
        self.asked = 0
        self.restarts = restarts

    def forget_restarts(self, unit: str) -> int:
        forgot, self.restarts = self.restarts, 0
        return forgot

    def model_state(self, unit: str) -> lv.ModelState | None:
        self.asked += 1
        return self.model

    def try_restart(self, unit: str) -> str | None:
        self.jobs.append(("try-restart", unit))
        return self.refuse

    def stop(self, unit: str) -> str | None:
        self.jobs.append(("stop", unit))
        return self.refuse


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A real datagram socket where the probe's journal entries land."""
    path = tmp_path / "journal.socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.05)
    monkeypatch.setenv("INFER_UNITS_JOURNAL_SOCKET", str(path))
    monkeypatch.setattr(metrics, "STATE_DIR", str(tmp_path / "metrics-state"))
    models = tmp_path / "models"        # the textfile names models that exist
    models.mkdir()
    (models / "m.toml").write_text('engine = "command"\ncommand = ["/bin/true"]\n')
    monkeypatch.setenv("INFER_UNITS_CONFIG_PATH", str(models))

    def entries() -> list[dict[str, str]]:
        out = []
        while True:
            try:
                data = sock.recv(65536).decode()
            except socket.timeout:
                return out
            out.append(dict(line.split("=", 1) for line in data.splitlines()))

    yield entries
    sock.close()


def cfg_for(url: str, **kw: object) -> lv.Config:
    args = dict(interval=1.0, failures=2, timeout=0.5, max_restarts=1, restart_window=3600.0)
    args.update(kw)
    return lv.Config("m.service", url, **args)  # type: ignore[arg-type]


def test_healthy_probe_asks_systemd_nothing(health: Health, tmp_path: Path, journal) -> None:
    """... but its restart count (RecordingSystemd.forget_restarts)."""
    systemd = RecordingSystemd()
    assert lv.run_probe(cfg_for(health.url), systemd, str(tmp_path)) == lv.OK
    assert systemd.asked == 0 and systemd.jobs == []
    state = json.loads((tmp_path / "m.liveness.json").read_text())
    assert state["last_probe"]["ok"] and state["consecutive_failures"] == 0
    assert journal() == []


def test_healthy_after_a_crash_loop_starts_the_backoff_over(health: Health, tmp_path: Path,
                                                            journal) -> None:
    systemd = RecordingSystemd(restarts=3)
    assert lv.run_probe(cfg_for(health.url), systemd, str(tmp_path)) == lv.OK
    assert systemd.restarts == 0 and systemd.jobs == []
    [entry] = journal()     # `journalctl -u m.service` shows it
    assert entry["OBJECT_SYSTEMD_UNIT"] == "m.service" and entry["PRIORITY"] == "5"
    assert entry["MESSAGE"] == ("liveness: m.service is healthy after 3 automatic restarts: "
                                "the crash-loop back-off starts over")
    assert lv.run_probe(cfg_for(health.url), systemd, str(tmp_path)) == lv.OK
    assert journal() == []


@pytest.fixture
def probe_log(capsys: pytest.CaptureFixture[str]) -> Any:
    """The liveness probe's own log set-up (helpers/entry.py's for a hook),
    writing to this test's captured stdout and stderr."""
    handler = setup_logging(StdioHandler(run_by_systemd=True))
    yield
    logging.getLogger(PROJECT).removeHandler(handler)


def test_hang_restart_then_cap(health: Health, tmp_path: Path, journal, probe_log: None,
                               capsys: pytest.CaptureFixture[str]) -> None:
    health.mode = "hang"
    systemd = RecordingSystemd()
    cfg = cfg_for(health.url)
    assert lv.run_probe(cfg, systemd, str(tmp_path)) == lv.COUNT
    assert "<5>m.service: health probe 1/2 failed: no answer within 0.5s" in capsys.readouterr().out
    assert lv.run_probe(cfg, systemd, str(tmp_path)) == lv.RESTART
    assert systemd.jobs == [("try-restart", "m.service")]
    [entry] = journal()
    assert entry["OBJECT_SYSTEMD_UNIT"] == "m.service" and entry["PRIORITY"] == "4"
    assert entry["MESSAGE"].startswith("liveness: restarting m.service: 2 health probes in a "
                                       "row failed")
    assert "last answers: no answer within 0.5s; no answer within 0.5s" in entry["MESSAGE"]
    assert "liveness restart 1 of 1 within 1h" in entry["MESSAGE"]
    state = json.loads((tmp_path / "m.liveness.json").read_text())
    assert state["restarts_total"] == 1 and state["consecutive_failures"] == 0
    assert metrics.load_state("m.service")["liveness_restarts_total"] == 1
    assert 'infer_units_liveness_restarts_total{unit="m.service"} 1\n' in \
        metrics.render_textfile()

    # The restarted server hangs again: the cap stops it, marked for ExecStopPost.
    systemd.model = lv.ModelState("active", "running", "dd" * 16, "")
    seen: list[str] = []
    systemd.stop = lambda unit: (seen.append((tmp_path / "m.liveness-cap").read_text()),  # type: ignore[method-assign]
                                 None)[1]
    assert lv.run_probe(cfg, systemd, str(tmp_path)) == lv.COUNT
    assert lv.run_probe(cfg, systemd, str(tmp_path)) == lv.CAP
    assert seen == ["dd" * 16]
    [entry] = journal()
    assert entry["PRIORITY"] == "3" and "leaving it failed" in entry["MESSAGE"]
    assert "1 liveness restarts within 1h is the cap" in entry["MESSAGE"]
    assert "systemctl start m.service" in entry["MESSAGE"]
    assert metrics.load_state("m.service")["liveness_capped"] == 1

    # Started by hand and healthy: the cap is lifted, a stale marker removed.
    health.mode = "ok"
    assert lv.run_probe(cfg, systemd, str(tmp_path)) == lv.OK
    assert not (tmp_path / "m.liveness-cap").exists()
    health.mode = "503"
    assert lv.run_probe(cfg, systemd, str(tmp_path)) == lv.COUNT
    # A failed probe lowers ready at once; the next passing one raises it.
    assert 'infer_units_ready{unit="m.service"} 0\n' in metrics.render_textfile()
    health.mode = "ok"
    capsys.readouterr()
    assert lv.run_probe(cfg, systemd, str(tmp_path)) == lv.OK
    assert "<5>m.service: health probe passed again after 1 failed" in capsys.readouterr().out
    assert metrics.load_state("m.service")["liveness_capped"] == 0
    assert 'infer_units_ready{unit="m.service"} 1\n' in metrics.render_textfile()


def test_a_long_lived_probe_s_textfile_follows_the_model_files(tmp_path: Path,
                                                               journal) -> None:
    """The probe lives as long as its model and rewrites the textfile after
    each change: every textfile names the models whose files exist then, not
    those of the probe's first one."""
    metrics.record_seen("m.service", up=True, ready=True)
    metrics.record_seen("n.service", up=True, ready=True)
    text = metrics.render_textfile()
    assert 'infer_units_up{unit="m.service"} 1\n' in text
    assert 'unit="n.service"' not in text
    models = tmp_path / "models"
    (models / "n.toml").write_text('engine = "command"\ncommand = ["/bin/true"]\n')
    (models / "m.toml").unlink()
    text = metrics.render_textfile()
    assert 'infer_units_up{unit="n.service"} 1\n' in text
    assert 'unit="m.service"' not in text


def test_a_restart_is_saved_before_systemd_is_asked(health: Health, tmp_path: Path,
                                                   journal) -> None:
    """Asking systemd may end the asker at once (a restart stops what is
    PartOf= the model): by then the restart, or the cap, is on disk."""
    health.mode = "503"
    seen: list[dict[str, Any]] = []

    class Asked(RecordingSystemd):
        def try_restart(self, unit: str) -> str | None:
            seen.append(json.loads((tmp_path / "m.liveness.json").read_text()))
            return super().try_restart(unit)

        def stop(self, unit: str) -> str | None:
            seen.append(json.loads((tmp_path / "m.liveness.json").read_text()))
            return super().stop(unit)

    cfg = cfg_for(health.url, failures=1, max_restarts=1)
    assert lv.run_probe(cfg, Asked(), str(tmp_path)) == lv.RESTART
    assert seen[-1]["restarts_total"] == 1 and len(seen[-1]["restarts"]) == 1
    assert lv.run_probe(cfg, Asked(), str(tmp_path)) == lv.CAP
    assert seen[-1]["capped"]


def test_a_restart_the_group_watch_counts_during_a_probe_is_kept(
        health: Health, tmp_path: Path, journal, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe read its state, probed for up to its timeout, then saved:
    a restart the group watch counted meanwhile was written over, and the
    cap lost it.  The state is read and saved under one lock, after the probe."""
    from infer_units.generator.nodes import Nodes
    from infer_units.helpers.act import groupwatch
    from ..support import wait_until
    health.mode = "hang"
    cfg = cfg_for(health.url, timeout=3.0, max_restarts=3)
    probe = threading.Thread(target=lv.run_probe, args=(cfg, RecordingSystemd(), str(tmp_path)))
    probe.start()
    try:
        assert wait_until(lambda: health.requests == 1)        # probing now
        model = groupwatch.Watched("m.service", "root", Nodes(("a", "b"), 0, "a", 29500, ""),
                                   3, cfg.restart_window)
        monkeypatch.setenv("INFER_UNITS_LIVENESS_DIR", str(tmp_path))
        assert groupwatch.restart_counted(model, UP, "a rank left", RecordingSystemd())
    finally:
        probe.join()
    state = json.loads((tmp_path / "m.liveness.json").read_text())
    assert state["restarts_total"] == 1 and len(state["restarts"]) == 1, state
    assert state["consecutive_failures"] == 1, state


def test_refused_jobs_are_not_counted_and_leave_no_marker(health: Health, tmp_path: Path,
                                                         journal) -> None:
    health.mode = "503"
    systemd = RecordingSystemd(refuse="Transaction for m.service/restart is destructive")
    cfg = cfg_for(health.url, failures=1, max_restarts=0)
    assert lv.run_probe(cfg, systemd, str(tmp_path)) == lv.CAP
    assert systemd.jobs == [("stop", "m.service")]
    assert not (tmp_path / "m.liveness-cap").exists()
    # Said before systemd is asked (asking may end the caller), then the refusal.
    assert [e["PRIORITY"] for e in journal()] == ["3", "3"]
    state = json.loads((tmp_path / "m.liveness.json").read_text())
    assert "capped" not in state and state["consecutive_failures"] == 1   # tried again next time
    cfg = cfg_for(health.url, failures=1, max_restarts=1)
    assert lv.run_probe(cfg, systemd, str(tmp_path)) == lv.RESTART
    state = json.loads((tmp_path / "m.liveness.json").read_text())
    said = [e["MESSAGE"] for e in journal()]
    assert state.get("restarts_total", 0) == 0 and len(said) == 2, said
    assert said[1] == ("liveness: could not restart it (m.service): Transaction for "
                       "m.service/restart is destructive; not counted")


def test_probe_command_without_systemd(health: Health, tmp_path: Path) -> None:
    """The real entry point: healthy, then failing with no systemd to ask."""
    argv = ["liveness-probe", "--unit", "m", "--url", health.url, "--timeout", "1s",
            "--failures", "1", "--state-dir", str(tmp_path)]
    done = run_cli(*argv, env=base_env(INFER_UNITS_STATE_DIR=str(tmp_path / "m")), check=0)
    assert done.stdout == ""
    health.mode = "503"
    run_cli(*argv, env=base_env(INFER_UNITS_STATE_DIR=str(tmp_path / "m")), check=0)
    state = json.loads((tmp_path / "m.liveness.json").read_text())
    assert state["last_probe"]["answer"] == "HTTP 503"
    # No systemd here, or (on a systemd host) no such unit: not counted either way.
    assert state["last_probe"]["skipped"] in ("systemd unavailable", "inactive/dead")
    assert state["consecutive_failures"] == 0
    assert run_cli("liveness-probe", "--unit", "m").returncode == 1


def _probe_dropin(conf: Path, name: str) -> str:
    """The text of the probe's drop-in the generator writes for `name`."""
    from infer_units.generator.build import load_all, render_checked
    [model] = [m for m in load_all(dirs=[str(conf)]).models if m.name == name]
    [dropin] = [u.text for u in render_checked(model)
                if u.name == f"infer-units-liveness@{name}.service.d/50-liveness.conf"]
    return dropin


def _probe_argv(conf: Path, name: str) -> list[str]:
    """The probe's command in its drop-in (the reset `ExecStart=` first)."""
    lines = values(_probe_dropin(conf, name), "Service", "ExecStart")
    return exec_argv(lines[-1])


def test_the_probe_runs_from_its_drop_in_alone(health: Health, tmp_path: Path) -> None:
    """The drop-in's command carries the URL, [liveness] and the hooks'
    INFER_UNITS_* settings of [env]: run with no model file on the search
    path, it probes as the model's file said."""
    conf = tmp_path / "conf"
    conf.mkdir()
    port = health.url.split(":")[2].split("/")[0]
    (conf / "m.toml").write_text(
        f'engine = "command"\ncommand = ["/bin/true"]\nport = {port}\n'
        f'[ready]\nurl = "{health.url}"\n[liveness]\nfailures = 1\ntimeout = "1s"\n'
        f'[env]\nINFER_UNITS_LIVENESS_DIR = "{tmp_path}/state"\n')
    dropin = _probe_dropin(conf, "m")
    argv = _probe_argv(conf, "m")
    assert argv[1:4] == ["liveness-probe", "--unit", "m.service"]
    settings = dict(v.strip('"').split("=", 1) for v in values(dropin, "Service", "Environment"))
    assert settings == {"INFER_UNITS_LIVENESS_DIR": f"{tmp_path}/state"}
    (conf / "m.toml").unlink()      # what runs is the unit's, not the file's
    run_cli(*argv[1:], env=base_env(INFER_UNITS_CONFIG_PATH=str(conf), **settings), check=0)
    state = json.loads((tmp_path / "state" / "m.liveness.json").read_text())
    assert state["url"] == health.url and state["failures"] == 1 and state["timeout"] == 1.0
    assert state["last_probe"]["ok"] and health.requests == 1
    # The template unit alone (no drop-in): it says what is missing.
    done = run_cli("liveness-probe", "--unit", "nosuch.service")
    assert done.returncode == 1 and "no --url" in done.stdout + done.stderr


def test_x_and_x_liveness_are_two_models_with_their_own_liveness(tmp_path: Path) -> None:
    """A model named like another's companion.  Both pass
    check, each gets one unit wanting its own instance of the template units,
    and each probe's drop-in names its own model only."""
    from infer_units.generator.build import load_all, render_checked
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "x.toml").write_text('engine = "vllm"\nmodel = "/m"\ngpus = [0]\nport = 8000\n')
    (conf / "x-liveness.toml").write_text('engine = "vllm"\nmodel = "/m"\ngpus = [1]\n'
                                          'port = 8001\n[liveness]\ninterval = "10s"\n')
    env = base_env(INFER_UNITS_CONFIG_PATH=str(conf))
    assert run_cli("check", "x", "x-liveness", env=env).returncode == 0
    loaded = load_all(dirs=[str(conf)])
    assert not loaded.errors and not loaded.conflicts
    names = {m.name: [u.name for u in render_checked(m)] for m in loaded.models}
    assert names == {"x": ["x.service", "infer-units-liveness@x.service.d/50-liveness.conf"],
                     "x-liveness": [
        "x-liveness.service", "infer-units-liveness@x-liveness.timer.d/50-liveness.conf",
        "infer-units-liveness@x-liveness.service.d/50-liveness.conf"]}
    units = {m.name: render_checked(m)[0].text for m in loaded.models}
    assert values(units["x"], "Unit", "Wants")[-1] == "infer-units-liveness@x.timer"
    assert values(units["x-liveness"], "Unit", "Wants")[-1] == \
        "infer-units-liveness@x-liveness.timer"
    x, xl = _probe_argv(conf, "x"), _probe_argv(conf, "x-liveness")
    # vLLM's /health reads a flag (vllm#36960): its liveness generates one token.
    assert x[2:10] == ["--unit", "x.service", "--url", "http://127.0.0.1:8000/v1/completions",
                       "--interval", "30s", "--failures", "4"]
    assert x[-2:] == ["--post",
                      '{"model": "/m", "prompt": "1", "max_tokens": 1, "temperature": 0}']
    assert xl[2:8] == ["--unit", "x-liveness.service",
                       "--url", "http://127.0.0.1:8001/v1/completions", "--interval", "10s"]


def test_the_probe_kind_comes_from_the_model(tmp_path: Path) -> None:
    """The probe's drop-in probes as the model's file says: SGLang's /health
    already generates; `probe = "health"` turns vLLM's generation off; a
    served model name is what is generated with."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "s.toml").write_text('engine = "sglang"\nmodel = "/m"\ngpus = [0]\nport = 8000\n')
    (conf / "h.toml").write_text('engine = "vllm"\nmodel = "/m"\ngpus = [1]\nport = 8001\n'
                                 '[liveness]\nprobe = "health"\n')
    (conf / "n.toml").write_text('engine = "vllm"\nmodel = "/m"\ngpus = [2]\nport = 8002\n'
                                 'args = ["--served-model-name", "tiny \\"q\\""]\n')
    s, h, n = (_probe_argv(conf, name) for name in "shn")
    assert s[5] == "http://127.0.0.1:8000/health" and "--post" not in s
    assert h[5] == "http://127.0.0.1:8001/health" and "--post" not in h
    assert n[5] == "http://127.0.0.1:8002/v1/completions"
    assert json.loads(n[n.index("--post") + 1])["model"] == 'tiny "q"'


# ------------------------------------------------------------------ the cap's ExecStopPost

def _stop_post(tmp_path: Path, engine: str) -> list[str]:
    """The model's last ExecStopPost= argv: wait-free (with the cap) for a
    model with GPUs, the cap's /bin/sh line for one without."""
    from infer_units.generator.build import load_all
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "m.toml").write_text(engine + 'port = 8000\n'
                                 f'[env]\nINFER_UNITS_LIVENESS_DIR = "{tmp_path}"\n')
    [model] = load_all(dirs=[str(conf)]).models
    from infer_units.generator.render import render
    line = values(render(model).text, "Service", "ExecStopPost")[-1]
    assert line.startswith("+")
    return exec_argv(line)


def _cap_cases(stop_post, marker: Path) -> None:
    assert stop_post("ee" * 16) == 0                 # an ordinary stop
    marker.write_text("ee" * 16)
    assert stop_post("ee" * 16) == 1 and not marker.exists()   # the cap's stop: failed
    marker.write_text("ff" * 16)
    assert stop_post("ee" * 16) == 0 and not marker.exists()   # stale: passes, removed


@needs_root
def test_wait_free_fails_the_stop_only_for_the_capped_invocation(tmp_path: Path,
                                                                 fake_gpus) -> None:
    """With GPUs the cap is wait-free's (no /bin/sh process on every stop):
    the rendered line itself, run with the unit's $INVOCATION_ID."""
    argv = _stop_post(tmp_path, 'engine = "vllm"\nmodel = "/m"\ngpus = [0]\n')
    marker = tmp_path / "m.liveness-cap"
    assert argv[1] == "wait-free" and argv[argv.index("--liveness-cap") + 1] == str(marker)
    args = [a.replace("$SERVICE_RESULT", "success") for a in argv[1:]]

    def stop_post(invocation: str) -> int:
        done = run_cli(*args, env=fake_gpus.env(INVOCATION_ID=invocation), timeout=60)
        assert "Traceback" not in done.stderr, done.stderr
        if done.returncode:
            assert "stopped by liveness at its restart cap" in done.stderr, done.stderr
        return done.returncode

    _cap_cases(stop_post, marker)
    marker.symlink_to(tmp_path / "conf" / "m.toml")          # never followed, removed
    assert stop_post("ee" * 16) == 0 and not marker.is_symlink()
    assert (tmp_path / "conf" / "m.toml").exists()


def test_cap_stop_post_fails_only_for_the_marked_invocation(tmp_path: Path) -> None:
    """Without GPUs (no wait-free) the cap is its own /bin/sh ExecStopPost=."""
    argv = _stop_post(tmp_path, 'engine = "command"\ncommand = ["/opt/srv/bin/serve"]\n'
                                'ready.url = "http://127.0.0.1:8000/health"\n')
    marker = tmp_path / "m.liveness-cap"
    assert argv[0] == "/bin/sh" and argv[-1] == str(marker)

    def stop_post(invocation: str) -> int:
        return subprocess.run(argv, env={"INVOCATION_ID": invocation, "PATH": "/usr/bin:/bin"},
                              timeout=10).returncode

    _cap_cases(stop_post, marker)


# ------------------------------------------------------------------ status

def test_status_view_and_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from infer_units.generator.build import load_all
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "on.toml").write_text('engine = "vllm"\nmodel = "/m"\ngpus = [0]\nport = 8000\n'
                                  '[liveness]\nfailures = 3\n')
    (conf / "off.toml").write_text('engine = "vllm"\nmodel = "/m"\ngpus = [1]\nport = 8001\n'
                                   '[liveness]\ninterval = "0"\n')
    monkeypatch.setenv("INFER_UNITS_LIVENESS_DIR", str(tmp_path))
    models = {m.name: m for m in load_all(dirs=[str(conf)]).models}
    assert lv.view(models["off"]) is None and lv.cell(None) == "off"
    entry = lv.view(models["on"])
    assert entry is not None and entry["last_probe"] is None
    assert lv.cell(entry) == "no probe yet"
    now = time.time()
    (tmp_path / "on.liveness.json").write_text(json.dumps({
        "last_probe": {"time": now - 5, "ok": False, "answer": "HTTP 503", "seconds": 0.01},
        "consecutive_failures": 2, "answers": ["HTTP 503", "HTTP 503"],
        "restarts": [now - 100, now - 30000], "restarts_total": 4}))
    entry = lv.view(models["on"])
    assert entry["restarts_in_window"] == 1 and entry["restarts_total"] == 4
    assert entry["timeout"] == 10.0 and entry["failures"] == 3
    assert lv.cell(entry) == "2/3 failed: HTTP 503, 4 restarts"
    json.dumps(entry)


def test_interval_dropin_resets_the_timers_once_then_sets_both(tmp_path: Path) -> None:
    """systemd: an empty OnActiveSec=/OnUnitInactiveSec= resets EVERY timer of
    the unit, so a second reset would drop the first setting (the timer then
    never fires: seen under systemd 252)."""
    from infer_units.generator.build import load_all, render_checked
    from ..unitfile import parse_unit
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "m.toml").write_text('engine = "vllm"\nmodel = "/m"\ngpus = [0]\nport = 8000\n'
                                 '[liveness]\ninterval = "5s"\n')
    [model] = load_all(dirs=[str(conf)]).models
    [_unit, dropin, _probe] = render_checked(model)
    assert dropin.name == "infer-units-liveness@m.timer.d/50-liveness.conf"
    timer = [(k, v) for k, v in parse_unit(dropin.text)["Timer"] if k.startswith("On")]
    assert timer == [("OnActiveSec", ""), ("OnActiveSec", "5s"), ("OnUnitInactiveSec", "5s")]
