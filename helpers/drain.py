"""`infer-units drain`: before a driver reload, stop every infer-units service
and reap every holder of /dev/nvidia* (not just CUDA users: anything that keeps
the module busy), sparing the ignore list."""

from __future__ import annotations

import sys

from . import exitcodes
from .attribution import is_infer_units_service
from .gpus import Backend, Gpu, GpuUse, backend, fd_holders
from .reaper import ReapPolicy, Reaper

REFCNT = "/sys/module/nvidia/refcnt"


class DeviceHolders(Backend):
    """Every process holding any GPU device node counts as a user of every GPU."""

    def __init__(self, base: Backend) -> None:
        self.base = base
        self.name = f"{base.name}+device-files"

    def gpus(self) -> list[Gpu]:
        return self.base.gpus()

    def users(self, gpus: list[Gpu]) -> dict[int, GpuUse]:
        every = {g.index for g in gpus}
        return {pid: GpuUse(pid, set(every))
                for pid in fd_holders(set(self.base.device_files()))}

    def device_files(self) -> list[str]:
        return self.base.device_files()


def module_refcount() -> str:
    try:
        with open(REFCNT, encoding="ascii") as f:
            return f"nvidia module refcount {f.read().strip()}"
    except OSError:
        return "nvidia module refcount not exposed (module unload disabled?)"


def _log(message: str) -> None:
    print(f"infer-units: {message}", file=sys.stderr, flush=True)


def drain(timeout: float, term_grace: float, ignore: tuple[str, ...], dry_run: bool) -> int:
    from .systemd import SystemdUnavailable, list_units, stop_units
    try:
        services = [u for u in list_units(["*.service"]) if is_infer_units_service(u)]
        if services:
            _log(("would stop " if dry_run else "stopping ") + ", ".join(services))
            if not dry_run:
                left = stop_units(services, timeout)
                if left:
                    _log("did not stop in time: " + ", ".join(left))
    except SystemdUnavailable as e:
        _log(f"systemd unavailable ({e}); reaping device holders only")
    view = DeviceHolders(backend())
    policy = ReapPolicy(foreign="kill", term_grace=term_grace, timeout=timeout,
                        ignore=ignore, dry_run=dry_run)
    result = Reaper(view, view.gpus(), None, policy).run()
    remaining = fd_holders(set(view.device_files()))
    spared = {h.info.pid for h in result.ignored}
    _log(f"{module_refcount()}; {len(remaining)} process(es) hold /dev/nvidia*"
         + (f" ({len(spared)} on the ignore list)" if spared else ""))
    if result.exit_code == exitcodes.CLEAN:
        _log("drained" if not dry_run else "dry run: nothing touched")
    return result.exit_code
