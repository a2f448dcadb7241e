"""Which GPUs exist and which pids use each of them.

Three backends answer the same two questions:
  - NVML (nvidia-ml-py): per-GPU compute/graphics processes with host pids and
    memory.  The only exact answer: every CUDA process opens every /dev/nvidiaN,
    so device files say nothing about which GPU a process uses.
  - /proc (driver loaded, no NVML): GPUs from /proc/driver/nvidia/gpus; a
    holder of /dev/nvidiaN is a user of GPU N.  Never narrowed by the
    process's own CUDA_VISIBLE_DEVICES: a process sets its environment
    itself, and one that names GPU 1 there may use GPU 0 all the same
    (docs/trust.md).  So every CUDA process counts on every GPU; another
    model's processes are narrowed by root's record of its GPUs (its start
    claims, decide/attribution.py).
  - fake (INFER_UNITS_FAKE_GPUS=gpus.json): a process uses fake GPU k exactly
    when it holds k's `device` file open.  For tests on machines without GPUs.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from typing import Any

from ...generator.settings import is_pci, normalize_pci
from .health import GpuFacts

log = logging.getLogger(__name__)

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
    # users() is one NVML call, not a scan of every process's fds: cheap
    # enough to ask every few ms while killed processes let go of their memory.
    cheap_users = False
    # Processes the last users() call could not look into (other users' fds
    # when not root): a holder may hide among them.
    unseen: int = 0

    def gpus(self) -> list[Gpu]:
        raise NotImplementedError

    def users(self, gpus: list[Gpu]) -> dict[int, GpuUse]:
        """pid -> the GPUs (among `gpus`) it uses."""
        raise NotImplementedError

    def memory(self, gpus: list[Gpu]) -> dict[int, tuple[int, int]]:
        """GPU index -> (used MiB, MiB used with no process at all: the driver's
        reservation), now; {} where the backend cannot say."""
        return {}

    def device_files(self) -> list[str]:
        """Every device node whose holders keep the driver busy (for drain)."""
        raise NotImplementedError

    def health_facts(self, gpu: Gpu) -> GpuFacts:
        """The GPU's health facts (healthfacts.py); unknown where not read."""
        from .health import HEALTHY, GpuFacts
        why = f"the {self.name} backend reads no health (no NVML)"
        return GpuFacts({k: None for k in HEALTHY}, {k: why for k in HEALTHY})

    def driver_facts(self) -> dict[str, object]:
        """Driver version and the CUDA version it supports (None: unknown)."""
        return {"version": None, "cuda": None, "why": f"the {self.name} backend has no NVML"}


# ------------------------------------------------------------------ fd scanning

def unseen_message(count: int) -> str:
    """Why some processes' fds could not be read, and what to do."""
    if os.geteuid() != 0:
        return f"cannot see processes of other users ({count}): run as root"
    return (f"cannot look into {count} process(es) (no CAP_SYS_PTRACE in this container?): "
            "a GPU user among them would be missed")


def _fd_targets(fd_dir: str) -> list[str]:
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return []
    out = []
    for fd in fds:
        try:
            out.append(os.readlink(f"{fd_dir}/{fd}"))
        except OSError:
            continue
    return out


def _task_fd_targets(pid: int) -> list[str]:
    """The fds of a process whose leader thread exited (a zombie leader): its
    /proc/PID/fd is empty, but a live thread's /proc/PID/task/TID/fd shows the
    table the threads still share."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        if tid != str(pid):
            targets = _fd_targets(f"/proc/{pid}/task/{tid}/fd")
            if targets:
                return targets
    return []


def _file_id(path: str) -> tuple[int, ...] | None:
    """What makes two paths one device node (or one plain file: the fakes)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (0, st.st_rdev) if stat.S_ISCHR(st.st_mode) else (1, st.st_dev, st.st_ino)


