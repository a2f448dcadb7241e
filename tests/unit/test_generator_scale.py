"""Merging stays linear: 20,000 [env] keys in the host-wide defaults and the
model took 13 s when every replaced key scanned every origin; and a replaced
table still forgets where its old keys came from."""

from __future__ import annotations

import time
from pathlib import Path

from infer_units.generator.build import load_all, render_checked
from infer_units.generator.loader import Loader

MODEL = 'engine = "command"\ncommand = ["/opt/srv/serve"]\ngpus = [0]\n'


def write_tree(root: Path, keys: int) -> Path:
    etc = root / "etc"
    (etc / "defaults.toml.d").mkdir(parents=True)
    (etc / "defaults.toml.d/10-env.toml").write_text(
        "[env]\n" + "".join(f'K{i} = "default {i}"\n' for i in range(keys)))
    (etc / "big.toml").write_text(
        MODEL + "[env]\n" + "".join(f'K{i} = "model {i}"\n' for i in range(keys)))
    return etc


def test_twenty_thousand_env_keys_merge_in_well_under_a_second(tmp_path: Path) -> None:
    etc = write_tree(tmp_path, 20_000)
    # CPU time, not wall: other work on a busy machine does not add to it.
    started = time.process_time()
    loaded = load_all(dirs=[str(etc)])
    unit = render_checked(loaded.models[0])[0]
    elapsed = time.process_time() - started
    assert not loaded.errors
    assert loaded.models[0].env["K19999"] == "model 19999"
    # the keys, CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES and the five cache directories
    assert unit.text.count("\nEnvironment=") == 20_007
    # Linear is a fraction of a second; quadratic is over ten seconds.
    assert elapsed < 3.0, f"{elapsed:.2f} s for 20,000 keys"


def test_replaced_table_forgets_its_origins(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "defaults.toml.d").mkdir(parents=True)
    (etc / "defaults.toml.d/10.toml").write_text('[reap]\ntimeout = "5s"\n')
    (etc / "m.toml").write_text(MODEL)
    (etc / "m.toml.d").mkdir()
    (etc / "m.toml.d/50.toml").write_text('reap = "off"\n')
    merged = Loader([str(etc)]).load_model("m", str(etc / "m.toml"))
    assert merged.data["reap"] == "off"
    assert merged.file_of("reap.timeout") == str(etc / "m.toml.d/50.toml")
    assert "reap.timeout" not in merged.origin
