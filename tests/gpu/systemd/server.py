"""A tensor-parallel CUDA "server" shaped like SGLang's and vLLM's: the main
process holds no GPU memory and spawns one worker per visible GPU
(torch.multiprocessing, spawn), each worker takes --gib of GPU memory and
ignores SIGTERM (a rank stuck in a collective).  When every worker holds its
memory, the main process answers GET /health with the workers' pids.  SIGTERM
makes the main process exit at once, leaving its workers behind, as a server
whose ranks hang does: the unit's KillMode=mixed and ExecStopPost must clean up.

    server.py --port P [--host H] [--gib G] [--tp N] [--tp-size N] [...]

Runs under the GPU machine's torch (through host-python).  Without CUDA
(IU_FAKE_GPUS=1, the local run) a worker holds its fake GPU's device file
open instead, which is how the fake backend sees a GPU user.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import threading
import time

FAKE = os.environ.get("IU_FAKE_GPUS") == "1"


def worker(rank: int, gib: float, ready, device_index: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hold = None
    if FAKE:
        hold = open(f"/var/lib/fakegpu/nvidia{device_index}", "rb")
    else:
        import torch
        torch.cuda.set_device(rank)
        hold = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
        hold.fill_(rank + 1)
        torch.cuda.synchronize()
    ready.put((rank, os.getpid()))
    while hold is not None:
        time.sleep(3600)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--gib", type=float, default=20.0)
    p.add_argument("--tp", "--tp-size", type=int, default=0)
    p.add_argument("--model-path", default="")
    a, extra = p.parse_known_args()
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    tp = a.tp or max(1, len(visible))
    if FAKE:
        import multiprocessing as mp
    else:
        import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    started = time.monotonic()
    procs = [ctx.Process(target=worker, args=(r, a.gib, ready, visible[r] if r < len(visible) else str(r)),
                         daemon=False) for r in range(tp)]
    for proc in procs:
        proc.start()
    ranks = dict(ready.get(timeout=600) for _ in procs)
    info = {"main": os.getpid(), "workers": [ranks[r] for r in range(tp)], "gib": a.gib,
            "tp": tp, "load_s": round(time.monotonic() - started, 3), "extra_args": extra,
            "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NCCL_P2P_DISABLE",
                                                    "CUDA_DEVICE_ORDER")}}
    print("ready " + json.dumps(info), flush=True)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(info).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((a.host, a.port), Health)

    def on_term(signum: int, frame: object) -> None:
        # Exit now; the TERM-ignoring workers stay behind.
        print("SIGTERM: main exits, workers left", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
