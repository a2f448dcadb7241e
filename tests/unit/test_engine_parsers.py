"""tools/check-engine-parsers.

The unit reading (tools/systemd_exec.py) is checked against the tests' own
reader on every golden unit, and on the $VAR rules systemd applies at exec
time; the P2P variants and the verdicts, on argvs and parses given here.  The
engines' real parsers need their venvs (pip, several GB):
tests/integration/test_engine_parsers_real.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ..unitfile import exec_argv, values as unit_values

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import engine_parsers  # noqa: E402
from systemd_exec import Exec, UnitError, expand_env, split_words  # noqa: E402

GOLDEN = sorted((ROOT / "tests" / "golden").glob("*/*.service"))


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_exec_reading_agrees_with_the_tests_reader(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for line in unit_values(text, "Service", "ExecStart"):
        e = Exec(line, path.name)
        if "$" in line.replace("$$", ""):
            continue    # the tests' reader does no exec-time expansion
        assert [e.executable] + e.argv({})[1:] == exec_argv(line)


def test_whole_word_variable_splits_or_vanishes() -> None:
    words = split_words('/py -m vllm $OFF "--x" ${A}b $$HOME "$${P}"')
    assert expand_env(words, {}) == ["/py", "-m", "vllm", "--x", "b", "$HOME", "${P}"]
    assert expand_env(words, {"OFF": " --disable-custom-all-reduce  --y ", "A": "a"}) == \
        ["/py", "-m", "vllm", "--disable-custom-all-reduce", "--y", "--x", "ab", "$HOME", "${P}"]


def test_escapes_and_specifiers() -> None:
    e = Exec(r'-/bin/x "a\x41\101\u00e9" \s 100%% %n', "m.service")
    assert e.argv({}) == ["/bin/x", "aAAé", " ", "100%", "m.service"]
    with pytest.raises(UnitError):
        Exec('/bin/x "open', "m.service")


UNIT = """[Service]
Environment="INFER_UNITS_P2P_OFF_ARGS="
EnvironmentFile=-/run/infer-units/m.env
ExecStartPre=+/usr/bin/infer-units pre-start --unit m.service --p2p \\
  --p2p-off-args=--disable-custom-all-reduce --p2p-off-env VLLM_ALLREDUCE_USE_SYMM_MEM=0
ExecStart=/v/bin/python -m vllm.entrypoints.cli.main serve /m --tensor-parallel-size 2 \\
  $INFER_UNITS_P2P_OFF_ARGS --max-model-len 8
"""


def test_p2p_variable_is_tried_both_ways() -> None:
    u = engine_parsers.Unit("render", "case", "m.service", UNIT)
    assert u.engine == "vllm"
    (on_label, on), (off_label, off) = u.variants({})
    assert u.exec is not None
    assert u.exec.argv(on)[-3:] == ["2", "--max-model-len", "8"]
    assert u.exec.argv(off)[-4:] == ["2", "--disable-custom-all-reduce", "--max-model-len", "8"]
    assert off["NCCL_P2P_DISABLE"] == "1" and off["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"
    assert "NCCL_P2P_DISABLE" not in on
    assert on_label == "INFER_UNITS_P2P_OFF_ARGS=''"


def test_p2p_off_with_custom_all_reduce_on_is_wrong() -> None:
    assert engine_parsers.meaning({"NCCL_P2P_DISABLE": "1"},
                                  {"tp": 2, "disable_custom_all_reduce": False})
    assert not engine_parsers.meaning({"NCCL_P2P_DISABLE": "1"},
                                      {"tp": 2, "disable_custom_all_reduce": True})
    assert not engine_parsers.meaning({"NCCL_P2P_DISABLE": "1"},
                                      {"tp": 1, "disable_custom_all_reduce": False})


def test_ranks_per_node_must_match_the_visible_gpus() -> None:
    four = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert not engine_parsers.meaning(four, {"tp": 8, "nnodes": 2})
    assert not engine_parsers.meaning(four, {"tp": 2, "pp": 2})
    assert "runs 8 GPU rank(s)" in str(engine_parsers.meaning(four, {"tp": 16, "nnodes": 2}))
    assert engine_parsers.meaning(four, {"tp": 2})
    assert not engine_parsers.meaning({}, {"tp": 2})    # PCI selectors: known only at start