class FdScan:
    """pid -> which of `paths` it holds open.  Scans every process (like
    fuser): only for the fake backend, the /proc fallback and drain.
    `unseen` counts the processes whose fds could not be read (other users'
    when not root): they may hold a device too.

    A node opened through another path to it shows as that path: a server
    chrooted into a root with /dev bound in holds "/host/dev/nvidia0" as seen
    from here (a drain once missed such a server).  A
    target that ends with one of `paths` is that path when it is the same
    device (or file)."""

    def __init__(self, paths: set[str]) -> None:
        self.held: dict[int, set[str]] = {}
        self.unseen = 0
        ids: dict[str, tuple[int, ...] | None] = {}
        suffixes = tuple(paths)
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
            except PermissionError:
                self.unseen += 1
                continue
            except OSError:          # gone meanwhile
                continue
            if fds:
                targets = _fd_targets(fd_dir)
            else:
                # Empty: a kernel thread, or a process whose leader exited
                # while other threads keep the devices open.
                targets = _task_fd_targets(pid)
            for target in targets:
                if target in paths:
                    self.held.setdefault(pid, set()).add(target)
                elif target.endswith(suffixes):
                    for path in paths:
                        # absolute: the match starts at a path component
                        if path.startswith("/") and target.endswith(path):
                            if path not in ids:
                                ids[path] = _file_id(path)
                            if ids[path] is not None and _file_id(target) == ids[path]:
                                self.held.setdefault(pid, set()).add(path)


def fd_holders(paths: set[str]) -> dict[int, set[str]]:
    return FdScan(paths).held


