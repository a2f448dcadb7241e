"""infer-units-generator normal-dir [early-dir late-dir]

Writes one <name>.service per valid model file into normal-dir, and the
.wants/.requires links its [install] asks for; a bad file is logged and
skipped, the others are still generated.  Like every systemd generator
(systemd.generator(7)) it writes into its output directory and nowhere else.
"""

from __future__ import annotations

import logging
import sys

from .atomicfile import Dir, open_dir
from .build import Loaded, as_config_error, load_all, render_checked
from .errors import ConfigError
from .log import PROJECT, GeneratorHandler, setup, systemd_log_level
from .paths import DEB_CLI, HOOK_CLI
from .render import RenderedUnit, shipped_units


def write_unit(out: Dir, unit: RenderedUnit) -> None:
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
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) not in (1, 3):
        # Only a person gets this wrong (systemd passes three): tell the terminal.
        print("usage: infer-units-generator normal-dir [early-dir late-dir]", file=sys.stderr)
        return 1
    sink = GeneratorHandler()
    setup(sink, systemd_log_level())
    try:
        return generate(argv[0], sink)
    finally:
        # main() returns to its caller (the fuzz tests run it in process).
        logging.getLogger(PROJECT).removeHandler(sink)


# Not __name__: run as `python3 -m infer_units.generator.main` (the tests,
# a developer) this module is __main__, outside the project's logger.
log = logging.getLogger(f"{PROJECT}.generator.main")


def generate(out_dir: str, sink: GeneratorHandler) -> int:
    """Load, validate and render every model into `out_dir`; what reached no
    log becomes the report unit (sink.finish)."""
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
        _write_all(loaded, out)
    sink.finish(out_dir)
    return 0


def _write_all(loaded: Loaded, out: Dir) -> None:
    """Every model's files."""
    for model in loaded.models:
        try:
            units = render_checked(model)
        except Exception as e:      # noqa: BLE001
            log.error(f"{as_config_error(model.main_path, e)} (no unit generated)")
            continue
        try:
            for unit in units:
                write_unit(out, unit)
            log.debug(f"{model.main_path}: wrote {model.unit_name}")
        except Exception as e:      # noqa: BLE001
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            log.error(str(ConfigError(model.main_path, None,
                                      f"cannot write {model.unit_name}: {reason}")))
    if HOOK_CLI != DEB_CLI and any(m.liveness is not None for m in loaded.models):
        # Not the .deb: the liveness template units are not on the unit path.
        try:
            for unit in shipped_units():
                write_unit(out, unit)
        except Exception as e:      # noqa: BLE001
            log.error(f"cannot write the liveness template units: {e} (models have no liveness)")


if __name__ == "__main__":
    sys.exit(main())
