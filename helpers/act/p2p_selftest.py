"""Peer-to-peer copy self-test, run with the engine's own interpreter (it has torch).

Standalone on purpose: the engine's environment does not have infer_units.
For every ordered pair of visible GPUs it copies a random buffer from one to
the other (torch uses cudaMemcpyPeer, direct DMA when peer access is on),
copies it back through the host and compares.  can_device_access_peer alone
is not enough: under IOMMU translation it says yes and the data arrives
corrupted (vllm #51513).  Prints one JSON object on stdout.
"""

from __future__ import annotations

import itertools
import json
import sys
import time

import os

BUFFER_MIB = int(os.environ.get("INFER_UNITS_P2P_MIB", "64"))


def main() -> int:
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"ok": False, "error": f"torch not importable: {e}", "pairs": []}))
        return 0
    count = torch.cuda.device_count()
    pairs = []
    elements = BUFFER_MIB * (1 << 20) // 4
    generator = torch.Generator().manual_seed(1234)
    reference = torch.randint(-(2 ** 31), 2 ** 31 - 1, (elements,), dtype=torch.int32,
                              generator=generator)
    for src, dst in itertools.permutations(range(count), 2):
        entry: dict[str, object] = {"src": src, "dst": dst,
                 "can_access_peer": bool(torch.cuda.can_device_access_peer(src, dst))}
        try:
            on_src = reference.to(f"cuda:{src}")
            start = time.perf_counter()
            on_dst = on_src.to(f"cuda:{dst}")
            torch.cuda.synchronize(dst)
            seconds = time.perf_counter() - start
            back = on_dst.cpu()
            mismatched = int((back != reference).sum().item())
            entry.update(ok=mismatched == 0, mismatched_words=mismatched,
                         gb_per_s=round(BUFFER_MIB / 1024 / seconds, 2) if seconds > 0 else None)
        except Exception as e:  # a CUDA error here is itself the finding
            entry.update(ok=False, error=f"{type(e).__name__}: {e}")
        pairs.append(entry)
    print(json.dumps({"ok": all(p["ok"] for p in pairs), "devices": count, "pairs": pairs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
