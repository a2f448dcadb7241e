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

import os
import stat
import sys
from ..records import dataclass, field
TYPE_CHECKING = False     # typing costs a hook's start-up; annotations are strings here
if TYPE_CHECKING:
    from typing import Any

from ...generator.settings import is_pci, normalize_pci

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..background import Background
    from .health import GpuFacts

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
    # users() costs ~0.05 ms (NVML), not a scan of every process's fds: worth
    # asking every few ms while killed processes let go of their memory.
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

    def health_facts(self, gpu: Gpu) -> "GpuFacts":
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
    from here (tests/gpu/systemd: drain missed such a server on H200).  A
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


# ------------------------------------------------------------------ fake backend

class FakeBackend(Backend):
    """Optional keys per GPU, for the memory checks (NVML's figures):
      "memory_used_mib"     the GPU's used memory, as nvmlDeviceGetMemoryInfo_v2
                            reports it (reservation excluded)
      "process_memory_mib"  what each holder of `device` uses on it (default 0)
      "reserved_mib"        the driver's reservation (default 0)
      "health"              DESIGN.md's health object (absent: healthy; a key
                            set to null: not supported, so unknown)
      "driver"              {"version": "580.159.04", "cuda": 13000} (default:
                            unknown), what nvmlSystemGetCudaDriverVersion_v2 says
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
            from ..jsontext import loads     # the fake table only: not on NVML's path (reap)
            with open(path, encoding="utf-8") as f:
                table = loads(f.read())
            from .health import parse_fake_health
            gpus, extra, health = [], {}, {}
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
                try:
                    health[gpu.index] = parse_fake_health(g.get("health"))
                except ValueError as e:
                    raise ValueError(f"GPU {gpu.index}: {e}") from None
            if len({g.index for g in gpus}) != len(gpus):
                raise ValueError("two GPUs with one index")
        except Exception as e:   # any shape of bad file is one line, not a traceback
            raise GpuError(f"INFER_UNITS_FAKE_GPUS={path}: {type(e).__name__}: {e}") from None
        self._gpus, self._extra, self._stamp = gpus, extra, stamp
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
            on = {by_device[f] for f in files}
            uses[pid] = GpuUse(pid, on, {k: self._extra.get(k, (0, 0))[0] for k in on})
        return uses

    def memory(self, gpus: list[Gpu]) -> dict[int, tuple[int, int]]:
        self._load()
        now = {g.index: g for g in self._gpus}
        used = {g.index: now[g.index].memory_used_mib for g in gpus if g.index in now}
        return {i: (mib, self._extra[i][1]) for i, mib in used.items() if mib is not None}

    def device_files(self) -> list[str]:
        return [g.device for g in self._gpus]

    def health_facts(self, gpu: Gpu) -> "GpuFacts":
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
    with _StandIns(_pynvml_stand_ins()):
        try:
            import pynvml  # Debian-less hosts: pip's nvidia-ml-py
            return pynvml
        except ImportError:
            pass
        try:
            from ..._vendor import pynvml  # type: ignore[attr-defined]  # bundled by the .deb
            return pynvml
        except ImportError:
            return None


# pynvml's import, 8,000 lines of ctypes declarations, also imports modules
# for one name each, none of which reap's path needs otherwise: ctypes.util
# (find_library, used only on Windows; it brings subprocess, shutil and
# tempfile), string (capwords, called at import time; it brings re and enum),
# threading (Lock, one made at import time) and functools (wraps, applied at
# import time; it brings collections).  pynvml's load on reap's path on the
# 2-core VM (2026-12-04): 10.5-13.0 ms with the real modules, 4.8-5.0 ms with
# the stand-ins below; on the H200 host it was 15-26 ms of the 32-51 ms before
# reap's first SIGKILL.  Each stand-in gives that one name, with the real
# module's behaviour; anything else asked of it loads the real module.

def _capwords(text: str, sep: str | None = None) -> str:
    """string.capwords, as CPython's string.py defines it."""
    return (sep or " ").join(word.capitalize() for word in text.split(sep))


# functools.WRAPPER_ASSIGNMENTS (3.12 added __type_params__; a name the
# wrapped function lacks is skipped, as update_wrapper skips it).
_WRAPPER_ASSIGNMENTS = ("__module__", "__name__", "__qualname__", "__doc__",
                        "__annotations__", "__type_params__")


def _wraps(wrapped: Any, assigned: tuple[str, ...] = _WRAPPER_ASSIGNMENTS,
           updated: tuple[str, ...] = ("__dict__",)) -> Any:
    """functools.wraps: update_wrapper's copy, with the same arguments."""
    def update(wrapper: Any) -> Any:
        for name in assigned:
            try:
                value = getattr(wrapped, name)
            except AttributeError:
                continue
            setattr(wrapper, name, value)
        for name in updated:
            getattr(wrapper, name).update(getattr(wrapped, name, {}))
        wrapper.__wrapped__ = wrapped
        return wrapper
    return update


def _find_library(name: str) -> str | None:
    """ctypes.util.find_library: pynvml keeps this function, so it asks the
    real module, loaded on this first use."""
    found: str | None = _StandIns.real("ctypes.util").find_library(name)
    return found


def _pynvml_stand_ins() -> dict[str, dict[str, Any]]:
    import _thread      # threading.Lock is this function
    return {"ctypes.util": {"find_library": _find_library},
            "string": {"capwords": _capwords},
            "threading": {"Lock": _thread.allocate_lock},
            "functools": {"wraps": _wraps}}


