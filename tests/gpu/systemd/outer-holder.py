"""Scenario 7's outsider: a CUDA process on the GPU machine itself, outside the
booted container's PID namespace, holding GIB on GPU 0 (CUDA_VISIBLE_DEVICES)
until RELEASE exists (or 300 s).  Writes READY (JSON: pid, GiB) once it holds
the memory.  With IU_FAKE_GPUS=1 (the local run) it holds FAKE_DEVICE open.

    outer-holder.py GIB READY RELEASE [FAKE_DEVICE]
"""

import json
import os
import sys
import time

gib, ready, release = float(sys.argv[1]), sys.argv[2], sys.argv[3]
if os.environ.get("IU_FAKE_GPUS") == "1":
    hold = open(sys.argv[4], "rb")
else:
    import torch
    hold = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    hold.fill_(3)
    torch.cuda.synchronize()
with open(ready + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "gib": gib,
               "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)
os.replace(ready + ".tmp", ready)
print(f"outer holder pid {os.getpid()} holds {gib} GiB", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.05)
print("outer holder exits", flush=True)
