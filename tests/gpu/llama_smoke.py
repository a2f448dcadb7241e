"""The GPU machine's llama-server build, bare, before the harness runs it under
systemd (tests/gpu/run-on-device llama-build):

    python3 tests/gpu/llama_smoke.py DIR        (DIR: tools/engines/build-llama-cuda's)

Starts DIR/bin/llama-server on GPU 0 with every layer offloaded and DIR's
context, and prints: the time to the first 200 on /health, the GPU memory it
holds (NVML), one completion, and after SIGTERM the time to its exit and to
the memory back.  Exits non-zero when any of it did not happen.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from infer_units.helpers.facts import gpus as gpus_mod

PORT = 18999


def status() -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def main(build: str) -> int:
    b = gpus_mod.backend()
    gpus = [g for g in b.gpus() if g.index == 0]

    def used() -> int:
        return b.memory(gpus)[0][0]

    with open(os.path.join(build, "CONTEXT")) as f:
        context = f.read().strip()
    idle = used()
    argv = [os.path.join(build, "bin/llama-server"), "--model", os.path.join(build, "model.gguf"),
            "--host", "127.0.0.1", "--port", str(PORT), "-ngl", "99", "-c", context, "--parallel", "1"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    log = open(os.path.join(build, "smoke-server.log"), "w")
    t0 = time.monotonic()
    server = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        while status() != 200:
            if server.poll() is not None or time.monotonic() - t0 > 30:
                print(f"llama-server: no 200 on /health (exit {server.poll()}); its log's end:")
                with open(os.path.join(build, "smoke-server.log")) as f:
                    print("".join(f.readlines()[-30:]))
                return 1
            time.sleep(0.01)
        ready = time.monotonic() - t0
        held = used() - idle
        body = json.dumps({"prompt": "Hello", "max_tokens": 4}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            completion = json.load(r)
        t1 = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        exited = time.monotonic() - t1
        while used() > idle + 256 and time.monotonic() - t1 < 10:
            time.sleep(0.002)
        back = time.monotonic() - t1
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    print(f"llama-server -ngl 99 -c {context}: /health 200 after {ready * 1000:.0f} ms, holds "
          f"{held} MiB on GPU 0 (idle {idle} MiB); completion: "
          f"{completion.get('choices', [{}])[0].get('text', '')!r} "
          f"({completion.get('usage', {}).get('completion_tokens')} tokens); SIGTERM: exit after "
          f"{exited * 1000:.0f} ms, memory back after {back * 1000:.0f} ms")
    return 0 if held >= 1024 and used() <= idle + 256 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