class _StandIns:
    """For the duration of one import (pynvml's), each module of `table` not
    imported yet is a stand-in that holds the given names; asked for any other
    name, it puts the real module in its place and answers from it.
    Afterwards sys.modules gives every later importer the real modules; what
    pynvml (or a module another thread imported meanwhile) holds stays the
    stand-in, whose names behave as the real ones and which answers every
    other name from the real module."""

    def __init__(self, table: dict[str, dict[str, Any]]) -> None:
        self.table = table
        self.lent: dict[str, Any] = {}

    def __enter__(self) -> None:
        import types
        for name, names in self.table.items():
            if name in sys.modules:
                continue
            parent, _, child = name.rpartition(".")
            if parent:
                __import__(parent)
            stand_in = types.ModuleType(name)
            stand_in.__dict__.update(names)

            def attribute(attr: str, name: str = name) -> Any:
                if attr.startswith("__"):       # the import system's questions (__path__)
                    raise AttributeError(attr)
                return getattr(_StandIns.real(name), attr)
            setattr(stand_in, "__getattr__", attribute)
            sys.modules[name] = stand_in
            if parent:
                setattr(sys.modules[parent], child, stand_in)
            self.lent[name] = stand_in

    def __exit__(self, *exc: object) -> None:
        for name, stand_in in self.lent.items():
            _StandIns._withdraw(name, stand_in)

    @staticmethod
    def _withdraw(name: str, stand_in: Any = None) -> None:
        """Take the stand-in (`stand_in`, or any) out of sys.modules and out of
        its parent package, so that the next import loads the real module."""
        module = sys.modules.get(name)
        if module is not None and (module is stand_in or
                                   (stand_in is None and module.__spec__ is None)):
            del sys.modules[name]
        parent, _, child = name.rpartition(".")
        held = getattr(sys.modules.get(parent), child, None) if parent else None
        if held is not None and (held is stand_in or (stand_in is None and held.__spec__ is None)):
            delattr(sys.modules[parent], child)

    @staticmethod
    def real(name: str) -> Any:
        """The real module `name`, imported now if a stand-in is in its place."""
        _StandIns._withdraw(name)
        import importlib
        return importlib.import_module(name)


def _nvml_init() -> tuple[Any, list[Any]] | None:
    """The module and every GPU's handle; None without nvidia-ml-py.  Raises
    what nvmlInit raises (no library, no driver)."""
    nvml = _load_pynvml()
    if nvml is None:
        return None
    _warmed()
    nvml.nvmlInit()
    return nvml, [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]


# A fresh process's NVML start on one H200 (2026-12-02, .devscratch probe, in
# process): pynvml's import 23 ms (8,000 lines, and ctypes.util with
# subprocess, shutil, tempfile behind it), nvmlInit 10 ms, the GPU's first
# handle (the driver attaching it) 7 ms.  The last two are the driver's ioctls,
# which ctypes runs without the GIL: warm_nvml() starts them in a thread at the
# top of a GPU command (helpers/entry.py), straight on the library, while the
# command's modules and pynvml are imported.  NVML counts its inits and keeps
# a GPU attached, so pynvml's own nvmlInit and handles then cost next to
# nothing.  The warm-up's session is never shut down: the process ends first.
_warming: list[Background] = []       # the warm-up, once started


def warm_nvml() -> None:
    """Begin NVML's init and each GPU's attach in the background."""
    if _warming or os.environ.get("INFER_UNITS_FAKE_GPUS"):
        return

    def run() -> None:
        try:
            import ctypes
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() == 0:
                count, handle = ctypes.c_uint(0), ctypes.c_void_p()
                if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0:
                    for i in range(count.value):
                        lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle))
        except BaseException:       # noqa: BLE001 - no library, no driver: pynvml says so after
            pass
    from ..background import Background
    _warming.append(Background(run))
    # A command that ends without asking NVML (a usage error, click's path)
    # leaves through the interpreter's finalisation: not while the thread is
    # inside the driver.  (The hooks and reap leave with os._exit.)
    import atexit
    atexit.register(_warmed, 5.0)


def _warmed(limit: float = -1) -> None:
    """Wait for warm_nvml()'s thread, if one was started (at most limit seconds)."""
    for warming in _warming:
        warming.wait(limit)


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
        """v1 used memory of one GPU (bench/reap_bench.py watches it)."""
        return self.nvml.nvmlDeviceGetMemoryInfo(self._handles[index]).used // (1 << 20)

    def memory(self, gpus: list[Gpu]) -> dict[int, tuple[int, int]]:
        """Version 2 separates the driver's reservation from "used" (H200,
        bench/results/2026-11-30-h200/nvml-memory.txt: v1 used 615 MiB with no
        process, v2 used 0 and reserved 615); without it, v1's used and a
        configured baseline (gpumemory.py)."""
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

    def health_facts(self, gpu: Gpu) -> "GpuFacts":
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
        scan = FdScan({g.device for g in every})
        self.unseen = scan.unseen
        for pid, _files in scan.held.items():
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
            try:
                started = _nvml_init()
                if started is not None:
                    _backend = NvmlBackend(*started)
            except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                print(f"infer-units: NVML unavailable ({e}); using /proc", file=sys.stderr)
            if _backend is None:
                if not os.path.isdir(NVIDIA_PROC):
                    raise GpuError("no NVIDIA driver: neither NVML nor /proc/driver/nvidia")
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

