"""What the driver and the kernel say about the GPUs' health: facts, not verdicts.

Every source answers in the shape of the fake backend's `health` object
(docs/architecture.md, "GPU health"), so one judge (decide/health.py) reads them all:

    {"xid": [79], "remapped_rows": {"pending": true, "failure": false},
     "retired_pages_pending": false, "ecc_uncorrected_volatile": 0,
     "persistence": true, "fabric": "completed", "mig": false,
     "addressing": "hmm", "cc": "off"}

A value of None is a fact nobody could read (NVML "Not Supported", an old
driver without the call, no permission): `unknown`, never ok.  Why it is
unknown is kept in `why[key]`.

Sources:
  - NVML (nvidia-ml-py names), every call on its own: one failing call makes
    one fact unknown, not the report.
  - the fake table (INFER_UNITS_FAKE_GPUS): the `health` object as written;
    absent means healthy, an explicit null means "not supported".
  - the kernel, under a root directory (tests build a fake tree, like
    netplan's --root-dir): /proc/modules, /dev/nvidia-uvm,
    /sys/module/nvidia_uvm/parameters/uvm_disable_hmm, the GPUs' IOMMU groups
    and their bridges' PCI config space (ACS), and the kernel log (/dev/kmsg)
    for `NVRM: Xid` lines.  Nothing here writes, execs or blocks.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...generator.settings import normalize_pci


HEALTHY: dict[str, Any] = {
    "xid": [], "remapped_rows": {"pending": False, "failure": False},
    "retired_pages_pending": False, "ecc_uncorrected_volatile": 0, "persistence": True,
    "fabric": "not-supported", "mig": False, "addressing": "none", "cc": "off",
}
FABRIC_STATES = ("not-supported", "not-started", "in-progress", "completed", "failed")
ADDRESSING = ("none", "hmm", "ats")
CC_STATES = ("off", "on", "devtools")


@dataclass
class GpuFacts:
    facts: dict[str, Any]
    why: dict[str, str] = field(default_factory=dict)   # key -> why it is None
    source: dict[str, str] = field(default_factory=dict)  # key -> where it was read


# ------------------------------------------------------------------ fake table

def parse_fake_health(value: Any) -> dict[str, Any]:
    """The fake table's `health` object, checked: a wrong shape is a bad table
    (GpuError from the backend), not a silently healthy GPU."""
    if value is None:
        return dict(HEALTHY)
    if not isinstance(value, dict):
        raise ValueError(f"health: expected an object, got {type(value).__name__}")
    unknown = set(value) - set(HEALTHY)
    if unknown:
        raise ValueError(f"health: unknown key(s) {sorted(unknown)} (known: {sorted(HEALTHY)})")
    out = dict(HEALTHY)
    for key, item in value.items():
        if item is None:                 # "not supported" on this GPU
            out[key] = None
        elif key == "xid":
            if not isinstance(item, list) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and 0 < x < 1 << 16
                    for x in item):
                raise ValueError("health.xid: expected a list of XID numbers")
            out[key] = list(item)
        elif key == "remapped_rows":
            if not isinstance(item, dict) or set(item) - {"pending", "failure", "correctable",
                                                          "uncorrectable"}:
                raise ValueError('health.remapped_rows: expected {"pending": bool, '
                                 '"failure": bool}')
            rows = {"pending": False, "failure": False, **item}
            if not all(isinstance(rows[k], bool) for k in ("pending", "failure")):
                raise ValueError("health.remapped_rows: pending and failure are booleans")
            out[key] = rows
        elif key in ("retired_pages_pending", "persistence", "mig"):
            if not isinstance(item, bool):
                raise ValueError(f"health.{key}: expected true or false")
            out[key] = item
        elif key == "ecc_uncorrected_volatile":
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise ValueError(f"health.{key}: expected a count (0 or more)")
            out[key] = item
        else:
            choices = {"fabric": FABRIC_STATES, "addressing": ADDRESSING, "cc": CC_STATES}[key]
            if item not in choices:
                raise ValueError(f"health.{key}: {item!r} is not one of {', '.join(choices)}")
            out[key] = item
    return out


def fake_facts(health: dict[str, Any]) -> GpuFacts:
    why = {k: "not supported (the fake table says null)" for k, v in health.items() if v is None}
    return GpuFacts(dict(health), why, {k: "fake table" for k in health})


# ------------------------------------------------------------------ NVML

def _nvml_call(nvml: Any, out: GpuFacts, key: str, name: str, fn: Any) -> Any:
    """One NVML call: its answer, or None with why (Not Supported, no such
    function in this driver, no permission, ...).  Nothing here becomes ok."""
    out.source[key] = f"NVML {name}"
    try:
        return fn()
    except nvml.NVMLError as e:
        not_supported = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
        missing = getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
        value = getattr(e, "value", None)
        if value == not_supported:
            out.why[key] = f"{name}: Not Supported on this GPU"
        elif value == missing:
            out.why[key] = f"{name}: not in this driver's NVML"
        else:
            out.why[key] = f"{name}: {e}"
    except (AttributeError, TypeError, OSError) as e:   # an older nvidia-ml-py
        out.why[key] = f"{name}: not available ({type(e).__name__}: {e})"
    return None


def nvml_facts(nvml: Any, handle: Any) -> GpuFacts:
    out = GpuFacts({k: None for k in HEALTHY})
    f = out.facts

    def call(key: str, name: str, fn: Callable[[], Any]) -> Any:
        return _nvml_call(nvml, out, key, name, fn)
    rows = call("remapped_rows", "nvmlDeviceGetRemappedRows",
                lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    if rows is not None:
        corr, unc, pending, failure = rows
        f["remapped_rows"] = {"pending": bool(pending), "failure": bool(failure),
                              "correctable": int(corr), "uncorrectable": int(unc)}
    pages = call("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus",
                 lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
    if pages is not None:
        f["retired_pages_pending"] = bool(pages)
    ecc = call("ecc_uncorrected_volatile", "nvmlDeviceGetTotalEccErrors",
               lambda: nvml.nvmlDeviceGetTotalEccErrors(
                   handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))
    if ecc is not None:
        f["ecc_uncorrected_volatile"] = int(ecc)
    persistence = call("persistence", "nvmlDeviceGetPersistenceMode",
                       lambda: nvml.nvmlDeviceGetPersistenceMode(handle))
    if persistence is not None:
        f["persistence"] = persistence == getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    f["fabric"] = _nvml_fabric(nvml, handle, call)
    mig = call("mig", "nvmlDeviceGetMigMode", lambda: nvml.nvmlDeviceGetMigMode(handle))
    if mig is not None:
        f["mig"] = bool(mig[0])          # [current, pending]
    mode = call("addressing", "nvmlDeviceGetAddressingMode",
                lambda: nvml.nvmlDeviceGetAddressingMode(handle))
    if mode is not None:
        f["addressing"] = {0: "none", 1: "hmm", 2: "ats"}.get(int(mode), f"mode {mode}")
    f["cc"] = _nvml_cc(nvml, call)
    # NVML's XID events start at registration (nvmlDeviceRegisterEvents): they
    # cannot say what happened since boot.  The kernel log can (kernel_xids).
    f["xid"] = None
    out.why["xid"] = "NVML reports XIDs only from now on: read from the kernel log"
    return out


def _nvml_fabric(nvml: Any, handle: Any, call: Any) -> str | None:
    struct = getattr(nvml, "c_nvmlGpuFabricInfo_v2_t", None)

    def ask() -> tuple[int, int]:
        if struct is None:
            raise AttributeError("no c_nvmlGpuFabricInfo_v2_t")
        import ctypes            # pynvml has imported it already
        info = struct()          # its __init__ sets the version field
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        return int(info.state), int(info.status)
    answer = call("fabric", "nvmlDeviceGetGpuFabricInfoV", ask)
    if answer is None:
        return None
    state, status = answer
    name = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}.get(state)
    if name == "completed" and status != 0:
        return "failed"
    return name or f"state {state}"


def _nvml_cc(nvml: Any, call: Any) -> str | None:
    state = call("cc", "nvmlSystemGetConfComputeState",
                 lambda: nvml.nvmlSystemGetConfComputeState())
    if state is None:
        return None
    if not int(state.ccFeature):
        return "off"
    return "devtools" if int(state.devToolsMode) else "on"


def nvml_cuda_driver(nvml: Any) -> tuple[int | None, str]:
    """The CUDA version the driver supports (12080 = 12.8), or None and why."""
    out = GpuFacts({})
    value = _nvml_call(nvml, out, "cuda", "nvmlSystemGetCudaDriverVersion_v2",
                       lambda: nvml.nvmlSystemGetCudaDriverVersion_v2())
    return (int(value) if value is not None else None), out.why.get("cuda", "")


def nvml_driver_version(nvml: Any) -> str | None:
    try:
        value = nvml.nvmlSystemGetDriverVersion()
    except Exception:  # noqa: BLE001  (a fact for the report, nothing depends on it)
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------ the kernel

# Bounds on what one read of the kernel log takes, in bytes and records.
KMSG_MAX_BYTES = 32 << 20
KMSG_MAX_RECORDS = 500_000
# The driver's own record: its message starts with this (docs/trust.md).
# Others put "NVRM: Xid" inside their records at will (a mount option in a
# user namespace is logged verbatim), so a record that merely contains it
# is not the driver's.
_XID = re.compile(rb"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
                  rb"(?:\.[0-7])?\): (\d+)")


@dataclass
class KernelLog:
    xids: dict[str, list[int]]      # "0000:41:00" (domain:bus:device) -> XIDs, in log order
    readable: bool
    why: str = ""                   # when not readable
    source: str = ""


class Kernel:
    """The kernel's files under `root` ("/" on a host; a test's fake tree)."""

    def __init__(self, root: str = "/") -> None:
        self.root = root.rstrip("/") or ""

    def path(self, path: str) -> str:
        return self.root + path

    def read(self, path: str, limit: int = 1 << 16) -> str | None:
        try:
            fd = os.open(self.path(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return os.read(fd, limit).decode(errors="replace")
        except OSError:
            return None
        finally:
            os.close(fd)

    # -- nvidia_uvm
    def modules(self) -> set[str] | None:
        text = self.read("/proc/modules", 1 << 20)
        if text is None:
            return None
        return {line.split(" ", 1)[0] for line in text.splitlines() if line}

    def exists(self, path: str) -> bool:
        return os.path.exists(self.path(path))

    def uvm_disable_hmm(self) -> str | None:
        """"Y", "N", or None where the parameter does not exist (a driver
        before HMM, or nvidia_uvm not loaded)."""
        text = self.read("/sys/module/nvidia_uvm/parameters/uvm_disable_hmm")
        return text.strip() if text is not None else None

    # -- IOMMU
    def iommu_group_count(self) -> int | None:
        try:
            return len(os.listdir(self.path("/sys/kernel/iommu_groups")))
        except FileNotFoundError:
            return 0
        except OSError:
            return None

    def pci_dir(self, pci: str) -> str | None:
        """/sys/bus/pci/devices/<pci>, resolved (the link names the bridges above)."""
        link = self.path(f"/sys/bus/pci/devices/{pci}")
        if not os.path.exists(link):
            return None
        return os.path.realpath(link)

    def iommu_type(self, pci: str) -> str | None:
        """The IOMMU group type of a device: "identity" (passthrough), "DMA",
        "DMA-FQ" (translated), "blocked"; None when it has no group."""
        device = self.pci_dir(pci)
        if device is None or not os.path.exists(os.path.join(device, "iommu_group")):
            return None
        group = os.path.realpath(os.path.join(device, "iommu_group"))
        try:
            with open(os.path.join(group, "type"), encoding="ascii") as f:
                return f.read().strip()
        except OSError:
            return "unknown"

    def bridges(self, pci: str) -> list[str] | None:
        """The PCI devices (bridges) above `pci`, nearest first; None when the
        GPU is not in sysfs."""
        device = self.pci_dir(pci)
        if device is None:
            return None
        out = []
        parent = os.path.dirname(device)
        while True:
            name = os.path.basename(parent)
            if not _is_pci_name(name):
                break
            out.append(parent)
            parent = os.path.dirname(parent)
        return out

    # -- the kernel log
    def kernel_log(self) -> KernelLog:
        """Every driver record `NVRM: Xid` still in the kernel's ring buffer.  /dev/kmsg
        opened non-blocking: each read is one record, EAGAIN is the end (a
        plain file in a test's tree ends at EOF); EPIPE means records were
        overwritten while we read: go on.  Bounded in bytes and records."""
        path = self.path("/dev/kmsg")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            why = (f"{path}: {e.strerror}" + (" (dmesg_restrict: run as root)"
                                               if e.errno in (errno.EPERM, errno.EACCES) else ""))
            return KernelLog({}, False, why, path)
        try:
            # Start after what `dmesg --clear` cleared (as dmesg does): the
            # operator's way to say "this XID is dealt with" after a reset.
            os.lseek(fd, 0, os.SEEK_DATA)
        except OSError:
            pass
        xids: dict[str, list[int]] = {}
        total = records = 0
        pending = b""
        try:
            while total < KMSG_MAX_BYTES and records < KMSG_MAX_RECORDS:
                try:
                    chunk = os.read(fd, 16384)
                except BlockingIOError:
                    break
                except OSError as e:
                    if e.errno == errno.EPIPE:
                        continue
                    if e.errno == errno.EINVAL:      # a record larger than our buffer
                        continue
                    return KernelLog(xids, False, f"{path}: {e.strerror}", path)
                if not chunk:
                    break
                total += len(chunk)
                records += 1
                pending += chunk
                lines = pending.split(b"\n")
                pending = lines.pop()
                for line in lines:
                    _add_xid(xids, line)
            _add_xid(xids, pending)
        finally:
            os.close(fd)
        return KernelLog(xids, True, "", path)


def _add_xid(xids: dict[str, list[int]], record: bytes) -> None:
    """One /dev/kmsg record, "PRIORITY,SEQ,USEC,FLAGS;MESSAGE" (continuation
    lines, " KEY=value", carry no message).  It counts when the kernel
    logged it (facility 0: what root writes to /dev/kmsg is "user" unless
    it says otherwise) and its message starts with the driver's prefix."""
    header, sep, message = record.partition(b";")
    if not sep or b"Xid" not in message:
        return
    priority = header.split(b",", 1)[0]
    if not priority.isdigit() or int(priority) >> 3 != 0:
        return
    match = _XID.match(message)
    if match:
        where = normalize_pci(match.group(1).decode() + ".0").rsplit(".", 1)[0]
        xids.setdefault(where, []).append(int(match.group(2)))


def _is_pci_name(name: str) -> bool:
    parts = name.split(":")
    return len(parts) == 3 and len(parts[2]) == 4 and parts[2][2] == "."


def xids_of(log: KernelLog, pci: str) -> list[int]:
    return list(log.xids.get(pci.rsplit(".", 1)[0], []))


# ------------------------------------------------------------------ ACS

PCI_EXT_CAP_ID_ACS = 0x000D
ACS_CTRL_REQ_REDIR = 0x0004     # P2P Request Redirect
ACS_CTRL_CMPLT_REDIR = 0x0008   # P2P Completion Redirect


def acs_control(config: bytes) -> int | None:
    """The ACS Control register from a device's PCI config space, 0 when the
    device has no ACS capability, None when the extended space (beyond 256
    bytes) could not be read (not root: sysfs shows 64 bytes)."""
    if len(config) <= 256:
        return None
    offset, seen = 0x100, set()
    while offset and offset not in seen and offset + 8 <= len(config):
        seen.add(offset)
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return 0
        if header & 0xFFFF == PCI_EXT_CAP_ID_ACS:
            return int.from_bytes(config[offset + 6:offset + 8], "little")
        offset = (header >> 20) & 0xFFC
    return 0


def read_config(bridge_dir: str) -> bytes | None:
    try:
        with open(os.path.join(bridge_dir, "config"), "rb") as f:
            return f.read(4096)
    except OSError:
        return None
