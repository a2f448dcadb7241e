"""Who is each user of a unit's GPUs, in this order (docs/trust.md):

  own      in this unit's own cgroup: leftovers of its previous run, reaped
  service  in another infer-units service's cgroup: never touched (exit 2)
  ignored  named in [reap] ignore or the built-in list: never touched
  foreign  anything else: handled by [reap] foreign (kill | wait | fail)
  ancestor the caller's own parent chain: reported, never touched

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
from ..facts.gpus import Backend, Gpu, GpuUse
from ..facts.procinfo import ProcInfo, ancestors, matches_name, read_cgroup, read_proc, unit_of_cgroup
from .identity import in_unit, is_infer_units_service, service_of

OWN, SERVICE, IGNORED, FOREIGN, ANCESTOR = "own", "service", "ignored", "foreign", "ancestor"
@dataclass
class Holder:
    info: ProcInfo
    use: GpuUse
    kind: str
    why: str

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
    elif matches_name(info, ignore):
        kind, why = IGNORED, f"{info.exe_name} is on the ignore list"
    else:
        parent_unit = None if info.unit else _service_parent(info)
        if parent_unit and parent_unit != own_unit:
            kind, why = SERVICE, (f"child of infer-units service {parent_unit} "
                                  "(outside its cgroup)")
        elif parent_unit:
            kind, why = OWN, f"child of {own_unit} outside its cgroup"
        else:
            place = _place(info)
            kind, why = FOREIGN, f"foreign user of GPU {_gpu_list(use)} ({place})"
    return Holder(info=info, use=use, kind=kind, why=why)


def attribute(backend: Backend, gpus: list[Gpu], own_unit: str | None,
              ignore: tuple[str, ...] = ()) -> Attribution:
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
        result.holders.append(classify(info, use, own_unit, ignore, spare))
    result.unaccounted = unaccounted(backend, gpus, uses)
    return result


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
