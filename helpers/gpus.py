"""Which GPUs exist and which pids use each of them.

Three backends answer the same two questions:
  - NVML (nvidia-ml-py): per-GPU compute/graphics processes with host pids and
    memory.  The only exact answer: every CUDA process opens every /dev/nvidiaN,
    so device files say nothing about which GPU a process uses.
  - /proc (driver loaded, no NVML): GPUs from /proc/driver/nvidia/gpus; users
    are holders of /dev/nvidia* narrowed by their CUDA_VISIBLE_DEVICES (a hint).
  - fake (INFER_UNITS_FAKE_GPUS=gpus.json): a process uses fake GPU k exactly
    when it holds k's `device` file open.  For tests on machines without GPUs.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from ..generator.settings import is_pci, normalize_pci

NVIDIA_PROC = "/proc/driver/nvidia/gpus"


class GpuError(Exception):
    """No GPUs can be listed, or a selector names none."""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    pci: str
    device: str                    # /dev/nvidiaN (or the fake file)
    memory_total_mib: int | None
    memory_used_mib: int | None = None


@dataclass
class GpuUse:
    pid: int
    gpus: set[int] = field(default_factory=set)
    memory_mib: dict[int, int] = field(default_factory=dict)   # gpu index -> MiB


class Backend:
    name = "none"
    exact = True      # False where "which GPU" is only a hint

    def gpus(self) -> list[Gpu]:
        raise NotImplementedError

    def users(self, gpus: list[Gpu]) -> dict[int, GpuUse]:
        """pid -> the GPUs (among `gpus`) it uses."""
        raise NotImplementedError

    def device_files(self) -> list[str]:
        """Every device node whose holders keep the driver busy (for drain)."""
        raise NotImplementedError


# ------------------------------------------------------------------ fd scanning

def fd_holders(paths: set[str]) -> dict[int, set[str]]:
    """pid -> which of `paths` it holds open.  Scans every process (like fuser):
    only for the fake backend, the /proc fallback and drain."""
    held: dict[int, set[str]] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target in paths:
                held.setdefault(pid, set()).add(target)
    return held


# ------------------------------------------------------------------ fake backend

class FakeBackend(Backend):
    name = "fake"

    def __init__(self, path: str) -> None:
        try:
            with open(path, encoding="utf-8") as f:
                table = json.load(f)
            self._gpus = [Gpu(index=int(g["index"]), uuid=str(g["uuid"]),
                              pci=normalize_pci(str(g["pci"])), device=str(g["device"]),
                              memory_total_mib=int(g.get("memory_mib", 0)) or None)
                          for g in table["gpus"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise GpuError(f"INFER_UNITS_FAKE_GPUS={path}: {e}") from None

    def gpus(self) -> list[Gpu]:
        return list(self._gpus)

    def users(self, gpus: list[Gpu]) -> dict[int, GpuUse]:
        by_device = {g.device: g.index for g in gpus}
        uses: dict[int, GpuUse] = {}
        for pid, files in fd_holders(set(by_device)).items():
            uses[pid] = GpuUse(pid, {by_device[f] for f in files})
        return uses

    def device_files(self) -> list[str]:
        return [g.device for g in self._gpus]


# ------------------------------------------------------------------ NVML backend

def _load_pynvml():  # type: ignore[no-untyped-def]
    try:
        import pynvml  # Debian-less hosts: pip's nvidia-ml-py
        return pynvml
    except ImportError:
        pass
    try:
        from .._vendor import pynvml  # type: ignore[attr-defined]  # bundled by the .deb
        return pynvml
    except ImportError:
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlBackend(Backend):
    name = "nvml"

    def __init__(self, nvml) -> None:  # type: ignore[no-untyped-def]
        self.nvml = nvml
        nvml.nvmlInit()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i)
                         for i in range(nvml.nvmlDeviceGetCount())]

    def gpus(self) -> list[Gpu]:
        nvml = self.nvml
        out = []
        for index, h in enumerate(self._handles):
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            try:
                minor = nvml.nvmlDeviceGetMinorNumber(h)
            except nvml.NVMLError:
                minor = index
            out.append(Gpu(index=index, uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                           pci=normalize_pci(_text(nvml.nvmlDeviceGetPciInfo(h).busId)),
                           device=f"/dev/nvidia{minor}",
                           memory_total_mib=mem.total // (1 << 20),
                           memory_used_mib=mem.used // (1 << 20)))
        return out

    def users(self, gpus: list[Gpu]) -> dict[int, GpuUse]:
        nvml = self.nvml
        uses: dict[int, GpuUse] = {}
        for g in gpus:
            h = self._handles[g.index]
            procs = []
            for query in (nvml.nvmlDeviceGetComputeRunningProcesses,
                          nvml.nvmlDeviceGetGraphicsRunningProcesses):
                try:
                    procs += query(h)
                except nvml.NVMLError:
                    pass
            for p in procs:
                use = uses.setdefault(p.pid, GpuUse(p.pid))
                use.gpus.add(g.index)
                used = p.usedGpuMemory
                if isinstance(used, int) and used < (1 << 62):
                    use.memory_mib[g.index] = used // (1 << 20)
        return uses

    def memory_used_mib(self, index: int) -> int:
        return self.nvml.nvmlDeviceGetMemoryInfo(self._handles[index]).used // (1 << 20)

    def device_files(self) -> list[str]:
        return _nvidia_device_files()


# ------------------------------------------------------------------ /proc backend

def _nvidia_device_files(dev: str = "/dev") -> list[str]:
    try:
        names = os.listdir(dev)
    except OSError:
        return []
    out = [f"{dev}/{n}" for n in sorted(names) if n.startswith("nvidia")]
    caps = f"{dev}/nvidia-caps"
    if os.path.isdir(caps):
        out += [f"{caps}/{n}" for n in sorted(os.listdir(caps))]
    return [p for p in out if not os.path.isdir(p)]


def _parse_information(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _visible_devices(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"CUDA_VISIBLE_DEVICES="):
                    return item.split(b"=", 1)[1].decode(errors="replace")
    except OSError:
        pass
    return None


class ProcBackend(Backend):
    name = "proc"
    exact = False

    def __init__(self, proc_dir: str = NVIDIA_PROC, dev_dir: str = "/dev") -> None:
        # Other roots only for tests (real files in a temporary directory).
        self.proc_dir = proc_dir
        self.dev_dir = dev_dir

    def gpus(self) -> list[Gpu]:
        out = []
        for index, pci in enumerate(sorted(os.listdir(self.proc_dir))):
            try:
                with open(f"{self.proc_dir}/{pci}/information", encoding="utf-8") as f:
                    info = _parse_information(f.read())
            except OSError:
                continue
            minor = info.get("Device Minor", str(index))
            out.append(Gpu(index=index, uuid=info.get("GPU UUID", ""), pci=normalize_pci(pci),
                           device=f"{self.dev_dir}/nvidia{minor}", memory_total_mib=None))
        return out

    def users(self, gpus: list[Gpu]) -> dict[int, GpuUse]:
        every = self.gpus()
        uses: dict[int, GpuUse] = {}
        wanted = {g.index for g in gpus}
        for pid, _files in fd_holders({g.device for g in every}).items():
            visible = _visible_devices(pid)
            on = {g.index for g in every} if visible is None else \
                {g.index for g in select(every, visible, strict=False)}
            on &= wanted
            if on:
                uses[pid] = GpuUse(pid, on)
        return uses

    def device_files(self) -> list[str]:
        return _nvidia_device_files(self.dev_dir)


# ------------------------------------------------------------------ selection

_backend: Backend | None = None


def backend() -> Backend:
    global _backend
    if _backend is None:
        fake = os.environ.get("INFER_UNITS_FAKE_GPUS")
        if fake:
            _backend = FakeBackend(fake)
        else:
            nvml = _load_pynvml()
            if nvml is not None:
                try:
                    _backend = NvmlBackend(nvml)
                except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                    print(f"infer-units: NVML unavailable ({e}); using /proc", file=sys.stderr)
            if _backend is None:
                if not os.path.isdir(NVIDIA_PROC):
                    raise GpuError("no NVIDIA driver: neither NVML nor /proc/driver/nvidia")
                _backend = ProcBackend()
    return _backend


def select(gpus: list[Gpu], selector: str, strict: bool = True) -> list[Gpu]:
    """GPUs named by "0,1", "GPU-…", "0000:41:00.0" or "all" (comma-separated)."""
    selector = selector.strip()
    if selector in ("all", ""):
        return list(gpus)
    chosen: list[Gpu] = []
    for item in (s.strip() for s in selector.split(",")):
        if not item:
            continue
        match: list[Gpu]
        if item.isdigit():
            match = [g for g in gpus if g.index == int(item)]
        elif is_pci(item):
            match = [g for g in gpus if g.pci == normalize_pci(item)]
        else:
            match = [g for g in gpus if g.uuid.lower() == item.lower()
                     or (len(item) > 8 and g.uuid.lower().startswith(item.lower()))]
        if not match:
            if strict:
                known = ", ".join(f"{g.index} ({g.uuid}, {g.pci})" for g in gpus) or "none"
                raise GpuError(f"GPU {item!r} not found; GPUs here: {known}")
            continue
        for g in match:
            if g not in chosen:
                chosen.append(g)
    return chosen