def maps_file(pid: int, path: str) -> bool:
    """Whether process `pid` has `path` mapped into its memory.  A CUDA
    process maps its GPU's device file; a monitor that only asks NVML holds
    the file open and maps nothing (docs/trust.md).  /proc/PID/maps is the
    kernel's text: a "\n" in a file name is escaped there, so a line is one
    mapping, and its name field must be the whole path (or, for a node seen
    through another root, a path ending in it that is the same node)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return False
    for line in raw.split("\n"):
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        name = fields[5]
        if name == path or (path.startswith("/") and name.endswith(path)
                            and _file_id(name) == _file_id(path)):
            return True
    return False


def context_heirs(devices: dict[str, int], listed: set[int]) -> dict[int, GpuUse]:
    """Who holds a GPU context whose creator is gone: a child forked after
    cuInit inherits the context (the device file's descriptors and
    mappings), and when the creator dies NVML goes on naming the dead pid
    while the child keeps the memory.  The live processes that hold and map
    one of `devices` (device file -> GPU index) and that NVML lists on no GPU
    (`listed`): a process with a context of its own elsewhere is listed
    there, and a monitor maps no device file."""
    heirs: dict[int, GpuUse] = {}
    for pid, files in fd_holders(set(devices)).items():
        if pid in listed:
            continue
        on = {devices[f] for f in files if maps_file(pid, f)}
        if on:
            heirs[pid] = GpuUse(pid, on)
    return heirs


# ------------------------------------------------------------------ fake backend

class FakeBackend(Backend):
    """Optional keys per GPU, for the memory checks (NVML's figures):
      "memory_used_mib"     the GPU's used memory, as nvmlDeviceGetMemoryInfo_v2
                            reports it (reservation excluded)
      "process_memory_mib"  what each holder of `device` uses on it (default 0)
      "reserved_mib"        the driver's reservation (default 0)
      "health"              the health object of docs/architecture.md (absent: healthy; a key
                            set to null: not supported, so unknown)
      "driver"              {"version": "580.159.04", "cuda": 13000} (default:
                            unknown), what nvmlSystemGetCudaDriverVersion_v2 says
      "listed_pids"         the pids NVML lists on this GPU, in place of the holders of
                            `device`: NVML names a context by the process that created it,
                            also once that process is gone and a child it forked after
                            cuInit holds the context (measured on an H100)
    The table is re-read when its file changes, so a test can change
    memory_used_mib while a command runs (write a new file and rename it)."""

    name = "fake"

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._load()

    def _load(self) -> None:
        path = self.path
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_ino)
            if stamp == self._stamp:
                return
            import json
            with open(path, encoding="utf-8") as f:
                table = json.loads(f.read())
            from .health import parse_fake_health
            gpus, extra, health = [], {}, {}
            listed: dict[int, list[int]] = {}
            driver = table.get("driver")
            if driver is not None and (not isinstance(driver, dict) or set(driver) - {"version", "cuda"}
                                       or not isinstance(driver.get("version", ""), str)):
                raise ValueError('driver: expected {"version": "...", "cuda": 12080}')
            if driver is not None and "cuda" in driver:
                _whole(driver["cuda"])
            for g in table["gpus"]:
                gpu = Gpu(index=_whole(g["index"]), uuid=str(g["uuid"]),
                          pci=normalize_pci(str(g["pci"])), device=str(g["device"]),
                          memory_total_mib=_whole(g.get("memory_mib", 0)) or None,
                          memory_used_mib=_optional(g.get("memory_used_mib")))
                gpus.append(gpu)
                extra[gpu.index] = (_whole(g.get("process_memory_mib", 0)),
                                    _whole(g.get("reserved_mib", 0)))
                if g.get("listed_pids") is not None:
                    listed[gpu.index] = [_whole(pid) for pid in g["listed_pids"]]
                try:
                    health[gpu.index] = parse_fake_health(g.get("health"))
                except ValueError as e:
                    raise ValueError(f"GPU {gpu.index}: {e}") from None
            if len({g.index for g in gpus}) != len(gpus):
                raise ValueError("two GPUs with one index")
        except Exception as e:   # any shape of bad file is one line, not a traceback
            raise GpuError(f"INFER_UNITS_FAKE_GPUS={path}: {type(e).__name__}: {e}") from None
        self._gpus, self._extra, self._stamp = gpus, extra, stamp
        self._listed = listed
        self._health, self._driver = health, driver or {}

    def gpus(self) -> list[Gpu]:
        self._load()
        return list(self._gpus)

    def users(self, gpus: list[Gpu]) -> dict[int, GpuUse]:
        self._load()
        by_device = {g.device: g.index for g in gpus}
        scan = FdScan(set(by_device))
        self.unseen = scan.unseen
        uses: dict[int, GpuUse] = {}
        for pid, files in scan.held.items():
            on = {by_device[f] for f in files} - set(self._listed)
            if on:
                uses[pid] = GpuUse(pid, on, {k: self._extra.get(k, (0, 0))[0] for k in on})
        for g in gpus:
            for pid in self._listed.get(g.index, ()):
                use = uses.setdefault(pid, GpuUse(pid))
                use.gpus.add(g.index)
                use.memory_mib[g.index] = self._extra[g.index][0]
        return uses

    def memory(self, gpus: list[Gpu]) -> dict[int, tuple[int, int]]:
        self._load()
        now = {g.index: g for g in self._gpus}
        used = {g.index: now[g.index].memory_used_mib for g in gpus if g.index in now}
        return {i: (mib, self._extra[i][1]) for i, mib in used.items() if mib is not None}

    def device_files(self) -> list[str]:
        return [g.device for g in self._gpus]

    def health_facts(self, gpu: Gpu) -> GpuFacts:
        from .health import fake_facts
        self._load()
        return fake_facts(self._health[gpu.index])

    def driver_facts(self) -> dict[str, object]:
        self._load()
        cuda = self._driver.get("cuda")
        return {"version": self._driver.get("version"), "cuda": cuda,
                "why": "" if cuda is not None else "the fake table has no driver.cuda"}


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {value!r}")
    number = int(value)
    if not 0 <= number < 1 << 40:
        raise ValueError(f"{value!r} out of range")
    return number


def _optional(value: object) -> int | None:
    return None if value is None else _whole(value)


# ------------------------------------------------------------------ NVML backend

def _load_pynvml() -> Any:
    """nvidia-ml-py's pynvml: the copy the .deb bundles first (its version is
    the one tested), else one installed beside us; None without either, and
    the /proc backend answers.  Imported here, not at the top, so a command
    that never asks NVML (the fake backend, a usage error) does not load it."""
    try:
        from ..._vendor import pynvml as vendored  # type: ignore[attr-defined,unused-ignore]
        return vendored
    except ImportError:
        pass
    try:
        import pynvml
        return pynvml
    except ImportError:
        return None


def _nvml_init() -> tuple[Any, list[Any]] | None:
    """The module and every GPU's handle; None without nvidia-ml-py.  Raises
    what nvmlInit raises (no library, no driver)."""
    nvml = _load_pynvml()
    if nvml is None:
        return None
    nvml.nvmlInit()
    return nvml, [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlBackend(Backend):
    name = "nvml"
    cheap_users = True

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml = nvml
        self._handles = handles

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
        """v1 used memory of one GPU (the reap bench watches it)."""
        used: int = self.nvml.nvmlDeviceGetMemoryInfo(self._handles[index]).used
        return used // (1 << 20)

    def memory(self, gpus: list[Gpu]) -> dict[int, tuple[int, int]]:
        """Version 2 separates the driver's reservation from "used" (v1
        counts it as used with no process at all); without it, v1's used and
        a configured baseline (gpumemory.py)."""
        nvml = self.nvml
        out: dict[int, tuple[int, int]] = {}
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        for g in gpus:
            h = self._handles[g.index]
            try:
                if v2 is not None:
                    mem = nvml.nvmlDeviceGetMemoryInfo(h, version=v2)
                    out[g.index] = (mem.used // (1 << 20), 0)
                    continue
            except (nvml.NVMLError, TypeError, AttributeError):
                pass
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                out[g.index] = (mem.used // (1 << 20), -1)     # -1: reservation unknown
            except nvml.NVMLError:
                continue
        return out

    def device_files(self) -> list[str]:
        return _nvidia_device_files()

    def health_facts(self, gpu: Gpu) -> GpuFacts:
        from .health import nvml_facts
        return nvml_facts(self.nvml, self._handles[gpu.index])

    def driver_facts(self) -> dict[str, object]:
        from .health import nvml_cuda_driver, nvml_driver_version
        cuda, why = nvml_cuda_driver(self.nvml)
        return {"version": nvml_driver_version(self.nvml), "cuda": cuda, "why": why}


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
        by_device = {g.device: g.index for g in gpus}
        scan = FdScan(set(by_device))
        self.unseen = scan.unseen
        return {pid: GpuUse(pid, {by_device[f] for f in files}) for pid, files in scan.held.items()}

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
            why = ""
            try:
                started = _nvml_init()
                if started is not None:
                    _backend = NvmlBackend(*started)
            except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                why = f" ({e})"
            if _backend is None:
                # A host without NVIDIA (a build host) hears of NVML only where
                # GPUs are asked about, in this error; not on every command.
                if not os.path.isdir(NVIDIA_PROC):
                    raise GpuError(f"no NVIDIA driver: neither NVML{why} nor /proc/driver/nvidia")
                if why:
                    # A driver without NVML: the answers are /proc's, and say so.
                    log.info(f"NVML unavailable{why}; using /proc")
                _backend = ProcBackend()
    return _backend


def _ascii_digits(text: str) -> bool:
    # str.isdigit() also takes "١" and "²": an index is ASCII digits only.
    return text.isascii() and text.isdigit()


def select(gpus: list[Gpu], selector: str, strict: bool = True) -> list[Gpu]:
    """GPUs named by "0,1", "GPU-…" (or a unique prefix of 9+ characters),
    "0000:41:00.0" or "all" (comma-separated).

    strict (what a user typed): an empty or blank selector, an empty item, an
    unknown or ambiguous name is a GpuError (usage error, exit 1): an unset
    shell variable must never mean every GPU.  Only "all" means all.
    Not strict (a process's CUDA_VISIBLE_DEVICES, a hint): what does not
    match is skipped, and empty means none, as CUDA reads it."""
    text = selector.strip()
    if text == "all":
        return list(gpus)
    if not text:
        if strict:
            raise GpuError(f"empty GPU selector {selector!r}: name GPUs (\"0,1\") or \"all\"")
        return []
    chosen: list[Gpu] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            if strict:
                raise GpuError(f"empty item in GPU selector {selector!r}")
            continue
        match: list[Gpu]
        if item == "all":
            if strict:
                raise GpuError(f'"all" cannot be combined with other GPUs: {selector!r}')
            continue
        if _ascii_digits(item):
            match = [g for g in gpus if g.index == int(item)]
        elif is_pci(item) and item.isascii():
            match = [g for g in gpus if g.pci == normalize_pci(item)]
        else:
            low = item.lower()
            match = [g for g in gpus if g.uuid.lower() == low]
            if not match and len(item) > 8:
                match = [g for g in gpus if g.uuid.lower().startswith(low)]
                if len(match) > 1 and strict:
                    raise GpuError(f"GPU {item!r} is ambiguous: prefix of "
                                   + ", ".join(g.uuid for g in match))
                if len(match) > 1:
                    continue
        if not match:
            if strict:
                known = ", ".join(f"{g.index} ({g.uuid}, {g.pci})" for g in gpus) or "none"
                raise GpuError(f"GPU {item!r} not found; GPUs here: {known}")
            continue
        for g in match:
            if g not in chosen:
                chosen.append(g)
    return chosen

