"""infer-units-generator normal-dir [early-dir late-dir]

Writes one <name>.service per valid model file into normal-dir, and the
.wants/.requires links its [install] asks for; a bad file is logged and
skipped, the others are still generated.
"""

from __future__ import annotations

import sys

from .atomicfile import Dir, open_dir
from .paths import DEB_CLI, HOOK_CLI, getenv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .build import Loaded
    from .cache import CachedUnit
    from .log import GeneratorLog
    from .render import RenderedUnit


def write_unit(out: Dir, unit: RenderedUnit | CachedUnit) -> None:
    """The unit, in its directory (a drop-in: NAME.service.d/), and its links.
    Atomically (atomicfile.py): a full disk (ENOSPC, EFBIG, EDQUOT) leaves the
    old file or none, never a truncated one (an empty unit would mean "masked"
    to systemd).  write_new: systemd empties the directory before each run,
    so the name is almost always free.  The subdirectories stay open for the
    next unit (Dir.child).  No fsync: the generator writes to a tmpfs rebuilt
    at every boot and daemon-reload, and write()/close() report a full tmpfs
    or ext4."""
    parent, _, base = unit.name.rpartition("/")
    (out.child(parent) if parent else out).write_new(base, unit.text)
    for link_dir in unit.links:
        out.child(link_dir).symlink(unit.name, "../" + unit.name)


def main(argv: list[str] | None = None) -> int:
    """The generator; called as the program (no argv: the .deb's launcher,
    the console script, `python3 -m`), it leaves through leave.leave()."""
    if argv is None:
        from .leave import leave
        leave(_main(sys.argv[1:]))
    return _main(argv)


def _main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) not in (1, 3):
        # Only a person gets this wrong (systemd passes three): tell the terminal.
        print("usage: infer-units-generator normal-dir [early-dir late-dir]", file=sys.stderr)
        return 1
    out_dir = argv[0]
    if getenv("INFER_UNITS_GENERATOR_CACHE") == "":
        return _generate(out_dir, None, None)       # the cache off: none of cache.py imported
    from . import cache
    path = cache.cache_path()
    try:
        key = cache.run_key(HOOK_CLI) if path else None
    except OSError:             # the code's files not where they should be: no cache
        path = key = None
    if path is not None and key is not None:
        units = cache.lookup(path, key)
        if units is not None:
            try:
                with open_dir(out_dir) as out:
                    for unit in units:
                        write_unit(out, unit)
                return 0
            except Exception:       # noqa: BLE001 - the full run below says what is wrong
                pass
    return _generate(out_dir, path, key)


def _generate(out_dir: str, path: str | None, key: tuple[Any, ...] | None) -> int:
    """The full run: load, validate and render every model (and, with a
    cache path, keep what it read and wrote for the next run, cache.py)."""
    import gc
    if gc.isenabled():
        # A short run whose memory all goes at exit: the cycle collector's
        # passes over the models' objects only cost time (~3% of the run).
        gc.disable()
        try:
            return _generate(out_dir, path, key)
        finally:
            gc.enable()
    from . import loader
    from .build import as_config_error, load_all
    from .log import LEVELS, GeneratorLog
    log = GeneratorLog()
    loader.RECORD = [] if path is not None else None
    try:
        loaded = load_all()
    except Exception as e:      # noqa: BLE001 - a bug of ours: one line, not a traceback
        log.error(f"{as_config_error('(search path)', e)} (no unit generated)")
        return 1
    for error in loaded.errors:
        log.error(f"{error} (no unit generated)")
    for conflict in loaded.conflicts:
        log.error(f"{conflict} (both generated; the start hook refuses to take a busy GPU)")
    try:
        out = open_dir(out_dir)
    except OSError as e:
        log.error(f"{out_dir}: cannot write units there: {e.strerror or e} (no unit generated)")
        return 1
    with out:
        written = _write_all(log, loaded, out)
    log.finish(out_dir)
    record, loader.RECORD = loader.RECORD, None
    if path is not None and key is not None and record is not None and log.errors == 0 \
            and log.max_level < LEVELS["debug"]:
        # A run that logged nothing: the next one may replay it (cache.py).
        from . import cache
        cache.store(path, key, record, written)
    return 0


def _write_all(log: GeneratorLog, loaded: Loaded, out: Dir) -> list[RenderedUnit]:
    """Every model's files; the list of those written."""
    from .build import as_config_error, render_checked
    from .errors import ConfigError
    written: list[RenderedUnit] = []
    for model in loaded.models:
        try:
            units = render_checked(model)
        except Exception as e:      # noqa: BLE001
            log.error(f"{as_config_error(model.main_path, e)} (no unit generated)")
            continue
        try:
            for unit in units:
                write_unit(out, unit)
                written.append(unit)
            log.debug(f"{model.main_path}: wrote {model.unit_name}")
        except Exception as e:      # noqa: BLE001
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            log.error(str(ConfigError(model.main_path, None,
                                      f"cannot write {model.unit_name}: {reason}")))
    if HOOK_CLI != DEB_CLI and any(m.liveness is not None for m in loaded.models):
        # Not the .deb: the liveness template units are not on the unit path.
        from .render import shipped_units
        try:
            for unit in shipped_units():
                write_unit(out, unit)
                written.append(unit)
        except Exception as e:      # noqa: BLE001
            log.error(f"cannot write the liveness template units: {e} (models have no liveness)")
    return written


if __name__ == "__main__":
    sys.exit(main())
