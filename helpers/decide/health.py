"""GPU and host health: the checks of docs/architecture.md "GPU health", as findings.

Each finding is ok / warning / error / unknown, with the fact it read and the
fix an operator types.  The facts come from facts/health.py (NVML, the fake
table, the kernel under a root directory); this module only judges.  Used by
`infer-units doctor`, by pre-start (the checks of the model's GPUs: an error
refuses the start unless `[health] accept` names the check), by `status` and
by the metrics file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...generator.settings import HEALTH_CHECKS
from ..facts.gpus import Backend, Gpu
from ..facts.health import (ACS_CTRL_CMPLT_REDIR, ACS_CTRL_REQ_REDIR, GpuFacts, Kernel,
                          KernelLog, acs_control, read_config, xids_of)

OK, UNKNOWN, WARNING, ERROR = "ok", "unknown", "warning", "error"
# Worst first; the metrics gauge's values (README "Metrics").
SEVERITY = {OK: 0, WARNING: 1, ERROR: 2, UNKNOWN: -1}
_RANK = {OK: 0, UNKNOWN: 1, WARNING: 2, ERROR: 3}

# Per GPU, then per host; pre-start applies all of these to the model's GPUs
# (HEALTH_CHECKS in generator/settings.py: the names `[health] accept` takes).
GPU_CHECKS = ("remapped-rows", "retired-pages", "xid", "ecc", "persistence", "fabric", "mig",
              "hmm", "cc", "iommu", "acs")
HOST_CHECKS = ("nvidia-uvm",)
assert set(GPU_CHECKS + HOST_CHECKS) == set(HEALTH_CHECKS), "settings.HEALTH_CHECKS out of date"

# XIDs after which the GPU must not take a new server (docs/architecture.md), with what
# the operator does about each; any other XID since boot is a warning.
FATAL_XIDS = {
    79: "the GPU has fallen off the bus: check its power and PCIe seating; reboot the host",
    48: "double-bit ECC error: reset the GPU",
    63: "ECC page retirement or row remapping recorded: reset the GPU to apply it",
    64: "ECC page retirement or row remapping failed: reset the GPU; if it recurs, RMA",
    74: "NVLink error: reset the GPU; check the NVLink/NVSwitch fabric",
    94: "contained ECC error: restart the applications on the GPU, then reset it",
    95: "uncontained ECC error: reset the GPU",
    119: "GSP RPC timeout: reset the GPU or reboot; update the driver if it recurs",
    120: "GSP error: reset the GPU or reboot; update the driver if it recurs",
}
P2P_FIX = 'in the model file: [nccl] p2p = "auto" (self-test at start) or "off"'


@dataclass(frozen=True)
class Finding:
    check: str
    level: str              # ok | warning | error | unknown
    fact: str               # what was read
    fix: str = ""           # what to do ("" when ok)
    source: str = ""        # where the fact was read
    gpu: int | None = None  # None: the host
    uuid: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"check": self.check, "level": self.level, "fact": self.fact, "fix": self.fix,
                "source": self.source, "gpu": self.gpu, "uuid": self.uuid}

    @property
    def where(self) -> str:
        return "host" if self.gpu is None else f"GPU {self.gpu} ({self.uuid})"


def worst(findings: list[Finding]) -> str:
    return max((f.level for f in findings), key=_RANK.__getitem__, default=OK)


def _reset(gpu: Gpu) -> str:
    return (f"stop its users (`infer-units drain` stops every model), then "
            f"`nvidia-smi -r -i {gpu.index}` (or reboot)")


# ------------------------------------------------------------------ per GPU

def judge_gpu(gpu: Gpu, got: GpuFacts, kernel: Kernel | None, log: KernelLog | None,
              why_no_kernel: str) -> list[Finding]:
    f, why = got.facts, got.why

    def out(check: str, level: str, fact: str, fix: str = "", key: str = "") -> Finding:
        source = got.source.get(key, "") if key else ""
        return Finding(check, level, fact, fix if level != OK else "", source, gpu.index, gpu.uuid)

    def unknown(check: str, key: str) -> Finding:
        return out(check, UNKNOWN, why.get(key, "not read"), key=key)

    found: list[Finding] = []
    rows = f["remapped_rows"]
    if rows is None:
        found.append(unknown("remapped-rows", "remapped_rows"))
    else:
        counts = (f"{rows['correctable']} correctable, {rows['uncorrectable']} uncorrectable "
                  "remapped rows; " if "correctable" in rows else "")
        if rows["failure"]:
            found.append(out("remapped-rows", ERROR, counts + "row remapping FAILED",
                             "the GPU has run out of spare rows: drain it and replace it (RMA)",
                             "remapped_rows"))
        elif rows["pending"]:
            found.append(out("remapped-rows", ERROR, counts + "a row remapping is pending",
                             _reset(gpu) + " to apply it", "remapped_rows"))
        else:
            found.append(out("remapped-rows", OK, counts + "none pending, no failure",
                             key="remapped_rows"))
    pages = f["retired_pages_pending"]
    if pages is None:
        found.append(unknown("retired-pages", "retired_pages_pending"))
    elif pages:
        found.append(out("retired-pages", ERROR, "a page retirement is pending",
                         _reset(gpu) + " to retire it", "retired_pages_pending"))
    else:
        found.append(out("retired-pages", OK, "no page retirement pending",
                         key="retired_pages_pending"))
    found.append(_judge_xid(gpu, f["xid"], why.get("xid", ""), log, out))
    ecc = f["ecc_uncorrected_volatile"]
    if ecc is None:
        found.append(unknown("ecc", "ecc_uncorrected_volatile"))
    elif ecc > 0:
        found.append(out("ecc", WARNING, f"{ecc} uncorrected ECC error(s) since the driver loaded",
                         f"`nvidia-smi -q -d ECC,ROW_REMAPPER -i {gpu.index}`; {_reset(gpu)}; "
                         "if they come back, RMA", "ecc_uncorrected_volatile"))
    else:
        found.append(out("ecc", OK, "0 uncorrected ECC errors (volatile)",
                         key="ecc_uncorrected_volatile"))
    persistence = f["persistence"]
    if persistence is None:
        found.append(unknown("persistence", "persistence"))
    elif not persistence:
        found.append(out("persistence", WARNING,
                         "persistence mode off: the driver state is torn down when the last "
                         "user exits, so every start re-initializes the GPU (seconds)",
                         "systemctl enable --now nvidia-persistenced", "persistence"))
    else:
        found.append(out("persistence", OK, "persistence mode on", key="persistence"))
    fabric = f["fabric"]
    if fabric is None:
        found.append(unknown("fabric", "fabric"))
    elif fabric in ("not-supported", "completed"):
        found.append(out("fabric", OK, "no NVSwitch fabric" if fabric == "not-supported"
                         else "NVSwitch fabric registration completed", key="fabric"))
    else:
        found.append(out("fabric", ERROR,
                         f"NVSwitch fabric {fabric}: CUDA cannot use the GPU until it completes",
                         "systemctl restart nvidia-fabricmanager; read "
                         "`journalctl -u nvidia-fabricmanager`", "fabric"))
    mig = f["mig"]
    if mig is None:
        found.append(unknown("mig", "mig"))
    elif mig:
        found.append(out("mig", WARNING, "MIG mode on: the whole GPU cannot run a server",
                         f"`nvidia-smi -i {gpu.index} -mig 0` and reset the GPU (infer-units "
                         "runs servers on whole GPUs: MIG devices in `gpus` are refused)", "mig"))
    else:
        found.append(out("mig", OK, "MIG off", key="mig"))
    found.append(_judge_hmm(f["addressing"], why.get("addressing", ""), kernel, why_no_kernel,
                            out))
    cc = f["cc"]
    if cc is None:
        found.append(unknown("cc", "cc"))
    elif cc != "off":
        found.append(out("cc", WARNING,
                         f"confidential computing {cc}: P2P DMA under the IOMMU's translation "
                         "corrupts data while nvidia-smi and cudaDeviceCanAccessPeer say fine",
                         P2P_FIX, "cc"))
    else:
        found.append(out("cc", OK, "confidential computing off", key="cc"))
    found += _judge_pci(gpu, kernel, why_no_kernel)
    return found


def _judge_xid(gpu: Gpu, listed: list[int] | None, why: str, log: KernelLog | None,
               out: Callable[..., Finding]) -> Finding:
    xids: list[int] | None = listed
    source = "fake table"
    if xids is None:        # NVML cannot say since boot: the kernel log can
        if log is None or not log.readable:
            reason = log.why if log is not None else why
            return Finding("xid", UNKNOWN, f"kernel log not readable: {reason}" if log
                           else reason, "", "kernel log", gpu.index, gpu.uuid)
        xids, source = xids_of(log, gpu.pci), log.source
    if not xids:
        return Finding("xid", OK, "no XID since boot", "", source, gpu.index, gpu.uuid)
    fatal = [x for x in dict.fromkeys(xids) if x in FATAL_XIDS]
    seen = ", ".join(str(x) for x in dict.fromkeys(xids))
    clear = ("; then `dmesg --clear` (journald keeps the lines) so the old XID stops counting"
             if source != "fake table" else "")
    if fatal:
        return Finding("xid", ERROR, f"XID {seen} since boot",
                       "; ".join(f"XID {x}: {FATAL_XIDS[x]}" for x in fatal) + clear,
                       source, gpu.index, gpu.uuid)
    return Finding("xid", WARNING, f"XID {seen} since boot (none of them leaves the GPU unusable)",
                   "usually the application's fault (e.g. 13, 31, 43): read the server's log; "
                   "see NVIDIA's XID catalog" + clear, source, gpu.index, gpu.uuid)


def _judge_hmm(addressing: str | None, why: str, kernel: Kernel | None, why_no_kernel: str,
               out: Callable[..., Finding]) -> Finding:
    param = kernel.uvm_disable_hmm() if kernel is not None else None
    where = "/sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
    fix = ("echo 'options nvidia_uvm uvm_disable_hmm=1' > /etc/modprobe.d/nvidia-uvm-hmm.conf; "
           "then reload nvidia_uvm (or reboot)")
    if addressing == "hmm":
        state = f"; uvm_disable_hmm={param}" if param is not None else ""
        return out("hmm", WARNING, "the GPU uses HMM addressing" + state + ": cuInit fails with "
                   "error 3 on some kernels (Proxmox, open kernel modules)", fix, "addressing")
    if addressing is not None:
        return out("hmm", OK, f"addressing mode {addressing}", key="addressing")
    if param == "Y":
        found = out("hmm", OK, "HMM disabled (uvm_disable_hmm=Y)")
        return Finding(found.check, found.level, found.fact, found.fix, where, found.gpu,
                       found.uuid)
    reason = why or "addressing mode not read"
    if kernel is None:
        return out("hmm", UNKNOWN, f"{reason}; {why_no_kernel}")
    return out("hmm", UNKNOWN, f"{reason}; uvm_disable_hmm="
               + (param if param is not None else "(no such parameter)"))


def _judge_pci(gpu: Gpu, kernel: Kernel | None, why_no_kernel: str) -> list[Finding]:
    def out(check: str, level: str, fact: str, fix: str = "", source: str = "") -> Finding:
        return Finding(check, level, fact, fix if level != OK else "", source, gpu.index, gpu.uuid)
    if kernel is None:
        return [out("iommu", UNKNOWN, why_no_kernel), out("acs", UNKNOWN, why_no_kernel)]
    found = []
    kind = kernel.iommu_type(gpu.pci)
    groups = "/sys/kernel/iommu_groups"
    if kind is None:
        count = kernel.iommu_group_count()
        if kernel.pci_dir(gpu.pci) is not None and count == 0:
            found.append(out("iommu", OK, "no IOMMU groups: DMA is not translated", source=groups))
        elif kernel.pci_dir(gpu.pci) is not None:
            found.append(out("iommu", UNKNOWN, f"the GPU has no IOMMU group ({count} groups)",
                             source=groups))
        else:
            found.append(out("iommu", UNKNOWN, f"{gpu.pci} is not in /sys/bus/pci/devices"))
    elif kind == "identity":
        found.append(out("iommu", OK, "IOMMU passthrough (identity) for the GPU", source=groups))
    else:
        found.append(out("iommu", WARNING, f"IOMMU group type {kind}: DMA is translated, so "
                         "peer-to-peer transfers between GPUs may fail or corrupt data",
                         f"iommu=pt on the kernel command line, or {P2P_FIX}", groups))
    bridges = kernel.bridges(gpu.pci)
    if bridges is None:
        found.append(out("acs", UNKNOWN, f"{gpu.pci} is not in /sys/bus/pci/devices"))
        return found
    if not bridges:
        found.append(out("acs", OK, "no PCI bridge above the GPU", source="sysfs"))
        return found
    redirecting, unread = [], []
    for bridge in bridges:
        name = os.path.basename(bridge)
        config = read_config(bridge)
        control = acs_control(config) if config is not None else None
        if control is None:
            unread.append(name)
        elif control & (ACS_CTRL_REQ_REDIR | ACS_CTRL_CMPLT_REDIR):
            redirecting.append(name)
    source = "PCI config space (ACS extended capability)"
    if redirecting:
        found.append(out("acs", WARNING,
                         "ACS P2P redirect on bridge(s) " + ", ".join(redirecting) +
                         ": peer-to-peer traffic goes through the root complex (slow, or broken "
                         "under an IOMMU)",
                         "disable ACS in the BIOS, or per bridge until reboot `setpci -s "
                         f"{redirecting[0]} ECAP_ACS+0x6.w=0000`; or {P2P_FIX}", source))
    elif unread:
        found.append(out("acs", UNKNOWN, "extended config space of " + ", ".join(unread) +
                         " not readable (run as root)", source=source))
    else:
        found.append(out("acs", OK, f"no ACS redirect on {len(bridges)} bridge(s) above the GPU",
                         source=source))
    return found


# ------------------------------------------------------------------ per host

def host_findings(kernel: Kernel | None, why_no_kernel: str) -> list[Finding]:
    if kernel is None:
        return [Finding("nvidia-uvm", UNKNOWN, why_no_kernel)]
    modules = kernel.modules()
    fix_module = ("modprobe nvidia_uvm, and list it in /etc/modules-load.d/nvidia.conf "
                  "(in a container: load it on the host)")
    if modules is None:
        return [Finding("nvidia-uvm", UNKNOWN, "/proc/modules not readable")]
    if "nvidia_uvm" not in modules:
        return [Finding("nvidia-uvm", ERROR, "nvidia_uvm is not loaded: CUDA cannot initialize",
                        fix_module, "/proc/modules")]
    if not kernel.exists("/dev/nvidia-uvm"):
        return [Finding("nvidia-uvm", ERROR, "nvidia_uvm is loaded but /dev/nvidia-uvm is "
                        "missing: CUDA cannot initialize",
                        "nvidia-modprobe -u -c=0 (in a container: pass /dev/nvidia-uvm "
                        "and /dev/nvidia-uvm-tools through)", "/dev/nvidia-uvm")]
    return [Finding("nvidia-uvm", OK, "nvidia_uvm loaded, /dev/nvidia-uvm present", "",
                    "/proc/modules")]


def orphan_xids(log: KernelLog | None, gpus: list[Gpu]) -> list[Finding]:
    """XIDs logged for a PCI address no listed GPU has: a GPU that fell off
    the bus is no longer listed, which is exactly when they matter."""
    if log is None or not log.readable:
        return []
    known = {g.pci.rsplit(".", 1)[0] for g in gpus}
    out = []
    for where, xids in sorted(log.xids.items()):
        if where in known:
            continue
        fatal = [x for x in dict.fromkeys(xids) if x in FATAL_XIDS]
        out.append(Finding("xid", ERROR if fatal else WARNING,
                           f"XID {', '.join(str(x) for x in dict.fromkeys(xids))} since boot "
                           f"for PCI {where}, which is not among the GPUs listed now",
                           "; ".join(f"XID {x}: {FATAL_XIDS[x]}" for x in fatal) or
                           "read the kernel log (journalctl -k | grep Xid)", log.source))
    return out


# ------------------------------------------------------------------ entry points

@dataclass
class Report:
    findings: list[Finding]
    driver: dict[str, Any]

    def of_gpu(self, index: int) -> list[Finding]:
        return [f for f in self.findings if f.gpu == index]


def kernel_for(b: Backend, root: str | None) -> tuple[Kernel | None, str]:
    """The kernel to read, or None and why.  With fake GPUs the driver's kernel
    side is not faked: it is read only from a tree given as `root`."""
    if root is not None:
        return Kernel(root), ""
    if b.name == "fake":
        return None, "fake GPUs (INFER_UNITS_FAKE_GPUS): the kernel side is read only with --root-dir"
    return Kernel("/"), ""


def check_gpus(b: Backend, gpus: list[Gpu], root: str | None = None,
               every: list[Gpu] | None = None) -> Report:
    """Every GPU check for `gpus` and the host checks.  `every`: all GPUs of
    the host (for XIDs of addresses none of them has); default `gpus`."""
    kernel, why_no_kernel = kernel_for(b, root)
    facts = [(g, b.health_facts(g)) for g in gpus]
    need_log = kernel is not None and any(got.facts.get("xid") is None for _, got in facts)
    log = kernel.kernel_log() if need_log and kernel is not None else None
    findings: list[Finding] = []
    for gpu, got in facts:
        findings += judge_gpu(gpu, got, kernel, log, why_no_kernel)
    findings += host_findings(kernel, why_no_kernel)
    if every is not None:
        findings += orphan_xids(log, every)
    return Report(findings, b.driver_facts())


def gate(report: Report, accept: tuple[str, ...] | list[str]) -> tuple[list[Finding], list[Finding]]:
    """pre-start's verdict: (refusing, to log).  An accepted error is logged as
    a warning saying it was accepted."""
    refusing = [f for f in report.findings if f.level == ERROR and f.check not in accept]
    logged = [f for f in report.findings if f.level == WARNING
              or (f.level == ERROR and f.check in accept)]
    return refusing, logged


def line(f: Finding, accepted: bool = False) -> str:
    text = f"{f.where}: {f.check} {f.level}"
    if accepted:
        text += " (accepted by [health] accept)"
    text += f": {f.fact}"
    return text + (f"; fix: {f.fix}" if f.fix else "")
