"""The Prometheus alert rules of contrib/prometheus, checked and
unit-tested with promtool (Debian's prometheus package) on series taken from a
textfile the code itself wrote: a real reap of a foreign holder, a start
refused for GPU health, and liveness' counters.  So a rule that names a series
or a label the code does not write fails here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..support import PYTHON, FakeGpus, run_cli

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "contrib/prometheus/infer-units.rules.yml"
PROMTOOL = shutil.which("promtool", path="/usr/bin:/bin")
# The labels one node_exporter scrape adds to every series it exports.
SCRAPE = {"instance": "gpu-a:9100", "job": "node"}
# Series of node_exporter's systemd collector the rules read; every other
# series they read must be one infer-units writes.
NODE_SERIES = {"node_systemd_unit_state"}

needs_promtool = pytest.mark.skipif(PROMTOOL is None,
                                    reason="promtool missing: tools/setup installs prometheus")

Series = dict[str, list[dict[str, str]]]


def written_textfile(gpus: FakeGpus, holders: Any, tmp_path: Path) -> str:
    """What the code writes for INFER_UNITS_METRICS_DIR after a reap that kills a
    foreign holder (m.service), a start refused for an XID on GPU 1 that also
    has a warning, persistence off (sick.service), a liveness restart of
    m.service that hit the cap, a start refused before any reap (boot.service,
    its model path missing), and a model reaped once whose file is gone."""
    holders([gpus.devices[0]])
    metrics = tmp_path / "textfile"
    metrics.mkdir()
    models = tmp_path / "models"
    models.mkdir()
    for name in ("m", "sick", "boot", "gone"):
        (models / f"{name}.toml").write_text('engine = "command"\ncommand = ["/bin/true"]\n')
    env = gpus.env(INFER_UNITS_STATE_DIR=str(tmp_path / "state"),
                   INFER_UNITS_METRICS_DIR=str(metrics), INFER_UNITS_CONFIG_PATH=str(models))
    # Refused before its first reap, as at boot: its model path is not there.
    run_cli("pre-start", "--unit", "boot.service", "--model-path", str(tmp_path / "absent"),
            env=env, check=1)
    # A model whose file is then deleted: its series go with it.
    run_cli("reap", "--gpus", "0", "--unit", "gone.service", env=env, check=0)
    (models / "gone.toml").unlink()
    run_cli("reap", "--gpus", "0", "--unit", "m.service", "--term-grace", "2s", env=env, check=0)
    table = json.loads(gpus.table.read_text())
    table["gpus"][1]["health"] = {"xid": [79], "persistence": False}     # an error, a warning
    gpus.table.write_text(json.dumps(table))
    run_cli("pre-start", "--unit", "sick.service", "--gpus", "1", "--timeout", "5s", env=env,
            check=2)
    done = subprocess.run(
        [PYTHON, "-c", "from infer_units.helpers.act.metrics import record_canary, "
         "record_liveness; from infer_units.helpers.act.canary import Result; "
         "record_liveness('m.service', {'consecutive_failures': 2, 'capped': True}, True); "
         "record_canary('m.service', Result('mismatch', 'token 0 differs', 0.2))"],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return (metrics / "infer-units.prom").read_text()


def parse(text: str) -> tuple[Series, dict[str, str]]:
    """Series name -> the label sets written, and (series with labels) -> value."""
    found: Series = {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"(\w+)\{(.*)\} (\S+)", line)
        assert match, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2)))
        found.setdefault(match.group(1), []).append(labels)
        values[series_text(match.group(1), labels)] = match.group(3)
    return found, values


def series_text(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def scraped(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    return {"series": series_text(name, {**labels, **SCRAPE}), "values": values}


def unit_state(name: str, state: str, values: str) -> dict[str, str]:
    return scraped("node_systemd_unit_state", {"name": name, "state": state, "type": "simple"},
                   values)


def annotations(name: str, labels: dict[str, str], value: str) -> dict[str, str]:
    """The rule's annotations as Prometheus renders them for these labels:
    the file's templates use only $labels.NAME and $value."""
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r["alert"] == name)
    out = {}
    for key, template in rule["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)
        text = text.replace("{{ $value }}", value)
        assert "{{" not in text, (name, key, text)
        out[key] = text
    return out


def alert(name: str, labels: dict[str, str], severity: str, value: str = "1"
          ) -> dict[str, Any]:
    return {"exp_labels": {**labels, "severity": severity},
            "exp_annotations": annotations(name, labels, value)}


def promtool_cases(found: Series, values: dict[str, str]) -> list[dict[str, Any]]:
    """One promtool test group per situation, each series with the labels the
    code wrote (plus the scrape's)."""
    def one(name: str, **want: str) -> dict[str, str]:
        matching = [labels for labels in found[name]
                    if all(labels.get(k) == v for k, v in want.items())]
        assert len(matching) == 1, (name, want, found.get(name))
        return matching[0]

    assert "gone.service" not in {labels.get("unit") for series in found.values()
                                  for labels in series}, found
    boot = one("infer_units_refused", unit="boot.service")
    assert values[series_text("infer_units_refused", boot)] == "1", values
    assert "infer_units_reaps_total" not in {n for n, ls in found.items()
                                             if any(x.get("unit") == "boot.service" for x in ls)}
    m_refused = one("infer_units_refused", unit="m.service")
    assert values[series_text("infer_units_refused", m_refused)] == "0", values
    m_reaps = one("infer_units_reaps_total", unit="m.service")
    killed = one("infer_units_processes_killed_total", unit="m.service")
    failures = one("infer_units_liveness_consecutive_failures", unit="m.service")
    restarts = one("infer_units_liveness_restarts_total", unit="m.service")
    capped = one("infer_units_liveness_capped", unit="m.service")
    mismatch = one("infer_units_canary_mismatch", unit="m.service")
    health = found["infer_units_gpu_health"]
    errors = [h for h in health if values[series_text("infer_units_gpu_health", h)] == "2"]
    assert [(h["gpu"], h["check"]) for h in errors] == [("1", "xid")], health
    health_series = [scraped("infer_units_gpu_health", h,
                             f'{values[series_text("infer_units_gpu_health", h)]}x30')
                     for h in health]
    host = {"instance": SCRAPE["instance"]}
    unit = {"unit": "m.service", **SCRAPE}
    none: list[dict[str, Any]] = []
    return [
        {"name": "a failed model is down; a failed unit that is not a model is not",
         "interval": "1m",
         "input_series": [scraped("infer_units_refused", m_refused, "0x20"),
                          unit_state("m.service", "failed", "0x4 1x15"),
                          unit_state("ssh.service", "failed", "1x20")],
         "alert_rule_test": [
             {"eval_time": "4m", "alertname": "InferUnitsModelDown", "exp_alerts": none},
             {"eval_time": "10m", "alertname": "InferUnitsModelDown",
              "exp_alerts": [alert("InferUnitsModelDown", {**host, "name": "m.service"},
                                   "critical")]},
             {"eval_time": "10m", "alertname": "InferUnitsCrashLoop", "exp_alerts": none}]},
        {"name": "a model refused at boot, before its first reap, is down",
         "interval": "1m",
         "input_series": [scraped("infer_units_refused", boot, "1x20"),
                          unit_state("boot.service", "failed", "1x20")],
         "alert_rule_test": [
             {"eval_time": "1m", "alertname": "InferUnitsModelDown", "exp_alerts": none},
             {"eval_time": "5m", "alertname": "InferUnitsModelDown",
              "exp_alerts": [alert("InferUnitsModelDown", {**host, "name": "boot.service"},
                                   "critical")]}]},
        {"name": "a model still starting after 30 minutes is not ready",
         "interval": "1m",
         "input_series": [scraped("infer_units_refused", m_refused, "0x40"),
                          unit_state("m.service", "activating", "1x40")],
         "alert_rule_test": [
             {"eval_time": "20m", "alertname": "InferUnitsModelNotReady", "exp_alerts": none},
             {"eval_time": "35m", "alertname": "InferUnitsModelNotReady",
              "exp_alerts": [alert("InferUnitsModelNotReady", {**host, "name": "m.service"},
                                   "warning")]}]},
        {"name": "liveness: failing probes, a restart, the cap",
         "interval": "1m",
         "input_series": [scraped("infer_units_liveness_consecutive_failures", failures,
                                  "0 0 2x10"),
                          scraped("infer_units_liveness_restarts_total", restarts, "0 0 1x10"),
                          scraped("infer_units_liveness_capped", capped, "0 0 1x10")],
         "alert_rule_test": [
             {"eval_time": "3m", "alertname": "InferUnitsModelUnhealthy", "exp_alerts": none},
             {"eval_time": "5m", "alertname": "InferUnitsModelUnhealthy",
              "exp_alerts": [alert("InferUnitsModelUnhealthy", unit, "warning", "2")]},
             {"eval_time": "1m", "alertname": "InferUnitsLivenessRestarts", "exp_alerts": none},
             {"eval_time": "3m", "alertname": "InferUnitsLivenessRestarts",
              "exp_alerts": [alert("InferUnitsLivenessRestarts", unit, "warning")]},
             {"eval_time": "3m", "alertname": "InferUnitsLivenessCapped",
              "exp_alerts": [alert("InferUnitsLivenessCapped", unit, "critical")]}]},
        {"name": "a GPU health error, and a start it refused",
         "interval": "1m",
         "input_series": [*health_series, unit_state("sick.service", "failed", "0 0 1x20")],
         "alert_rule_test": [
             {"eval_time": "1m", "alertname": "InferUnitsGpuHealthError",
              "exp_alerts": [alert("InferUnitsGpuHealthError", {**h, **SCRAPE}, "critical")
                             for h in errors]},
             {"eval_time": "1m", "alertname": "InferUnitsStartRefusedGpuHealth",
              "exp_alerts": none},
             {"eval_time": "5m", "alertname": "InferUnitsStartRefusedGpuHealth",
              "exp_alerts": [alert("InferUnitsStartRefusedGpuHealth", host, "critical")]}]},
        {"name": "a GPU health error with no failed unit refuses nothing yet",
         "interval": "1m",
         "input_series": [*health_series, unit_state("sick.service", "failed", "0x20")],
         "alert_rule_test": [
             {"eval_time": "10m", "alertname": "InferUnitsStartRefusedGpuHealth",
              "exp_alerts": none}]},
        {"name": "a known answer that differs",
         "interval": "1m",
         "input_series": [scraped("infer_units_canary_mismatch", mismatch, "0 0 1x10")],
         "alert_rule_test": [
             {"eval_time": "1m", "alertname": "InferUnitsKnownAnswerMismatch", "exp_alerts": none},
             {"eval_time": "3m", "alertname": "InferUnitsKnownAnswerMismatch",
              "exp_alerts": [alert("InferUnitsKnownAnswerMismatch", unit, "critical")]}]},
        {"name": "a start every minute is a crash loop",
         "interval": "1m",
         "input_series": [scraped("infer_units_reaps_total", m_reaps, "1+1x40")],
         "alert_rule_test": [
             {"eval_time": "2m", "alertname": "InferUnitsCrashLoop", "exp_alerts": none},
             {"eval_time": "20m", "alertname": "InferUnitsCrashLoop",
              "exp_alerts": [alert("InferUnitsCrashLoop", unit, "warning")]}]},
        {"name": "foreign holders signalled at a start",
         "interval": "1m",
         "input_series": [scraped("infer_units_processes_killed_total", killed, "0 0 1x10")],
         "alert_rule_test": [
             {"eval_time": "1m", "alertname": "InferUnitsForeignGpuHolders", "exp_alerts": none},
             {"eval_time": "3m", "alertname": "InferUnitsForeignGpuHolders",
              "exp_alerts": [alert("InferUnitsForeignGpuHolders", unit, "warning")]}]},
        {"name": "counters that do not move raise nothing",
         "interval": "1m",
         "input_series": [scraped("infer_units_processes_killed_total", killed, "1x90"),
                          scraped("infer_units_liveness_restarts_total", restarts, "1x90"),
                          scraped("infer_units_reaps_total", m_reaps, "5x90")],
         "alert_rule_test": [
             {"eval_time": "80m", "alertname": name, "exp_alerts": none}
             for name in ("InferUnitsForeignGpuHolders", "InferUnitsLivenessRestarts",
                          "InferUnitsCrashLoop")]},
    ]


@pytest.fixture
def textfile(fake_gpus: FakeGpus, holders: Any, tmp_path: Path) -> tuple[Series, dict[str, str]]:
    return parse(written_textfile(fake_gpus, holders, tmp_path))


def test_rules_read_only_series_and_labels_the_code_writes(
        textfile: tuple[Series, dict[str, str]]) -> None:
    found, _ = textfile
    rules = "\n".join(line for line in RULES.read_text().splitlines()
                      if not line.lstrip().startswith("#"))
    used = set(re.findall(r"\b(infer_units_\w+|node_\w+)\b", rules))
    assert used - set(found) == NODE_SERIES, sorted(used - set(found))
    for label in set(re.findall(r"\$labels\.(\w+)", rules)) - {"instance", "name"}:
        assert any(label in labels for series in found.values() for labels in series), label


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    done = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 10 rules found" in done.stdout, done.stdout


@needs_promtool
def test_promtool_rule_tests_pass_on_the_written_series(
        textfile: tuple[Series, dict[str, str]], tmp_path: Path) -> None:
    cases = promtool_cases(*textfile)
    # Every alert of the file is tested firing at least once.
    names = set(re.findall(r"^\s*- alert: (\w+)", RULES.read_text(), re.M))
    fired = {t["alertname"] for case in cases for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == names, names - fired
    tests = tmp_path / "infer-units.rules.test.yml"
    # JSON is YAML: promtool reads it as written.
    tests.write_text(json.dumps({"rule_files": [str(RULES)], "evaluation_interval": "1m",
                                 "tests": cases}, indent=1))
    done = subprocess.run([str(PROMTOOL), "test", "rules", str(tests)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
