"""Each engine's generated unit against its fake (tests/e2e/fake_engine.py)
under real systemd: readiness, start timeouts, stop windows, P2P and
per-instance ports behave as with the real servers."""

from __future__ import annotations

import json
import time

import pytest

from .e2e_support import FAKE_TABLE, FAKES, add_model, alive, engine_toml, holders, show, wait_until

pytestmark = pytest.mark.e2e


def recorded(box, name: str) -> dict:
    return json.loads(box.sh(f"cat /run/{name}.json").stdout)


def start(box, *names: str) -> float:
    started = time.monotonic()
    box.sh("systemctl daemon-reload && systemctl start " + " ".join(names))
    return time.monotonic() - started


def test_sglang_slow_health_becomes_active_with_a_short_interval(box) -> None:
    # /health takes 1.5 s to answer (upstream: sleep 1 s + one token), after a
    # 503 warm-up; polling every 500 ms must still see it answer.
    add_model(box, "sg-slow", engine_toml(
        "sg-slow", "sglang", [0, 1], 18101, ready='interval = "500ms"',
        env={"FAKE_HEALTH_S": "1.5", "FAKE_WARMUP_S": "1", "FAKE_LOAD_S": "1"}))
    took = start(box, "sg-slow")
    props = show(box, "sg-slow.service", "ActiveState", "NRestarts")
    assert props == {"ActiveState": "active", "NRestarts": "0"}, props
    assert took >= 3.5, f"active after {took:.1f}s: before load + warm-up + a 1.5 s answer"
    argv = recorded(box, "sg-slow")["argv"]
    assert argv[1:4] == ["-m", "sglang.launch_server", "--model-path"]
    assert "--disable-custom-all-reduce" not in argv
    log = box.journal("sg-slow.service")
    assert "answered HTTP 200" in log
    box.sh("systemctl stop sg-slow")
    assert holders(box, "0,1") == []


def test_vllm_serve_entry_and_ready_timeout_reach_the_server(box) -> None:
    add_model(box, "vl", engine_toml("vl", "vllm", [0, 1], 18102,
                                     extra="[stop]\ntimeout = \"20s\"",
                                     env={"FAKE_LOAD_S": "1"}).replace(
        'timeout = "60s"', 'timeout = "45min"'))
    start(box, "vl")
    rec = recorded(box, "vl")
    assert rec["argv"][1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", "/models/vl"]
    assert int(rec["env"]["VLLM_ENGINE_READY_TIMEOUT_S"]) >= 45 * 60
    assert rec["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert show(box, "vl.service", "TimeoutStopUSec")["TimeoutStopUSec"] == "35s"
    # vLLM's EngineCore dies first; its orphaned workers still hold the GPUs
    # and are cleaned before `systemctl stop` returns.
    assert len(holders(box, "0,1")) == 2   # EngineCore's two workers
    box.sh("systemctl stop vl")
    assert holders(box, "0,1") == []
    assert show(box, "vl.service", "ActiveState", "Result") == {
        "ActiveState": "inactive", "Result": "success"}


def test_vllm_aborts_its_own_start_like_upstream_when_the_timeout_is_short(box) -> None:
    # The fake reproduces vLLM's own abort (what a 600 s default did to a
    # slow-loading model): a server-side timeout below the load time fails.
    # (its orphaned workers would keep a pipe open: output goes to a file)
    out = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} CUDA_VISIBLE_DEVICES=5 "
                 "VLLM_ENGINE_READY_TIMEOUT_S=1 FAKE_LOAD_S=3 timeout 20 "
                 f"{FAKES['fake-python']} -m vllm.entrypoints.cli.main serve /m --port 18199 "
                 ">/tmp/vl-abort.out 2>&1; echo rc=$?; cat /tmp/vl-abort.out", check=False)
    box.sh("pkill -KILL -f 'serve /m --port 18199' || true")
    assert "rc=1" in out.stdout and "Timed out waiting for engine core" in out.stdout


