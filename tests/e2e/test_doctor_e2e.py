"""GPU health under real systemd: a model whose GPU has an error-level finding
(the fake table's `health`: XID 79) is refused at start with exit 2 and no
automatic restart, the GPU and the finding at err priority in the journal;
`[health] accept` lets it start, with the finding logged as a warning;
`doctor` and the metrics file say the same."""

from __future__ import annotations

import json

import pytest

from .e2e_support import add_model, model_toml, show, wait_until

pytestmark = pytest.mark.e2e

SICK_TABLE = "/etc/infer-units/sickgpus.json"
UUID = "GPU-51c0000-0000-0000-0000-000000000007"


@pytest.fixture
def sick(box):
    box.sh("mkdir -p /var/lib/fakegpu && : > /var/lib/fakegpu/sick7")
    box.write(SICK_TABLE, json.dumps({"gpus": [
        {"index": 7, "uuid": UUID, "pci": "0000:87:00.0", "device": "/var/lib/fakegpu/sick7",
         "memory_mib": 143771,
         "health": {"xid": [79], "persistence": False}}]}))
    text = model_toml("sick", [7], 18311).replace(
        'INFER_UNITS_FAKE_GPUS = "/etc/infer-units/fakegpus.json"',
        f'INFER_UNITS_FAKE_GPUS = "{SICK_TABLE}"\nINFER_UNITS_METRICS_DIR = "/run/sick-metrics"')
    assert SICK_TABLE in text
    box.sh("mkdir -p /run/sick-metrics")
    add_model(box, "sick", text)
    box.sh("systemctl daemon-reload")
    yield text
    box.sh("systemctl stop sick; systemctl reset-failed sick; rm -rf /etc/infer-units/sick.toml "
           "/etc/infer-units/sick.toml.d /run/sick-metrics; systemctl daemon-reload", check=False)


def test_a_sick_gpu_refuses_the_start_without_restart_and_says_why_at_err(box, sick) -> None:
    done = box.sh("systemctl start sick", check=False)
    assert done.returncode != 0
    # The hook leaves after cancelling its own start: wait for the unit to
    # settle.  Refused, not failed-and-retrying: an auto-restart would be
    # "activating/auto-restart", never inactive or failed.
    def settled() -> dict[str, str]:
        return show(box, "sick.service", "ActiveState", "SubState", "NRestarts", "ExecStartPre",
                    "Job")
    assert wait_until(lambda: "code=(null)" not in settled()["ExecStartPre"]
                      and not settled().get("Job"), timeout=60), settled()
    props = settled()
    assert props["ActiveState"] in ("failed", "inactive"), props
    assert props["SubState"] != "auto-restart" and props["NRestarts"] == "0", props
    assert "sick.service" not in box.sh("systemctl list-jobs --no-legend").stdout
    assert "code=exited ; status=2" in props["ExecStartPre"], props["ExecStartPre"]
    errors = box.sh("journalctl -p err -u sick.service -o cat --no-pager", check=False).stdout
    assert f"refused: GPU 7 ({UUID}): xid error: XID 79 since boot" in errors, errors
    assert "[health] accept = [\"xid\"]" in errors
    # warnings are not at err priority, but in the journal at warning
    assert "persistence warning" not in errors
    warnings = box.sh("journalctl -p warning -u sick.service -o cat --no-pager", check=False).stdout
    assert "persistence warning" in warnings
    assert "start of sick.service refused; no automatic restart" in box.journal("sick.service")
    # the metrics file has the gauge: 2 (error) for xid on GPU 7
    prom = box.sh("cat /run/sick-metrics/infer-units.prom").stdout
    assert f'infer_units_gpu_health{{gpu="7",uuid="{UUID}",check="xid"}} 2' in prom, prom
    # doctor says the same, exit 2, one JSON document
    doc = box.sh(f"INFER_UNITS_FAKE_GPUS={SICK_TABLE} infer-units doctor --json sick", check=False)
    assert doc.returncode == 2, doc.stderr
    report = json.loads(doc.stdout)
    xid = next(f for f in report["gpus"][0]["findings"] if f["check"] == "xid")
    assert xid["level"] == "error"
    assert any(f["check"] == "gpu-health" and f["level"] == "error"
               for f in report["models"][0]["findings"])
    box.sh("systemctl reset-failed sick", check=False)


def test_health_accept_lets_the_start_through_and_logs_a_warning(box, sick) -> None:
    box.write("/etc/infer-units/sick.toml.d/accept.toml", '[health]\naccept = ["xid"]\n')
    box.sh("systemctl daemon-reload")
    pre = show(box, "sick.service", "ExecStartPre")["ExecStartPre"]
    assert "--accept-health xid" in pre, pre
    box.sh("systemctl start sick")
    assert wait_until(lambda: show(box, "sick.service", "ActiveState")["ActiveState"] == "active",
                      timeout=60)
    warnings = box.sh("journalctl -p warning -u sick.service -o cat --no-pager").stdout
    assert "xid error (accepted by [health] accept): XID 79 since boot" in warnings, warnings
    errors = box.sh("journalctl -p err -u sick.service -o cat --no-pager --since=-1min",
                    check=False).stdout
    assert "accepted by" not in errors
