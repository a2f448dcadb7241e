"""Host facts, read and never changed: GPUs (NVML, /proc, the fake table), their
memory, processes, ports, systemd (the one pystemd wrapper)."""
