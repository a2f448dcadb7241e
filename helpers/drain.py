"""`infer-units drain`: before a driver reload, stop every infer-units service
and reap every holder of /dev/nvidia* (not just CUDA users: anything that keeps
the module busy), sparing the ignore list."""

from __future__ import annotations

import sys

from . import exitcodes
from .attribution import is_infer_units_service
from .gpus import Backend, FdScan, Gpu, GpuError, GpuUse, backend, fd_holders
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
        scan = FdScan(set(self.base.device_files()))
        self.unseen = scan.unseen
        return {pid: GpuUse(pid, set(every)) for pid in scan.held}

    def memory(self, gpus: list[Gpu]) -> dict[int, tuple[int, int]]:
        return self.base.memory(gpus)

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
    try:
        view = DeviceHolders(backend())
        gpus = view.gpus()
    except GpuError as e:
        _log(str(e))
        return exitcodes.CONFIG_ERROR
    # A leftover of an infer-units service (its stop timed out, say) is never
    # touched, but it must not stop the rest from being reaped: spare it,
    # reap everything else, then exit 2 naming it (DESIGN: 2 = blocked).
    policy = ReapPolicy(foreign="kill", term_grace=term_grace, timeout=timeout,
                        ignore=ignore, dry_run=dry_run, services="spare")
    result = Reaper(view, gpus, None, policy).run()
    remaining = fd_holders(set(view.device_files()))
    spared = {h.info.pid for h in result.ignored}
    _log(f"{module_refcount()}; {len(remaining)} process(es) hold /dev/nvidia*"
         + (f" ({len(spared)} on the ignore list)" if spared else ""))
    if result.exit_code == exitcodes.CLEAN:
        _log("drained" if not dry_run else "dry run: nothing touched")
    else:
        _log(f"not drained: {result.message}")
    return result.exit_code
