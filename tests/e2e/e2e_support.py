"""Model files and the fake GPU table for the end-to-end tests and bench/restart_bench.py."""

from __future__ import annotations

import json

FAKE_GPU_COUNT = 6
FAKE_TABLE = "/etc/infer-units/fakegpus.json"


def fake_gpu_table() -> str:
    return json.dumps({"gpus": [
        {"index": i, "uuid": f"GPU-e2e{i:05d}-0000-0000-0000-{i:012d}",
         "pci": f"0000:{0x41 + i:02x}:00.0", "device": f"/var/lib/fakegpu/nvidia{i}",
         "memory_mib": 143771} for i in range(FAKE_GPU_COUNT)]})


def model_toml(name: str, gpus: list[int], port: int, extra_args: list[str] | None = None,
               env: dict[str, str] | None = None, reap: str = "", ready_timeout: str = "60s",
               load: float = 1.0) -> str:
    argv = ["/usr/local/bin/fake-engine", "--port", str(port), "--load", str(load),
            *(extra_args or [])]
    lines = ['engine = "command"', f"command = {json.dumps(argv, ensure_ascii=False)}", f"gpus = {gpus}",
             f"port = {port}", "", "[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"']
    for k, v in (env or {}).items():
        lines.append(f"{k} = {json.dumps(v, ensure_ascii=False)}")
    lines += ["", "[reap]", 'term-grace = "1s"', 'timeout = "15s"', reap,
              "", "[ready]", f'timeout = "{ready_timeout}"', 'interval = "100ms"',
              "", "[service]", 'RestartSec = "1s"']
    return "\n".join(lines) + "\n"
