"""A process that holds GPU memory, optionally with spawned workers that
outlive it (torch.multiprocessing spawn, as SGLang and vLLM start TP workers),
or with a child forked after its context exists (fork): the child inherits
the context, and NVML goes on naming this process for it once it is gone.

    python3 cuda_holder.py GIB [spawn | fork]
"""

import os
import signal
import sys
import time

import torch
import torch.multiprocessing as mp


def worker(gib: float) -> None:
    y = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    y.fill_(1)
    torch.cuda.synchronize()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # like a TP worker stuck in a collective
    while True:
        time.sleep(60)


if __name__ == "__main__":
    gib = float(sys.argv[1])
    x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    x.fill_(7)
    torch.cuda.synchronize()
    if "spawn" in sys.argv[2:]:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=worker, args=(gib,)) for _ in range(2)]
        for p in procs:
            p.start()
        print("workers", " ".join(str(p.pid) for p in procs), flush=True)
    if "fork" in sys.argv[2:]:
        heir = os.fork()
        if heir == 0:
            while True:
                time.sleep(60)
        print("workers", heir, flush=True)
    print("ready", flush=True)
    while True:
        time.sleep(60)
