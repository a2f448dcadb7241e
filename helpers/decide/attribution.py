"""Who is each user of a unit's GPUs, in this order (docs/trust.md):

  own      in this unit's own cgroup: leftovers of its previous run, reaped
  service  in another infer-units service's cgroup: never touched (exit 2)
  ignored  named in [reap] ignore or the built-in list: never touched
  foreign  anything else: handled by [reap] foreign (kill | wait | fail)
  ancestor the caller's own parent chain: reported, never touched

A context whose creator is gone (NVML names the dead pid while a child
forked after cuInit holds the memory) is found through the GPU's device
file when asked (`heirs`): its live holders are classified as above.

Besides the processes: `unseen` counts processes whose fds could not be read
(other users', when not root) and `unaccounted` the GPU memory no listed
process holds (users in another PID namespace): either means "not provably
free", never "free".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ...generator.settings import BUILTIN_IGNORE
from ..facts.gpumemory import unaccounted
from ..facts.gpus import Backend, Gpu, GpuUse, context_heirs
from ..facts.procinfo import ProcInfo, ancestors, matches_name, read_cgroup, read_proc, unit_of_cgroup
from .claims import claimed_gpus
from .identity import in_unit, is_infer_units_service, service_of

OWN, SERVICE, IGNORED, FOREIGN, ANCESTOR = "own", "service", "ignored", "foreign", "ancestor"
@dataclass
class Holder:
    info: ProcInfo
    use: GpuUse
    kind: str
    why: str
    service: str | None = None      # kind SERVICE: that service

    def as_json(self) -> dict[str, object]:
        i = self.info
        return {"pid": i.pid, "ppid": i.ppid, "user": i.user, "comm": i.comm,
                "cmdline": i.cmdline, "state": i.state, "unit": i.unit,
                "container": i.container, "cgroup": i.cgroup,
                "gpus": sorted(self.use.gpus),
                "memory_mib": {str(k): v for k, v in sorted(self.use.memory_mib.items())},
                "kind": self.kind, "why": self.why}


@dataclass
class Attribution:
    gpus: list[Gpu]
    holders: list[Holder] = field(default_factory=list)
    unseen: int = 0                                          # processes out of sight
    unaccounted: dict[int, int] = field(default_factory=dict)   # GPU -> MiB
    vanished: list[int] = field(default_factory=list)       # listed, gone from /proc
    heirs: set[int] = field(default_factory=set)            # holding a vanished pid's context

    def of_kind(self, kind: str) -> list[Holder]:
        return [h for h in self.holders if h.kind == kind]


def _service_parent(info: ProcInfo) -> str | None:
    """A process outside any unit (root cgroup) whose parent chain runs
    through an infer-units service: a worker that left (or was moved out of)
    that service's cgroup is still that service's, not foreign."""
    pid, seen = info.ppid, 0
    while pid > 1 and seen < 16:
        seen += 1
        cgroup = read_cgroup(pid)
        if unit_of_cgroup(cgroup):
            return service_of(cgroup)
        parent = read_proc(pid)
        if parent is None:
            return None
        pid = parent.ppid
    return None


def classify(info: ProcInfo, use: GpuUse, own_unit: str | None, ignore: tuple[str, ...],
             spare: set[int]) -> Holder:
    if info.pid in spare:
        kind, why = ANCESTOR, f"holds GPU {_gpu_list(use)} and is this command's own parent chain"
    elif own_unit and in_unit(info.cgroup, own_unit):
        kind, why = OWN, f"left in {own_unit}'s own cgroup"
    elif (service := service_of(info.cgroup)) and service != own_unit:
        kind, why = SERVICE, f"belongs to infer-units service {service}"
        return Holder(info=info, use=use, kind=kind, why=why, service=service)
    elif matches_name(info, ignore):
        kind, why = IGNORED, f"{info.exe_name} is on the ignore list"
    else:
        parent_unit = None if info.unit else _service_parent(info)
        if parent_unit and parent_unit != own_unit:
            return Holder(info=info, use=use, kind=SERVICE, service=parent_unit,
                          why=f"child of infer-units service {parent_unit} (outside its cgroup)")
        elif parent_unit:
            kind, why = OWN, f"child of {own_unit} outside its cgroup"
        else:
            place = _place(info)
            kind, why = FOREIGN, f"foreign user of GPU {_gpu_list(use)} ({place})"
    return Holder(info=info, use=use, kind=kind, why=why)


def attribute(backend: Backend, gpus: list[Gpu], own_unit: str | None,
              ignore: tuple[str, ...] = (), heirs: bool = False) -> Attribution:
    """`heirs`: also look for the live holders of a context whose listed
    creator is gone (a scan of every process's fds: the reaper asks once a
    listed pid has stayed gone longer than a teardown takes)."""
    ignore = tuple(dict.fromkeys(BUILTIN_IGNORE + tuple(ignore)))
    spare = ancestors(os.getpid())
    result = Attribution(gpus=gpus)
    uses = backend.users(gpus)
    result.unseen = backend.unseen
    for pid, use in sorted(uses.items()):
        info = read_proc(pid)
        if info is None or info.exited:   # gone, or exiting: wait until unlisted
            result.vanished.append(pid)
            continue
        holder = classify(info, use, own_unit, ignore, spare)
        if holder.service is not None and not backend.exact:
            # Which GPU is only "holds its device file" here, and every CUDA
            # process holds every one: another model is on the GPUs its
            # start claimed (root's record), not on all of them.
            use.gpus &= claimed_gpus(holder.service, gpus)
            if not use.gpus:
                continue
        result.holders.append(holder)
    if heirs and result.vanished:
        _add_heirs(result, backend, {pid: uses[pid] for pid in result.vanished}, own_unit,
                   ignore, spare)
    result.unaccounted = unaccounted(backend, gpus, uses)
    return result


def _add_heirs(result: Attribution, backend: Backend, gone: dict[int, GpuUse],
               own_unit: str | None, ignore: tuple[str, ...], spare: set[int]) -> None:
    on = {index for use in gone.values() for index in use.gpus}
    devices = {g.device: g.index for g in result.gpus if g.index in on}
    listed = set(backend.users(backend.gpus()))
    for pid, use in sorted(context_heirs(devices, listed).items()):
        info = read_proc(pid)
        if info is None or info.exited:
            continue
        holder = classify(info, use, own_unit, ignore, spare)
        creators = ", ".join(str(p) for p, u in gone.items() if u.gpus & use.gpus)
        holder.why += (f"; holds GPU {_gpu_list(use)} with a context NVML names by gone "
                       f"pid {creators}")
        result.holders.append(holder)
        result.heirs.add(pid)


def _gpu_list(use: GpuUse) -> str:
    return ",".join(str(g) for g in sorted(use.gpus))


def _place(info: ProcInfo) -> str:
    """Where a foreign process runs, saying so when its cgroup only borrows
    a service's name (a user's `systemd-run --user --unit=NAME`)."""
    if info.container:
        return f"container {info.container}"
    if info.unit is None:
        return "no unit"
    if is_infer_units_service(info.unit):
        return f"cgroup {info.cgroup}, not the service {info.unit}"
    return info.unit