def test_llamacpp_503_while_loading_then_active(box) -> None:
    add_model(box, "ll", engine_toml("ll", "llamacpp", [2], 18103, env={"FAKE_LOAD_S": "2"}))
    took = start(box, "ll")
    assert took >= 2, f"active after {took:.1f}s while /health said 503 Loading model"
    assert show(box, "ll.service", "ActiveState")["ActiveState"] == "active"
    box.sh("systemctl stop ll")


def test_two_tgi_models_run_side_by_side(box) -> None:
    # Without per-model ports and paths two TGI launchers collide: the second
    # deletes the first one's shard sockets, and with two shards each its
    # torch master port (29500) is taken, which fails the second.
    first = box.sh(f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} CUDA_VISIBLE_DEVICES=3,4 "
                   f"setsid {FAKES['fake-tgi']} --model-id m --num-shard 2 --port 18190 "
                   ">/dev/null 2>&1 & sleep 2; stat -c %i /tmp/text-generation-server-0; "
                   f"INFER_UNITS_FAKE_GPUS={FAKE_TABLE} CUDA_VISIBLE_DEVICES=3,4 timeout 20 "
                   f"{FAKES['fake-tgi']} --model-id m --num-shard 2 --port 18191; echo rc=$?; "
                   "stat -c %i /tmp/text-generation-server-0 || echo gone", check=False)
    box.sh("pkill -f 'fake-tgi --model-id m' || true")
    inode_before, *_rest, inode_after = first.stdout.split()
    assert "rc=1" in first.stdout and "Shard failed" in first.stdout, first.stdout
    assert inode_after != inode_before, "the second launcher left the first one's socket"

    add_model(box, "tgi-a", engine_toml("tgi-a", "tgi", [3], 18110))
    add_model(box, "tgi-b", engine_toml("tgi-b", "tgi", [4], 18120))
    start(box, "tgi-a", "tgi-b")
    for name in ("tgi-a", "tgi-b"):
        assert show(box, f"{name}.service", "ActiveState")["ActiveState"] == "active"
    a, b = recorded(box, "tgi-a")["argv"], recorded(box, "tgi-b")["argv"]
    for flag in ("--master-port", "--prometheus-port", "--shard-uds-path"):
        assert a[a.index(flag) + 1] != b[b.index(flag) + 1], flag
    # TGI's own drain (90 s) twice (router, then shards), 30 s teardown, 15 s margin
    assert show(box, "tgi-a.service", "TimeoutStopUSec")["TimeoutStopUSec"] == "3min 45s"
    box.sh("systemctl stop tgi-a tgi-b")


def test_check_reports_engine_port_collisions(box) -> None:
    add_model(box, "tgi-c", engine_toml("tgi-c", "tgi", [5], 18130).replace(
        'engine = "tgi"', 'engine = "tgi"\nargs = ["--prometheus-port", "18112"]'))
    out = box.sh("infer-units check tgi-c tgi-a", check=False)
    assert out.returncode == 1
    assert "--prometheus-port 18112 also used by tgi-a" in out.stderr
    box.sh("rm /etc/infer-units/tgi-c.toml && systemctl daemon-reload")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_p2p_auto_verdict_reaches_the_server_argv(box, engine: str) -> None:
    bad, good = f"p2p-bad-{engine}", f"p2p-good-{engine}"
    # GPUs 0,1: the copy 0->1 arrives corrupted (CPU stand-in for torch).
    add_model(box, bad, engine_toml(bad, engine, [0, 1], 18140, p2p="auto",
                                    env={"FAKE_TORCH_CORRUPT": "0>1"}))
    add_model(box, good, engine_toml(good, engine, [2, 3], 18141, p2p="auto"))
    box.sh("rm -rf /run/infer-units/p2p")
    start(box, bad)
    rec = recorded(box, bad)
    assert "--disable-custom-all-reduce" in rec["argv"]
    assert rec["env"].get("NCCL_P2P_DISABLE") == "1"
    assert "P2P OFF" in box.journal(f"{bad}.service")
    box.sh(f"systemctl stop {bad}")
    start(box, good)
    rec = recorded(box, good)
    assert "--disable-custom-all-reduce" not in rec["argv"]
    assert "NCCL_P2P_DISABLE" not in rec["env"]
    box.sh(f"systemctl stop {good}")


