"""Crash loops under real systemd: each automatic restart waits
longer, up to a ceiling (systemd >= 254 by itself: RestartSteps=,
RestartMaxDelaySec=; systemd 252: pre-start waits out the rest), the journal
says so at each step, the loop never ends failed, and a server that comes up
healthy starts the count over.  Refusals no retry can fix (a GPU this host
does not have, a model path that is not there) end the unit failed without
any automatic restart."""

from __future__ import annotations

import json
import shlex

import pytest

from .e2e_support import FAKE_TABLE, add_model, engine_toml, make_model_path, show, wait_until

pytestmark = pytest.mark.e2e

NAME, PORT = "bo-loop", 18501
TIMES, OK = "/run/bo-loop.times", "/run/bo-loop.ok"
STATE = ("ActiveState", "SubState", "Result", "MainPID", "NRestarts")
# A server that exits at once with status 3, each start's time written first,
# until OK exists: then it loads and serves /health.
SERVER = (f"date +%s.%N >> {TIMES}; test -e {OK} && "
          f"exec /usr/local/bin/fake-engine --port {PORT} --load 0.2; exit 3")
MODEL = f"""engine = "command"
command = {json.dumps(["/bin/sh", "-c", SERVER])}
port = {PORT}
[ready]
timeout = "30s"
interval = "100ms"
[liveness]
interval = "1s"
failures = 3
[service]
RestartSec = "1s"
RestartSteps = 2
RestartMaxDelaySec = "4s"
"""


def state(box, name: str = NAME) -> dict[str, str]:
    return show(box, f"{name}.service", *STATE)


def starts(box) -> list[float]:
    out = box.sh(f"cat {TIMES} 2>/dev/null || true").stdout
    return [float(t) for t in out.split()]


def test_a_crash_loop_backs_off_to_its_ceiling_and_a_healthy_start_resets_it(box) -> None:
    add_model(box, NAME, MODEL)
    box.sh(f"rm -f {TIMES} {OK}; systemctl daemon-reload; systemctl reset-failed {NAME} "
           f"2>/dev/null; systemctl start --no-block {NAME}")
    # Waits of 1, 2, 4, 4, 4 s: the old start limit (5 automatic restarts
    # within a minute) would have left it failed after the sixth start.
    assert wait_until(lambda: len(starts(box)) >= 7, 90, 0.5), (starts(box), state(box))
    times = starts(box)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.9 and gaps[2] >= 3.9, gaps
    # the ceiling: 4 s, never the 8 s the next doubling would be
    assert all(3.9 <= g < 7.5 for g in gaps[3:6]), gaps
    log = box.journal(f"{NAME}.service")
    assert "repeated too quickly" not in log
    props = state(box)
    assert int(props["NRestarts"]) >= 6 and props["ActiveState"] != "inactive", props
    if box.suite == "bookworm":      # systemd 252: pre-start waits and says so
        assert f"automatic restart 3 of {NAME}.service (crash loop): waiting 4.0s in all" \
            in log, log[-3000:]
    else:                            # systemd >= 254: RestartSteps= does
        assert "Scheduled restart job, restart counter is at 3." in log, log[-3000:]
    # It comes up healthy: its liveness probe starts the count over ...
    box.sh(f"touch {OK}")
    assert wait_until(lambda: state(box)["ActiveState"] == "active", 30, 0.2), state(box)
    assert wait_until(lambda: "the crash-loop back-off starts over"
                      in box.journal(f"{NAME}.service"), 30, 0.5), \
        box.journal(f"{NAME}.service")[-3000:]
    assert state(box)["NRestarts"] == "0", state(box)
    # ... so its next crash is restarted after RestartSec=, not the ceiling.
    before = len(starts(box))
    box.sh(f"rm -f {OK}; kill -KILL {state(box)['MainPID']}")
    assert wait_until(lambda: len(starts(box)) >= before + 2, 30, 0.2), state(box)
    times = starts(box)
    assert times[before + 1] - times[before] < 3.5, times[before - 1:]   # 1 s, then 2 s
    box.sh(f"systemctl stop {NAME}; systemctl reset-failed {NAME} 2>/dev/null || true")
    assert state(box)["ActiveState"] in ("inactive", "failed")


def test_a_gpu_this_host_does_not_have_ends_failed_without_restarts(box) -> None:
    name = "bo-nogpu"
    add_model(box, name, "\n".join([
        'engine = "command"', 'command = ["/usr/local/bin/fake-engine", "--port", "18502"]',
        "gpus = [9]", "port = 18502", "[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"',
        "[service]", 'RestartSec = "1s"']) + "\n")
    box.sh(f"systemctl daemon-reload; systemctl reset-failed {name} 2>/dev/null; "
           f"systemctl start {name}", check=False)
    assert wait_until(lambda: state(box, name)["ActiveState"] == "failed", 20, 0.2), \
        state(box, name)
    log = box.journal(f"{name}.service")
    assert "GPU '9' not found" in log and \
        f"start of {name}.service refused; no automatic restart" in log, log[-3000:]
    # RestartSec=1s: an automatic restart would have come within this (an
    # absence can only be waited for).
    box.sh("sleep 3")
    props = state(box, name)
    assert props["NRestarts"] == "0" and props["ActiveState"] == "failed", props
    box.sh(f"systemctl reset-failed {name}")


def test_a_missing_model_path_ends_failed_without_restarts(box) -> None:
    """A model whose path is not on this host: pre-start
    names the path and cancels its own start, so the unit ends failed with no
    automatic restart; once the path is there the same unit starts, and
    systemd read RequiresMountsFor= (a space, '%' and quotes in the path) as
    the path written."""
    name, path = "bo-nomodel", '/models/bo mp 100% "q"'
    text = engine_toml(name, "vllm", [5], 18503, env={"FAKE_LOAD_S": "0.2"}).replace(
        f'model = "/models/{name}"', f"model = '{path}'")
    add_model(box, name, text, model_present=False)
    box.sh(f"systemctl daemon-reload; systemctl reset-failed {name} 2>/dev/null; "
           f"systemctl start {name}", check=False)
    assert wait_until(lambda: state(box, name)["ActiveState"] == "failed", 20, 0.2), \
        (state(box, name), box.journal(f"{name}.service")[-3000:])
    log = box.journal(f"{name}.service")
    assert f"model: {path} does not exist on this host (No such file or directory;" in log \
        and f"start of {name}.service refused; no automatic restart" in log, log[-3000:]
    # The model's path as written (systemctl quotes a value with spaces or
    # quotes), beside the one systemd adds for the unit's CacheDirectory=.
    mounts = box.sh(f"systemctl show -p RequiresMountsFor --value {name}").stdout
    assert sorted(shlex.split(mounts)) == [path, f"/var/cache/infer-units/{name}"], mounts
    box.sh("sleep 3")      # RestartSec=1s: as above, an absence can only be waited for
    props = state(box, name)
    assert props["NRestarts"] == "0" and props["ActiveState"] == "failed", props
    assert "Scheduled restart job" not in box.journal(f"{name}.service")
    # The model put in place: the same unit starts, the path reaches the server whole.
    make_model_path(box, path)
    box.sh(f"systemctl reset-failed {name}; systemctl start {name}")
    assert state(box, name)["ActiveState"] == "active", state(box, name)
    argv = json.loads(box.sh(f"cat /run/{name}.json").stdout)["argv"]
    assert argv[argv.index("serve") + 1] == path, argv
    box.sh(f"systemctl stop {name}; rm -f /etc/infer-units/{name}.toml; "
           f"rmdir {shlex.quote(path)}; systemctl daemon-reload")
