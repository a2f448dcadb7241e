"""GPU memory that no visible process accounts for.

NVML answers in the caller's PID namespace: inside a container (LXC, nspawn)
the processes of other namespaces are not listed, but their memory still shows
in the GPU's used memory (docs/architecture.md).  So "no process is listed"
is not "free": compare used memory with what the listed processes hold.

The baseline is what a GPU uses with no process at all.  NVML's memory info
v2 reports the driver's reservation apart from "used", so the baseline is 0
there.  With only v1, "used" includes the reservation and the baseline
defaults to V1_BASELINE_MIB, above the reservations seen (docs/performance.md
has them).  INFER_UNITS_GPU_BASELINE_MIB overrides it for every GPU (e.g.
through the model's [env]).  On top, SLACK_MIB per GPU and
PER_PROCESS_SLACK_MIB per listed process absorb NVML's own rounding per
process.
"""

from __future__ import annotations

import os

from .gpus import Backend, Gpu, GpuError, GpuUse

V1_BASELINE_MIB = 1024
SLACK_MIB = 64
PER_PROCESS_SLACK_MIB = 16
BASELINE_ENV = "INFER_UNITS_GPU_BASELINE_MIB"


def baseline_mib(reserved: int) -> int:
    """reserved >= 0: used memory already excludes the driver's reservation;
    -1: unknown (v1), so the default baseline applies."""
    text = os.environ.get(BASELINE_ENV)
    if text is not None:
        if not (text.isascii() and text.strip().isdigit()):
            raise GpuError(f"{BASELINE_ENV}={text!r}: expected a whole number of MiB")
        return int(text)
    return V1_BASELINE_MIB if reserved < 0 else 0


def unaccounted(backend: Backend, gpus: list[Gpu], uses: dict[int, GpuUse]) -> dict[int, int]:
    """GPU index -> MiB used beyond the baseline and what the listed processes
    hold; only GPUs above the slack.  A GPU with a listed process of unknown
    memory is not judged (NVML says "not available" under MIG, for example)."""
    out: dict[int, int] = {}
    for index, (used, reserved) in backend.memory(gpus).items():
        listed = [u for u in uses.values() if index in u.gpus]
        if any(index not in u.memory_mib for u in listed):
            continue
        extra = used - sum(u.memory_mib[index] for u in listed) - baseline_mib(reserved)
        if extra > SLACK_MIB + PER_PROCESS_SLACK_MIB * len(listed):
            out[index] = extra
    return out


def describe(extra: dict[int, int]) -> list[str]:
    return [f"GPU {index}: {mib} MiB used by no visible process (a process in another "
            "PID namespace or container?)" for index, mib in sorted(extra.items())]


def chosen(selector: str) -> tuple[Backend, list[Gpu]]:
    """The backend and the GPUs a --gpus selector names, for the hooks and the
    CLI alike; GpuError (a usage error) for a bad selector or a bad
    INFER_UNITS_GPU_BASELINE_MIB, before any work."""
    from .gpus import backend, select
    b = backend()
    gpus = select(b.gpus(), selector)
    baseline_mib(-1)
    return b, gpus
