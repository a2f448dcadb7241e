"""What the P2P self-test's verdict writes into the unit's env file
(helpers/act/p2p.py verdict_env): the engine's own P2P check is skipped
only where the self-test copied between the model's GPUs and found them
working."""

from __future__ import annotations

from infer_units.helpers.act.p2p import P2PVerdict, verdict_env

OFF_ENV = {"VLLM_ALLREDUCE_USE_FLASHINFER": "0"}
OK_ENV = {"VLLM_SKIP_P2P_CHECK": "1"}
OFF_ARGS = "--disable-custom-all-reduce"


def _env(verdict: P2PVerdict) -> dict[str, str | None]:
    return verdict_env(verdict, OFF_ARGS, OFF_ENV, OK_ENV)


def test_a_verified_pass_skips_the_engines_own_check() -> None:
    env = _env(P2PVerdict(True, False, "every GPU pair copied and compared equal", {}))
    assert env == {"NCCL_P2P_DISABLE": None, "VLLM_ALLREDUCE_USE_FLASHINFER": None,
                   "INFER_UNITS_P2P_OFF_ARGS": None, "VLLM_SKIP_P2P_CHECK": "1"}


def test_a_pass_cached_this_boot_is_still_a_verified_one() -> None:
    assert _env(P2PVerdict(True, True, "cached", {}))["VLLM_SKIP_P2P_CHECK"] == "1"


def test_a_failed_test_leaves_the_engines_check_alone() -> None:
    env = _env(P2PVerdict(False, False, "peer copy failed", {}))
    assert env["VLLM_SKIP_P2P_CHECK"] is None       # removed: a past pass no longer counts
    assert env["NCCL_P2P_DISABLE"] == "1" and env["INFER_UNITS_P2P_OFF_ARGS"] == OFF_ARGS


def test_a_test_that_could_not_run_verifies_nothing() -> None:
    env = _env(P2PVerdict(False, False, "self-test could not run", {"ran": False}))
    assert env["VLLM_SKIP_P2P_CHECK"] is None and env["NCCL_P2P_DISABLE"] == "1"


def test_one_gpu_is_not_a_verified_pass() -> None:
    env = _env(P2PVerdict(True, False, "one GPU: no peer traffic", {}, tested=False))
    assert env["VLLM_SKIP_P2P_CHECK"] is None and env["NCCL_P2P_DISABLE"] is None


def test_an_engine_without_its_own_check_gets_nothing_more() -> None:
    env = verdict_env(P2PVerdict(True, False, "ok", {}), "", {}, {})
    assert env == {"NCCL_P2P_DISABLE": None}
