"""doctor names the GPU backend and why: never
`backend None, driver ?`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from infer_units.helpers.cli.doctor import backend_detail, nvml_source

from ..support import FakeGpus, base_env, run_cli


def test_the_fake_backend_is_named_as_a_test_table(tmp_path: Path) -> None:
    fake = FakeGpus(tmp_path / "g", count=1)
    done = run_cli("doctor", "--json", env=fake.env())
    report = json.loads(done.stdout)
    assert report["backend"] == "fake" and report["backend_detail"].startswith("fake ("), report
    text = run_cli("doctor", env=fake.env()).stdout
    assert "backend fake (INFER_UNITS_FAKE_GPUS" in text and "driver ?" not in text, text


def test_no_backend_says_why(tmp_path: Path) -> None:
    done = run_cli("doctor", env=base_env(INFER_UNITS_FAKE_GPUS=str(tmp_path / "none.json")))
    assert "backend None" not in done.stdout and "driver ?" not in done.stdout, done.stdout
    assert "backend none (" in done.stdout, done.stdout


def test_the_proc_fallback_says_where_nvml_went() -> None:
    text = backend_detail("proc", None)
    assert text.startswith("/proc fallback (") and "CUDA_VISIBLE_DEVICES" in text
    if importlib.util.find_spec("pynvml") is None and nvml_source() is None:
        assert "nvidia-ml-py is neither bundled nor installed" in text, text
    else:
        assert "NVML did not start" in text, text
    assert backend_detail("nvml", None).startswith("NVML (nvidia-ml-py ")
