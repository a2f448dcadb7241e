"""`[nccl] p2p = "auto"`: run the copy-and-compare self-test once per boot for a
set of GPUs, and turn NCCL's P2P off for the unit when it fails."""

from __future__ import annotations

import logging
import hashlib
import json
import os
import pwd
from dataclasses import dataclass

from ...generator.atomicfile import read_text, write_file
from ...generator.paths import run_dir
from ..facts.gpus import Gpu
from ..facts.procinfo import boot_id
from ..facts.untrusted import escaped, run_untrusted
from .envfile import update_env_file

log = logging.getLogger(__name__)


CACHE_DIR = os.environ.get("INFER_UNITS_P2P_CACHE") or os.path.join(run_dir(), "p2p")
SELFTEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "p2p_selftest.py")


@dataclass
class P2PVerdict:
    ok: bool
    cached: bool
    reason: str
    report: dict[str, object]
    # The self-test copied between the GPUs (now or earlier this boot); not
    # for one GPU, where there is nothing to test.
    tested: bool = True


def cache_path(gpus: list[Gpu], tester: str) -> str:
    """One verdict per set of GPUs *and* tester (the account and interpreter
    that ran the self-test): the verdict is that account's word, since it owns
    the venv that printed it, so it is never another model's answer."""
    key = ",".join(sorted(g.uuid or g.pci for g in gpus)) + "|" + tester
    return os.path.join(CACHE_DIR, hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def _tester(python: str, user: str | None) -> str:
    account = selftest_account(user)
    uid = os.geteuid() if account is None else account.pw_uid
    return f"{uid}:{os.path.realpath(python)}"


def _gpu_at(gpus: list[Gpu], position: object) -> str:
    """A pair's device as the self-test numbered it (its report is the
    tester's, so anything may stand there)."""
    if isinstance(position, int) and not isinstance(position, bool) and 0 <= position < len(gpus):
        return str(gpus[position].index)
    return "?"


# Who runs the model's `python` for the self-test.  The interpreter, its venv,
# site-packages and .pth files belong to the model's user (untrusted: see
# README "Trust model"), so root never executes it: the model's `user`, or
# nobody for a model without one (its server runs as root, but its venv may
# still be someone else's).  A root-owned venv is readable by them and works.
FALLBACK_USER = "nobody"


def selftest_account(user: str | None) -> pwd.struct_passwd | None:
    """The account to drop to, None when not root (then we run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        account = pwd.getpwnam(user or FALLBACK_USER)
    except KeyError:
        account = pwd.getpwnam(FALLBACK_USER)
    if account.pw_uid == 0:
        account = pwd.getpwnam(FALLBACK_USER)
    return account


def selftest_env(gpus: list[Gpu], server_env: dict[str, str],
                 account: pwd.struct_passwd | None) -> dict[str, str]:
    """A scrubbed environment: what the server gets from the model ([env]),
    a plain PATH and the GPUs under test; nothing of the hook's own."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    if account is not None:
        env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    if "INFER_UNITS_P2P_MIB" in os.environ:
        env["INFER_UNITS_P2P_MIB"] = os.environ["INFER_UNITS_P2P_MIB"]
    env.update(server_env)
    # The test covers exactly this unit's GPUs, in PCI order like the server sees them.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in gpus)
    return env


def _run_selftest(python: str, gpus: list[Gpu], timeout: float, user: str | None = None,
                  server_env: dict[str, str] | None = None) -> dict[str, object]:
    account = selftest_account(user)
    env = selftest_env(gpus, server_env or {}, account)
    groups = os.getgrouplist(account.pw_name, account.pw_gid) if account is not None else None
    try:
        # The model's python prints what it likes, as long as it likes: read
        # in bounded pieces, within the timeout (facts/untrusted.py).
        done = run_untrusted([python, SELFTEST], timeout, env, account, groups)
    except OSError as e:
        return {"ok": False, "error": f"cannot run {python}: {e.strerror}", "ran": False}
    if done.timed_out:
        # A hung peer copy is the classic broken-IOMMU symptom.
        return {"ok": False, "error": f"self-test hung for {timeout:g}s", "hung": True}
    lines = [line for line in done.stdout.split("\n") if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().split("\n") or ["no output"])[-1][-500:]
        return {"ok": False, "error": f"self-test exited {done.returncode}: {tail}", "ran": False}
    try:
        report = escaped(json.loads(lines[-1]))
    except ValueError as e:
        return {"ok": False, "error": f"self-test printed no report ({e})", "ran": False}
    if not isinstance(report, dict):
        return {"ok": False, "error": "self-test printed no report (not an object)", "ran": False}
    return report


# The unit's ExecStart expands this (unbraced $VAR: zero words when empty).
OFF_ARGS_VAR = "INFER_UNITS_P2P_OFF_ARGS"


def check_p2p(gpus: list[Gpu], env_file: str | None, python: str,
              timeout: float = 90.0, off_args: str = "",
              off_env: dict[str, str] | None = None, user: str | None = None,
              server_env: dict[str, str] | None = None,
              ok_env: dict[str, str] | None = None) -> P2PVerdict:
    if len(gpus) < 2:
        verdict = P2PVerdict(True, False, "one GPU: no peer traffic", {}, tested=False)
        _apply(verdict, env_file, off_args, off_env or {}, ok_env or {})
        return verdict
    path = cache_path(gpus, _tester(python, user))
    boot = boot_id()
    try:
        cached = json.loads(read_text(path) or "{}")
        if cached.get("boot_id") == boot:
            verdict = P2PVerdict(bool(cached["ok"]), True, str(cached["reason"]), cached["report"])
            _apply(verdict, env_file, off_args, off_env or {}, ok_env or {})
            return verdict
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    report = _run_selftest(python, gpus, timeout, user, server_env)
    if report.get("ok"):
        verdict = P2PVerdict(True, False, "every GPU pair copied and compared equal", report)
    elif report.get("ran") is False or "torch not importable" in str(report.get("error", "")):
        # Could not test: P2P off to be safe, and no cache so the next start tries again.
        verdict = P2PVerdict(False, False, f"self-test could not run ({report.get('error')}); "
                             "P2P disabled to be safe", report)
        _apply(verdict, env_file, off_args, off_env or {}, ok_env or {})
        return verdict
    else:
        pairs = report.get("pairs")
        bad = [p for p in (pairs if isinstance(pairs, list) else [])
               if isinstance(p, dict) and not p.get("ok")]
        # The self-test numbers devices as CUDA sees them: positions in `gpus`.
        detail = "; ".join(
            f"GPU {_gpu_at(gpus, p.get('src'))}->{_gpu_at(gpus, p.get('dst'))}: "
            + str(p.get("error") or f"{p.get('mismatched_words')} words differ")
            for p in bad) or str(report.get("error"))
        verdict = P2PVerdict(False, False, f"peer copy failed: {detail}", report)
    write_file(path, json.dumps({"boot_id": boot, "ok": verdict.ok, "reason": verdict.reason,
                                 "report": verdict.report, "gpus": [g.uuid for g in gpus]}),
               dir_mode=0o755)
    _apply(verdict, env_file, off_args, off_env or {}, ok_env or {})
    return verdict


def verdict_env(verdict: P2PVerdict, off_args: str, off_env: dict[str, str],
                ok_env: dict[str, str]) -> dict[str, str | None]:
    """What the verdict sets (None: removes) in the unit's env file.  P2P off
    is NCCL_P2P_DISABLE=1 plus what the engine needs for its own peer-access
    kernels (argv through $INFER_UNITS_P2P_OFF_ARGS, environment); P2P on
    removes all of it.  `ok_env` (vLLM's VLLM_SKIP_P2P_CHECK=1) only where
    the self-test copied between these GPUs and found P2P working; otherwise
    the engine's own check stays as the engine sets it."""
    off = {"NCCL_P2P_DISABLE": "1", **off_env}
    if off_args:
        off[OFF_ARGS_VAR] = off_args
    verified = verdict.ok and verdict.tested
    return {**{k: None if verdict.ok else v for k, v in off.items()},
            **{k: v if verified else None for k, v in ok_env.items()}}


def _apply(verdict: P2PVerdict, env_file: str | None, off_args: str,
           off_env: dict[str, str], ok_env: dict[str, str]) -> None:
    """The verdict into the unit's env file (verdict_env())."""
    env = verdict_env(verdict, off_args, off_env, ok_env)
    off = " ".join(f"{k}={v}" for k, v in env.items() if k not in ok_env)
    if env_file:
        update_env_file(env_file, env)
        state = "on" if verdict.ok else f"OFF ({off} in {env_file})"
    else:
        state = "on" if verdict.ok else f"broken (would set {off})"
    log.info(f"P2P {state}: {verdict.reason}"
             + (" [result cached this boot]" if verdict.cached else ""))