def test_stop_with_a_foreign_gpu_user_left_behind_is_fast_and_clean(box) -> None:
    add_model(box, "fg", engine_toml("fg", "llamacpp", [5], 18150, env={"FAKE_LOAD_S": "0.2"}))
    start(box, "fg")
    box.sh("systemd-run --unit=fg-foreign /usr/bin/python3 -c "
           "'import time; f=open(\"/var/lib/fakegpu/nvidia5\"); time.sleep(3600)'")
    deadline = time.monotonic() + 10
    while not any(h["unit"] == "fg-foreign.service" for h in holders(box, "5")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    foreign = [h["pid"] for h in holders(box, "5") if h["unit"] == "fg-foreign.service"][0]
    started = time.monotonic()
    box.sh("systemctl stop fg")
    took = time.monotonic() - started
    assert took < 5, f"stop took {took:.1f}s waiting for a GPU user outside the unit"
    assert show(box, "fg.service", "ActiveState", "Result") == {
        "ActiveState": "inactive", "Result": "success"}
    assert alive(box, foreign), "the stop touched a process outside the unit"
    assert str(foreign) in box.journal("fg.service")
    box.sh("systemctl stop fg-foreign")


def test_known_answer_changed_under_the_same_key_refuses_the_start_until_accepted(box) -> None:
    # The fake answers the check greedily, the same every time; FAKE_ANSWER
    # (its [env], which is not in the record's key) changes its answer as a
    # silent fault would: the same key with another answer is a mismatch.
    name = "ll-ka"
    add_model(box, name, engine_toml(name, "llamacpp", [5], 18121, env={"FAKE_LOAD_S": "0.2"}))
    start(box, name)
    assert show(box, f"{name}.service", "ActiveState")["ActiveState"] == "active"
    box.sh(f"systemctl restart {name}")
    log = box.journal(f"{name}.service")
    assert "known answer: first check on this host: answer recorded" in log, log
    assert "known answer: answer matches the one recorded" in log, log
    assert box.sh(f"stat -c %a /var/lib/infer-units/canary/{name}.json").stdout.strip() == "600"
    add_model(box, name, engine_toml(name, "llamacpp", [5], 18121,
                                     env={"FAKE_LOAD_S": "0.2", "FAKE_ANSWER": "2"}))
    restarts = show(box, f"{name}.service", "NRestarts")["NRestarts"]
    done = box.sh(f"systemctl daemon-reload && systemctl restart {name}", check=False)
    assert done.returncode != 0

    def settled() -> bool:
        p = show(box, f"{name}.service", "ActiveState", "SubState")
        jobs = box.sh(f"systemctl list-jobs --no-legend {name}.service", check=False).stdout
        return p["ActiveState"] in ("failed", "inactive") and p["SubState"] != "auto-restart" \
            and not jobs.strip()
    assert wait_until(settled, 30), show(box, f"{name}.service", "ActiveState", "SubState")
    assert show(box, f"{name}.service", "NRestarts")["NRestarts"] == restarts
    log = box.journal(f"{name}.service")
    assert 'token 0: recorded "49", now "50"' in log, log
    assert holders(box, "5") == []
    # Judged right: the next start records its answer.
    done = box.sh(f"infer-units canary {name} --accept")
    assert "its next start records its answer" in done.stdout, done.stdout
    start(box, name)
    assert show(box, f"{name}.service", "ActiveState")["ActiveState"] == "active"
    assert "known answer: answer accepted and recorded" in box.journal(f"{name}.service")
    assert box.sh(f"infer-units canary {name}").stdout.startswith(f"{name}.service: match:")
    box.sh(f"systemctl stop {name}")
